"""The log contract suite: what every :class:`Log` adapter must do.

eddyline speaks to its log only through the port in ``eddyline_runtime.log.port``;
these tests pin down that port's semantics (topics, offsets, read_committed
transactions, epoch fencing, lag), so every adapter runs the very
same tests. The ``log`` fixture is parametrized over :data:`ADAPTERS`: the
embedded SQLite log, and Kafka: the project's own broker (tests/support/kafka/,
started once per run), or the one ``EDDYLINE_TEST_KAFKA_BOOTSTRAP`` names
(``host:port,...``; client settings, e.g. SASL, from the file
``EDDYLINE_LOG_SETTINGS`` names). Each Kafka test gets fresh, empty topics
under a prefix of its own. Never a fake or librdkafka's mock cluster: they
are not faithful for transactions.

``open_again`` opens another handle on the same log, as a second process would,
to check that what one handle commits the other sees.

What Kafka allows to differ is left open on purpose: a transaction's commit
marker may take an offset, so the tests compare the offsets a commit reports
with what fetch returns instead of expecting them to follow on without gaps;
a commit may return before its records and offsets are visible (Kafka's
coordinator answers EndTxn, then writes the markers), so readers wait for
them (:func:`settle`); a timestamp of 0 means "unset" and may read back as
the append time (librdkafka sends 0 as "now"); and compacted topics take only
keyed records (Kafka refuses the rest), so keyless records go to other topics.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eddyline_runtime.log import (
    CommittedTransaction,
    FetchedColumns,
    FetchResult,
    InvalidTopicError,
    LagTracker,
    Log,
    OffsetOutOfRangeError,
    ProducerFencedError,
    Record,
    TopicConflictError,
    TopicSpec,
    TransactionStateError,
    UnknownTopicError,
    UnsupportedLogUrlError,
    open_log,
)
from eddyline_runtime.partitions import TopicPartition

LogOpener = Callable[[], Log]


def sqlite_opener(tmp_path: Path) -> LogOpener:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    return lambda: open_log(url)


def kafka_opener(bootstrap: str) -> LogOpener:
    from eddyline_runtime.log.kafka import KafkaLog
    from eddyline_runtime.log.kafka_settings import settings_from_environment

    url = f"kafka://{bootstrap}"
    settings = settings_from_environment()
    prefix = f"eddyline-contract-{uuid.uuid4().hex[:12]}."
    return lambda: KafkaLog.open(url, settings, topic_prefix=prefix)


ADAPTERS = ["sqlite", "kafka"]


IN = TopicPartition("app-input", 0)
IN_1 = TopicPartition("app-input", 1)
OUT = TopicPartition("app-output", 0)
OUT_1 = TopicPartition("app-output", 1)


@pytest.fixture(params=ADAPTERS)
def open_again(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogOpener]:
    """Open a handle on this test's log; every handle still open is closed at the end."""
    if request.param == "kafka":
        opener = kafka_opener(request.getfixturevalue("kafka_bootstrap"))
    else:
        opener = sqlite_opener(tmp_path)
    opened: list[Log] = []

    def open_handle() -> Log:
        handle = opener()
        opened.append(handle)
        return handle

    yield open_handle
    for handle in opened:
        handle.close()


@pytest.fixture
def log(open_again: LogOpener) -> Log:
    log = open_again()
    log.create_topic("app-input", 2)
    log.create_topic("app-output", 2)
    return log


def rec(
    value: bytes,
    key: bytes | None = b"k",
    timestamp: int = 1_000,
    headers: tuple[tuple[str, bytes], ...] = (),
) -> Record:
    return Record(key, value, timestamp, headers)


def values(result: FetchResult) -> list[bytes | None]:
    return [record.value for record in result.records]


def fetch_all(log: Log, tp: TopicPartition) -> list[Record]:
    """Every record from the beginning to the end offset. One fetch may return fewer
    than are there: Kafka's hands over what its fetch responses held so far (with
    aborted records between two transactions, the second may come in a later one)."""
    records: list[Record] = []
    offset, end = log.beginning_offset(tp), log.end_offset(tp)
    while offset < end:
        fetched = log.fetch(tp, offset).records
        if not fetched:  # only markers or aborted records up to the end
            break
        records.extend(fetched)
        offset = fetched[-1].offset + 1
    return records


