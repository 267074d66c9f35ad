"""The drift check reads the apps' children from kopf's watches (child_cache.py) instead of a
GET per child: a watched copy serves a read only when it is the version the server last
answered the operator with; anything else (never seen, deleted, edited by someone else, a
watch behind the operator's own write) is asked of the server. The client's transport is the
recorder of test_client.py; the real watches are tests/e2e/test_operator_drift.py's business."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import kopf
import pytest

from eddyline_operator import child_cache, handlers
from eddyline_operator.child_cache import DELETED, ChildCache
from eddyline_operator.client import Kube
from eddyline_operator.reconcile import names
from eddyline_runtime.spec import GROUP, PLURAL, VERSION
from tests.unit.operator.test_client import RecordingTransport, service

Obj = dict[str, Any]


def labelled(version: str, **spec: Any) -> Obj:
    """The query Service as the server holds it: the operator's labels, a version."""
    stored = service(clusterIP="10.0.0.7", type="ClusterIP", **spec)
    stored["spec"]["ports"][0].update(protocol="TCP", targetPort=7070)
    stored["metadata"].update(
        resourceVersion=version, labels={names.LABEL_MANAGED_BY: names.OPERATOR}
    )
    return stored


def wanted() -> Obj:
    applied = service()
    applied["metadata"]["labels"] = {names.LABEL_MANAGED_BY: names.OPERATOR}
    return applied


def methods(transport: RecordingTransport) -> list[str]:
    return [method for method, _, _, _ in transport.sent]


def test_a_watched_copy_serves_a_read_only_at_the_version_the_server_last_answered() -> None:
    cache = ChildCache(["Service"])
    cache.record("Service", "ADDED", labelled("5"))
    assert cache.lookup("Service", "apps", "wc-query") is None  # never answered by the server
    cache.confirm("Service", "apps", "wc-query", labelled("5"))
    found = cache.lookup("Service", "apps", "wc-query")
    assert found == labelled("5")
    assert found is not cache.lookup("Service", "apps", "wc-query")  # a copy per reader
    cache.record("Service", "MODIFIED", labelled("6"))  # someone else's edit
    assert cache.lookup("Service", "apps", "wc-query") is None
    cache.confirm("Service", "apps", "wc-query", labelled("6"))
    assert cache.lookup("Service", "apps", "wc-query") == labelled("6")
    cache.record("Service", DELETED, labelled("7"))
    assert cache.lookup("Service", "apps", "wc-query") is None


def test_a_watch_behind_the_operators_own_write_is_not_trusted() -> None:
    cache = ChildCache(["Service"])
    cache.record("Service", "ADDED", labelled("5"))
    cache.confirm("Service", "apps", "wc-query", labelled("8"))  # the answer to a write
    assert cache.lookup("Service", "apps", "wc-query") is None
    cache.record("Service", "MODIFIED", labelled("8"))  # the write's event arrives
    assert cache.lookup("Service", "apps", "wc-query") == labelled("8")
    cache.confirm("Service", "apps", "wc-query", None)  # a 404, a delete
    assert cache.lookup("Service", "apps", "wc-query") is None


def test_the_watched_copy_leaves_managed_fields_out() -> None:
    """The drift check compares without them; they were most of the cache's memory."""
    cache = ChildCache(["Service"])
    stored = labelled("5")
    stored["metadata"]["managedFields"] = [{"manager": "eddyline-operator"}]
    cache.record("Service", "ADDED", stored)
    cache.confirm("Service", "apps", "wc-query", stored)
    assert cache.lookup("Service", "apps", "wc-query") == labelled("5")


