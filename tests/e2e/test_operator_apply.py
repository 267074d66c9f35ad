"""Issue 23, item 7: what the operator no longer wants disappears from its children.

The operator wrote children with merge patches, which never remove anything: switching
``storage.whenDeleted`` from Delete to Retain left the StreamApp's owner reference on the
log's claim (deleting the app then deleted the claim the spec said to keep), and switching
the log from sqlite to Kafka left the single-node pin beside the zone spread. It now applies
whole objects (server-side apply); each transition is checked on the real API server of the
control plane (the old emulator treated apply patches as merge patches).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.control_plane.client import wait_until
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture
from tests.support.kafka.broker import KafkaCluster

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
APP = "applied"
NAMESPACE = "operator-apply"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
# Bounds for a broken run on a loaded 2-core machine, not expectations.
TIMEOUT = 120

Obj = dict[str, Any]


operator = operator_fixture(NAMESPACE, directory="operator-apply")


def apply_app(operator: Operator, **spec: Any) -> None:
    document: Obj = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["metadata"]["name"] = APP
    document["spec"].update(spec)
    operator.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(document))


def log_claim(operator: Operator) -> Obj | None:
    return operator.get("", "persistentvolumeclaims", f"{APP}-log")


def pod_spec(operator: Operator) -> Obj:
    stateful_set = operator.get("apps", "statefulsets", APP)
    assert stateful_set is not None
    spec: Obj = stateful_set["spec"]["template"]["spec"]
    return spec


def waited(operator: Operator, condition: Any, what: str) -> None:
    try:
        wait_until(condition, what, TIMEOUT)
    except TimeoutError:
        print(operator.describe_failure(APP))
        raise


@pytest.fixture
def app(operator: Operator) -> Iterator[str]:
    storage = {"size": "1Gi", "logSize": "1Gi", "whenDeleted": "Delete"}
    apply_app(operator, storage=storage)
    waited(
        operator,
        lambda: (
            (claim := log_claim(operator)) is not None
            and bool(claim["metadata"].get("ownerReferences"))
            and operator.get("apps", "statefulsets", APP) is not None
        ),
        "the log claim, owned by the app, and the StatefulSet",
    )
    yield APP
    operator.kubectl("delete", "sapp", APP, "--wait=false", "--ignore-not-found")
    waited(operator, lambda: not operator.pods(APP), "the app's pods gone")
    claim = log_claim(operator)
    if claim is not None:  # kept (Retain): the next test starts from nothing
        operator.kubectl("delete", "pvc", f"{APP}-log", "--wait=false", "--ignore-not-found")
    waited(
        operator,
        lambda: (
            log_claim(operator) is None
            and operator.get("apps", "statefulsets", APP) is None
            and operator.get("eddyline.dev/v1alpha1", "streamapps", APP) is None
        ),
        "the app, its StatefulSet and its log claim gone",
    )


def test_switching_when_deleted_to_retain_removes_the_owner_reference_from_the_log_claim(
    operator: Operator, app: str
) -> None:
    claim = log_claim(operator)
    assert claim is not None
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("StreamApp", app)
    apply_app(operator, storage={"size": "1Gi", "logSize": "1Gi", "whenDeleted": "Retain"})
    waited(
        operator,
        lambda: not (log_claim(operator) or {}).get("metadata", {}).get("ownerReferences"),
        "the log claim without the app's owner reference",
    )
    # The operator's field manager owns what it applied, under its own name.
    claim = log_claim(operator)
    assert claim is not None
    managers = {m["manager"]: m["operation"] for m in claim["metadata"]["managedFields"]}
    assert managers.get("eddyline-operator") == "Apply", managers
    # Deleting the app now keeps the claim, as the spec says.
    operator.kubectl("delete", "sapp", app, "--wait=true", timeout=TIMEOUT)
    waited(
        operator,
        lambda: operator.get("apps", "statefulsets", app) is None,
        "the garbage collector to remove the StatefulSet",
    )
    assert log_claim(operator) is not None


def test_switching_the_log_from_sqlite_to_kafka_removes_the_single_node_pin(
    operator: Operator, app: str, kafka_broker: KafkaCluster
) -> None:
    def pinned() -> bool:
        affinity = pod_spec(operator).get("affinity") or {}
        return "nodeAffinity" in affinity

    waited(operator, pinned, "the embedded log's pods pinned to the log's node")
    assert "topologySpreadConstraints" not in pod_spec(operator)
    apply_app(
        operator,
        log={"url": f"kafka://{kafka_broker.bootstrap}"},
        storage={"size": "1Gi", "logSize": "1Gi", "whenDeleted": "Delete"},
    )

    def spread_not_pinned() -> bool:
        spec = pod_spec(operator)
        return "topologySpreadConstraints" in spec and not pinned()

    waited(operator, spread_not_pinned, "the pods spread over zones, no longer pinned")
    assert "podAntiAffinity" in pod_spec(operator)["affinity"]