SETTLE_S = 10.0


def settle(
    reader: Log,
    committed: CommittedTransaction,
    group_offsets: tuple[str, dict[TopicPartition, int]] | None = None,
) -> None:
    """Wait until ``reader`` sees what ``committed`` wrote (and ``group_offsets`` committed).

    Kafka's transaction coordinator answers a commit once it has decided it, then writes
    the commit markers; until a partition's marker lands, the transaction's records lie
    above its last stable offset, invisible to read_committed readers, and its offsets
    are not yet the group's. The embedded log makes a commit visible before it returns.
    """
    deadline = time.monotonic() + SETTLE_S
    for tp, last in committed.last_offsets.items():
        while reader.end_offset(tp) <= last:
            assert time.monotonic() < deadline, f"{tp}@{last} not visible {SETTLE_S} s after commit"
            time.sleep(0.01)
    if group_offsets is not None:
        group, offsets = group_offsets
        while reader.committed_offsets(group, list(offsets)) != offsets:
            assert time.monotonic() < deadline, f"{group} offsets not {offsets} after commit"
            time.sleep(0.01)


# Topics


def test_create_topic_returns_its_spec(log: Log) -> None:
    assert log.create_topic("events", 3) == TopicSpec("events", 3, compacted=False)
    assert log.create_topic("store-changelog", 1, compacted=True) == TopicSpec(
        "store-changelog", 1, compacted=True
    )


def test_creating_the_same_topic_again_is_a_no_op(log: Log) -> None:
    log.produce(IN, [rec(b"a")])
    assert log.create_topic("app-input", 2) == TopicSpec("app-input", 2)
    assert log.end_offset(IN) == 1
    assert values(log.fetch(IN, 0)) == [b"a"]


@pytest.mark.parametrize(("partitions", "compacted"), [(3, False), (1, False), (2, True)], ids=str)
def test_creating_a_topic_with_another_shape_raises_conflict(
    log: Log, partitions: int, compacted: bool
) -> None:
    with pytest.raises(TopicConflictError, match="app-input"):
        log.create_topic("app-input", partitions, compacted=compacted)
    assert log.topics()["app-input"] == TopicSpec("app-input", 2, compacted=False)


def test_topics_lists_every_created_topic(log: Log) -> None:
    log.create_topic("store-changelog", 4, compacted=True)
    assert dict(log.topics()) == {
        "app-input": TopicSpec("app-input", 2),
        "app-output": TopicSpec("app-output", 2),
        "store-changelog": TopicSpec("store-changelog", 4, compacted=True),
    }


def test_topics_created_by_one_handle_are_seen_by_another(log: Log, open_again: LogOpener) -> None:
    log.create_topic("events", 5)
    assert open_again().topics()["events"] == TopicSpec("events", 5)


@pytest.mark.parametrize(
    "operation",
    [
        lambda log, tp: log.produce(tp, [rec(b"a")]),
        lambda log, tp: log.fetch(tp, 0),
        lambda log, tp: log.end_offset(tp),
    ],
    ids=["produce", "fetch", "end_offset"],
)
@pytest.mark.parametrize(
    "tp",
    [TopicPartition("no-such-topic", 0), TopicPartition("app-input", 2)],
    ids=["unknown topic", "partition beyond count"],
)
def test_unknown_topic_or_partition_raises_and_names_the_existing_topics(
    log: Log, operation: Callable[[Log, TopicPartition], object], tp: TopicPartition
) -> None:
    with pytest.raises(UnknownTopicError) as raised:
        operation(log, tp)
    assert "app-input" in str(raised.value)
    assert "app-output" in str(raised.value)


# Produce and fetch


def test_empty_partition_begins_and_ends_at_zero(log: Log) -> None:
    assert log.beginning_offset(IN) == 0
    assert log.end_offset(IN) == 0
    result = log.fetch(IN, 0)
    assert list(result.records) == []
    assert result.end_offset == 0


def test_produce_returns_consecutive_offsets_from_the_end_offset(log: Log) -> None:
    assert log.produce(IN, [rec(b"a"), rec(b"b"), rec(b"c")]) == [0, 1, 2]
    assert log.end_offset(IN) == 3
    assert log.produce(IN, [rec(b"d"), rec(b"e")]) == [3, 4]
    assert log.end_offset(IN) == 5


