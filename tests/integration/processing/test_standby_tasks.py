"""Standby tasks: warm copies of another member's stores (KIP-535's standby replicas).

Two instances share one log file (each its own SqliteLog object and state
directory, as two processes would): member "a" runs every task, member "b"
only keeps standbys of the stateful ones. What a user relies on: the standby
holds the active copy's data and says how far behind it is, it never writes
to the log, and promoting it (a rebalance after "a" is lost) restores only
the changelog tail it had not replayed yet.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.task_manager import RestoreReport
from eddyline_runtime.engine.topics import TopicLayout, resolve_topics
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.membership import StoreRole
from eddyline_runtime.partitions import TaskId, TopicPartition, partition_for_key
from eddyline_runtime.restore.replay import LagInfo
from eddyline_runtime.restore.replay import standby_task as standby_module
from eddyline_runtime.restore.replay.lag import wall_clock_ms
from eddyline_runtime.restore.replay.standby_task import StandbyTask
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import KeyRange, RocksDBStore
from tests.support.logs import PausableLog
from tests.support.waiting import wait_for
from tests.support.word_count import APP, streams_config, word_count
from tests.support.word_count import produce_lines as produce_input

STORE = "counts"
PARTITIONS = 2
LONGS = serde_for("long")
MEMBERS = (Member("a"), Member("b"))


LINES = ["a b a", "b a c", "a a a", "c b", "d e f g", "h i j k"]
MORE_LINES = ["a c e g i k", "b d f h j", "a k"]
EXPECTED = Counter(" ".join(LINES).split())
EXPECTED_AFTER_MORE = EXPECTED + Counter(" ".join(MORE_LINES).split())


class Pair:
    """Member "a" runs every task; member "b" keeps a standby of each stateful one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = SqliteLog(root / "log.db")  # the test's own client of the log
        self.log.create_topic("lines", PARTITIONS)
        self.layout: TopicLayout = resolve_topics(word_count(), APP, self.log)
        self.tasks = frozenset(self.layout.tasks())
        self.stateful = frozenset(self.layout.stateful_tasks())
        assert len(self.stateful) == PARTITIONS
        self.assignment = Assignment(
            active={"a": self.tasks, "b": frozenset()},
            standby={"a": frozenset(), "b": self.stateful},
            members=MEMBERS,
        )
        self.logs: list[SqliteLog] = []
        self.instances: list[StreamsInstance] = []
        self.restores: dict[str, list[RestoreReport]] = {"a": [], "b": []}
        self.a = self.instance("a")
        self.b = self.instance("b")

    def instance(self, member_id: str) -> StreamsInstance:
        """A new instance of ``member_id`` (on its state directory) under the assignment."""
        log = PausableLog(self.root / "log.db")
        self.logs.append(log)
        instance = StreamsInstance(
            word_count(),
            streams_config(self.root / f"state-{member_id}"),
            log,
            instance_id=member_id,
            member=next(m for m in MEMBERS if m.id == member_id),
            assignment=self.assignment,
            on_restore=[self.restores[member_id].append],
        )
        self.instances.append(instance)
        return instance

    def close(self) -> None:
        errors: list[BaseException] = []
        for instance in self.instances:
            try:
                instance.close(30)
            except BaseException as error:  # close the others regardless
                errors.append(error)
        for log in self.logs:
            log.close()
        self.log.close()
        if errors:
            raise errors[0]

    def changelog(self, partition: int) -> TopicPartition:
        return TopicPartition(self.layout.changelogs[STORE], partition)

    def changelog_ends(self) -> dict[int, int]:
        return {p: self.log.end_offset(self.changelog(p)) for p in range(PARTITIONS)}

    def inputs(self) -> list[TopicPartition]:
        return [tp for task in sorted(self.tasks) for tp in self.layout.input_partitions(task)]

    def inputs_committed(self) -> bool:
        # Sub-topology 0's inputs come first: once committed, so is what they wrote.
        committed = self.log.committed_offsets(APP, self.inputs())
        return all(committed.get(tp, 0) == self.log.end_offset(tp) for tp in self.inputs())

    def at_changelog_end(self, instance: StreamsInstance) -> bool:
        lags = instance.all_local_store_partition_lags().get(STORE, {})
        return all(
            p in lags and lags[p].current_offset_position == end
            for p, end in self.changelog_ends().items()
        )

    def settled(self, *instances: StreamsInstance) -> bool:
        for instance in instances:
            instance.check()  # raises if a stream thread failed
        return self.inputs_committed() and all(self.at_changelog_end(i) for i in instances)

    def end_offsets(self) -> dict[TopicPartition, int]:
        """Every partition's end offset, of every topic in the log."""
        return {
            TopicPartition(topic, p): self.log.end_offset(TopicPartition(topic, p))
            for topic, spec in self.log.topics().items()
            for p in range(spec.partitions)
        }

    def committed(self) -> dict[TopicPartition, int]:
        return self.log.committed_offsets(APP, self.inputs())


