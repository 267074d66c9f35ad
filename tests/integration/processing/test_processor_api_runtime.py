"""The Processor API and the record cache as a Kafka Streams user meets them, end to end.

One process, the real SQLite log and RocksDB stores: flushed aggregates carry
the timestamp and headers of the record that last updated them, headers reach
output topics, the uncommitted-bytes budget holds within one record,
``context.commit()`` and wall-clock punctuation commit, READ_UNCOMMITTED
queries see what the cache holds back, and the metrics a user looks for exist.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from eddyline_runtime.assignor import Assignment
from eddyline_runtime.config import IsolationLevel, StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.queryable import KeyQueryMetadata
from eddyline_runtime.engine.stream_thread import CommitReport
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import (
    Processor,
    ProcessorContext,
    PunctuationType,
    StoreSpec,
    StreamsBuilder,
    Topology,
)
from eddyline_runtime.serde import serde_for

LONGS = serde_for("long")


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    log = SqliteLog(tmp_path / "log.db")
    yield log
    log.close()


def config(tmp_path: Path, **settings: Any) -> StreamsConfig:
    return StreamsConfig.from_properties(
        {"application.id": "app", "state.dir": str(tmp_path / "state"), **settings}
    )


def read_all(log: SqliteLog, topic: str) -> list[Record]:
    records: list[Record] = []
    for partition in range(log.topics()[topic].partitions):
        tp = TopicPartition(topic, partition)
        records.extend(log.fetch(tp, log.beginning_offset(tp), 1_000_000).records)
    return records


def run_until_caught_up(instance: StreamsInstance, timeout: float = 60) -> StreamsInstance:
    instance.start()
    try:
        instance.wait_until_caught_up(timeout)
    finally:
        instance.close()
    return instance


def counting() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("events", key_serde="string", value_serde="string")
        .group_by_key()
        .count("counts")
        .to_stream()
        .to("counted", key_serde="string", value_serde="long")
    )
    return builder.build()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
def test_a_cached_aggregation_publishes_each_key_with_its_last_records_timestamp_and_headers(
    tmp_path: Path, log: SqliteLog, guarantee: str
) -> None:
    log.create_topic("events", 1)
    log.produce(
        TopicPartition("events", 0),
        [
            Record(b"a", b"x", 10, (("id", b"1"),)),
            Record(b"b", b"x", 40, (("id", b"2"),)),
        ],
    )
    run_until_caught_up(
        StreamsInstance(
            counting(),
            config(tmp_path, **{"processing.guarantee": guarantee, "commit.interval.ms": 60_000}),
            log,
        )
    )
    assert [(r.key, r.timestamp, r.headers) for r in read_all(log, "counted")] == [
        (b"a", 10, (("id", b"1"),)),
        (b"b", 40, (("id", b"2"),)),
    ]


class Relay(Processor):
    """Forwards each value and keeps it in a store; headers pass through untouched."""

    def process(self, key: Any, value: Any) -> None:
        self.context.get_state_store("kept").put(key, value)
        self.context.forward(key, value)


def relay(store: StoreSpec | None = None) -> Topology:
    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("relay", Relay, "in")
    topology.add_state_store(store or StoreSpec("kept"), "relay")
    topology.add_sink("out", "relayed", "relay")
    return topology


def test_record_headers_reach_the_output_topic(tmp_path: Path, log: SqliteLog) -> None:
    log.create_topic("events", 1)
    headers = (("trace-id", b"abc"), ("trace-id", b"def"))
    log.produce(TopicPartition("events", 0), [Record(b"k", b"v", 7, headers)])
    run_until_caught_up(StreamsInstance(relay(), config(tmp_path), log))
    assert [(r.timestamp, r.headers) for r in read_all(log, "relayed")] == [(7, headers)]


def test_the_uncommitted_bytes_budget_holds_within_one_record(
    tmp_path: Path, log: SqliteLog
) -> None:
    log.create_topic("events", 1)
    value = b"v" * 10 * 1024
    log.produce(TopicPartition("events", 0), [Record(b"%06d" % i, value, i) for i in range(1_500)])
    reports: list[CommitReport] = []
    limit = 1024 * 1024
    settings = {
        "commit.interval.ms": 600_000,
        "statestore.cache.max.bytes": 0,
        "statestore.uncommitted.max.bytes": limit,
    }
    run_until_caught_up(
        StreamsInstance(relay(), config(tmp_path, **settings), log, on_commit=[reports.append])
    )
    # Each record buffers its store write, its changelog record and its output:
    # about 3 x 10 KiB. A commit may come after at most one record past the limit.
    per_record = 3 * (len(value) + 6)
    assert max(report.records for report in reports) <= limit // per_record + 1
    assert sum(report.records for report in reports) == 1_500


def test_the_uncommitted_bytes_budget_holds_within_one_record_when_batching(
    tmp_path: Path, log: SqliteLog
) -> None:
    """A DSL chain goes batch-at-a-time; the batches shrink near the limit."""
    log.create_topic("events", 1)
    value = b"v" * 10 * 1024
    log.produce(TopicPartition("events", 0), [Record(b"%06d" % i, value, i) for i in range(1_500)])
    builder = StreamsBuilder()
    builder.stream("events").map_values(bytes).to("copied")
    reports: list[CommitReport] = []
    limit = 1024 * 1024
    settings = {
        "processing.guarantee": "exactly_once_v2",  # outputs are held until the commit
        "commit.interval.ms": 600_000,
        "statestore.uncommitted.max.bytes": limit,
    }
    run_until_caught_up(
        StreamsInstance(
            builder.build(), config(tmp_path, **settings), log, on_commit=[reports.append]
        )
    )
    # Each record buffers its output only: about 10 KiB.
    per_record = len(value) + 6
    assert max(report.records for report in reports) <= limit // per_record + 1
    assert sum(report.records for report in reports) == 1_500
    assert len(read_all(log, "copied")) == 1_500


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
def test_a_dsl_chain_copies_each_records_headers_onto_its_output_among_records_without(
    tmp_path: Path, log: SqliteLog, guarantee: str
) -> None:
    log.create_topic("events", 1)
    records = [
        Record(b"%04d" % i, b"v", i, (("id", b"%d" % i),) if 100 <= i < 110 else ())
        for i in range(3_000)
    ]
    log.produce(TopicPartition("events", 0), records)
    builder = StreamsBuilder()
    builder.stream("events").map_values(bytes.upper).to("copied")
    run_until_caught_up(
        StreamsInstance(
            builder.build(), config(tmp_path, **{"processing.guarantee": guarantee}), log
        )
    )
    copied = read_all(log, "copied")
    assert [(r.key, r.value, r.headers) for r in copied] == [
        (r.key, b"V", r.headers) for r in records
    ]


class CommitOnMarker(Processor):
    def process(self, key: Any, value: Any) -> None:
        if value == b"commit":
            self.context.commit()


def test_context_commit_commits_after_the_record(tmp_path: Path, log: SqliteLog) -> None:
    log.create_topic("events", 1)
    log.produce(
        TopicPartition("events", 0),
        [Record(None, b"x", 1), Record(None, b"commit", 2), Record(None, b"x", 3)],
    )
    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("committer", CommitOnMarker, "in")
    reports: list[CommitReport] = []
    run_until_caught_up(
        StreamsInstance(
            topology,
            config(tmp_path, **{"commit.interval.ms": 600_000}),
            log,
            on_commit=[reports.append],
        )
    )
    requested = [r for r in reports if "context.commit()" in r.reason]
    assert [r.records for r in requested] == [2]
    assert requested[0].input_offsets == {TopicPartition("events", 0): 2}


class Heartbeat(Processor):
    """Emits a heartbeat every 20 ms of wall-clock time, input or not."""

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        context.schedule(20, PunctuationType.WALL_CLOCK_TIME, self.beat)

    def beat(self, now: int) -> None:
        self.context.forward(b"beat", str(now).encode())

    def process(self, key: Any, value: Any) -> None:
        pass


def test_wall_clock_punctuation_runs_and_commits_without_input(
    tmp_path: Path, log: SqliteLog
) -> None:
    log.create_topic("events", 1)
    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("heartbeat", Heartbeat, "in")
    topology.add_sink("out", "beats", "heartbeat")
    instance = StreamsInstance(
        topology,
        config(tmp_path, **{"processing.guarantee": "exactly_once_v2"}),
        log,
    )
    instance.start()
    try:
        deadline = threading.Event()
        for _ in range(250):
            if "beats" in log.topics() and len(read_all(log, "beats")) >= 3:
                break
            deadline.wait(0.02)
    finally:
        instance.close()
    beats = read_all(log, "beats")
    assert len(beats) >= 3
    # A punctuation's records carry its time.
    assert all(int(r.value or b"0") == r.timestamp for r in beats)


class QueryWhileDirty(Processor):
    """On the marker record, asks (from another thread) what READ_UNCOMMITTED sees."""

    instance: ClassVar[StreamsInstance]
    seen: ClassVar[list[bytes | None]] = []

    def process(self, key: Any, value: Any) -> None:
        if value != b"query":
            self.context.get_state_store("kept").put(key, value)
            return

        def query() -> None:
            local = QueryWhileDirty.instance.local_store_partitions("kept")[0]
            QueryWhileDirty.seen.append(
                local.open_reader(IsolationLevel.READ_UNCOMMITTED).get(b"k")
            )

        reader = threading.Thread(target=query)
        reader.start()
        reader.join()


def test_read_uncommitted_queries_see_writes_still_in_the_record_cache(
    tmp_path: Path, log: SqliteLog
) -> None:
    log.create_topic("events", 1)
    log.produce(TopicPartition("events", 0), [Record(b"k", b"dirty", 1), Record(b"q", b"query", 2)])
    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("query", QueryWhileDirty, "in")
    topology.add_state_store(StoreSpec("kept"), "query")
    instance = StreamsInstance(topology, config(tmp_path), log)  # cache on, 30 s commits
    QueryWhileDirty.instance, QueryWhileDirty.seen = instance, []
    run_until_caught_up(instance)
    assert QueryWhileDirty.seen == [b"dirty"]


def test_the_metrics_a_kafka_streams_user_looks_for_exist(tmp_path: Path, log: SqliteLog) -> None:
    log.create_topic("events", 1)
    log.produce(TopicPartition("events", 0), [Record(b"k", b"v", 1), Record(b"k", b"w", 2)])
    instance = StreamsInstance(relay(), config(tmp_path), log)
    instance.start()
    try:
        instance.wait_until_caught_up(60)
        names = {(name.group, name.name) for name in instance.metrics.snapshot()}
        thread = instance.threads[0].name
        overwrites = instance.metrics.value(
            "stream-record-cache-metrics", "overwrites-total", {"thread-id": thread}
        )
    finally:
        instance.close()
    assert {
        ("stream-task-metrics", "enforced-processing-rate"),
        ("stream-task-metrics", "enforced-processing-total"),
        ("stream-record-cache-metrics", "overwrites-total"),
        ("stream-record-cache-metrics", "evictions-total"),
    } <= names
    assert overwrites == 1.0  # k written twice before the commit


def test_an_unlogged_store_reports_no_changelog_lag(tmp_path: Path, log: SqliteLog) -> None:
    log.create_topic("events", 1)
    log.produce(TopicPartition("events", 0), [Record(b"k", b"v", 1)])
    instance = StreamsInstance(relay(StoreSpec("kept", logged=False)), config(tmp_path), log)
    instance.start()
    try:
        instance.wait_until_caught_up(60)
        assert instance.local_store_partitions("kept")  # still queryable
        assert instance.all_local_store_partition_lags() == {}
    finally:
        instance.close()


def test_key_metadata_before_an_assignment_covers_the_key_names_its_partition_and_no_host(
    tmp_path: Path, log: SqliteLog
) -> None:
    """Unlike Kafka's NOT_AVAILABLE (partition -1): the partition is a property of the key
    and the topology, and a router needs it to find the copies members hold while no
    assignment names them (a topology upgrade's pause; docs/queries.md)."""
    log.create_topic("events", 1)
    instance = StreamsInstance(
        relay(),
        config(tmp_path),
        log,
        assignment=Assignment(active={"0": frozenset()}, standby={"0": frozenset()}),
    )
    instance.start()
    try:
        metadata = instance.key_query_metadata("kept", b"k")
        # A store the topology does not have is "not found" (Kafka Streams answers null),
        # not an exception: a caller routing a key asks before it knows the store exists.
        unknown = instance.key_query_metadata("no-such-store", b"k")
    finally:
        instance.close()
    assert metadata == KeyQueryMetadata(None, (), 0)
    assert unknown is None