def test_a_confirmed_version_is_trusted_for_a_while_then_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf re-lists after a watch's gap without a DELETED for what went in it: a copy of a
    child deleted then would look current forever, so a version the server answered stands
    in for a GET only for TRUST_SECONDS."""
    now = [1000.0]
    monkeypatch.setattr(child_cache.time, "monotonic", lambda: now[0])
    cache = ChildCache(["Service"])
    cache.record("Service", None, labelled("5"))
    cache.confirm("Service", "apps", "wc-query", labelled("5"))
    now[0] += child_cache.TRUST_SECONDS - 1
    assert cache.lookup("Service", "apps", "wc-query") is not None
    now[0] += 1
    transport = RecordingTransport(None)  # deleted in the gap: the server has none
    assert Kube(transport, children=cache).apply(wanted(), unless_same=True) == "created"
    assert methods(transport) == ["GET", "PATCH"]


def test_kinds_the_cache_is_not_given_are_never_served_from_it() -> None:
    cache = ChildCache(["Service"])
    pod = {"metadata": {"name": "wc-0", "namespace": "apps", "resourceVersion": "1"}}
    cache.record("Pod", "ADDED", pod)
    cache.confirm("Pod", "apps", "wc-0", pod)
    assert cache.lookup("Pod", "apps", "wc-0") is None


def test_a_drift_check_of_an_untouched_child_sends_no_request() -> None:
    """The first check GETs (nothing confirmed yet); once the watch shows that version, the
    next checks find the child as wanted without a request."""
    cache = ChildCache(["Service"])
    transport = RecordingTransport(labelled("5"))
    kube = Kube(transport, children=cache)
    assert kube.apply(wanted(), unless_same=True) == "unchanged"
    assert methods(transport) == ["GET"]
    cache.record("Service", None, labelled("5"))  # kopf's listing
    transport.sent.clear()
    for _ in range(3):
        assert kube.apply(wanted(), unless_same=True) == "unchanged"
    assert methods(transport) == []


def test_a_child_edited_by_hand_is_read_again_and_put_back() -> None:
    cache = ChildCache(["Service"])
    cache.record("Service", None, labelled("5"))
    cache.confirm("Service", "apps", "wc-query", labelled("5"))
    edited = labelled("6")
    edited["spec"]["ports"][0]["port"] = 8080
    cache.record("Service", "MODIFIED", edited)
    transport = RecordingTransport(edited, patched=labelled("7"))
    assert Kube(transport, children=cache).apply(wanted(), unless_same=True) == "updated"
    assert methods(transport) == ["GET", "PATCH"]
    assert transport.sent[-1][2]["spec"]["ports"][0]["port"] == 7070
    cache.record("Service", "MODIFIED", labelled("7"))  # the apply's own event
    assert cache.lookup("Service", "apps", "wc-query") == labelled("7")


def test_a_child_deleted_by_hand_is_read_again_and_created() -> None:
    cache = ChildCache(["Service"])
    cache.record("Service", None, labelled("5"))
    cache.confirm("Service", "apps", "wc-query", labelled("5"))
    cache.record("Service", DELETED, labelled("5"))
    transport = RecordingTransport(None, patched=labelled("9"))
    assert Kube(transport, children=cache).apply(wanted(), unless_same=True) == "created"
    assert methods(transport) == ["GET", "PATCH"]


def test_a_delete_by_the_operator_is_not_answered_from_the_watch_afterwards() -> None:
    cache = ChildCache(["Service"])
    cache.record("Service", None, labelled("5"))
    cache.confirm("Service", "apps", "wc-query", labelled("5"))
    transport = RecordingTransport(None)
    kube = Kube(transport, children=cache)
    kube.delete("Service", "apps", "wc-query")
    assert kube.get("Service", "apps", "wc-query") is None  # asked: its DELETED not here yet
    assert methods(transport) == ["DELETE", "GET"]


def test_every_child_kind_is_watched_into_the_cache_filtered_by_the_operators_label() -> None:
    """kopf has an event handler for each kind in CHILD_KINDS, and the label selector the
    configure handler sets applies to their watches and to no other (pods, StreamApps)."""
    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings, memo=kopf.Memo())
    recorders = [
        h.selector
        for h in kopf.get_default_registry()._watching.get_all_handlers()
        if h.id.startswith("record-") and h.selector is not None
    ]
    for group, version, plural in handlers.CHILD_KINDS.values():
        resource = kopf.Resource(group, version, plural)
        assert sum(selector.check(resource) for selector in recorders) == 1, plural
        assert list(settings.watching.label_selectors.collect(resource)) == [
            f"{names.LABEL_MANAGED_BY}={names.OPERATOR}"
        ]
    for other in (kopf.Resource("", "v1", "pods"), kopf.Resource(GROUP, VERSION, PLURAL)):
        assert not any(selector.check(other) for selector in recorders)
        assert not list(settings.watching.label_selectors.collect(other))


def test_an_event_without_the_operators_label_takes_the_copy_out(memo: kopf.Memo) -> None:
    """Should an object without the label come through (the server filters on it), the
    cache drops its copy instead of holding one that stopped being the operator's."""
    record = handlers._child_recorder("Service")
    children = handlers.operator_of(memo).children
    asyncio.run(record(event={"type": "ADDED", "object": labelled("5")}, memo=memo))
    children.confirm("Service", "apps", "wc-query", labelled("5"))
    assert children.lookup("Service", "apps", "wc-query") is not None
    unlabelled = json.loads(json.dumps(labelled("5")))
    unlabelled["metadata"]["labels"] = {}
    asyncio.run(record(event={"type": "MODIFIED", "object": unlabelled}, memo=memo))
    assert children.lookup("Service", "apps", "wc-query") is None
