"""What each child names (issue 38), read from the objects the operator really renders, and
the order that lets one pass withhold what names a foreign object."""

from __future__ import annotations

from typing import Any

from eddyline_operator.reconcile import objects, prune, references, restore_job
from eddyline_operator.reconcile.plan import parse_app
from tests.support.k8s_objects import body

Obj = dict[str, Any]
K8S = {"when": "Always", "master": "k8s://https://kubernetes.default.svc"}
EMBEDDED = {"url": "sqlite:///var/lib/eddyline/log/log.db"}


def rendered(**spec: Any) -> dict[references.Ref, Obj]:
    app = parse_app(body(**spec))
    owner = objects.owner_reference(name="wc", uid="uid-1")
    made = objects.desired_objects(app, "apps", owner, default_image="i", log_node="node-0")
    return {references.ref(o): o for o in made}


def test_the_statefulset_names_its_account_config_membership_service_and_claims() -> None:
    found = references.refers_to(rendered(restore=K8S, log=EMBEDDED)["StatefulSet", "wc"])
    assert found == {
        ("ServiceAccount", "wc-runtime"),
        ("ConfigMap", "wc-config"),
        ("ConfigMap", "wc-membership"),
        ("Service", "wc-headless"),
        ("PersistentVolumeClaim", "wc-log"),
        ("PersistentVolumeClaim", "wc-restore"),
    }


def test_role_bindings_name_their_role_and_subjects_but_never_the_charts_cluster_role() -> None:
    made = rendered(restore=K8S)
    assert references.refers_to(made["RoleBinding", "wc-membership"]) == {
        ("Role", "wc-membership"),
        ("ServiceAccount", "wc-runtime"),
    }
    assert references.refers_to(made["RoleBinding", "wc-restore"]) == {
        ("ServiceAccount", "wc-restore")
    }
    assert references.refers_to(made["Role", "wc-membership"]) == {("ConfigMap", "wc-membership")}


def test_a_restore_job_names_its_account_the_config_and_both_claims() -> None:
    app = parse_app(body(restore=K8S, log=EMBEDDED))
    owner = objects.owner_reference(name="wc", uid="uid-1")
    job = restore_job.job(
        app,
        "apps",
        owner,
        store="counts",
        partitions=[0],
        attempt=1,
        image="i",
        log_node=None,
        embedded_log=True,
        log_url="sqlite:///var/lib/eddyline/log/log.db",
    )
    assert references.refers_to(job) == {
        ("ServiceAccount", "wc-restore"),
        ("ConfigMap", "wc-config"),
        ("ConfigMap", "wc-restore-executor"),  # the executors' pod template (k8s:// master)
        ("PersistentVolumeClaim", "wc-restore"),
        ("PersistentVolumeClaim", "wc-log"),
    }


def test_every_child_comes_after_the_children_it_names() -> None:
    """children.py withholds in one pass: it must meet a named child before its referrer."""
    made = list(rendered(restore=K8S, log=EMBEDDED).values())
    seen: set[references.Ref] = {("ConfigMap", "wc-membership")}  # looked at first
    for obj in made:
        later = {references.ref(o) for o in made} - seen
        assert not references.refers_to(obj) & later, references.ref(obj)
        seen.add(references.ref(obj))


def test_what_names_a_withheld_child_is_withheld_and_says_through_what() -> None:
    made = rendered()
    unavailable = {("ConfigMap", "wc-membership"): "belongs to Helm"}
    role = references.withheld(made["Role", "wc-membership"], unavailable)
    assert role is not None and role.names == ("ConfigMap", "wc-membership")
    assert role.message.endswith("it names ConfigMap wc-membership, which belongs to Helm")
    assert references.withheld(made["RoleBinding", "wc-membership"], unavailable) is None
    unavailable[role.ref] = "is withheld itself"
    binding = references.withheld(made["RoleBinding", "wc-membership"], unavailable)
    assert binding is not None and binding.names == ("Role", "wc-membership")
    assert "which is withheld itself" in binding.message


def test_only_children_controlled_by_the_app_and_unwanted_are_pruned() -> None:
    mine = [{"kind": "StreamApp", "uid": "uid-1", "controller": True}]
    existing = [
        {"kind": "ServiceAccount", "metadata": {"name": "wc-restore", "ownerReferences": mine}},
        {"kind": "ServiceAccount", "metadata": {"name": "wc-runtime", "ownerReferences": mine}},
        {"kind": "ConfigMap", "metadata": {"name": "wc-membership", "ownerReferences": mine}},
        {"kind": "ConfigMap", "metadata": {"name": "wc-labelled-only"}},
        {"kind": "PersistentVolumeClaim", "metadata": {"name": "wc-log", "ownerReferences": mine}},
    ]
    app = parse_app(body())
    found = prune.unwanted(
        existing,
        {("ServiceAccount", "wc-runtime")},
        app="wc",
        app_uid="uid-1",
        kinds=prune.kinds(app),
    )
    assert [references.ref(o) for o in found] == [("ServiceAccount", "wc-restore")]
    deleting = parse_app(body(storage={"whenDeleted": "Delete"}))
    found = prune.unwanted(existing, set(), app="wc", app_uid="uid-1", kinds=prune.kinds(deleting))
    assert ("PersistentVolumeClaim", "wc-log") in [references.ref(o) for o in found]
