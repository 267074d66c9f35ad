"""Ownership (issue 23, item 4): no two apps' children share a name, and an existing object is
touched only when its controller is this StreamApp (or it is this app's own orphan)."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from eddyline_operator.reconcile import names, objects, ownership, restore_job
from eddyline_operator.reconcile.plan import parse_app
from tests.support.k8s_objects import body

Obj = dict[str, Any]

# Names chosen so that one app's name is another's name plus a child suffix.
APPS = ["x", "x-restore", "x-runtime", "x-config", "x-membership", "x-log", "x-query", "state-x"]


def children(app_name: str) -> set[tuple[str, str]]:
    """(kind, name) of everything the operator creates for app ``app_name``, restores on."""
    document = copy.deepcopy(body(restore={"when": "Always"}, log={"url": "sqlite:///x/log.db"}))
    document["metadata"]["name"] = app_name
    app = parse_app(document)
    owner = objects.owner_reference(name=app_name, uid=f"uid-{app_name}")
    made = objects.desired_objects(app, "apps", owner, default_image="img", log_node="node-1")
    made.append(objects.membership_config_map(app_name, "apps", owner, "{}"))
    made.append(
        restore_job.job(
            app,
            "apps",
            owner,
            store="s",
            partitions=[0],
            attempt=0,
            image="i",
            log_node=None,
            embedded_log=True,
            log_url="sqlite:///x/log.db",
        )
    )
    found = {(o["kind"], o["metadata"]["name"]) for o in made}
    for claim in objects.stateful_set(app, "apps", owner, default_image="i", log_node=None)["spec"][
        "volumeClaimTemplates"
    ]:  # the StatefulSet controller's claims, for ordinals 0..2
        found |= {
            ("PersistentVolumeClaim", f"{claim['metadata']['name']}-{app_name}-{i}")
            for i in range(3)
        }
    return found


def test_no_two_apps_children_share_a_name() -> None:
    made = {app: children(app) for app in APPS}
    for first, second in itertools.combinations(APPS, 2):
        shared = made[first] & made[second]
        assert not shared, f"apps {first} and {second} both want {sorted(shared)}"


def test_the_runtime_account_is_not_the_bare_app_name() -> None:
    assert ("ServiceAccount", "x-runtime") in children("x")
    assert names.runtime_account("x") != restore_job.service_account_name("x")


def owned(uid: str | None, *, labels: dict[str, str] | None = None) -> Obj:
    meta: Obj = {"name": "wc-config", "labels": labels or {}}
    if uid is not None:
        meta["ownerReferences"] = [
            {"kind": "StreamApp", "name": "other", "uid": uid, "controller": True}
        ]
    return {"metadata": meta}


def test_an_object_controlled_by_this_app_is_its() -> None:
    ownership.check(owned("uid-1"), kind="ConfigMap", app="wc", app_uid="uid-1")


def test_an_object_controlled_by_another_owner_is_a_conflict_naming_it() -> None:
    with pytest.raises(ownership.NameConflictError, match=r"ConfigMap wc-config .*StreamApp other"):
        ownership.check(owned("uid-2"), kind="ConfigMap", app="wc", app_uid="uid-1")


def test_an_orphan_is_taken_back_only_when_a_claim_with_this_apps_labels() -> None:
    """The log claim has no owner under whenDeleted: Retain; no other kind is ever left
    without one, so labels alone never make another kind the app's (issue 38)."""
    ours = names.labels("wc", "log")
    claim = "PersistentVolumeClaim"
    ownership.check(owned(None, labels=ours), kind=claim, app="wc", app_uid="uid-1")
    with pytest.raises(ownership.NameConflictError, match="it has no owner reference"):
        ownership.check(owned(None, labels=ours), kind="ServiceAccount", app="wc", app_uid="u")
    helm = {names.LABEL_MANAGED_BY: "Helm"}
    with pytest.raises(ownership.NameConflictError, match="managed by Helm"):
        ownership.check(owned(None, labels=helm), kind="ServiceAccount", app="wc", app_uid="u")
    theirs = names.labels("other", "log")
    with pytest.raises(ownership.NameConflictError):
        ownership.check(owned(None, labels=theirs), kind=claim, app="wc", app_uid="uid-1")