def test_fetch_returns_records_as_produced_with_their_offsets(log: Log) -> None:
    produced = [
        Record(b"user-1", b"clicked", 1_700_000_000_000, (("trace", b"\x00\x01"), ("src", b"web"))),
        Record(None, b"keyless", 1_700_000_000_001),
        Record(b"user-1", None, 1_700_000_000_002, (("tombstone", b""),)),
        Record(b"", b"", 1, (("dup", b"1"), ("dup", b"2"), ("empty", b""))),
    ]
    offsets = log.produce(IN, produced)
    result = log.fetch(IN, 0)
    assert list(result.records) == [
        Record(r.key, r.value, r.timestamp, r.headers, offset)
        for r, offset in zip(produced, offsets, strict=True)
    ]
    assert result.end_offset == 4
    assert all(isinstance(name, str) for r in result.records for name, _ in r.headers)


def test_a_zero_timestamp_reads_back_as_zero_or_as_the_append_time(log: Log) -> None:
    before = int(time.time() * 1000)
    log.produce(IN, [Record(b"k", b"v", 0)])
    after = int(time.time() * 1000)
    (record,) = log.fetch(IN, 0).records
    assert record.timestamp == 0 or before - 1_000 <= record.timestamp <= after + 1_000


def test_fetch_from_an_offset_returns_the_records_from_there_in_order(log: Log) -> None:
    log.produce(IN, [rec(b"%d" % i) for i in range(10)])
    result = log.fetch(IN, 6)
    assert [r.offset for r in result.records] == [6, 7, 8, 9]
    assert values(result) == [b"6", b"7", b"8", b"9"]
    assert result.end_offset == 10


def test_fetch_returns_at_most_max_records(log: Log) -> None:
    log.produce(IN, [rec(b"%d" % i) for i in range(10)])
    result = log.fetch(IN, 2, max_records=3)
    assert [r.offset for r in result.records] == [2, 3, 4]
    assert result.end_offset == 10


def test_fetch_at_the_end_offset_returns_no_records(log: Log) -> None:
    log.produce(IN, [rec(b"a"), rec(b"b")])
    result = log.fetch(IN, 2)
    assert list(result.records) == []
    assert result.end_offset == 2


@pytest.mark.parametrize("offset", [-1, 4, 100])
def test_fetch_outside_the_partition_raises_offset_out_of_range(log: Log, offset: int) -> None:
    log.produce(IN, [rec(b"a"), rec(b"b"), rec(b"c")])
    with pytest.raises(OffsetOutOfRangeError) as raised:
        log.fetch(IN, offset)
    assert (raised.value.beginning, raised.value.end) == (0, 3)


def test_the_offset_for_a_timestamp_is_the_first_record_at_or_after_it(log: Log) -> None:
    # Out of order at offset 3: Kafka's offsetsForTimes does not skip a record after
    # the one found, whatever its time; the records before the one found are skipped.
    times = [1_000, 2_000, 3_000, 2_500, 4_000]
    log.produce(IN, [rec(b"%d" % i, timestamp=t) for i, t in enumerate(times)])
    assert log.offset_for_timestamp(IN, 0) == 0
    assert log.offset_for_timestamp(IN, -1) == log.offset_for_timestamp(IN, -2) == 0  # < 1970
    assert log.offset_for_timestamp(IN, 1_000) == 0
    assert log.offset_for_timestamp(IN, 1_001) == 1
    assert log.offset_for_timestamp(IN, 2_500) == 2
    assert log.offset_for_timestamp(IN, 3_500) == 4
    assert log.offset_for_timestamp(IN, 4_001) == log.end_offset(IN) == 5  # none is
    assert log.offset_for_timestamp(IN_1, 0) == 0  # an empty partition: its end


def test_partitions_and_topics_have_their_own_offsets(log: Log) -> None:
    assert log.produce(IN, [rec(b"a"), rec(b"b")]) == [0, 1]
    assert log.produce(IN_1, [rec(b"x")]) == [0]
    assert log.produce(OUT, [rec(b"o")]) == [0]
    assert values(log.fetch(IN, 0)) == [b"a", b"b"]
    assert values(log.fetch(IN_1, 0)) == [b"x"]
    assert values(log.fetch(OUT, 0)) == [b"o"]
    assert log.end_offset(OUT_1) == 0


