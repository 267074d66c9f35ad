"""The operator meets objects it does not own and careless manifests (issue 23, items 4, 8
and 11) on the real control plane with the real ``kubectl``.

* an object that holds a name the app wants and is not the app's is left untouched, and the
  app says so (``Degraded``/``NameConflict``, naming the object) until it is gone;
* ``kubectl scale --replicas=0`` suspends the app (the scale subresource, as an HPA or KEDA
  would).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.control_plane.client import wait_until
from tests.support.control_plane.operator import Kubectl, Operator
from tests.support.control_plane.operator_fixture import operator_fixture

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
NAMESPACE = "hardening-real"


def manifest(name: str, **spec: Any) -> str:
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document = copy.deepcopy(document)
    document["metadata"]["name"] = name
    document["spec"].update(spec)
    return yaml.safe_dump(document)


operator = operator_fixture(NAMESPACE, directory="hardening")


@pytest.fixture
def kubectl(operator: Operator) -> Kubectl:
    return operator.kubectl


def degraded(operator: Operator, app: str) -> dict[str, Any] | None:
    found = operator.condition(app, "Degraded")
    return found if found is not None and found["status"] == "True" else None


def test_an_object_of_another_owner_is_never_adopted_and_the_conflict_is_reported(
    operator: Operator, kubectl: Kubectl
) -> None:
    theirs_manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "victim-config"},
        "data": {"mine": "yes"},
    }
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(theirs_manifest))
    kubectl("apply", "-f", "-", stdin=manifest("victim", suspend=True))
    condition = wait_until(lambda: degraded(operator, "victim"), "Degraded for the conflict", 60)
    assert condition["reason"] == "NameConflict", condition
    assert "ConfigMap victim-config" in condition["message"]
    app = operator.app("victim")
    assert condition["observedGeneration"] == app["metadata"]["generation"]
    assert app["status"]["phase"] == "Suspended"  # Suspended stays; the condition says why
    theirs = operator.get("", "configmaps", "victim-config")
    assert theirs is not None
    assert theirs["data"] == {"mine": "yes"} and not theirs["metadata"].get("ownerReferences")
    assert operator.get("apps", "statefulsets", "victim") is not None  # the rest was applied
    warnings = [e for e in operator.objects("", "events") if e.get("reason") == "NameConflict"]
    assert warnings and "ConfigMap victim-config" in warnings[0]["message"]
    assert warnings[0]["type"] == "Warning"

    kubectl("delete", "configmap", "victim-config")

    def resolved() -> bool:
        config = operator.get("", "configmaps", "victim-config")
        owners = (config or {}).get("metadata", {}).get("ownerReferences") or []
        return degraded(operator, "victim") is None and [o["uid"] for o in owners] == [
            app["metadata"]["uid"]
        ]

    wait_until(resolved, "the app's own ConfigMap and Degraded cleared", 60)
    kubectl("delete", "sapp", "victim")


def test_scaling_to_zero_through_the_scale_subresource_suspends_the_app(
    operator: Operator, kubectl: Kubectl
) -> None:
    kubectl("apply", "-f", "-", stdin=manifest("scaled", replicas=1))
    wait_until(lambda: operator.get("apps", "statefulsets", "scaled"), "the StatefulSet", 60)
    assert "scaled" in kubectl("scale", "sapp", "scaled", "--replicas=0")

    def suspended() -> bool:
        sts = operator.get("apps", "statefulsets", "scaled")
        ready = operator.condition("scaled", "Ready")
        return bool(
            sts is not None
            and sts["spec"]["replicas"] == 0
            and operator.app("scaled").get("status", {}).get("phase") == "Suspended"
            and ready is not None
            and "spec.replicas is 0" in ready["message"]
        )

    wait_until(suspended, "Suspended with the StatefulSet at 0", 60)
    wait_until(lambda: not operator.pods("scaled"), "no pods left", 120)
    kubectl("delete", "sapp", "scaled")