def store_contents(instance: StreamsInstance, role: StoreRole) -> dict[str, int]:
    contents: dict[str, int] = {}
    for local in instance.local_store_partitions(STORE):
        if local.role is role:
            for key, value in local.open_reader(None).scan(KeyRange()):
                contents[key.decode()] = LONGS.deserialize(value)
    return contents


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    group = Pair(tmp_path)
    try:
        group.a.start()
        group.b.start()
        produce_lines(group.log, LINES)
        wait_for(lambda: group.settled(group.a, group.b), "both members caught up")
        yield group
    finally:
        group.close()


def test_the_lines_reach_every_counts_partition() -> None:
    assert {partition_for_key(word.encode(), PARTITIONS) for word in EXPECTED} == {0, 1}


def test_a_standby_holds_the_active_data_and_reports_its_changelog_position(pair: Pair) -> None:
    standbys = pair.b.local_store_partitions(STORE)
    assert [(s.partition, s.role, s.running, s.current) for s in standbys] == [
        (p, StoreRole.STANDBY, False, False) for p in range(PARTITIONS)
    ]
    ends = pair.changelog_ends()
    assert all(end > 0 for end in ends.values())
    # Caught up: the next offset it would apply is the changelog's end.
    assert pair.b.all_local_store_partition_lags() == {
        STORE: {p: LagInfo(end, end) for p, end in ends.items()}
    }
    assert all(s.lag.offset_lag == 0 for s in standbys)
    # The active copy, running, reports lag 0 as well.
    assert pair.a.all_local_store_partition_lags() == {
        STORE: {p: LagInfo(end, end) for p, end in ends.items()}
    }
    assert store_contents(pair.b, StoreRole.STANDBY) == dict(EXPECTED)
    assert store_contents(pair.a, StoreRole.ACTIVE) == dict(EXPECTED)
    assert pair.b.processed == 0


def test_a_standby_never_writes_to_the_log(pair: Pair) -> None:
    pair.a.close(30)
    ends, committed = pair.end_offsets(), pair.committed()
    # Work an active member would do: the standby-only member must leave it alone.
    produce_lines(pair.log, MORE_LINES)
    ends.update({tp: pair.log.end_offset(tp) for tp in ends if tp.topic == "lines"})
    time.sleep(0.5)  # many loops of b's stream thread
    assert pair.b.processed == 0
    pair.b.close(30)
    # A new standby-only run on b's state resumes after what it applied.
    again = pair.instance("b")
    again.start()
    wait_for(lambda: pair.at_changelog_end(again), "the new run is at the changelog end")
    time.sleep(0.3)
    assert [s.replayed for t in again.threads for s in t.standbys.values()] == [0] * PARTITIONS
    assert store_contents(again, StoreRole.STANDBY) == dict(EXPECTED)
    again.close(30)
    assert pair.end_offsets() == ends
    assert pair.committed() == committed