def test_records_produced_by_one_handle_are_fetched_by_another(
    log: Log, open_again: LogOpener
) -> None:
    other = open_again()
    log.produce(IN, [rec(b"a")])
    assert other.produce(IN, [rec(b"b")]) == [1]
    assert values(log.fetch(IN, 0)) == [b"a", b"b"]
    assert values(other.fetch(IN, 0)) == [b"a", b"b"]


def test_records_and_offsets_survive_closing_and_reopening(log: Log, open_again: LogOpener) -> None:
    log.produce(IN, [rec(b"a"), rec(b"b")])
    log.commit_offsets("app", {IN: 2})
    log.close()
    reopened = open_again()
    assert values(reopened.fetch(IN, 0)) == [b"a", b"b"]
    assert reopened.committed_offsets("app", [IN]) == {IN: 2}


# Group offsets


def test_committed_offsets_has_only_the_committed_partitions(log: Log) -> None:
    assert log.committed_offsets("app", [IN, IN_1]) == {}
    log.commit_offsets("app", {IN: 7})
    assert log.committed_offsets("app", [IN, IN_1]) == {IN: 7}
    assert log.committed_offsets("app", [IN_1]) == {}


def test_committing_offsets_again_replaces_them(log: Log) -> None:
    log.commit_offsets("app", {IN: 3, IN_1: 1})
    log.commit_offsets("app", {IN: 9})
    assert log.committed_offsets("app", [IN, IN_1]) == {IN: 9, IN_1: 1}


def test_groups_commit_offsets_independently(log: Log) -> None:
    log.commit_offsets("app", {IN: 3})
    log.commit_offsets("audit", {IN: 1, IN_1: 4})
    assert log.committed_offsets("app", [IN, IN_1]) == {IN: 3}
    assert log.committed_offsets("audit", [IN, IN_1]) == {IN: 1, IN_1: 4}
    assert log.committed_offsets("nobody", [IN, IN_1]) == {}


# Transactions


def test_transaction_is_invisible_until_commit(log: Log, open_again: LogOpener) -> None:
    other = open_again()
    log.produce(OUT, [rec(b"before")])
    log.commit_offsets("app", {IN: 1})
    producer = log.transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"t1"))
    producer.send(OUT_1, rec(b"t2"))
    producer.send_offsets("app", {IN: 5, IN_1: 2})
    for reader in (log, other):
        assert values(reader.fetch(OUT, 0)) == [b"before"]
        assert reader.fetch(OUT, 0).end_offset == 1
        assert reader.end_offset(OUT) == 1
        assert reader.end_offset(OUT_1) == 0
        assert reader.committed_offsets("app", [IN, IN_1]) == {IN: 1}
    producer.abort()


def test_commit_makes_records_and_offsets_visible_atomically(
    log: Log, open_again: LogOpener
) -> None:
    other = open_again()
    producer = log.transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"a"))
    producer.send(OUT_1, rec(b"b"))
    producer.send(OUT, rec(b"c"))
    producer.send_offsets("app", {IN: 5, IN_1: 2})
    committed = producer.commit()
    for reader in (log, other):
        settle(reader, committed, ("app", {IN: 5, IN_1: 2}))
        assert values(reader.fetch(OUT, 0)) == [b"a", b"c"]
        assert values(reader.fetch(OUT_1, 0)) == [b"b"]
        assert reader.committed_offsets("app", [IN, IN_1]) == {IN: 5, IN_1: 2}
        assert reader.end_offset(OUT) > committed.last_offsets[OUT]
        assert reader.end_offset(OUT_1) > committed.last_offsets[OUT_1]


def test_commit_reports_each_send_offset_in_order_and_the_last_per_partition(log: Log) -> None:
    log.produce(OUT, [rec(b"earlier")])
    producer = log.transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"a"))
    producer.send(OUT_1, rec(b"b"))
    producer.send(OUT, rec(b"c"))
    committed = producer.commit()
    assert isinstance(committed, CommittedTransaction)
    settle(log, committed)
    assert [tp for tp, _ in committed.offsets] == [OUT, OUT_1, OUT]
    (_, a), (_, b), (_, c) = committed.offsets
    assert 1 <= a < c
    assert dict(committed.last_offsets) == {OUT: c, OUT_1: b}
    fetched = {r.value: r.offset for r in log.fetch(OUT, 0).records}
    assert fetched == {b"earlier": 0, b"a": a, b"c": c}
    assert [r.offset for r in log.fetch(OUT_1, 0).records] == [b]


