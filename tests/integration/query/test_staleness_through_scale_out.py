"""A scale out under queries bounded in time: a task moves only to a copy that knows its
staleness, so some copy of every partition answers throughout.

Real members on the embedded log, assigned by the real assignor from their own reports
(``member_report``, as the operator reads ``/v1/layout``), with warm-ups (KIP-441) and no
standbys: the task's previous owner drops its copy the moment the task moves. The new
member's warm-up replay is held (:class:`PausableLog`) so its copy stays within
``acceptable.recovery.lag`` without ever reaching its changelog's end (it cannot tell its
staleness), and its restorations are held at each probing rebalance, so what is answered
while the new owner restores is seen, not raced. ``make bench-queries`` found the case
this covers: one query of a scale out refused by every copy (``StalenessBoundError``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.assignor import Assignment, Member, assign
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.membership import MemberReport, StoreCopy, StoreRole, warmup_policy
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.query.client import QueryRouter
from eddyline_runtime.query.layout import member_report
from eddyline_runtime.query.server import QueryServer
from tests.support.logs import PausableLog
from tests.support.ports import free_port
from tests.support.query_cluster import (
    COUNTS_SUBTOPOLOGY,
    STORE,
    Cluster,
    Node,
    partition_of,
    produce_lines,
    started_cluster,
)
from tests.support.waiting import wait_for
from tests.support.word_count import streams_config, word_count

VOCABULARY = ["apple", "banana", "cherry", "date", "elder", "fig", "grape", "hazel"]
LINES = [" ".join(VOCABULARY[i % 8 : i % 8 + 3]) for i in range(16)]
AN_HOUR_MS = 3_600_000
# Kafka Streams' default: the new member's copy is within it from its first report.
ACCEPTABLE_RECOVERY_LAG = 10_000


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Cluster[PausableLog]]:
    # Two members, no standbys: a task that moves leaves no copy on its previous owner.
    cluster = started_cluster(tmp_path, LINES, PausableLog, size=2, standbys=0)
    try:
        yield cluster
    finally:
        cluster.close()


def reports(group: Cluster[PausableLog]) -> dict[str, MemberReport]:
    return {node.member.id: member_report(node.instance) for node in group.nodes}


def probing_rebalance(group: Cluster[PausableLog], members: list[Member]) -> Assignment:
    """The next assignment, as the operator computes it each cycle."""
    return assign(
        group.layout.tasks(),
        members,
        0,
        previous=group.assignment,
        stateful=group.layout.stateful_tasks(),
        warmups=warmup_policy(
            reports(group),
            acceptable_recovery_lag=ACCEPTABLE_RECOVERY_LAG,
            max_warmup_replicas=1,
        ),
    )


def join(group: Cluster[PausableLog], member: Member, assignment: Assignment) -> Node[PausableLog]:
    log = PausableLog(group.root / "log.db")
    # Its warm-ups open but replay nothing: built from nothing, never at the changelog's end.
    log.standby_replay_paused.set()
    instance = StreamsInstance(
        word_count(),
        streams_config(group.root / f"state-{member.id}"),
        log,
        instance_id=member.id,
        member=member,
        assignment=assignment,
    )
    node = Node(member, log, instance)
    group.nodes.append(node)
    instance.start()
    host, _, port = node.address.rpartition(":")
    node.server = QueryServer(instance, host, int(port))
    node.server.start()
    return node


def copies(node: Node[PausableLog]) -> set[tuple[int, StoreRole]]:
    return {(local.partition, local.role) for local in node.instance.local_store_partitions(STORE)}


def applied(group: Cluster[PausableLog], assignment: Assignment) -> bool:
    """Every member holds exactly the copies of the store ``assignment`` gives it."""
    for node in group.nodes:
        share = assignment.tasks_of(node.member.id)
        wanted = {(t.partition, StoreRole.ACTIVE) for t in share.active if t.subtopology == 1}
        wanted |= {(t.partition, StoreRole.STANDBY) for t in share.standby | share.warmup}
        if copies(node) != wanted:
            return False
    return True


def rebalance(group: Cluster[PausableLog], assignment: Assignment) -> None:
    group.assignment = assignment
    for node in group.nodes:
        node.instance.apply_assignment(assignment)


def copy_of(group: Cluster[PausableLog], member_id: str, task: TaskId) -> StoreCopy:
    """The member's copy of the task's store, as it reports it."""
    return reports(group)[member_id].stores[STORE][task.partition]


def answers(group: Cluster[PausableLog], counts: dict[str, int]) -> dict[str, int | None]:
    """Every word queried with a bound in time through the router, as a dashboard would."""
    router = QueryRouter([node.address for node in group.nodes], timeout=2)
    return {word: router.get(STORE, word, max_staleness_ms=AN_HOUR_MS).value for word in counts}


@pytest.mark.usefixtures("pausable_standby_replay")
def test_a_task_moves_to_a_new_member_only_once_its_copy_knows_its_staleness(
    group: Cluster[PausableLog],
) -> None:
    counts = {word: sum(line.split().count(word) for line in LINES) for word in VOCABULARY}
    new = Member("new", zone="zone-new", address=f"127.0.0.1:{free_port()}")
    members = [*group.assignment.members, new]

    # The new member joins: a stateful task warms up there, nothing moves yet.
    warming = probing_rebalance(group, members)
    [task] = warming.warmup["new"]
    assert task.subtopology == COUNTS_SUBTOPOLOGY
    previous_owner = group.node(warming.active_owner(task))
    rebalance(group, warming)
    joined = join(group, new, warming)
    wait_for(lambda: applied(group, warming), "every member runs the warm-up assignment")

    building = copy_of(group, "new", task)
    assert building.role is StoreRole.STANDBY
    # Within acceptable.recovery.lag (caught up by KIP-441's rule alone), but it has never
    # reached its changelog's end: it cannot tell how current it is.
    assert 0 < building.lag <= ACCEPTABLE_RECOVERY_LAG
    assert building.staleness_unknown

    # A probing rebalance now must not hand the task over: its previous owner would drop
    # its copy and the new one, restoring, could answer no bounded query.
    joined.log.restoration_released.clear()
    try:
        early = probing_rebalance(group, members)
        rebalance(group, early)
        wait_for(lambda: applied(group, early), "every member runs the next assignment")
        assert answers(group, counts) == counts
        assert early.active_owner(task) == previous_owner.member.id
    finally:
        joined.log.restoration_released.set()

    # Its replay runs: the copy reaches the changelog's end once and knows its as-of time.
    joined.log.standby_replay_paused.clear()
    wait_for(
        lambda: not copy_of(group, "new", task).staleness_unknown,
        "the warm-up reached its end once",
    )
    # Held behind again while the owner counts on: the new owner will restore a tail.
    joined.log.standby_replay_paused.set()
    word = next(w for w in VOCABULARY if partition_of(w) == task.partition)
    produce_lines(group.log, [word] * 3)
    wait_for(lambda: copy_of(group, "new", task).lag > 0, "the warm-up fell behind")
    wait_for(group.inputs_committed, "the previous owner committed the new lines")
    settled = {**counts, word: counts[word] + 3}

    joined.log.restoration_released.clear()
    try:
        moved = probing_rebalance(group, members)
        assert moved.active_owner(task) == "new"
        rebalance(group, moved)
        wait_for(joined.log.restoration_waiting.is_set, "the new owner restores the tail")
        wait_for(lambda: applied(group, moved), "the previous owner dropped its copy")
        assert (task.partition, StoreRole.ACTIVE) not in copies(previous_owner)
        # The new owner, restoring, is the only copy; it knows its staleness (the time
        # its warm-up last reached the changelog's end), so bounded queries are answered,
        # with the value as of that time.
        during = answers(group, settled)
        assert during == {**settled, word: during[word]}
        assert during[word] in (counts[word], settled[word])
    finally:
        joined.log.restoration_released.set()
    joined.log.standby_replay_paused.clear()
    wait_for(lambda: answers(group, settled) == settled, "the new owner restored and counts")
