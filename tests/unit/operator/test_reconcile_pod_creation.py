"""Issue 38: pods the StatefulSet controller cannot create (a quota, a pod spec the server
refuses) make the app Degraded with the controller's own message, not Progressing forever."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from eddyline_operator import children, handlers
from eddyline_operator.reconcile import pod_creation
from eddyline_operator.reconcile.plan import Observed, plan
from tests.support.k8s_objects import body, pod, three_zones
from tests.unit.operator.conftest import MemoryKube

Obj = dict[str, Any]
NOW = "2026-11-23T10:00:00Z"
QUOTA = (
    'create Pod wc-0 in StatefulSet wc failed error: pods "wc-0" is forbidden: exceeded '
    "quota: pods, requested: pods=1, used: pods=2, limited: pods=2"
)


def event(reason: str, at: str, message: str = "", *, uid: str = "sts-1", count: int = 1) -> Obj:
    return {
        "kind": "Event",
        "metadata": {"name": f"wc.{reason}.{at}", "namespace": "apps"},
        "involvedObject": {"kind": "StatefulSet", "name": "wc", "uid": uid},
        "reason": reason,
        "message": message,
        "lastTimestamp": at,
        "count": count,
        "type": "Warning" if reason == "FailedCreate" else "Normal",
    }


def test_the_latest_word_of_the_controller_decides() -> None:
    failed = event("FailedCreate", "2026-11-23T09:59:50Z", QUOTA, count=12)
    assert pod_creation.failure([failed]) == f"{QUOTA} (12 times)"
    made = event("SuccessfulCreate", "2026-11-23T09:59:55Z", "create Pod wc-0 succeeded")
    assert pod_creation.failure([failed, made]) is None
    later = event("FailedCreate", "2026-11-23T09:59:58Z", QUOTA)
    assert pod_creation.failure([failed, made, later]) == QUOTA
    same_second = event("SuccessfulCreate", "2026-11-23T09:59:58Z", "create Pod wc-1 succeeded")
    assert pod_creation.failure([same_second, later]) == QUOTA  # some pod was not made
    assert pod_creation.failure([failed], stateful_set_uid="sts-2") is None  # an earlier one


def test_a_failed_create_while_pods_are_missing_degrades_the_app_with_its_message() -> None:
    events = [event("FailedCreate", "2026-11-23T09:59:50Z", QUOTA)]
    result = plan(
        Observed(body=body(), pods=[pod(0)], nodes=three_zones(), now=NOW,
                 stateful_set_events=events)
    )  # fmt: skip
    degraded = next(c for c in result.status.conditions if c.type == "Degraded")
    assert degraded.status == "True" and degraded.reason == "PodCreateFailed"
    assert degraded.message == f"the StatefulSet controller cannot create pods: {QUOTA}"
    assert result.status.phase == "Degraded"
    warnings = [(e.type, e.reason, e.message) for e in result.events if e.type == "Warning"]
    assert warnings == [("Warning", "PodCreateFailed", degraded.message)]
    # Every pod there: an old FailedCreate says nothing.
    full = plan(
        Observed(body=body(), pods=[pod(i) for i in range(3)], nodes=three_zones(), now=NOW,
                 stateful_set_events=events)
    )  # fmt: skip
    assert next(c for c in full.status.conditions if c.type == "Degraded").status == "False"


def test_the_events_are_listed_only_while_pods_are_missing_and_not_every_cycle(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(children, "EVENTS_SECONDS", 3600.0)  # no clock in the test
    listed: list[str | None] = []
    original = kube.list

    def counting(kind: str, namespace: str | None, **query: str | None) -> list[Obj]:
        if kind == "Event":
            listed.append(query.get("fields"))
        return original(kind, namespace, **query)

    kube.list = counting  # type: ignore[method-assign]
    kube.put(body())
    kube.put(event("FailedCreate", "2026-11-23T09:59:50Z", QUOTA))
    kube.put({**event("FailedCreate", "2026-11-23T09:59:59Z", "theirs"),
              "involvedObject": {"kind": "StatefulSet", "name": "other"}})  # fmt: skip
    for each in three_zones():
        kube.put({"kind": "Node", **each})
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    assert listed == ["involvedObject.kind=StatefulSet,involvedObject.name=wc"]
    status = kube.objects["StreamApp", "apps", "wc"]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "PodCreateFailed" and QUOTA in degraded["message"]
    assert ("Warning", "PodCreateFailed") in [(t, r) for t, r, _ in kube.events]  # type: ignore[attr-defined]
    # A starting app's cycles come four a second: the list is reused for EVENTS_SECONDS.
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    assert len(listed) == 1
    status = kube.objects["StreamApp", "apps", "wc"]["status"]
    assert next(c for c in status["conditions"] if c["type"] == "Degraded")["status"] == "True"
    for i in range(3):
        kube.put({"kind": "Pod", **pod(i)})
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    assert len(listed) == 1