def test_transaction_records_keep_key_value_timestamp_and_headers(log: Log) -> None:
    sent = Record(b"user-1", None, 1_700_000_000_000, (("h", b"\xff"),))
    producer = log.transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, sent)
    committed = producer.commit()
    settle(log, committed)
    ((_, offset),) = committed.offsets
    assert list(log.fetch(OUT, 0).records) == [
        Record(b"user-1", None, 1_700_000_000_000, (("h", b"\xff"),), offset)
    ]


def test_abort_makes_nothing_of_the_transaction_visible(log: Log) -> None:
    log.commit_offsets("app", {IN: 1})
    producer = log.transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"aborted"))
    producer.send_offsets("app", {IN: 5})
    producer.abort()
    assert values(log.fetch(OUT, log.beginning_offset(OUT))) == []
    assert log.committed_offsets("app", [IN]) == {IN: 1}


def test_a_producer_runs_transactions_one_after_another(log: Log) -> None:
    producer = log.transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"first"))
    producer.send_offsets("app", {IN: 1})
    producer.commit()
    producer.begin()
    producer.send(OUT, rec(b"aborted"))
    producer.send_offsets("app", {IN: 2})
    producer.abort()
    producer.begin()
    producer.send(OUT, rec(b"third"))
    producer.send_offsets("app", {IN: 3})
    third = producer.commit()
    settle(log, third, ("app", {IN: 3}))
    assert [r.value for r in fetch_all(log, OUT)] == [b"first", b"third"]
    assert fetch_all(log, OUT)[-1].offset == third.last_offsets[OUT]
    assert log.committed_offsets("app", [IN]) == {IN: 3}


def test_a_transaction_with_only_offsets_commits_them(log: Log) -> None:
    producer = log.transactional_producer("app-0_0")
    producer.begin()
    producer.send_offsets("app", {IN: 4})
    committed = producer.commit()
    settle(log, committed, ("app", {IN: 4}))
    assert list(committed.offsets) == []
    assert log.committed_offsets("app", [IN]) == {IN: 4}
    assert fetch_all(log, OUT) == []


def test_a_transaction_that_fails_writes_nothing(log: Log) -> None:
    producer = log.transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"a"))
    producer.send_offsets("app", {IN: 5})
    with pytest.raises(UnknownTopicError):
        producer.send(TopicPartition("no-such-topic", 0), rec(b"b"))
        producer.commit()
    producer.abort()
    assert fetch_all(log, OUT) == []
    assert log.committed_offsets("app", [IN]) == {}


def test_send_without_begin_raises_transaction_state_error(log: Log) -> None:
    producer = log.transactional_producer("app-0_0")
    with pytest.raises(TransactionStateError):
        producer.send(OUT, rec(b"a"))
    producer.begin()
    producer.send(OUT, rec(b"b"))
    settle(log, producer.commit())
    with pytest.raises(TransactionStateError):
        producer.send(OUT, rec(b"c"))
    assert values(log.fetch(OUT, 0)) == [b"b"]


def test_commit_without_begin_raises_transaction_state_error(log: Log) -> None:
    producer = log.transactional_producer("app-0_0")
    with pytest.raises(TransactionStateError):
        producer.commit()


def test_begin_twice_raises_transaction_state_error(log: Log) -> None:
    producer = log.transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"a"))
    with pytest.raises(TransactionStateError):
        producer.begin()
    settle(log, producer.commit())
    assert values(log.fetch(OUT, 0)) == [b"a"]


# Fencing


def test_opening_a_producer_again_bumps_the_epoch(log: Log, open_again: LogOpener) -> None:
    first = log.transactional_producer("app-0_0")
    second = log.transactional_producer("app-0_0")
    third = open_again().transactional_producer("app-0_0")
    assert first.transactional_id == second.transactional_id == "app-0_0"
    assert first.epoch < second.epoch < third.epoch