def test_promoting_a_caught_up_standby_restores_nothing(pair: Pair) -> None:
    ends = pair.changelog_ends()
    pair.a.close(30)
    pair.b.apply_assignment(
        Assignment(
            active={"a": frozenset(), "b": pair.tasks},
            standby={"a": frozenset(), "b": frozenset()},
            members=MEMBERS,
        )
    )
    wait_for(lambda: pair.b.check() is not None and pair.b.ready(), "b runs every task")
    restored = {r.task: r.result for r in pair.restores["b"]}
    assert set(restored) == pair.stateful
    for task, result in restored.items():
        assert result.store == STORE and result.changelog == pair.changelog(task.partition)
        assert (result.first_offset, result.end_offset, result.records) == (
            ends[task.partition],
            ends[task.partition],
            0,
        )
    assert [local.role for local in pair.b.local_store_partitions(STORE)] == [
        StoreRole.ACTIVE
    ] * PARTITIONS
    # The promoted copy carries on counting from the replicated state.
    produce_lines(pair.log, MORE_LINES)
    wait_for(
        lambda: (
            pair.settled(pair.b)
            and store_contents(pair.b, StoreRole.ACTIVE) == dict(EXPECTED_AFTER_MORE)
        ),
        "b counted the new lines",
    )


def test_a_standby_opened_as_the_active_began_its_epoch_is_promoted_without_a_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38's false loss, in the order the load of a full run once gave: "b" opened
    its standby's store (recording the changelog's epoch then), and "a" created the task,
    beginning its epoch at the changelog's end, before "b"'s standby started replaying.
    The copy committed a's records as the earlier epoch's, and its promotion stopped the
    task with a ChangelogLossError though nothing was lost. Forced here: "b"'s first read
    of a changelog's epoch (opening its first standby) returns only once "a", started
    after that read, began a new epoch of that changelog."""
    pair = Pair(tmp_path)
    b_log = pair.logs[1]
    read = SqliteLog.partition_epoch
    b_reading = threading.Event()
    interleaved: list[TopicPartition] = []

    def first_read_then_a_begins(tp: TopicPartition) -> str:
        epoch = read(b_log, tp)
        if tp.topic == pair.layout.changelogs[STORE] and not b_reading.is_set():
            b_reading.set()
            wait_for(lambda: read(b_log, tp) != epoch, f"a began its epoch of {tp}")
            interleaved.append(tp)
        return epoch

    monkeypatch.setattr(b_log, "partition_epoch", first_read_then_a_begins)
    try:
        pair.b.start()
        wait_for(b_reading.is_set, "b opens its first standby")
        pair.a.start()
        produce_lines(pair.log, LINES)
        wait_for(lambda: pair.settled(pair.a, pair.b), "both members caught up")
        assert len(interleaved) == 1  # the order was forced for one standby
        pair.a.close(30)
        pair.b.apply_assignment(
            Assignment(
                active={"a": frozenset(), "b": pair.tasks},
                standby={"a": frozenset(), "b": frozenset()},
                members=MEMBERS,
            )
        )
        # Was: ChangelogLossError (offset N in epoch 0, which ended at offset 0).
        wait_for(lambda: pair.b.check() is not None and pair.b.ready(), "b runs every task")
        assert [r.result.records for r in pair.restores["b"]] == [0] * PARTITIONS
        assert store_contents(pair.b, StoreRole.ACTIVE) == dict(EXPECTED)
    finally:
        pair.close()


def test_promoting_a_standby_keeps_its_store_open_under_a_query_iterating_it(
    pair: Pair,
) -> None:
    """The promotion takes over the standby's open store (no close and reopen, as Kafka
    Streams recycles a standby): a range query iterating the standby goes on to its end
    and reads everything the caught-up copy held, and b's copies stay readable throughout."""
    iterators = [
        local.open_reader(None).scan(KeyRange()) for local in pair.b.local_store_partitions(STORE)
    ]
    seen: dict[str, int] = {}
    for iterator in iterators:
        key, value = next(iterator)  # mid-iteration, as a slow range query would be
        seen[key.decode()] = LONGS.deserialize(value)
    pair.a.close(30)
    pair.b.apply_assignment(
        Assignment(
            active={"a": frozenset(), "b": pair.tasks},
            standby={"a": frozenset(), "b": frozenset()},
            members=MEMBERS,
        )
    )
    partitions = len(iterators)
    readable: list[int] = []

    def runs_every_task() -> bool:
        readable.append(len({local.partition for local in pair.b.local_store_partitions(STORE)}))
        return pair.b.check() is not None and pair.b.ready()

    wait_for(runs_every_task, "b runs every task")
    assert min(readable) == partitions  # never a moment without b's copy of a partition
    for iterator in iterators:
        for key, value in iterator:
            seen[key.decode()] = LONGS.deserialize(value)
    assert seen == dict(EXPECTED)
    assert store_contents(pair.b, StoreRole.ACTIVE) == dict(EXPECTED)


