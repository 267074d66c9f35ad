"""Issue 38: a name conflict stops every child that names the foreign object, and children the
spec no longer asks for are pruned; one cycle over the in-memory store (``conftest``)."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from eddyline_operator import handlers
from eddyline_operator.reconcile import names
from tests.support.k8s_objects import body, pod, three_zones
from tests.unit.operator.conftest import MemoryKube

Obj = dict[str, Any]
K8S_MASTER = "k8s://https://kubernetes.default.svc"
RESTORE = {"when": "Always", "master": K8S_MASTER}
EMBEDDED = {"url": "sqlite:///var/lib/eddyline/log/log.db"}


def foreign(kind: str, name: str) -> Obj:
    """An object another owner holds (a Helm release's), with what its kind needs."""
    obj: Obj = {
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "apps",
            "labels": {names.LABEL_MANAGED_BY: "Helm"},
        },
    }
    if kind == "ConfigMap":
        obj["data"] = {"theirs": "yes"}
    return obj


def cycle(kube: MemoryKube, memo: kopf.Memo, app: Obj) -> Obj:
    kube.put(app)
    for each in three_zones():
        kube.put({"kind": "Node", **each})
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    status: Obj = kube.objects["StreamApp", "apps", "wc"]["status"]
    return status


def degraded(status: Obj) -> Obj:
    found: Obj = next(c for c in status["conditions"] if c["type"] == "Degraded")
    return found


# (the foreign object, the spec that makes the app want it, the children that name it).
CASES = [
    pytest.param(
        ("ServiceAccount", "wc-runtime"),
        {},
        [("StatefulSet", "wc"), ("RoleBinding", "wc-membership")],
        id="serviceAccountName-and-subjects",
    ),
    pytest.param(("Role", "wc-membership"), {}, [("RoleBinding", "wc-membership")], id="roleRef"),
    pytest.param(("ConfigMap", "wc-config"), {}, [("StatefulSet", "wc")], id="configMap-volume"),
    pytest.param(
        ("ConfigMap", "wc-membership"),
        {},
        [("Role", "wc-membership"), ("RoleBinding", "wc-membership"), ("StatefulSet", "wc")],
        id="role-resourceNames-and-pod-args",
    ),
    pytest.param(("Service", "wc-headless"), {}, [("StatefulSet", "wc")], id="serviceName"),
    pytest.param(
        ("PersistentVolumeClaim", "wc-log"),
        {"log": EMBEDDED},
        [("StatefulSet", "wc")],
        id="log-claimName",
    ),
    pytest.param(
        ("PersistentVolumeClaim", "wc-restore"),
        {"restore": RESTORE},
        [("StatefulSet", "wc")],
        id="restore-claimName",
    ),
    pytest.param(
        ("ServiceAccount", "wc-restore"),
        {"restore": RESTORE},
        [("RoleBinding", "wc-restore")],
        id="restore-subjects",
    ),
]


@pytest.mark.parametrize(("theirs", "spec", "withheld"), CASES)
def test_a_child_that_names_a_foreign_object_is_not_applied(
    kube: MemoryKube,
    memo: kopf.Memo,
    theirs: tuple[str, str],
    spec: Obj,
    withheld: list[tuple[str, str]],
) -> None:
    kube.put(foreign(*theirs))
    status = cycle(kube, memo, body(**spec))
    assert kube.objects[(theirs[0], "apps", theirs[1])] == foreign(*theirs)  # untouched
    for kind, name in withheld:
        assert (kind, "apps", name) not in kube.objects, f"{kind} {name} was applied"
    assert ("Service", "apps", "wc-query") in kube.objects  # what names nothing foreign is
    condition = degraded(status)
    assert condition["status"] == "True" and condition["reason"] == "NameConflict"
    assert status["phase"] == "Degraded"
    for kind, name in withheld:
        assert f"{kind} {name} not applied" in condition["message"]
    first = f"{withheld[0][0]} {withheld[0][1]}"
    directly = f"{first} not applied (and removed if made before): it names {theirs[0]} {theirs[1]}"
    assert f"{directly}, which belongs to no StreamApp" in condition["message"]
    # Gone: the next cycle applies every child and Degraded clears.
    del kube.objects[(theirs[0], "apps", theirs[1])]
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    for kind, name in withheld:
        assert (kind, "apps", name) in kube.objects
    assert degraded(kube.objects["StreamApp", "apps", "wc"]["status"])["status"] == "False"


