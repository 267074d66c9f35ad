"""A member's report names each store copy's role by one StoreRole, in JSON by its word."""

from __future__ import annotations

import json

import pytest

from eddyline_runtime.membership import (
    RESTORE_PENDING,
    STORE_ROLES,
    GlobalStoreCopy,
    MemberReport,
    StoreCopy,
    StoreRole,
)
from eddyline_runtime.partitions import TaskId


def report(stores: dict[int, StoreCopy]) -> MemberReport:
    task = TaskId(0, 0)
    return MemberReport("m-0", "h", frozenset({task}), frozenset({task}), {"counts": stores}, True)


def test_the_roles_a_report_may_name_are_the_enum_s_words() -> None:
    assert STORE_ROLES == ("active", "standby", "restoring", "restorePending")
    assert tuple(StoreRole) == tuple(StoreRole(word) for word in STORE_ROLES)


def test_a_report_round_trips_its_roles_through_json() -> None:
    sent = report({p: StoreCopy(role, p) for p, role in enumerate(StoreRole)})
    received = MemberReport.from_json(json.loads(json.dumps(sent.to_json())))
    assert received == sent
    assert [copy.role for copy in received.stores["counts"].values()] == list(StoreRole)
    assert sent.to_json()["stores"]["counts"]["3"] == {"role": "restorePending", "lag": 3}


def test_a_role_given_by_its_word_becomes_the_enum() -> None:
    assert StoreCopy("standby", 4).role is StoreRole.STANDBY


def test_an_unknown_role_is_refused_naming_it_and_the_known_ones() -> None:
    data = report({0: StoreCopy(StoreRole.ACTIVE, 0)}).to_json()
    data["stores"]["counts"]["0"]["role"] = "leader"
    with pytest.raises(ValueError, match=r"unknown store role 'leader'.*active, standby"):
        MemberReport.from_json(data)


def test_a_report_carries_the_stores_its_member_set_aside() -> None:
    """The operator reads them to report the rebuild (an old report without them reads as none)."""
    sent = report({0: StoreCopy(StoreRole.ACTIVE, 0)})
    sent = MemberReport(**{**sent.__dict__, "stores_set_aside": ("/state/.quarantine/1_0-x",)})
    assert MemberReport.from_json(sent.to_json()).stores_set_aside == ("/state/.quarantine/1_0-x",)
    old = sent.to_json()
    del old["stores_set_aside"]
    assert MemberReport.from_json(old).stores_set_aside == ()


def test_a_report_carries_its_global_stores_outside_the_task_copies() -> None:
    """Global stores have no task: reported apart (bootstrapped, lag), never in ``stores``;
    an older runtime's report without them reads as none."""
    sent = report({0: StoreCopy(StoreRole.ACTIVE, 0)})
    rates = GlobalStoreCopy("currencies", bootstrapped=False, lag=12)
    sent = MemberReport(**{**sent.__dict__, "global_stores": {"rates": rates}})
    data = json.loads(json.dumps(sent.to_json()))
    assert data["global_stores"] == {
        "rates": {"topic": "currencies", "bootstrapped": False, "lag": 12}
    }
    assert MemberReport.from_json(data) == sent
    assert "rates" not in sent.stores
    del data["global_stores"]
    assert MemberReport.from_json(data).global_stores == {}


def test_task_lags_take_each_task_s_most_behind_store_and_skip_pending_builds() -> None:
    """What the assignor judges warm-ups by: per task, the largest lag over its stores."""
    sent = MemberReport(
        "m-0",
        "h",
        frozenset(),
        frozenset(),
        {
            "counts": {0: StoreCopy(StoreRole.STANDBY, 5), 1: StoreCopy(StoreRole.ACTIVE, 0)},
            "totals": {0: StoreCopy(StoreRole.STANDBY, 40), 2: StoreCopy(RESTORE_PENDING, 900)},
            "unowned": {0: StoreCopy(StoreRole.STANDBY, 7)},
        },
        True,
        store_owners={"counts": 1, "totals": 1},
    )
    assert sent.task_lags() == {TaskId(1, 0): 40, TaskId(1, 1): 0}


def test_a_report_carries_each_copy_s_bytes_on_disk_and_an_older_one_parses_without() -> None:
    sized = report({0: StoreCopy(StoreRole.ACTIVE, 0, 4096), 1: StoreCopy(StoreRole.STANDBY, 3)})
    document = json.loads(json.dumps(sized.to_json()))
    assert document["stores"]["counts"]["0"]["disk_bytes"] == 4096
    assert MemberReport.from_json(document).stores == sized.stores
    # A runtime from before sizes were reported writes no "disk_bytes": the size is unknown.
    assert "disk_bytes" not in document["stores"]["counts"]["1"]  # unknown: not written
    del document["stores"]["counts"]["0"]["disk_bytes"]
    older = MemberReport.from_json(document)
    assert [c.disk_bytes for c in older.stores["counts"].values()] == [None, None]


def test_tasks_of_unknown_staleness_are_the_copies_reported_unable_to_tell() -> None:
    """What the assignor keeps a task from moving to: a copy whose member said (null) it
    cannot tell how current it is; a runtime that says nothing is judged by lag alone."""
    knows = StoreCopy(StoreRole.STANDBY, 5, as_of_ms=1_000, reports_staleness=True)
    cannot_tell = StoreCopy(StoreRole.STANDBY, 5, as_of_ms=None, reports_staleness=True)
    sent = MemberReport(
        "m-0",
        "h",
        frozenset(),
        frozenset(),
        {
            "counts": {0: knows, 1: cannot_tell, 2: StoreCopy(RESTORE_PENDING, 900)},
            "totals": {0: cannot_tell, 1: knows},
        },
        True,
        store_owners={"counts": 1, "totals": 1},
    )
    # One store of task 1_0 cannot tell, so the task's copy cannot.
    assert sent.tasks_of_unknown_staleness() == {TaskId(1, 0), TaskId(1, 1)}
    document = json.loads(json.dumps(sent.to_json()))
    assert document["stores"]["counts"]["1"]["as_of_ms"] is None
    assert MemberReport.from_json(document).tasks_of_unknown_staleness() == {
        TaskId(1, 0),
        TaskId(1, 1),
    }
    # An older runtime writes no "as_of_ms": not "cannot tell" but "does not say".
    for partitions in document["stores"].values():
        for copy in partitions.values():
            copy.pop("as_of_ms", None)
            copy.pop("staleness_ms", None)
    assert MemberReport.from_json(document).tasks_of_unknown_staleness() == frozenset()
    # A copy built without a staleness report is written without one, and reads back so.
    silent = report({0: StoreCopy(StoreRole.STANDBY, 5)})
    written = json.loads(json.dumps(silent.to_json()))
    assert "as_of_ms" not in written["stores"]["counts"]["0"]
    assert not MemberReport.from_json(written).stores["counts"][0].reports_staleness
