"""The release watcher's rules (engine/task_release.py), with a scripted old owner."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest

from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.engine.task_release import (
    TaskRelease,
    probe_layout,
    running_tasks,
)
from eddyline_runtime.membership import MemberReport, StoreCopy, StoreRole
from eddyline_runtime.partitions import TaskId
from tests.support.ports import free_port
from tests.support.waiting import wait_for

T0, T1 = TaskId(1, 0), TaskId(1, 1)
L_ADDRESS = "127.0.0.1:1"
MEMBERS = (Member("l", address=L_ADDRESS), Member("s", address="127.0.0.1:2"))
BEFORE = Assignment(
    active={"l": frozenset({T0, T1}), "s": frozenset()},
    standby={"l": frozenset(), "s": frozenset({T0, T1})},
    members=MEMBERS,
)
MOVED = Assignment(
    active={"l": frozenset({T1}), "s": frozenset({T0})},
    standby={"l": frozenset(), "s": frozenset({T1})},
    members=MEMBERS,
)


class OldOwner:
    """What the old owner's layout says it runs; None: it cannot be reached."""

    def __init__(self, running: frozenset[TaskId] | None) -> None:
        self.running = running
        self.asked: list[str] = []

    def __call__(self, address: str, timeout: float) -> frozenset[TaskId] | None:
        assert timeout > 0
        self.asked.append(address)
        return self.running


class Watched:
    def __init__(
        self, owner: OldOwner, *, wait_seconds: float = 30.0, limit_seconds: float = 30.0
    ) -> None:
        self.owner = owner
        self.copy_caught_up = True
        self.delivered = threading.Event()
        self.release = TaskRelease(
            "s",
            caught_up=lambda task: self.copy_caught_up,
            deliver=self.delivered.set,
            probe=owner,
            wait_seconds=wait_seconds,
            limit_seconds=limit_seconds,
            poll_seconds=0.01,
        )


@pytest.fixture
def still_running() -> Iterator[Watched]:
    watched = Watched(OldOwner(frozenset({T0, T1})))
    yield watched
    watched.release.close()


def test_a_task_moving_here_from_a_live_member_is_held_until_it_releases_it(
    still_running: Watched,
) -> None:
    release = still_running.release
    assert release.hold(BEFORE, MOVED) == {T0}
    wait_for(lambda: len(still_running.owner.asked) >= 3, "the old owner asked a few times")
    assert release.held() == {T0} and not still_running.delivered.is_set()
    still_running.owner.running = frozenset({T1})  # it committed and closed T0
    wait_for(still_running.delivered.is_set, "the released task delivered")
    assert release.held() == frozenset()
    assert [(o.task, o.owner, o.how) for o in release.outcomes] == [(T0, "l", "released")]
    assert set(still_running.owner.asked) == {L_ADDRESS}


def test_a_released_task_waits_for_its_copy_to_reach_the_changelog_end(
    still_running: Watched,
) -> None:
    still_running.copy_caught_up = False
    still_running.owner.running = frozenset()
    still_running.release.hold(BEFORE, MOVED)
    wait_for(lambda: len(still_running.owner.asked) >= 1, "the old owner asked")
    assert still_running.release.held() == {T0} and not still_running.delivered.is_set()
    still_running.copy_caught_up = True
    wait_for(still_running.delivered.is_set, "the released task delivered")
    assert [o.how for o in still_running.release.outcomes] == ["released"]


def test_an_unreachable_old_owner_is_asked_no_more() -> None:
    watched = Watched(OldOwner(None))
    watched.copy_caught_up = False
    try:
        assert watched.release.hold(BEFORE, MOVED) == {T0}
        wait_for(lambda: watched.owner.asked, "the old owner asked")
        # Only the copy's last replay round is waited for (the owner commits nothing more).
        watched.copy_caught_up = True
        wait_for(watched.delivered.is_set, "the task delivered")
        assert watched.owner.asked == [L_ADDRESS]
        assert [o.how for o in watched.release.outcomes] == ["unreachable"]
    finally:
        watched.release.close()


