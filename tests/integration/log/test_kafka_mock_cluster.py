"""KafkaLog's wiring against librdkafka's mock cluster: produce, fetch, watermarks, lag.

The mock cluster speaks the Kafka protocol on local ports, so these tests run
the real librdkafka clients end to end. It is faithful for what is tested
here and for group offsets, not for exactly-once or admin calls: the
transaction and admin paths are tested against a fake at the confluent-kafka
boundary (tests/unit/log), and against a broker by the contract suite.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from eddyline_runtime.log import (
    LagTracker,
    Log,
    OffsetOutOfRangeError,
    Record,
    UnknownTopicError,
    open_log,
)
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.log.kafka import reader as kafka_reader
from eddyline_runtime.partitions import TopicPartition
from tests.support.kafka.mock_cluster import MockCluster

IN = TopicPartition("in", 0)
IN_1 = TopicPartition("in", 1)
_runs = itertools.count()


@pytest.fixture(scope="module")
def cluster() -> Iterator[MockCluster]:
    cluster = MockCluster()
    yield cluster
    cluster.close()


@pytest.fixture
def open_handle(cluster: MockCluster) -> Iterator[type[KafkaLog]]:
    """Handles on this test's own topics ("in", "out", "changelog"; 4 partitions each)."""
    prefix = f"run{next(_runs)}."
    for topic in ("in", "out", "changelog"):
        cluster.create_topic(prefix + topic)
    opened: list[KafkaLog] = []

    def open_one() -> KafkaLog:
        log = KafkaLog.open(cluster.url, {}, topic_prefix=prefix, request_timeout_s=10.0)
        opened.append(log)
        return log

    yield open_one  # type: ignore[misc]
    for log in opened:
        log.close()


@pytest.fixture
def log(open_handle: type[KafkaLog]) -> KafkaLog:
    return open_handle()  # type: ignore[call-arg]


def rec(value: bytes, key: bytes | None = b"k") -> Record:
    return Record(key, value, 1_000)


def test_records_round_trip_with_keys_values_headers_and_timestamps(log: KafkaLog) -> None:
    produced = [
        Record(b"user-1", b"clicked", 1_700_000_000_000, (("trace", b"\x00\x01"), ("src", b"web"))),
        Record(None, b"keyless", 1_700_000_000_001),
        Record(b"user-1", None, 1_700_000_000_002, (("tombstone", b""),)),
        # Not 0: librdkafka reads a zero timestamp as "now".
        Record(b"", b"", 1, (("dup", b"1"), ("dup", b"2"), ("empty", b""))),
    ]
    offsets = log.produce(IN, produced)
    assert offsets == [0, 1, 2, 3]
    result = log.fetch(IN, 0)
    assert list(result.records) == [
        Record(r.key, r.value, r.timestamp, r.headers, o)
        for r, o in zip(produced, offsets, strict=True)
    ]
    assert result.end_offset == 4


def test_fetch_continues_seeks_and_honours_max_records(log: KafkaLog) -> None:
    log.produce(IN, [rec(b"%d" % i) for i in range(10)])
    first = log.fetch(IN, 0, max_records=4)
    assert [r.offset for r in first.records] == [0, 1, 2, 3]
    assert [r.offset for r in log.fetch(IN, 4, max_records=4).records] == [4, 5, 6, 7]
    assert [r.value for r in log.fetch(IN, 1, max_records=2).records] == [b"1", b"2"]  # a seek
    rest = log.fetch(IN, 8)
    assert [r.offset for r in rest.records] == [8, 9]
    assert rest.end_offset == 10


def test_fetch_at_the_end_returns_no_records_and_the_end_offset(log: KafkaLog) -> None:
    assert log.fetch(IN, 0).end_offset == 0
    log.produce(IN, [rec(b"a"), rec(b"b")])
    result = log.fetch(IN, 2)
    assert (list(result.records), result.end_offset) == ([], 2)