def test_fenced_producer_commit_raises_and_writes_nothing(log: Log) -> None:
    log.commit_offsets("app", {IN: 1})
    zombie = log.transactional_producer("app-0_0")
    zombie.begin()
    zombie.send(OUT, rec(b"zombie"))
    zombie.send(OUT_1, rec(b"zombie"))
    zombie.send_offsets("app", {IN: 9, IN_1: 9})
    log.transactional_producer("app-0_0")
    with pytest.raises(ProducerFencedError) as raised:
        zombie.commit()
    assert raised.value.transactional_id == "app-0_0"
    assert fetch_all(log, OUT) == []
    assert fetch_all(log, OUT_1) == []
    assert log.committed_offsets("app", [IN, IN_1]) == {IN: 1}


def test_commit_transactions_commits_each_and_reports_a_fenced_one_alone(log: Log) -> None:
    """Several producers' transactions committed together: the fenced one's outcome is its
    ProducerFencedError and nothing of it is written; the others commit their records and
    offsets (each outcome in the order the producers were given)."""
    first = log.transactional_producer("app-0_0")
    zombie = log.transactional_producer("app-0_1")
    last = log.transactional_producer("app-1_0")
    for producer, tp, offsets in (
        (first, OUT, {IN: 3}),
        (zombie, OUT_1, {IN_1: 9}),
        (last, OUT_1, {IN_1: 4}),
    ):
        producer.begin()
        producer.send(tp, rec(producer.transactional_id.encode()))
        producer.send_offsets("app", offsets)
    log.transactional_producer("app-0_1")  # fences the zombie's open transaction
    outcomes = log.commit_transactions([first, zombie, last])
    assert isinstance(outcomes[1], ProducerFencedError)
    assert outcomes[1].transactional_id == "app-0_1"
    committed = [o for o in (outcomes[0], outcomes[2]) if isinstance(o, CommittedTransaction)]
    assert len(committed) == 2
    settle(log, committed[0], ("app", {IN: 3}))
    settle(log, committed[1], ("app", {IN: 3, IN_1: 4}))
    assert [r.value for r in fetch_all(log, OUT)] == [b"app-0_0"]
    assert [r.value for r in fetch_all(log, OUT_1)] == [b"app-1_0"]


def test_newer_producer_commits_after_fencing_and_the_zombie_stays_fenced(
    log: Log, open_again: LogOpener
) -> None:
    zombie = log.transactional_producer("app-0_0")
    zombie.begin()
    zombie.send(OUT, rec(b"zombie"))
    zombie.send_offsets("app", {IN: 9})
    newer = open_again().transactional_producer("app-0_0")
    newer.begin()
    newer.send(OUT, rec(b"newer"))
    newer.send_offsets("app", {IN: 2})
    settle(log, newer.commit(), ("app", {IN: 2}))
    with pytest.raises(ProducerFencedError):
        zombie.commit()
    with pytest.raises(ProducerFencedError):
        zombie.begin()
        zombie.send(OUT, rec(b"zombie again"))
        zombie.commit()
    assert values(log.fetch(OUT, 0)) == [b"newer"]
    assert log.committed_offsets("app", [IN]) == {IN: 2}


def test_a_producer_fenced_between_transactions_cannot_commit_the_next(log: Log) -> None:
    zombie = log.transactional_producer("app-0_0")
    zombie.begin()
    zombie.send(OUT, rec(b"before fencing"))
    settle(log, zombie.commit())
    log.transactional_producer("app-0_0")
    with pytest.raises(ProducerFencedError):
        zombie.begin()
        zombie.send(OUT, rec(b"after fencing"))
        zombie.commit()
    assert values(log.fetch(OUT, 0)) == [b"before fencing"]


def test_different_transactional_ids_do_not_fence_each_other(log: Log) -> None:
    task_0 = log.transactional_producer("app-0_0")
    task_1 = log.transactional_producer("app-0_1")
    task_0.begin()
    task_1.begin()
    task_0.send(OUT, rec(b"from 0_0"))
    task_1.send(OUT_1, rec(b"from 0_1"))
    task_0.send_offsets("app", {IN: 1})
    task_1.send_offsets("app", {IN_1: 1})
    settle(log, task_1.commit())
    settle(log, task_0.commit(), ("app", {IN: 1, IN_1: 1}))
    assert values(log.fetch(OUT, 0)) == [b"from 0_0"]
    assert values(log.fetch(OUT_1, 0)) == [b"from 0_1"]
    assert log.committed_offsets("app", [IN, IN_1]) == {IN: 1, IN_1: 1}