def test_an_old_owner_that_never_releases_is_waited_for_the_bound_only() -> None:
    watched = Watched(OldOwner(frozenset({T0})), wait_seconds=0.1, limit_seconds=0.2)
    try:
        watched.release.hold(BEFORE, MOVED)
        wait_for(watched.delivered.is_set, "the task delivered after the bound")
        [outcome] = watched.release.outcomes
        assert (outcome.how, outcome.waited_seconds >= 0.2) == ("bound", True)
    finally:
        watched.release.close()


def test_an_old_owner_still_running_the_task_is_waited_for_past_the_catch_up_time() -> None:
    """Issue 38's soak: an old owner slow to take its new assignment still runs the task
    (its output keeps flowing), so the hold outlasts ``wait_seconds`` (the copy's catch-up
    time) up to ``limit_seconds``; promoting at 5 s fenced its final commit, redone here."""
    watched = Watched(OldOwner(frozenset({T0})), wait_seconds=0.05)
    try:
        watched.release.hold(BEFORE, MOVED)
        asked = len(watched.owner.asked)
        # Asked again and again well past wait_seconds (polled every 10 ms), still held.
        wait_for(lambda: len(watched.owner.asked) >= asked + 30, "the old owner asked on")
        assert watched.release.held() == {T0} and not watched.delivered.is_set()
        watched.owner.running = frozenset()
        wait_for(watched.delivered.is_set, "the released task delivered")
        assert [o.how for o in watched.release.outcomes] == ["released"]
    finally:
        watched.release.close()


def test_a_copy_that_does_not_catch_up_is_promoted_wait_seconds_after_the_release() -> None:
    watched = Watched(OldOwner(frozenset()), wait_seconds=0.1)
    watched.copy_caught_up = False
    try:
        watched.release.hold(BEFORE, MOVED)
        wait_for(watched.delivered.is_set, "the task delivered after the catch-up time")
        [outcome] = watched.release.outcomes
        assert (outcome.how, outcome.waited_seconds >= 0.1) == ("bound", True)
    finally:
        watched.release.close()


def test_a_newer_assignment_without_the_old_owner_keeps_the_hold(still_running: Watched) -> None:
    """The old owner leaving the membership (a drained pod) does not end the hold: it may
    still be making its final commit of the task. Issue 38's soak: ending the hold at once
    promoted the copy before that commit was visible, and it was replayed. The owner is asked
    on as before: it releases the task, or answers no more (then it counts as unreachable)."""
    release = still_running.release
    release.hold(BEFORE, MOVED)
    without_l = Assignment(
        active={"s": frozenset({T0, T1})}, standby={"s": frozenset()}, members=MEMBERS[1:]
    )
    assert release.hold(MOVED, without_l) == {T0}
    asked = len(still_running.owner.asked)
    wait_for(lambda: len(still_running.owner.asked) > asked, "the leaving owner asked on")
    assert not still_running.delivered.is_set()
    still_running.owner.running = None  # it exited after its final commit
    wait_for(still_running.delivered.is_set, "the task delivered")
    assert [(o.task, o.how) for o in release.outcomes] == [(T0, "unreachable")]


def test_a_task_no_longer_moving_here_ends_the_hold(still_running: Watched) -> None:
    release = still_running.release
    release.hold(BEFORE, MOVED)
    assert release.hold(MOVED, BEFORE) == frozenset()
    assert [(o.task, o.how) for o in release.outcomes] == [(T0, "dropped")]


def test_a_newer_assignment_keeps_a_hold_that_still_applies(still_running: Watched) -> None:
    release = still_running.release
    release.hold(BEFORE, MOVED)
    # The next generation moves T1 here as well: T0 is still held (its owner has not released
    # it), and T1 joins it; the previous assignment of T0 is this member's own by now.
    both = Assignment(
        active={"l": frozenset(), "s": frozenset({T0, T1})},
        standby={"l": frozenset(), "s": frozenset()},
        members=MEMBERS,
    )
    assert release.hold(MOVED, both) == {T0, T1}


@pytest.mark.parametrize(
    ("previous", "why"),
    [
        (None, "no previous assignment"),
        (
            Assignment(
                active={"l": frozenset({T0, T1}), "s": frozenset()},
                standby={"l": frozenset(), "s": frozenset()},
                members=MEMBERS,
            ),
            "no copy here to keep replaying",
        ),
    ],
)
def test_what_is_not_held(previous: Assignment | None, why: str, still_running: Watched) -> None:
    assert still_running.release.hold(previous, MOVED) == frozenset(), why
    assert not still_running.release.outcomes