@pytest.mark.usefixtures("pausable_standby_replay")
def test_promoting_a_standby_restores_only_the_tail_it_had_not_replayed(pair: Pair) -> None:
    b_log = pair.b.log
    assert isinstance(b_log, PausableLog)
    replicated = pair.changelog_ends()
    b_log.standby_replay_paused.set()
    produce_lines(pair.log, MORE_LINES)
    wait_for(lambda: pair.settled(pair.a), "a processed the new lines")
    ends = pair.changelog_ends()
    assert all(ends[p] > replicated[p] for p in range(PARTITIONS))
    # While behind, the standby reports the changelog's end and its own position.
    wait_for(
        lambda: (
            {
                p: lag.end_offset_position
                for p, lag in pair.b.all_local_store_partition_lags()[STORE].items()
            }
            == ends
        ),
        "b sees the new changelog ends",
    )
    lags = pair.b.all_local_store_partition_lags()[STORE]
    for p in range(PARTITIONS):
        assert lags[p] == LagInfo(replicated[p], ends[p])
        assert lags[p].offset_lag == ends[p] - replicated[p]
    assert store_contents(pair.b, StoreRole.STANDBY) == dict(EXPECTED)

    pair.a.close(30)
    # Still paused, so the standby cannot catch up before the promotion.
    pair.b.apply_assignment(
        Assignment(
            active={"a": frozenset(), "b": pair.tasks},
            standby={"a": frozenset(), "b": frozenset()},
            members=MEMBERS,
        )
    )
    wait_for(lambda: pair.b.check() is not None and pair.b.ready(), "b runs every task")
    restored = {r.task: r.result for r in pair.restores["b"]}
    assert set(restored) == pair.stateful
    for task, result in restored.items():
        p = task.partition
        # Exactly the records the standby had not applied (every changelog record is keyed).
        assert (result.first_offset, result.end_offset, result.records) == (
            replicated[p],
            ends[p],
            ends[p] - replicated[p],
        )
    assert store_contents(pair.b, StoreRole.ACTIVE) == dict(EXPECTED_AFTER_MORE)


# ---------------------------------------------------------------------------------------
# One StandbyTask, replayed by hand
# ---------------------------------------------------------------------------------------