# Compaction


# Lag


def test_lag_is_unknown_until_both_a_fetch_and_a_position_are_known(log: Log) -> None:
    log.produce(IN, [rec(b"a"), rec(b"b"), rec(b"c")])
    lag = LagTracker()
    assert lag.current_lag(IN) is None
    lag.fetched(IN, log.fetch(IN, 0, max_records=1))
    assert lag.current_lag(IN) is None
    lag.advanced(IN, 1)
    assert lag.current_lag(IN) == 2
    only_advanced = LagTracker()
    only_advanced.advanced(IN, 0)
    assert only_advanced.current_lag(IN) is None


def test_lag_is_the_end_offset_seen_by_the_last_fetch_minus_the_position(log: Log) -> None:
    log.produce(IN, [rec(b"%d" % i) for i in range(5)])
    lag = LagTracker()
    lag.fetched(IN, log.fetch(IN, 0))
    lag.advanced(IN, 5)
    assert lag.current_lag(IN) == 0
    log.produce(IN, [rec(b"5"), rec(b"6")])
    assert lag.current_lag(IN) == 0  # not known until the next fetch
    lag.fetched(IN, log.fetch(IN, 5))
    assert lag.current_lag(IN) == 2
    assert lag.current_lag(IN_1) is None


# URLs


def test_open_log_rejects_a_url_it_does_not_serve(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedLogUrlError, match="sqlite:///"):
        open_log(f"postgres:///{tmp_path / 'log.db'}")


def test_fetch_needs_a_positive_record_limit(log: Log) -> None:
    log.create_topic("events", 1)
    with pytest.raises(ValueError, match="max_records"):
        log.fetch(TopicPartition("events", 0), 0, max_records=0)


def test_fetch_changes_gives_keyed_changes_and_the_last_offset_read(log: Log) -> None:
    # Not compacted: Kafka refuses keyless records on compacted topics.
    log.create_topic("changes", 1)
    tp = TopicPartition("changes", 0)
    log.produce(tp, [rec(b"1", key=b"a"), rec(b"x", key=None), Record(b"b", None, 1), rec(b"2")])
    batch = log.fetch_changes(tp, 0, max_records=3)
    assert list(batch.entries) == [(b"a", b"1"), (b"b", None)]
    assert batch.last_offset == 2  # the keyless record counts as read
    rest = log.fetch_changes(tp, 3)
    assert (list(rest.entries), rest.last_offset) == ([(b"k", b"2")], 3)
    assert log.fetch_changes(tp, 4).last_offset == -1
    with pytest.raises(OffsetOutOfRangeError):
        log.fetch_changes(tp, 5)


# Columns: the processing loop's batch produce, send and fetch


def test_produced_columns_read_back_as_records_and_as_columns(log: Log) -> None:
    log.produce(IN, [rec(b"before", headers=(("h", b"1"),))])
    last = log.produce_columns(IN, [b"a", None, b"c"], [b"1", b"2", None], [10, 20, 30])
    assert last == 3
    assert [(r.key, r.value, r.timestamp, r.offset) for r in fetch_all(log, IN)[1:]] == [
        (b"a", b"1", 10, 1),
        (None, b"2", 20, 2),
        (b"c", None, 30, 3),
    ]
    assert fetch_all(log, IN)[0].headers == (("h", b"1"),)
    columns = log.fetch_columns(IN, 1, 2)
    assert isinstance(columns, FetchedColumns)
    assert (list(columns.offsets), list(columns.keys), list(columns.values)) == (
        [1, 2],
        [b"a", None],
        [b"1", b"2"],
    )
    assert (list(columns.timestamps), columns.end_offset, len(columns)) == ([10, 20], 4, 2)


def test_fetching_columns_at_the_end_returns_none_and_the_end_offset(log: Log) -> None:
    log.produce(IN, [rec(b"a")])
    columns = log.fetch_columns(IN, 1)
    assert (len(columns), columns.end_offset) == (0, 1)
    with pytest.raises(OffsetOutOfRangeError):
        log.fetch_columns(IN, 2)


