"""The runtime end to end on a real Apache Kafka broker (tests/support/kafka/).

Word count under ``exactly_once_v2``: transactional producers per task, input
offsets committed inside the transactions, read_committed readers, the
repartition topic and the changelogs, then a restart that rebuilds wiped
stores from the changelogs; and a zombie: a second instance of the same
application takes the tasks over through the same transactional ids, so
the first one's producers are fenced by the broker and nothing it still
sends becomes visible; ``Log.partition_epoch`` is the topic id (KIP-516).
Unlike the mock cluster, the broker's transactions
are Kafka's own.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.task_manager import RestoreReport
from eddyline_runtime.engine.topics import resolve_topics
from eddyline_runtime.log import ProducerFencedError, Record, TopicSpec
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing import Materialized, StreamsBuilder, Topology
from eddyline_runtime.restore.replay import LagInfo, StandbyTask
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import RocksDBStore
from tests.support.crash_runs import committed_records
from tests.support.word_count import word_count

LONGS = serde_for("long")
LINES = [f"w{i % 7} w{i % 3} w{i % 11}" for i in range(300)]
EXPECTED = Counter(" ".join(LINES).split())
PARTITIONS = 2


@pytest.fixture
def log(kafka_bootstrap: str) -> Iterator[KafkaLog]:
    log = KafkaLog.open(
        f"kafka://{kafka_bootstrap}", {}, topic_prefix=f"runtime-{uuid.uuid4().hex[:8]}."
    )
    yield log
    log.close()


def config(tmp_path: Path, application_id: str, name: str = "state") -> StreamsConfig:
    return StreamsConfig.from_properties(
        {
            "application.id": application_id,
            "state.dir": str(tmp_path / name),
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": 100,
        }
    )


def produce_lines(log: KafkaLog, lines: list[str]) -> None:
    log.create_topic("lines", PARTITIONS)
    for partition in range(PARTITIONS):
        log.produce(
            TopicPartition("lines", partition),
            [Record(None, line.encode(), i + 1) for i, line in enumerate(lines[partition::2])],
        )


def published(log: KafkaLog) -> dict[str, list[int]]:
    """Every count published per word, in order (one partition holds each word)."""
    counts: dict[str, list[int]] = {}
    # Each partition to its end offset: one fetch returns what has arrived (maybe one batch).
    for record in committed_records(log, "word-counts", PARTITIONS):
        assert record.key is not None and record.value is not None
        counts.setdefault(record.key.decode(), []).append(LONGS.deserialize(record.value))
    return counts


def settled_counts(log: KafkaLog, expected: Counter[str], timeout: float = 20) -> dict[str, int]:
    """The last published count per word, once they are ``expected`` (commit markers are
    written after a commit returns) or the time is up."""
    deadline = time.monotonic() + timeout
    while True:
        latest = {word: counts[-1] for word, counts in published(log).items()}
        if latest == dict(expected) or time.monotonic() > deadline:
            return latest
        time.sleep(0.1)


def run_until_caught_up(instance: StreamsInstance) -> None:
    instance.start()
    try:
        instance.wait_until_caught_up(120)
    finally:
        instance.close()


@pytest.mark.slow
def test_word_count_is_exact_under_exactly_once_and_restores_from_its_changelogs(
    tmp_path: Path, log: KafkaLog
) -> None:
    produce_lines(log, LINES)
    run_until_caught_up(StreamsInstance(word_count(), config(tmp_path, "wc"), log))
    assert settled_counts(log, EXPECTED) == dict(EXPECTED)
    for word, counts in published(log).items():  # a duplicated commit would repeat a count
        assert counts == sorted(set(counts)), f"{word}: {counts}"
    assert log.topics()["wc-counts-changelog"] == TopicSpec("wc-counts-changelog", 2, True)

    for task in ("1_0", "1_1"):  # wipe the stores: the changelogs rebuild them
        for path in sorted((tmp_path / "state" / task / "counts").iterdir()):
            path.unlink()
    produce_lines(log, ["w1 w100"])
    restores: list[RestoreReport] = []
    run_until_caught_up(
        StreamsInstance(word_count(), config(tmp_path, "wc"), log, on_restore=[restores.append])
    )
    assert sum(report.result.records for report in restores) >= len(EXPECTED)
    expected = EXPECTED + Counter(["w1", "w100"])
    assert settled_counts(log, expected) == dict(expected)


@pytest.mark.slow
def test_a_zombie_instance_is_fenced_by_the_tasks_transactional_ids(
    tmp_path: Path, log: KafkaLog, caplog: pytest.LogCaptureFixture
) -> None:
    """Two instances of one application each believe they own every task: the newer
    one's producers fence the older one's (same transactional ids), the zombie's next
    commit is refused by the broker, and every count is still published exactly once."""
    produce_lines(log, LINES)
    zombie = StreamsInstance(word_count(), config(tmp_path, "zz", "zombie"), log)
    newer = StreamsInstance(word_count(), config(tmp_path, "zz", "newer"), log)
    zombie.start()
    try:
        zombie.wait_until_caught_up(120)
        newer.start()  # its producers fence the zombie's
        try:
            newer.wait_until_caught_up(120)
            produce_lines(log, ["w1 w200"])  # both fetch these; only one may commit them
            newer.wait_until_caught_up(120)
            zombie.wait_until_caught_up(120)
        finally:
            newer.close()
    finally:
        zombie.close()
    assert any("taken over by another member" in m for m in caplog.messages), caplog.messages
    run_until_caught_up(StreamsInstance(word_count(), config(tmp_path, "zz", "last"), log))
    expected = EXPECTED + Counter(["w1", "w200"])
    assert settled_counts(log, expected) == dict(expected)
    for word, counts in published(log).items():
        assert counts == sorted(set(counts)), f"{word}: {counts}"


# Each line of the burst becomes this many output records: one commit then sends thousands,
# and librdkafka, told of the fencing by the first of them, refuses the rest (issue 38 saw
# it after ~1,400 to ~2,300 produce calls on this broker).
FAN_OUT = 50
BURST_LINES = 1_000


def fan_out() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("burst", value_serde="string")
        .flat_map_values(lambda line: [line] * FAN_OUT)
        .to("copies", value_serde="string")
    )
    return builder.build()


@pytest.mark.slow
def test_a_member_fenced_while_sending_hands_its_task_over_and_keeps_running(
    tmp_path: Path, log: KafkaLog, caplog: pytest.LogCaptureFixture
) -> None:
    """A newer member's producer fences this one's while it is idle; its next commit is a
    burst, and librdkafka refuses the burst's produce() calls with ``_FATAL`` once it knows
    (issue 38: the stream thread failed and its pod exited with code 1, the message naming no
    fence). The member drops the task as fenced instead, keeps running (and, still assigned
    the task here, takes it back), and every output is published exactly once."""
    log.create_topic("burst", 1)
    source = TopicPartition("burst", 0)
    log.produce(source, [Record(None, b"first", 1)])
    settings = {
        "application.id": "fb",
        "state.dir": str(tmp_path / "state"),
        "processing.guarantee": "exactly_once_v2",
        # One commit for the whole burst, once the member ran out of input.
        "commit.interval.ms": 60_000,
    }
    member = StreamsInstance(fan_out(), StreamsConfig.from_properties(settings), log)
    member.start()
    try:
        member.wait_until_caught_up(120)
        log.transactional_producer("fb-0_0").close()  # the task's newer owner fences it
        log.produce(source, [Record(None, b"line %d" % i, 2) for i in range(BURST_LINES)])
        deadline = time.monotonic() + 120
        while not sum(thread.migrated for thread in member.threads):
            member.check()  # raises what failed a thread (today's code: the _FATAL)
            assert time.monotonic() < deadline, "the burst's commit never met the fencing"
            time.sleep(0.05)
        # Still assigned here, it takes the task back (a new producer) and redoes the burst.
        end = log.end_offset(source)
        while log.committed_offsets("fb", [source]).get(source) != end:
            member.check()
            assert time.monotonic() < deadline, "the burst was never committed after the fence"
            time.sleep(0.05)
        assert member.healthy()
    finally:
        member.close()
    dropped = [m for m in caplog.messages if "taken over by another member" in m]
    assert dropped and "sending to" in dropped[0] and "fenced" in dropped[0], caplog.messages
    out = TopicPartition("copies", 0)
    expected = Counter({b"line %d" % i: FAN_OUT for i in range(BURST_LINES)})
    expected[b"first"] = FAN_OUT

    def published() -> Counter[bytes | None]:
        values: Counter[bytes | None] = Counter()
        position, end = log.beginning_offset(out), log.end_offset(out)
        while position < end:  # a fetch returns one batch of what the broker holds
            records = log.fetch(out, position, max_records=100_000).records
            if not records:
                break
            values.update(record.value for record in records)
            position = records[-1].offset + 1
        return values

    deadline = time.monotonic() + 20  # commit markers are written after a commit returns
    while published() != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    assert published() == expected  # the fenced commit's records are never read


def test_partition_epoch_is_the_topic_id_and_changes_when_the_topic_is_recreated(
    log: KafkaLog,
) -> None:
    # Not compacted: Kafka refuses DeleteRecords on a topic whose only policy is compact.
    tp = TopicPartition("events", 0)
    log.create_topic("events", 1)
    first = log.partition_epoch(tp)
    log.produce(tp, [Record(b"k", b"v", 1)] * 3)
    assert log.partition_epoch(tp) == first  # appends keep the incarnation

    admin = AdminClient({"bootstrap.servers": log.settings.bootstrap})
    real = log.real_topic(tp.topic)
    upto = KafkaPartition(real, 0, 2)
    admin.delete_records([upto])[upto].result()
    # Records deleted from the start move the beginning (a gap), not the incarnation.
    assert (log.beginning_offset(tp), log.partition_epoch(tp)) == (2, first)

    admin.delete_topics([real])[real].result()
    deadline = time.monotonic() + 30
    while real in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{real} still listed 30 s after its deletion"
        time.sleep(0.1)
    log.create_topic("events", 1)
    assert log.partition_epoch(tp) != first
    assert (log.beginning_offset(tp), log.end_offset(tp)) == (0, 0)


@pytest.mark.slow
def test_a_transaction_the_broker_timed_out_cannot_commit_and_writes_nothing(
    kafka_bootstrap: str,
) -> None:
    """The broker aborts a transaction open longer than ``transaction.timeout.ms``
    (bumping the producer's epoch); its commit then fails as a fenced producer's does,
    so the stream thread drops the task uncommitted and rejoins."""
    log = KafkaLog.open(
        f"kafka://{kafka_bootstrap}",
        {},
        topic_prefix=f"timeout-{uuid.uuid4().hex[:8]}.",
        transaction_timeout_s=2.0,
    )
    try:
        out = TopicPartition("out", 0)
        log.create_topic("out", 1)
        producer = log.transactional_producer("timeout-0_0")
        producer.begin()
        producer.send(out, Record(b"k", b"late", 1))
        producer.send_offsets("timeout", {out: 1})
        time.sleep(5)  # > 2 s, plus the broker's 1 s sweep for timed-out transactions
        with pytest.raises(ProducerFencedError):
            producer.commit()
        assert list(log.fetch(out, log.beginning_offset(out)).records) == []
        assert log.committed_offsets("timeout", [out]) == {}
        again = log.transactional_producer("timeout-0_0")  # the task's next owner
        again.begin()
        again.send(out, Record(b"k", b"next", 2))
        committed = again.commit()
        deadline = time.monotonic() + 10
        while log.end_offset(out) <= committed.last_offsets[out]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert [r.value for r in log.fetch(out, log.beginning_offset(out)).records] == [b"next"]
    finally:
        log.close()


def test_a_commit_returns_before_its_records_reach_the_end_and_undecided_says_so(
    log: KafkaLog,
) -> None:
    """Kafka's commit returns once the coordinator logged the decision; the markers reach
    the partition later, and until then the last stable offset (``end_offset``) stays below
    the committed records. ``undecided`` is true from the first send until the markers are
    there, and once it is false the end holds everything the commit wrote: the invariant a
    moved task's new owner relies on before it promotes its copy (issue 38: a copy taken to
    be at the end replayed the old owner's final commit)."""
    changelog = TopicPartition("changelog", 0)
    log.create_topic("changelog", 1, compacted=True)
    assert not log.undecided(changelog)
    producer = log.transactional_producer("undecided-0_0")
    try:
        producer.begin()
        producer.send(changelog, Record(b"k", b"v", 1))
        deadline = time.monotonic() + 10
        while not log.undecided(changelog):  # sent within linger.ms
            assert time.monotonic() < deadline, "the open transaction's record never arrived"
            time.sleep(0.01)
        assert log.end_offset(changelog) == 0  # an open transaction's record is above the end
        committed = producer.commit()
        deadline = time.monotonic() + 10
        while log.undecided(changelog):
            assert time.monotonic() < deadline, "the commit's markers never arrived"
            time.sleep(0.01)
        assert log.end_offset(changelog) > committed.last_offsets[changelog]
    finally:
        producer.close()


class RecordingConsumer:
    """librdkafka's consumer, with the calls that name topics recorded in order."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self.calls: list[tuple[str, str]] = []

    def list_topics(self, topic: str | None = None, **kwargs: Any) -> Any:
        self.calls.append(("metadata", str(topic)))
        return self._consumer.list_topics(topic, **kwargs)

    def incremental_assign(self, partitions: list[KafkaPartition]) -> None:
        self.calls.extend(("assign", p.topic) for p in partitions)
        self._consumer.incremental_assign(partitions)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def test_a_standby_reads_its_first_changelog_records_without_waiting_for_a_metadata_scan(
    tmp_path: Path, log: KafkaLog
) -> None:
    """A standby's first read of a changelog topic: librdkafka fetches a partition only once
    it has its topic's metadata, which for a topic new to the consumer it asks for on its
    once-a-second scan, not on assignment. The reader asks for it before it assigns, so the
    fetch starts at once (it took 0.5 to 1.1 s on this broker before, while the copy reported
    the whole changelog as lag and the standby's thread waited: in the realnode tier a query
    that fell over to such a copy right after the first commit found nothing). The copy then
    holds every committed record and reports no lag."""
    changelog = TopicPartition("changelog", 1)
    log.create_topic("changelog", 2, compacted=True)
    producer = log.transactional_producer("first-read-1_1")
    try:
        producer.begin()
        for index in range(13):
            producer.send(changelog, Record(b"k%d" % index, b"v%d" % index, 1))
        producer.commit()
    finally:
        producer.close()
    deadline = time.monotonic() + 10
    while log.undecided(changelog):  # the commit's markers land after it returns
        assert time.monotonic() < deadline, "the commit's markers never arrived"
        time.sleep(0.01)
    # As in a stream thread, the reader already reads another topic (its tasks' input).
    source = TopicPartition("source", 0)
    log.create_topic("source", 1)
    log.produce(source, [Record(None, b"line", 1)])
    assert len(log.fetch(source, 0).records) == 1
    reader = log._reader()
    consumer = RecordingConsumer(reader._consumer)
    reader._consumer = consumer  # type: ignore[assignment]
    real = log.check_partition(changelog)
    with RocksDBStore("counts", tmp_path / "counts") as store:
        standby = StandbyTask(TaskId(1, 1), {"counts": store}, {"counts": changelog})
        standby.start(log)
        assert standby.lag("counts").offset_lag == 14  # 13 records and the commit marker
        started = time.monotonic()
        applied = [standby.replay(log)]
        while sum(applied) < 13:  # a fetch hands over what librdkafka has so far
            assert len(applied) < 100, f"the standby applied {applied}, not 13 records"
            applied.append(standby.replay(log))
        print(f"first changelog read took {time.monotonic() - started:.3f} s ({applied})")
        # The end it read held the commit's marker; the next replay finds only that
        # marker past the copy, so the copy is at the end and says so.
        assert standby.replay(log) == 0
        assert standby.lag("counts").offset_lag == 0
        assert standby.replay(log) == 0
        assert standby.lag("counts") == LagInfo(13, 13)
        assert [store.get(b"k%d" % i) for i in range(13)] == [b"v%d" % i for i in range(13)]
    assigned = consumer.calls.index(("assign", real))
    assert ("metadata", real) in consumer.calls[:assigned], consumer.calls


def test_topic_retention_is_the_topics_retention_ms_and_compact_delete_policy(
    log: KafkaLog,
) -> None:
    """What the broker itself holds: its log cleaner then deletes old segments of a
    window store's changelog and compacts the rest, as for Kafka Streams' changelogs."""
    log.create_topic("windows-changelog", 1, compacted=True)
    log.set_topic_retention("windows-changelog", 3_600_000)
    admin = AdminClient({"bootstrap.servers": log.settings.bootstrap})

    def broker_config() -> tuple[str, str]:
        resource = ConfigResource("topic", log.real_topic("windows-changelog"))
        configs = next(iter(admin.describe_configs([resource]).values())).result()
        return configs["cleanup.policy"].value, configs["retention.ms"].value

    assert broker_config() == ("compact,delete", "3600000")
    log.set_topic_retention("windows-changelog", None)
    assert broker_config() == ("compact", "-1")
    assert log.topics()["windows-changelog"] == TopicSpec("windows-changelog", 1, True)


def test_a_stores_changelog_configs_reach_the_broker(log: KafkaLog) -> None:
    """``Materialized.with_logging_enabled(configs)``: the changelog of a key-value store
    given ``compact,delete`` and a retention, as the broker describes it; another store's
    stays ``compact`` (Kafka Streams' default)."""
    log.create_topic("input", 1)
    builder = StreamsBuilder()
    grouped = builder.stream("input", key_serde="string").group_by_key()
    configs = {"cleanup.policy": "compact,delete", "retention.ms": "7200000"}
    grouped.count(Materialized.as_("aged").with_logging_enabled(configs))
    grouped.count("kept")
    resolve_topics(builder.build(), "app", log)
    admin = AdminClient({"bootstrap.servers": log.settings.bootstrap})

    def broker_config(topic: str) -> tuple[str, str]:
        resource = ConfigResource("topic", log.real_topic(topic))
        described = next(iter(admin.describe_configs([resource]).values())).result()
        return described["cleanup.policy"].value, described["retention.ms"].value

    assert broker_config("app-aged-changelog") == ("compact,delete", "7200000")
    assert broker_config("app-kept-changelog")[0] == "compact"


def test_members_racing_to_create_a_topic_all_list_it_as_soon_as_they_return(
    log: KafkaLog,
) -> None:
    """Pods starting together race to create their internal and output topics. The broker's
    controller refuses all but one with TOPIC_ALREADY_EXISTS a moment before its metadata
    lists the topic: a loser that returned then listed the topics without it, and a stream
    thread failed on the missing output topic (``KeyError: 'word-counts'``)."""
    prefix = log.topic_prefix
    members = [log, *(KafkaLog.open(log.url, {}, topic_prefix=prefix) for _ in range(2))]
    missing: list[str] = []

    def create_then_list(member: KafkaLog, topic: str, start: threading.Barrier) -> None:
        start.wait()
        assert member.create_topic(topic, 4) == TopicSpec(topic, 4)
        if member.topics().get(topic) != TopicSpec(topic, 4):
            missing.append(topic)

    try:
        for _ in range(10):
            topic = f"raced-{uuid.uuid4().hex[:8]}"
            start = threading.Barrier(len(members))
            with ThreadPoolExecutor(len(members)) as pool:
                for done in [pool.submit(create_then_list, m, topic, start) for m in members]:
                    done.result()
    finally:
        for member in members[1:]:
            member.close()
    assert missing == []
