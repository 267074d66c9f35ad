"""KIP-695 through the runtime: a StreamsInstance's task over two co-partitioned inputs.

The unit tests (tests/unit/engine/test_partition_group.py) drive a
PartitionGroup by hand. Here a real instance fetches, processes and commits
on its stream thread, and each ``max.task.idle.ms`` regime shows in what an
application can observe: the order of the outputs, when they appear, and the
``stream-task-metrics`` / ``enforced-processing-total`` metric.

The task reads ``clicks`` and ``users`` through one source and writes every
record to ``out`` as it processes it, so ``out`` is the processing order.
A thread fetches every input partition of a task in each iteration, so to
see a partition that the task has fetched but that still has lag (records
produced but not fetched yet), some tests use a log whose fetches return
one record at a time: a slow broker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import FetchedColumns, FetchResult, Log, Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Topology

CLICKS = TopicPartition("clicks", 0)
USERS = TopicPartition("users", 0)
OUT = TopicPartition("out", 0)
APP = "timestamp-sync"


class OneRecordPerFetchLog(SqliteLog):
    """A slow broker: each fetch returns at most one record."""

    def fetch(self, tp: TopicPartition, offset: int, max_records: int = 10_000) -> FetchResult:
        return super().fetch(tp, offset, 1)

    def fetch_columns(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> FetchedColumns:
        return super().fetch_columns(tp, offset, 1)  # what the processing loop fetches with


def merge() -> Topology:
    """One source over both topics (one task per partition), every record straight to out."""
    return Topology().add_source("inputs", ["clicks", "users"]).add_sink("out", "out", "inputs")


LogFactory = Callable[..., SqliteLog]


@pytest.fixture
def make_log(tmp_path: Path) -> Iterator[LogFactory]:
    """The log with both inputs created (one partition each), of the kind asked for."""
    opened: list[SqliteLog] = []

    def make(kind: type[SqliteLog] = SqliteLog) -> SqliteLog:
        log = kind(tmp_path / "log.db")
        log.create_topic("clicks", 1)
        log.create_topic("users", 1)
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()


def produce(log: Log, tp: TopicPartition, timestamps: Sequence[int]) -> None:
    """Records named after their topic and timestamp (``clicks@10``)."""
    name = tp.topic.encode()
    log.produce(tp, [Record(name, name + b"@%d" % ts, ts) for ts in timestamps])


def start(log: Log, tmp_path: Path, max_task_idle_ms: int) -> StreamsInstance:
    config = StreamsConfig.from_properties(
        {
            "application.id": APP,
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": "exactly_once_v2",
            "max.task.idle.ms": max_task_idle_ms,
        }
    )
    instance = StreamsInstance(merge(), config, log)
    instance.start()
    return instance


def outputs(log: Log) -> list[str]:
    """The values in out, in order (fetching until the end: the slow log gives one at a time)."""
    if "out" not in log.topics():
        return []
    values: list[str] = []
    while records := log.fetch(OUT, len(values)).records:
        values.extend("" if r.value is None else r.value.decode() for r in records)
    return values


def enforced_processing(instance: StreamsInstance) -> float:
    """Records the task took while an input was empty (summed over tasks)."""
    metrics = instance.final_metrics or instance.metrics.snapshot()
    return sum(
        value
        for name, value in metrics.items()
        if (name.group, name.name) == ("stream-task-metrics", "enforced-processing-total")
    )


def run_to_end(log: Log, tmp_path: Path, max_task_idle_ms: int) -> StreamsInstance:
    instance = start(log, tmp_path, max_task_idle_ms)
    try:
        instance.wait_until_caught_up(timeout=20)
    finally:
        instance.close()
    return instance


# Users (timestamps 1-3) happened before every click (10-30).
USER_TIMES, CLICK_TIMES = [1, 2, 3], [10, 20, 30]
IN_TIMESTAMP_ORDER = ["users@1", "users@2", "users@3", "clicks@10", "clicks@20", "clicks@30"]


def test_minus_one_takes_buffered_records_while_the_other_input_still_has_lag(
    make_log: LogFactory, tmp_path: Path
) -> None:
    log = make_log(OneRecordPerFetchLog)
    produce(log, USERS, USER_TIMES)
    produce(log, CLICKS, CLICK_TIMES)

    instance = run_to_end(log, tmp_path, max_task_idle_ms=-1)

    # Each iteration fetched one record per input and processed what it had:
    # clicks@10 went before users@2 and users@3, still unfetched.
    assert outputs(log) == [
        "users@1",
        "clicks@10",
        "users@2",
        "clicks@20",
        "users@3",
        "clicks@30",
    ]
    assert instance.processed == 6
    assert enforced_processing(instance) == 0  # -1 never waits, so never enforces


def test_zero_waits_while_the_other_input_has_lag_then_goes_in_timestamp_order(
    make_log: LogFactory, tmp_path: Path
) -> None:
    log = make_log(OneRecordPerFetchLog)
    produce(log, USERS, USER_TIMES)
    produce(log, CLICKS, CLICK_TIMES)

    instance = run_to_end(log, tmp_path, max_task_idle_ms=0)

    # clicks@10 was buffered from the first iteration on, but users had lag:
    # the task waited for users@2 and users@3 to be fetched.
    assert outputs(log) == IN_TIMESTAMP_ORDER
    # Users then empty with lag 0: the three clicks were enforced processing.
    assert enforced_processing(instance) == 3


@pytest.mark.parametrize(("max_task_idle_ms", "enforced"), [(-1, 0), (0, 3)])
def test_an_empty_caught_up_input_does_not_hold_back_the_other(
    make_log: LogFactory, tmp_path: Path, max_task_idle_ms: int, enforced: int
) -> None:
    log = make_log()
    produce(log, CLICKS, CLICK_TIMES)  # users stays empty

    started = time.monotonic()
    instance = run_to_end(log, tmp_path, max_task_idle_ms)

    assert outputs(log) == ["clicks@10", "clicks@20", "clicks@30"]
    assert time.monotonic() - started < 5  # no idling worth the name (cf. the 1.5 s below)
    # 0 proceeds as soon as a fetch says users is at its end, counting each record
    # taken while users was empty; -1 does not look, so it counts nothing.
    assert enforced_processing(instance) == enforced


IDLE_MS = 1_500


def test_positive_waits_that_long_for_an_empty_caught_up_input(
    make_log: LogFactory, tmp_path: Path
) -> None:
    log = make_log()
    produce(log, CLICKS, CLICK_TIMES)  # users stays empty, and caught up from the first fetch

    started = time.monotonic()
    instance = start(log, tmp_path, max_task_idle_ms=IDLE_MS)
    try:
        time.sleep(0.8)
        assert instance.processed == 0  # still waiting for users to be produced
        instance.wait_until_caught_up(timeout=20)
        waited = time.monotonic() - started
    finally:
        instance.close()

    assert waited >= (IDLE_MS - 100) / 1000
    assert outputs(log) == ["clicks@10", "clicks@20", "clicks@30"]
    assert enforced_processing(instance) == 3


def test_positive_takes_records_produced_while_waiting_in_timestamp_order(
    make_log: LogFactory, tmp_path: Path
) -> None:
    log = make_log()
    produce(log, CLICKS, [10, 30, 50])

    started = time.monotonic()
    instance = start(log, tmp_path, max_task_idle_ms=IDLE_MS)
    try:
        time.sleep(0.3)
        produce(log, USERS, [20])  # arrives within the wait
        # The task proceeds as soon as it fetches users@20: clicks@10, users@20...
        deadline = time.monotonic() + 5
        while instance.processed < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        released = time.monotonic() - started
        # ...then users is empty again and the wait starts over before clicks@30.
        assert instance.processed == 2
        instance.wait_until_caught_up(timeout=20)
        finished = time.monotonic() - started
    finally:
        instance.close()

    assert released < (300 + IDLE_MS) / 1000
    assert finished - released >= (IDLE_MS - 100) / 1000
    assert outputs(log) == ["clicks@10", "users@20", "clicks@30", "clicks@50"]
    assert enforced_processing(instance) == 2