def test_columns_sent_in_a_transaction_commit_with_records_sent_one_by_one(log: Log) -> None:
    producer = log.transactional_producer("app-task-0")
    producer.begin()
    producer.send(OUT, rec(b"one", headers=(("trace", b"x"),)))
    producer.send_columns(OUT, [b"k2", b"k3"], [b"two", b"three"], [2, 3])
    producer.send_columns(OUT_1, [b"k4"], [b"four"], [4])
    committed = producer.commit()
    settle(log, committed)
    assert committed.last_offsets == {OUT: 2, OUT_1: 0}
    assert list(committed.offsets) == [(OUT, 0), (OUT, 1), (OUT, 2), (OUT_1, 0)]
    records = fetch_all(log, OUT)
    assert [(r.key, r.value, r.timestamp) for r in records] == [
        (b"k", b"one", 1_000),
        (b"k2", b"two", 2),
        (b"k3", b"three", 3),
    ]
    assert [r.headers for r in records] == [(("trace", b"x"),), (), ()]


def test_columns_carry_headers_when_a_record_has_some(log: Log) -> None:
    trace = (("trace", b"x"), ("trace", b"y"))
    log.produce_columns(IN, [b"a", b"b"], [b"1", b"2"], [1, 2])
    log.produce_columns(IN, [b"c", b"d"], [b"3", b"4"], [3, 4], [(), trace])
    producer = log.transactional_producer("app-task-0")
    producer.begin()
    producer.send_columns(IN, [b"e", b"f"], [b"5", b"6"], [5, 6], [trace, ()])
    settle(log, producer.commit())
    assert [r.headers for r in fetch_all(log, IN)] == [(), (), (), trace, trace, ()]
    assert log.fetch_columns(IN, 0, 2).headers is None  # no record of the fetch has any
    assert list(log.fetch_columns(IN, 1).headers or ()) == [(), (), trace, trace, ()]


def test_columns_of_different_lengths_are_refused(log: Log) -> None:
    with pytest.raises(ValueError, match="one entry per record"):
        log.produce_columns(IN, [b"a", b"b"], [b"1"], [1, 2])
    assert log.end_offset(IN) == 0


@pytest.mark.parametrize("size", [255, 256, 600])
def test_a_large_batch_keeps_every_record_and_offset_in_order(log: Log, size: int) -> None:
    log.produce(IN, [rec(b"first")])
    keys = [b"k%d" % i if i % 7 else None for i in range(size)]
    values = [b"v%d" % i if i % 5 else None for i in range(size)]
    timestamps = list(range(1, size + 1))
    assert log.produce_columns(IN, keys, values, timestamps) == size
    producer = log.transactional_producer("app-task-0")
    producer.begin()
    producer.send_columns(IN, keys, values, timestamps)
    committed = producer.commit()
    settle(log, committed)
    assert committed.last_offsets == {IN: 2 * size}
    records = fetch_all(log, IN)[1:]
    assert [r.offset for r in records] == list(range(1, 2 * size + 1))
    assert [(r.key, r.value, r.timestamp) for r in records] == 2 * list(
        zip(keys, values, timestamps, strict=True)
    )


# Topic retention (window and session store changelogs)


def test_topic_retention_is_reported_back_replaced_and_cleared(
    log: Log, open_again: LogOpener
) -> None:
    log.create_topic("app-windows-changelog", 2, compacted=True)
    assert log.topic_retention("app-windows-changelog") is None
    log.set_topic_retention("app-windows-changelog", 90_000)
    assert open_again().topic_retention("app-windows-changelog") == 90_000
    log.set_topic_retention("app-windows-changelog", 120_000)
    assert log.topic_retention("app-windows-changelog") == 120_000
    # Still compacted (compact,delete on Kafka): creating it again as compacted is a no-op.
    assert log.topics()["app-windows-changelog"].compacted
    log.create_topic("app-windows-changelog", 2, compacted=True)
    log.set_topic_retention("app-windows-changelog", None)
    assert log.topic_retention("app-windows-changelog") is None


def test_topic_retention_of_an_unknown_topic_or_below_zero_is_refused(log: Log) -> None:
    before = log.topic_retention("app-output")  # a broker's default may delete by age
    with pytest.raises(UnknownTopicError):
        log.set_topic_retention("no-such-topic", 1_000)
    with pytest.raises(InvalidTopicError, match=r"retention\.ms"):
        log.set_topic_retention("app-output", -5)
    assert log.topic_retention("app-output") == before