def test_children_made_before_the_conflict_are_removed_and_the_claims_kept(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    """An earlier operator (or an earlier cycle, before the account was replaced) made the
    StatefulSet and the RoleBinding: neither is kept pointing at the foreign account, and
    the pods already running as it go; the StatefulSet is deleted without its claims."""
    cycle(kube, memo, body())
    assert ("StatefulSet", "apps", "wc") in kube.objects
    template = kube.objects["StatefulSet", "apps", "wc"]["spec"]["template"]
    for i in range(2):  # as the StatefulSet controller makes them
        made = pod(i)
        made["spec"] = {**template["spec"], **made["spec"], "subdomain": "wc-headless"}
        kube.put({"kind": "Pod", **made})
    # Someone replaces the app's ServiceAccount with their own.
    kube.put(foreign("ServiceAccount", "wc-runtime"))
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    assert ("StatefulSet", "wc", "Orphan") in kube.deletions
    assert ("RoleBinding", "wc-membership", "Background") in kube.deletions
    assert {("Pod", "wc-0"), ("Pod", "wc-1")} <= {(k, n) for k, n, _ in kube.deletions}
    assert ("ServiceAccount", "apps", "wc-runtime") in kube.objects  # theirs stays
    assert ("Role", "apps", "wc-membership") in kube.objects  # names nothing foreign


def test_a_withheld_child_that_is_not_the_apps_is_never_deleted(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    theirs = foreign("StatefulSet", "wc")
    kube.put(foreign("ServiceAccount", "wc-runtime"))
    kube.put(theirs)
    cycle(kube, memo, body())
    assert kube.objects["StatefulSet", "apps", "wc"] == theirs
    assert not [d for d in kube.deletions if d[0] == "StatefulSet"]


def test_a_restore_job_is_not_launched_as_a_foreign_account_and_a_running_one_goes(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = body(restore=RESTORE)
    cycle(kube, memo, app)
    running = {
        "kind": "Job",
        "metadata": {
            "name": "wc-restore-0123456789",
            "namespace": "apps",
            "labels": {names.LABEL_APP: "wc", names.LABEL_COMPONENT: "restore"},
            "ownerReferences": [{"kind": "StreamApp", "uid": "uid-1", "controller": True}],
        },
        "spec": {"template": {"spec": {"serviceAccountName": "wc-restore"}}},
    }
    kube.put(running)
    kube.put(foreign("ServiceAccount", "wc-restore"))
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    assert ("Job", "wc-restore-0123456789", "Background") in kube.deletions
    message = degraded(kube.objects["StreamApp", "apps", "wc"]["status"])["message"]
    assert "RoleBinding wc-restore not applied" in message


def test_a_labelled_object_without_an_owner_is_not_adopted_unless_it_is_a_claim(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    """Labels are not ownership: anyone may label a ServiceAccount as the operator's."""
    forged = {
        "kind": "ServiceAccount",
        "metadata": {"name": "wc-runtime", "namespace": "apps", "labels": names.labels("wc", "x")},
    }
    kube.put(forged)
    status = cycle(kube, memo, body())
    assert kube.objects["ServiceAccount", "apps", "wc-runtime"] == forged
    assert "ServiceAccount wc-runtime already exists" in degraded(status)["message"]
    assert ("StatefulSet", "apps", "wc") not in kube.objects


def test_the_apps_own_retained_log_claim_is_taken_back(kube: MemoryKube, memo: kopf.Memo) -> None:
    kept = {
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "wc-log", "namespace": "apps", "labels": names.labels("wc", "log")},
        "spec": {},
    }
    kube.put(kept)
    status = cycle(kube, memo, body(log=EMBEDDED))
    assert degraded(status)["status"] == "False"
    assert ("StatefulSet", "apps", "wc") in kube.objects


# -- pruning --------------------------------------------------------------------------------


def owned_by(uid: str) -> list[Obj]:
    return [{"kind": "StreamApp", "name": "wc", "uid": uid, "controller": True}]


def test_restore_back_to_never_prunes_its_claim_account_and_binding(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    cycle(kube, memo, body(restore=RESTORE, storage={"whenDeleted": "Delete"}))
    made = [("PersistentVolumeClaim", "wc-restore"), ("ServiceAccount", "wc-restore")]
    made.append(("RoleBinding", "wc-restore"))
    for kind, name in made:
        assert (kind, "apps", name) in kube.objects
    cycle(kube, memo, body(storage={"whenDeleted": "Delete"}))
    for kind, name in made:
        assert (kind, "apps", name) not in kube.objects, f"{kind} {name} was kept"
    assert ("ServiceAccount", "apps", "wc-runtime") in kube.objects
    assert ("ConfigMap", "apps", "wc-config") in kube.objects
    pruned = [m for _, r, m in kube.events if r == "Pruned"]  # type: ignore[attr-defined]
    assert "deleted RoleBinding wc-restore: the spec no longer asks for it" in pruned


def test_a_k8s_master_switched_to_local_prunes_only_the_binding(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    cycle(kube, memo, body(restore=RESTORE))
    assert ("RoleBinding", "apps", "wc-restore") in kube.objects
    cycle(kube, memo, body(restore={"when": "Always", "master": "local[2]"}))
    assert ("RoleBinding", "apps", "wc-restore") not in kube.objects
    assert ("ServiceAccount", "apps", "wc-restore") in kube.objects


def test_claims_are_pruned_only_under_when_deleted_delete(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    cycle(kube, memo, body(restore=RESTORE))  # whenDeleted defaults to Retain
    cycle(kube, memo, body())
    assert ("PersistentVolumeClaim", "apps", "wc-restore") in kube.objects
    assert ("ServiceAccount", "apps", "wc-restore") not in kube.objects


def test_the_log_claim_goes_when_the_log_moves_to_kafka_under_delete(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    storage = {"whenDeleted": "Delete"}
    cycle(kube, memo, body(log=EMBEDDED, storage=storage))
    assert ("PersistentVolumeClaim", "apps", "wc-log") in kube.objects
    cycle(kube, memo, body(storage=storage))
    assert ("PersistentVolumeClaim", "apps", "wc-log") not in kube.objects


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("ServiceAccount", "wc"),  # the runtime account's name before it became wc-runtime
        ("Role", "wc-old"),
        ("RoleBinding", "wc-old"),
        ("ConfigMap", "wc-old"),
        ("Service", "wc-old"),
        ("PodDisruptionBudget", "wc-old"),
    ],
)
def test_an_owned_child_of_each_kind_the_app_no_longer_wants_is_pruned(
    kube: MemoryKube, memo: kopf.Memo, kind: str, name: str
) -> None:
    leftover = {
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "apps",
            "labels": names.labels("wc", "runtime"),
            "ownerReferences": owned_by("uid-1"),
        },
    }
    kube.put(leftover)
    cycle(kube, memo, body())
    assert (kind, "apps", name) not in kube.objects


def test_only_the_apps_controller_reference_makes_a_child_prunable(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    """Labels alone, another owner's reference, or the membership ConfigMap: all stay."""
    labels = names.labels("wc", "runtime")
    kept = [
        {"kind": "ConfigMap", "metadata": {"name": "wc-labelled", "labels": labels}},
        {
            "kind": "ConfigMap",
            "metadata": {"name": "wc-other", "labels": labels, "ownerReferences": owned_by("u2")},
        },
        {
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "wc-log", "labels": names.labels("wc", "log")},
        },
    ]
    for obj in kept:
        kube.put({**obj, "metadata": {**obj["metadata"], "namespace": "apps"}})
    cycle(kube, memo, body(storage={"whenDeleted": "Delete"}))
    for obj in kept:
        assert (obj["kind"], "apps", obj["metadata"]["name"]) in kube.objects