def test_a_standby_replays_in_batches_committing_each_and_resumes_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("changes", 1, compacted=True)
    tp = TopicPartition("changes", 0)
    records = [Record(f"k{i % 7}".encode(), str(i).encode(), i) for i in range(24)]
    records.append(Record(b"k0", None, 24))  # a tombstone: k0 is deleted
    log.produce(tp, records)
    monkeypatch.setattr(standby_module, "_REPLAY_BATCH", 10)
    directory = tmp_path / "0_0" / "s"
    store = RocksDBStore("s", directory)
    try:
        standby = StandbyTask(TaskId(0, 0), {"s": store}, {"s": tp})
        assert standby.lag("s") == LagInfo(0, 0)  # before start: nothing known
        standby.start(log)
        assert standby.lag("s") == LagInfo(0, 25)
        assert standby.lag("s").offset_lag == 25
        progress = []
        while applied := standby.replay(log):
            progress.append((applied, standby.lag("s"), store.committed_offset(tp)))
        assert progress == [
            (10, LagInfo(10, 25), 9),
            (10, LagInfo(20, 25), 19),
            (5, LagInfo(25, 25), 24),
        ]
        assert standby.replayed == 25
        reader = store.reader(None)
        assert reader.get(b"k0") is None
        assert {k.decode(): v.decode() for k, v in reader.scan(KeyRange())} == {
            f"k{i}": str(max(j for j in range(24) if j % 7 == i)) for i in range(1, 7)
        }
        # The changelog grows: the next replay picks up exactly the new records.
        log.produce(tp, [Record(b"k1", b"new", 25)])
        assert standby.replay(log) == 1
        assert standby.lag("s") == LagInfo(26, 26)
        standby.close()
        # A restart on the same store resumes after its committed offset.
        store = RocksDBStore("s", directory)
        standby = StandbyTask(TaskId(0, 0), {"s": store}, {"s": tp})
        standby.start(log)
        assert standby.lag("s") == LagInfo(26, 26)
        assert standby.replay(log) == 0
        assert store.reader(None).get(b"k1") == b"new"
    finally:
        store.close()
        log.close()


def produce_lines(log: SqliteLog, lines: list[str]) -> None:
    produce_input(log, lines, PARTITIONS)


def test_a_standby_says_when_it_last_held_its_whole_changelog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LagInfo.caught_up_at_ms``: the time of the last end read the copy had applied
    everything up to; None while it replays a backlog it never got through."""
    log = PausableLog(tmp_path / "log.db")
    log.create_topic("changes", 1, compacted=True)
    tp = TopicPartition("changes", 0)
    log.produce(tp, [Record(f"k{i}".encode(), b"v", i) for i in range(15)])
    monkeypatch.setattr(standby_module, "_REPLAY_BATCH", 10)
    store = RocksDBStore("s", tmp_path / "0_0" / "s")
    try:
        standby = StandbyTask(TaskId(0, 0), {"s": store}, {"s": tp})
        standby.start(log)
        assert standby.lag("s").caught_up_at_ms is None  # 15 records to go
        standby.replay(log)
        assert standby.lag("s").caught_up_at_ms is None  # 10 applied, 5 to go
        before = wall_clock_ms()
        standby.replay(log)
        caught_up = standby.lag("s").caught_up_at_ms
        assert caught_up is not None and before <= caught_up <= wall_clock_ms()
        # The changelog grows while replay is held back: the time stays where it was.
        log.produce(tp, [Record(b"k1", b"new", 15)])
        log.standby_replay_paused.set()
        with log.standby_replay():
            assert standby.replay(log) == 0
        assert standby.lag("s") == LagInfo(15, 16)
        assert standby.lag("s").caught_up_at_ms == caught_up
        # Caught up again: the later end read's time.
        log.standby_replay_paused.clear()
        standby.replay(log)
        again = standby.lag("s").caught_up_at_ms
        assert again is not None and again >= caught_up
        standby.close()
        # A copy that opens holding its whole changelog is caught up from its start.
        store = RocksDBStore("s", tmp_path / "0_0" / "s")
        standby = StandbyTask(TaskId(0, 0), {"s": store}, {"s": tp})
        standby.start(log)
        assert standby.lag("s").caught_up_at_ms is not None
    finally:
        store.close()
        log.close()
