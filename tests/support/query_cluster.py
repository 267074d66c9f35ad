"""A group of word-count instances in this process, each with its own query server.

Shared by the query tests. Every member has its own state
directory, its own log object on the shared log file (as separate processes
would: ``log_factory`` chooses its class) and its own query server, under one
assignment with a standby for every stateful task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from eddyline_runtime.assignor import Assignment, Member, assign
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.task_manager import RestoreReport
from eddyline_runtime.engine.topics import TopicLayout, resolve_topics
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.partitions import TaskId, TopicPartition, partition_for_key
from eddyline_runtime.query.server import QueryServer
from tests.support.ports import free_port
from tests.support.waiting import wait_for
from tests.support.word_count import APP, streams_config, word_count
from tests.support.word_count import produce_lines as produce_input

STORE = "counts"
PARTITIONS = 3
COUNTS_SUBTOPOLOGY = 1  # word_count(): 0 splits and repartitions, 1 counts
DEADLINE_SECONDS = 30

LogT = TypeVar("LogT", bound=SqliteLog)


def partition_of(word: str) -> int:
    return partition_for_key(word.encode(), PARTITIONS)


@dataclass
class Node(Generic[LogT]):
    member: Member
    log: LogT
    instance: StreamsInstance
    server: QueryServer | None = None
    restores: list[RestoreReport] = field(default_factory=list)

    @property
    def address(self) -> str:
        assert self.member.address is not None
        return self.member.address

    def stop(self) -> None:
        """Stop serving and close the instance: the member is gone."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.instance.close(30)


class Cluster(Generic[LogT]):
    """``size`` instances of ``word_count()`` on one log, ``standbys`` per stateful task.

    Each member reads the log through its own ``log_factory(path)``; the test's
    own client of the log (``self.log``) is a plain SqliteLog.
    """

    def __init__(
        self, root: Path, log_factory: Callable[[Path], LogT], size: int = 3, standbys: int = 1
    ) -> None:
        self.root = root
        self.log = SqliteLog(root / "log.db")  # the test's own client of the log
        self.log.create_topic("lines", PARTITIONS)
        self.layout: TopicLayout = resolve_topics(word_count(), APP, self.log)
        members = [
            Member(str(i), zone=f"zone-{i}", address=f"127.0.0.1:{free_port()}")
            for i in range(size)
        ]
        self.assignment: Assignment = assign(
            self.layout.tasks(), members, standbys, stateful=self.layout.stateful_tasks()
        )
        self.nodes: list[Node[LogT]] = []
        for member in members:
            log = log_factory(root / "log.db")
            restores: list[RestoreReport] = []
            instance = StreamsInstance(
                word_count(),
                streams_config(root / f"state-{member.id}"),
                log,
                instance_id=member.id,
                member=member,
                assignment=self.assignment,
                on_restore=[restores.append],
            )
            self.nodes.append(Node(member, log, instance, restores=restores))

    def start(self) -> Cluster[LogT]:
        for node in self.nodes:
            node.instance.start()
            host, _, port = node.address.rpartition(":")
            node.server = QueryServer(node.instance, host, int(port))
            node.server.start()
        return self

    def close(self) -> None:
        errors: list[BaseException] = []
        for node in self.nodes:
            try:
                node.stop()
            except BaseException as error:  # close the others regardless
                errors.append(error)
            node.log.close()
        self.log.close()
        if errors:
            raise errors[0]

    # -- who holds what ---------------------------------------------------------------

    def node(self, member_id: str) -> Node[LogT]:
        return next(n for n in self.nodes if n.member.id == member_id)

    def active_node(self, partition: int) -> Node[LogT]:
        return self.node(self.assignment.active_owner(TaskId(COUNTS_SUBTOPOLOGY, partition)))

    def standby_node(self, partition: int) -> Node[LogT]:
        owners = self.assignment.standby_owners(TaskId(COUNTS_SUBTOPOLOGY, partition))
        assert len(owners) == 1, owners
        return self.node(owners[0])

    def other_node(self, partition: int) -> Node[LogT]:
        """The member holding neither copy of ``partition``."""
        holders = {self.active_node(partition).member.id, self.standby_node(partition).member.id}
        return next(n for n in self.nodes if n.member.id not in holders)

    def copies(self, partition: int) -> tuple[Node[LogT], Node[LogT], Node[LogT]]:
        """The members holding ``partition``'s active copy, its standby, and neither."""
        return self.active_node(partition), self.standby_node(partition), self.other_node(partition)

    def changelog(self, partition: int) -> TopicPartition:
        return TopicPartition(self.layout.changelogs[STORE], partition)

    # -- progress ---------------------------------------------------------------------

    def inputs_committed(self) -> bool:
        inputs = [tp for task in self.layout.tasks() for tp in self.layout.input_partitions(task)]
        # Sub-topology 0's inputs first: once they are committed, so is what they wrote.
        committed = self.log.committed_offsets(APP, inputs)
        return all(committed.get(tp, 0) == self.log.end_offset(tp) for tp in inputs)

    def settled(self) -> bool:
        """Every input processed and committed; every store copy at its changelog's end."""
        for node in self.nodes:
            node.instance.check()  # raises if a stream thread failed
        if not self.inputs_committed():
            return False
        for partition in range(PARTITIONS):
            end = self.log.end_offset(self.changelog(partition))
            task = TaskId(COUNTS_SUBTOPOLOGY, partition)
            holders = [self.assignment.active_owner(task), *self.assignment.standby_owners(task)]
            for node in map(self.node, holders):
                lag = node.instance.all_local_store_partition_lags().get(STORE, {}).get(partition)
                if lag is None or lag.current_offset_position != end:
                    return False
        return all(node.instance.ready() for node in self.nodes)

    def wait_until_settled(self, timeout: float = DEADLINE_SECONDS) -> None:
        wait_for(self.settled, "the group processed its input", timeout)


def reassigned(
    assignment: Assignment, partition: int, *, active: str, standbys: list[str]
) -> Assignment:
    """``assignment`` with the counting task of ``partition`` active on ``active`` and its
    standbys on ``standbys`` only: the next generation an authority would publish."""
    task = TaskId(COUNTS_SUBTOPOLOGY, partition)
    actives = {m: set(tasks) - {task} for m, tasks in assignment.active.items()}
    standby = {m: set(tasks) - {task} for m, tasks in assignment.standby.items()}
    actives[active].add(task)
    for member in standbys:
        standby[member].add(task)
    return Assignment(
        active={m: frozenset(tasks) for m, tasks in actives.items()},
        standby={m: frozenset(tasks) for m, tasks in standby.items()},
        members=assignment.members,
    )


def started_cluster(
    root: Path,
    lines: list[str],
    log_factory: Callable[[Path], LogT],
    *,
    size: int = 3,
    standbys: int = 1,
) -> Cluster[LogT]:
    """A started group that has processed ``lines``; closed again if it fails to get there."""
    group = Cluster(root, log_factory, size, standbys)
    try:
        group.start()
        produce_lines(group.log, lines)
        group.wait_until_settled()
    except BaseException:
        group.close()
        raise
    return group


def running_cluster(
    root: Path, lines: list[str], log_factory: Callable[[Path], LogT]
) -> Iterator[Cluster[LogT]]:
    """:func:`started_cluster` for a fixture to ``yield from``: closed once it is done."""
    group = started_cluster(root, lines, log_factory)
    try:
        yield group
    finally:
        group.close()


def produce_lines(log: SqliteLog, lines: list[str]) -> None:
    produce_input(log, lines, PARTITIONS)
