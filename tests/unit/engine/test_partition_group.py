"""KIP-695: max.task.idle.ms -1 / 0 / N with lag known only from fetches already made.

Two inputs of one task, a click stream and a user table, live in the embedded
log. The task has fetched clicks; whether it may process them depends on what
it knows about the users partition.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from eddyline_runtime.engine.partition_group import PartitionGroup
from eddyline_runtime.errors import ConfigError
from eddyline_runtime.log import FetchResult, LagTracker, Log, Record, open_log
from eddyline_runtime.partitions import TopicPartition

CLICKS = TopicPartition("clicks", 0)
USERS = TopicPartition("users", 0)


class Task:
    """Just enough of a task: fetch into the group, track lag, a settable clock."""

    def __init__(self, log: Log, max_task_idle_ms: int) -> None:
        self.log = log
        self.lag = LagTracker()
        self.now = 1_000
        self.positions = {CLICKS: 0, USERS: 0}
        self.group = PartitionGroup(
            [CLICKS, USERS],
            max_task_idle_ms=max_task_idle_ms,
            current_lag=self.lag.current_lag,
            clock_ms=lambda: self.now,
        )
        for tp in self.positions:
            self.lag.advanced(tp, 0)

    def fetch(self, tp: TopicPartition) -> None:
        result = self.log.fetch(tp, self.positions[tp])
        self.lag.fetched(tp, result)
        self.group.add_records(tp, result.records)
        self.positions[tp] += len(result.records)
        self.lag.advanced(tp, self.positions[tp])

    def drain(self) -> list[int]:
        timestamps = []
        while self.group.ready_to_process():
            taken = self.group.next_record()
            assert taken is not None
            timestamps.append(taken[1].timestamp)
        return timestamps


@pytest.fixture
def log(tmp_path: Path) -> Log:
    log = open_log(f"sqlite:///{tmp_path / 'log.db'}")
    log.create_topic("clicks", 1)
    log.create_topic("users", 1)
    log.produce(CLICKS, [Record(b"u1", b"click", ts) for ts in (10, 30, 50)])
    return log


def test_minus_one_never_waits_for_empty_inputs(log: Log) -> None:
    task = Task(log, max_task_idle_ms=-1)
    task.fetch(CLICKS)  # users never fetched: its lag is unknown
    assert task.drain() == [10, 30, 50]
    assert task.group.enforced_processing == 0


def test_zero_waits_while_lag_is_unknown_then_proceeds_when_caught_up(log: Log) -> None:
    task = Task(log, max_task_idle_ms=0)
    task.fetch(CLICKS)
    assert task.drain() == []  # users' lag unknown: wait for a fetch
    task.fetch(USERS)  # empty and at the end: lag 0
    assert task.drain() == [10, 30, 50]
    assert task.group.enforced_processing == 3


def test_zero_waits_while_an_empty_input_has_lag_then_orders_by_timestamp(log: Log) -> None:
    task = Task(log, max_task_idle_ms=0)
    log.produce(USERS, [Record(b"u1", b"alice", 20)])
    task.fetch(CLICKS)
    # A fetch response that told the end offset (1) but brought no records yet.
    task.lag.fetched(USERS, FetchResult(records=[], end_offset=1))
    assert task.lag.current_lag(USERS) == 1
    assert task.drain() == []  # data exists upstream: wait for it
    task.fetch(USERS)
    assert task.drain() == [10, 20, 30, 50]


def test_positive_idle_waits_that_long_after_lag_reaches_zero(log: Log) -> None:
    task = Task(log, max_task_idle_ms=200)
    task.fetch(CLICKS)
    task.fetch(USERS)  # caught up: start waiting for users to be produced
    assert task.drain() == []
    task.now += 199
    assert task.drain() == []
    task.now += 1
    assert task.drain() == [10, 30, 50]
    assert task.group.enforced_processing == 3


def test_positive_idle_takes_data_that_arrives_while_waiting_in_order(log: Log) -> None:
    task = Task(log, max_task_idle_ms=200)
    task.fetch(CLICKS)
    task.fetch(USERS)
    task.now += 100
    log.produce(USERS, [Record(b"u1", b"alice", 20)])
    task.fetch(USERS)
    # Both inputs buffered: in timestamp order until users is empty again, and
    # then the wait for users starts over.
    assert task.drain() == [10, 20]
    assert task.group.enforced_processing == 0
    task.now += 200
    assert task.drain() == [30, 50]
    assert task.group.enforced_processing == 2


def test_values_below_minus_one_are_rejected() -> None:
    with pytest.raises(ConfigError, match=r"max\.task\.idle\.ms"):
        PartitionGroup([CLICKS], max_task_idle_ms=-2, current_lag=lambda tp: 0, clock_ms=lambda: 0)


@pytest.mark.parametrize("seed", range(5))
def test_batches_release_records_in_the_order_one_by_one_would(seed: int) -> None:
    """Runs of one partition, cut where another partition's head is older (ties: the
    partition listed first), give the sequence that taking the oldest record one at a
    time gives."""
    rng = random.Random(seed)
    partitions = [TopicPartition("in", p) for p in range(3)]
    buffered = {
        tp: [Record(None, b"%d" % i, rng.randint(0, 40), offset=i) for i in range(60)]
        for tp in partitions
    }

    def group() -> PartitionGroup:
        made = PartitionGroup(
            partitions, max_task_idle_ms=-1, current_lag=lambda tp: 0, clock_ms=lambda: 0
        )
        for tp, records in buffered.items():
            for start in range(0, len(records), 25):  # several fetches per partition
                made.add_records(tp, records[start : start + 25])
        return made

    one_by_one, in_batches = group(), group()
    expected = []
    while (taken := one_by_one.next_record()) is not None:
        expected.append((taken[0], taken[1].offset))
    released = []
    while in_batches.ready_to_process():
        batch = in_batches.next_batch(rng.randint(1, 30))
        assert batch is not None
        released.extend((batch.tp, offset) for offset in batch.offsets)
    assert released == expected
    assert in_batches.buffered() == 0


def test_enforced_processing_counts_the_records_of_a_batch(log: Log) -> None:
    task = Task(log, max_task_idle_ms=0)
    task.fetch(CLICKS)
    task.fetch(USERS)  # empty and at the end: lag 0, so the clicks go ahead
    assert task.group.ready_to_process()
    batch = task.group.next_batch(10)
    assert batch is not None and list(batch.timestamps) == [10, 30, 50]
    assert task.group.enforced_processing == 3


def test_a_batch_carries_headers_only_when_one_of_its_records_has_some() -> None:
    group = PartitionGroup([CLICKS], max_task_idle_ms=-1, current_lag=lambda tp: 0, clock_ms=int)
    trace = (("trace", b"x"),)
    group.add_records(
        CLICKS, [Record(b"k", b"v", t, trace if t == 3 else (), offset=t) for t in range(6)]
    )
    assert group.ready_to_process()
    first = group.next_batch(2)
    assert first is not None and first.headers is None
    second = group.next_batch(2)
    assert second is not None and list(second.headers or ()) == [(), trace]
    assert group.next_record() == (CLICKS, Record(b"k", b"v", 4, (), 4))


def test_the_enforced_processing_rate_counts_records_not_batches(log: Log) -> None:
    task = Task(log, max_task_idle_ms=0)
    log.produce(CLICKS, [Record(b"c", b"v", t) for t in range(10)])
    task.fetch(CLICKS)
    task.fetch(USERS)
    task.now += 1  # the empty users partition is waited out
    assert task.group.ready_to_process()
    batch = task.group.next_batch(10)
    assert batch is not None and len(batch) == 10
    assert task.group.enforced_processing == 10
    assert task.group.enforced_processing_sensor.total_rate() == 10.0


# -- record lateness (Kafka's task metrics record-lateness-avg / -max) ---------------------------


def released_lateness(
    batches: list[tuple[TopicPartition, list[int]]], max_records: int
) -> tuple[float, float, int]:
    """Release ``batches`` (timestamps per partition, added in turn) ``max_records`` at a
    time; returns the lateness sensor's (avg, max, count)."""
    group = PartitionGroup(
        [CLICKS, USERS], max_task_idle_ms=-1, current_lag=lambda _tp: 0, clock_ms=lambda: 0
    )
    for tp, timestamps in batches:
        group.add_records(tp, [Record(None, b"", t) for t in timestamps])
    while group.next_batch(max_records) is not None:
        pass
    group.flush_lateness()  # what the task does after its turn
    sensor = group.record_lateness_sensor
    return sensor.avg(), sensor.max(), sensor.total_count


@pytest.mark.parametrize("max_records", [1, 3, 100], ids=lambda n: f"batches-of-{n}")
def test_each_released_record_counts_its_lateness_behind_the_stream_time_before_it(
    max_records: int,
) -> None:
    batches = [(CLICKS, [5, 10, 7, 20, 15]), (USERS, [12, 3])]
    avg, maximum, count = released_lateness(batches, max_records)
    # The oldest head goes first: 5, 10, 7 (late by 3), 12, 3 (late by 9), 20, 15 (by 5).
    assert count == 7
    assert maximum == 9
    assert avg == pytest.approx(17 / 7)


def test_records_in_order_are_never_late() -> None:
    avg, maximum, count = released_lateness([(CLICKS, [1, 2, 2, 3]), (USERS, [])], 100)
    assert (avg, maximum, count) == (0, 0, 4)
