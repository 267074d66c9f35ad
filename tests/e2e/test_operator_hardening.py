"""The operator meets objects it does not own and careless manifests (issue 23, items 4, 8
and 11) on the emulated cluster with the real ``kubectl``.

* an object that holds a name the app wants and is not the app's is left untouched, and the
  app says so (``Degraded``/``NameConflict``, naming the object) until it is gone;
* ``kubectl scale --replicas=0`` suspends the app (the scale subresource, as an HPA or KEDA
  would).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.k8s.kubectl import KUBECTL, Kubectl
from tests.support.k8s.operator_harness import REPO, OperatorHarness
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH"),
]

MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"


def manifest(name: str, **spec: Any) -> str:
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document = copy.deepcopy(document)
    document["metadata"]["name"] = name
    document["spec"].update(spec)
    return yaml.safe_dump(document)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorHarness]:
    pytest.importorskip("helm_sdkpy")
    running = OperatorHarness(tmp_path_factory.mktemp("hardening"), examples=["wordcount"])
    running.start()
    running.wait_until_operator_watches()
    yield running
    running.stop()


@pytest.fixture
def kubectl(harness: OperatorHarness) -> Kubectl:
    assert harness.kubectl is not None
    return harness.kubectl


def degraded(harness: OperatorHarness, app: str) -> dict[str, Any] | None:
    found = harness.condition(app, "Degraded")
    return found if found is not None and found["status"] == "True" else None


def test_an_object_of_another_owner_is_never_adopted_and_the_conflict_is_reported(
    harness: OperatorHarness, kubectl: Kubectl
) -> None:
    theirs_manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "victim-config"},
        "data": {"mine": "yes"},
    }
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(theirs_manifest))
    kubectl("apply", "-f", "-", stdin=manifest("victim", suspend=True))
    condition = wait_for(lambda: degraded(harness, "victim"), "Degraded for the conflict", 30)
    assert condition["reason"] == "NameConflict", condition
    assert "ConfigMap victim-config" in condition["message"]
    app = harness.app("victim")
    assert condition["observedGeneration"] == app["metadata"]["generation"]
    assert app["status"]["phase"] == "Suspended"  # Suspended stays; the condition says why
    theirs = harness.get("", "configmaps", "victim-config")
    assert theirs is not None
    assert theirs["data"] == {"mine": "yes"} and not theirs["metadata"].get("ownerReferences")
    assert harness.get("apps", "statefulsets", "victim") is not None  # the rest was applied
    warnings = [e for e in harness.objects("", "events") if e.get("reason") == "NameConflict"]
    assert warnings and "ConfigMap victim-config" in warnings[0]["message"]
    assert warnings[0]["type"] == "Warning"

    kubectl("delete", "configmap", "victim-config")

    def resolved() -> bool:
        config = harness.get("", "configmaps", "victim-config")
        owners = (config or {}).get("metadata", {}).get("ownerReferences") or []
        return degraded(harness, "victim") is None and [o["uid"] for o in owners] == [
            app["metadata"]["uid"]
        ]

    wait_for(resolved, "the app's own ConfigMap and Degraded cleared", 30)
    kubectl("delete", "sapp", "victim")


def test_scaling_to_zero_through_the_scale_subresource_suspends_the_app(
    harness: OperatorHarness, kubectl: Kubectl
) -> None:
    kubectl("apply", "-f", "-", stdin=manifest("scaled", replicas=1))
    wait_for(lambda: harness.get("apps", "statefulsets", "scaled"), "the StatefulSet", 30)
    assert "scaled" in kubectl("scale", "sapp", "scaled", "--replicas=0")

    def suspended() -> bool:
        sts = harness.get("apps", "statefulsets", "scaled")
        ready = harness.condition("scaled", "Ready")
        return bool(
            sts is not None
            and sts["spec"]["replicas"] == 0
            and harness.app("scaled").get("status", {}).get("phase") == "Suspended"
            and ready is not None
            and "spec.replicas is 0" in ready["message"]
        )

    wait_for(suspended, "Suspended with the StatefulSet at 0", 30)
    wait_for(lambda: not harness.pods("scaled"), "no pods left", 60)
    kubectl("delete", "sapp", "scaled")