def test_records_produced_by_another_handle_are_fetched_at_once(
    log: KafkaLog, open_handle: type[KafkaLog]
) -> None:
    other = open_handle()  # type: ignore[call-arg]
    log.produce(IN, [rec(b"a")])
    assert [r.value for r in other.fetch(IN, 0).records] == [b"a"]
    assert other.produce(IN, [rec(b"b")]) == [1]
    assert [r.value for r in log.fetch(IN, 1).records] == [b"b"]  # not a stale "caught up"


@pytest.mark.parametrize("offset", [-1, 4, 100])
def test_fetch_outside_the_partition_raises_offset_out_of_range(log: KafkaLog, offset: int) -> None:
    log.produce(IN, [rec(b"a"), rec(b"b"), rec(b"c")])
    with pytest.raises(OffsetOutOfRangeError) as raised:
        log.fetch(IN, offset)
    assert (raised.value.beginning, raised.value.end) == (0, 3)


def test_watermarks_are_the_log_start_and_the_end_per_partition(log: KafkaLog) -> None:
    assert (log.beginning_offset(IN), log.end_offset(IN)) == (0, 0)
    log.produce(IN, [rec(b"a"), rec(b"b")])
    log.produce(IN_1, [rec(b"x")])
    assert (log.beginning_offset(IN), log.end_offset(IN)) == (0, 2)
    assert log.end_offset(IN_1) == 1


def test_lag_is_known_from_fetches_only_and_follows_new_records(log: KafkaLog) -> None:
    log.produce(IN, [rec(b"%d" % i) for i in range(5)])
    lag = LagTracker()
    assert lag.current_lag(IN) is None
    result = log.fetch(IN, 0, max_records=2)
    lag.fetched(IN, result)
    lag.advanced(IN, result.records[-1].offset + 1)
    assert lag.current_lag(IN) == 3
    result = log.fetch(IN, 2)
    lag.fetched(IN, result)
    lag.advanced(IN, 5)
    assert lag.current_lag(IN) == 0
    log.produce(IN, [rec(b"5"), rec(b"6")])
    assert lag.current_lag(IN) == 0  # no broker round trip per check
    lag.fetched(IN, log.fetch(IN, 5, max_records=1))
    assert lag.current_lag(IN) == 2


def test_fetch_changes_gives_keyed_changes_and_the_last_offset_read(log: KafkaLog) -> None:
    tp = TopicPartition("changelog", 0)
    log.produce(tp, [rec(b"1", key=b"a"), rec(b"x", key=None), Record(b"b", None, 1)])
    batch = log.fetch_changes(tp, 0)
    assert (list(batch.entries), batch.last_offset) == ([(b"a", b"1"), (b"b", None)], 2)
    assert log.fetch_changes(tp, 3).last_offset == -1


def test_an_unknown_topic_is_refused_without_creating_it(
    log: KafkaLog, cluster: MockCluster
) -> None:
    with pytest.raises(UnknownTopicError, match=r"no-such-topic.*changelog, in, out"):
        log.produce(TopicPartition("no-such-topic", 0), [rec(b"a")])
    with pytest.raises(UnknownTopicError):
        log.fetch(TopicPartition("in", 4), 0)
    assert not any(name.endswith("no-such-topic") for name in cluster.topic_names())


def test_group_offsets_are_committed_and_read_back(
    log: KafkaLog, open_handle: type[KafkaLog]
) -> None:
    assert log.committed_offsets("app", [IN, IN_1]) == {}
    log.commit_offsets("app", {IN: 7, IN_1: 1})
    log.commit_offsets("app", {IN: 9})
    assert open_handle().committed_offsets("app", [IN, IN_1]) == {IN: 9, IN_1: 1}  # type: ignore[call-arg]


def test_open_log_selects_the_kafka_adapter_by_url(cluster: MockCluster) -> None:
    cluster.create_topic("selected")
    log = open_log(cluster.url, {"client.id": "eddyline-test"})
    try:
        assert isinstance(log, KafkaLog)
        assert log.url == cluster.url
        assert log.produce(TopicPartition("selected", 0), [rec(b"a")]) == [0]
    finally:
        log.close()