def test_an_old_owner_without_a_query_address_is_not_waited_for(still_running: Watched) -> None:
    no_address = Assignment(
        active=MOVED.active, standby=MOVED.standby, members=(Member("l"), MEMBERS[1])
    )
    assert still_running.release.hold(BEFORE, no_address) == frozenset()


def test_running_tasks_are_the_active_and_restoring_copies_of_a_layout() -> None:
    report = MemberReport(
        member="l",
        topology_hash="h",
        tasks=frozenset(),
        stateful=frozenset(),
        stores={
            "counts": {
                0: StoreCopy(StoreRole.ACTIVE, 0),
                1: StoreCopy(StoreRole.RESTORING, 5),
                2: StoreCopy(StoreRole.STANDBY, 0),
                3: StoreCopy(StoreRole.RESTORE_PENDING, 9),
            },
            "unowned": {4: StoreCopy(StoreRole.ACTIVE, 0)},
        },
        ready=True,
        store_owners={"counts": 1},
    )
    assert running_tasks(report) == {TaskId(1, 0), TaskId(1, 1)}


def test_a_refused_layout_request_means_unreachable() -> None:
    assert probe_layout(f"127.0.0.1:{free_port()}", 1.0) is None


def test_the_old_owner_is_fenced_once_before_the_copy_is_asked_whether_it_caught_up() -> None:
    """The end a copy must reach is read only after the old owner can commit nothing more
    (issue 38): the fence comes first, once per hold, and a failed fence is tried again in
    the next round without the copy being asked meanwhile."""
    events: list[str] = []
    failures = [RuntimeError("coordinator not available")]
    delivered = threading.Event()

    def fence(tasks: Sequence[TaskId]) -> dict[TaskId, Exception]:
        events.extend(f"fence {task}" for task in tasks)
        return dict.fromkeys(tasks, failures.pop()) if failures else {}

    def caught_up(task: TaskId) -> bool:
        events.append(f"caught up? {task}")
        return events.count(f"caught up? {task}") >= 2

    release = TaskRelease(
        "s",
        caught_up=caught_up,
        deliver=delivered.set,
        fence=fence,
        probe=OldOwner(frozenset()),
        poll_seconds=0.01,
    )
    try:
        assert release.hold(BEFORE, MOVED) == {T0}
        wait_for(delivered.is_set, "the task let go")
    finally:
        release.close()
    assert events == [f"fence {T0}", f"fence {T0}", f"caught up? {T0}", f"caught up? {T0}"]
    assert [(o.task, o.how) for o in release.outcomes] == [(T0, "released")]


def test_tasks_let_go_in_one_round_are_fenced_in_one_call_and_a_failed_one_alone_waits() -> None:
    """A rebalance moving many tasks off one member fences them together (one round trip
    on Kafka); the id that could not be fenced is tried again alone, and its copy is not
    asked whether it caught up until it was fenced."""
    calls: list[list[TaskId]] = []
    asked: list[TaskId] = []
    delivered = threading.Event()
    fail_once = {T1: RuntimeError("coordinator not available")}

    def fence(tasks: Sequence[TaskId]) -> dict[TaskId, Exception]:
        calls.append(list(tasks))
        failed = {task: fail_once.pop(task) for task in tasks if task in fail_once}
        return failed

    def caught_up(task: TaskId) -> bool:
        asked.append(task)
        return True

    both_moved = Assignment(
        active={"l": frozenset(), "s": frozenset({T0, T1})},
        standby={"l": frozenset({T0, T1}), "s": frozenset()},
        members=MEMBERS,
    )
    release = TaskRelease(
        "s",
        caught_up=caught_up,
        deliver=delivered.set,
        fence=fence,
        probe=OldOwner(frozenset()),
        poll_seconds=0.01,
    )
    try:
        assert release.hold(BEFORE, both_moved) == {T0, T1}
        wait_for(lambda: not release.held(), "both tasks let go")
    finally:
        release.close()
    assert calls == [[T0, T1], [T1]]
    assert asked == [T0, T1]
    assert sorted((o.task, o.how) for o in release.outcomes) == [
        (T0, "released"),
        (T1, "released"),
    ]