def test_a_partition_read_rarely_is_paused_when_its_buffer_fills_and_resumed_when_read(
    log: KafkaLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_reader, "_BUFFER_PAUSE", 20)
    log.produce(IN_1, [rec(b"%d" % i) for i in range(100)])
    assert len(log.fetch(IN_1, 0, max_records=1).records) == 1
    reader = log._reader()

    def buffered() -> int:
        for _ in range(10):  # fetches of another partition drain librdkafka's queue
            log.fetch(IN, 0)
            time.sleep(0.02)
        return sum(len(buffer) for buffer in reader._buffers.values())

    before = buffered()
    assert [p for _, p in reader._paused] == [1]
    time.sleep(0.3)  # longer than fetch.wait.max.ms: no fetch of it is in flight
    log.produce(IN_1, [rec(b"%d" % i) for i in range(100, 1_000)])
    assert buffered() == before  # paused: nothing more is fetched for it
    position, values = 1, []
    while position < 1_000:
        records = log.fetch(IN_1, position).records
        values += [r.value for r in records]
        position = records[-1].offset + 1
    assert values == [b"%d" % i for i in range(1, 1_000)]
    assert reader._paused == set()


def test_a_partition_left_unread_is_unassigned_and_read_again_from_where_asked(
    log: KafkaLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_reader, "_IDLE_UNASSIGN_S", 0.2)
    log.produce(IN_1, [rec(b"a"), rec(b"b")])
    assert [r.value for r in log.fetch(IN_1, 0, max_records=1).records] == [b"a"]
    time.sleep(0.3)
    log.fetch(IN, 0)  # any fetch sweeps idle partitions
    assert all(p != 1 for _, p in log._reader()._assigned)
    assert [r.value for r in log.fetch(IN_1, 1).records] == [b"b"]


_PRODUCER_PROCESS = """
import sys
from eddyline_runtime.log import Record, open_log
from eddyline_runtime.partitions import TopicPartition
url, topic = sys.argv[1:]
log = open_log(url, {})
tp = TopicPartition(topic, 0)
print(log.committed_offsets("app", [tp]).get(tp), log.produce(tp, [Record(b"k", b"from child", 7)]))
log.close()
"""


def values_to_the_end(log: Log, tp: TopicPartition) -> list[bytes | None]:
    """Every record's value up to the end offset. One fetch returns what has arrived,
    which may be the first of two batches: the two processes each wrote their own."""
    values: list[bytes | None] = []
    offset = 0
    while True:
        result = log.fetch(tp, offset)
        values += [r.value for r in result.records]
        offset = result.records[-1].offset + 1 if result.records else offset
        if offset >= result.end_offset:
            return values


def test_another_process_produces_to_the_same_cluster_and_sees_committed_offsets(
    cluster: MockCluster,
) -> None:
    cluster.create_topic("shared")
    log = open_log(cluster.url, {})
    try:
        tp = TopicPartition("shared", 0)
        log.produce(tp, [rec(b"from parent")])
        log.commit_offsets("app", {tp: 1})
        child = subprocess.run(
            [sys.executable, "-c", _PRODUCER_PROCESS, cluster.url, "shared"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert child.stdout.split("\n")[0] == "1 [1]"
        assert values_to_the_end(log, tp) == [b"from parent", b"from child"]
    finally:
        log.close()


def test_a_fetch_that_finds_only_a_commit_marker_reports_no_lag(log: KafkaLog) -> None:
    # The mock writes a transaction's commit marker (an offset of its own), which is
    # all this test relies on; its read_committed visibility is not Kafka's.
    producer = log.transactional_producer("app-0_0")
    producer.begin()
    producer.send(IN, rec(b"t"))
    assert producer.commit().last_offsets == {IN: 0}
    assert log.end_offset(IN) == 2  # the marker took offset 1
    lag = LagTracker()
    result = log.fetch(IN, 0)
    assert [r.offset for r in result.records] == [0]
    after = log.fetch(IN, 1)
    assert (list(after.records), after.end_offset) == ([], 1)
    lag.fetched(IN, after)
    lag.advanced(IN, 1)
    assert lag.current_lag(IN) == 0  # KIP-695 does not wait on a marker
    producer.close()
