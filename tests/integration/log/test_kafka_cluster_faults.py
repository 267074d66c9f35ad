"""Exactly-once on a three-broker Kafka cluster while a broker restarts and leaders move.

A word count under ``exactly_once_v2`` runs on the project's three-node KRaft
cluster (tests/support/kafka/) with every topic replicated three times and
``min.insync.replicas=2``, while lines keep arriving. During the run the
broker that coordinates most of the tasks' transactions (and so leads their
``__transaction_state`` partitions) is killed and started again, and then a
preferred-leader election moves the partition leaders back to it: each
transaction coordinator, group coordinator and partition leader the tasks use
moves twice. Afterwards every word's last published count is exact and no count
is published twice (a transaction committed twice, or a record lost, shows).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import ElectionType
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.serde import serde_for
from tests.support.crash_runs import committed_records
from tests.support.kafka.broker import KafkaCluster
from tests.support.waiting import wait_for
from tests.support.word_count import word_count

LONGS = serde_for("long")
PARTITIONS = 2
LINES_PER_BATCH = 10
APPLICATION = "wc3"
TASKS = [f"{sub}_{partition}" for sub in (0, 1) for partition in range(PARTITIONS)]


def batch_lines(batch: int) -> list[str]:
    return [f"w{(batch * 7 + i) % 13} w{i % 5} b{batch % 9}" for i in range(LINES_PER_BATCH)]


def java_hash(text: str) -> int:
    """Java's String.hashCode, which places a transactional id on a __transaction_state
    partition (``abs(hashCode) % transaction.state.log.num.partitions``)."""
    value = 0
    for char in text:
        value = (31 * value + ord(char)) & 0xFFFFFFFF
    return value


def coordinator_broker(admin: AdminClient, transactional_ids: list[str]) -> int:
    """The broker leading the most of these ids' __transaction_state partitions."""
    state = admin.list_topics("__transaction_state", timeout=10).topics["__transaction_state"]
    partitions = state.partitions
    leaders = Counter(
        partitions[(java_hash(tid) & 0x7FFFFFFF) % len(partitions)].leader
        for tid in transactional_ids
    )
    return leaders.most_common(1)[0][0]


def leaders(admin: AdminClient, topic: str) -> dict[int, int]:
    metadata = admin.list_topics(topic, timeout=10).topics[topic]
    return {p: info.leader for p, info in metadata.partitions.items()}


def known_to_every_broker(cluster: KafkaCluster, topic: str) -> None:
    """Brokers learn of a new topic from the controller one by one: until each has, a
    metadata request that lands on a late one does not list it."""
    for node in cluster.nodes:
        own = AdminClient({"bootstrap.servers": node.address})
        wait_for(
            lambda own=own: topic in own.list_topics(timeout=10).topics or None,  # type: ignore[misc]
            f"{topic} in broker {node.node_id}'s metadata",
            30,
        )


def in_sync(admin: AdminClient, topic: str) -> bool:
    metadata = admin.list_topics(topic, timeout=10).topics[topic]
    return all(len(info.isrs) == len(info.replicas) for info in metadata.partitions.values())


@pytest.fixture
def log(kafka3: KafkaCluster) -> Iterator[KafkaLog]:
    log = KafkaLog.open(
        f"kafka://{kafka3.bootstrap}",
        {"replication.factor": "3", "min.insync.replicas": "2"},
        topic_prefix=f"faults-{uuid.uuid4().hex[:8]}.",
    )
    yield log
    log.close()


def published(log: KafkaLog) -> dict[str, list[int]]:
    counts: dict[str, list[int]] = {}
    # Each partition to its end offset: one fetch returns what has arrived (maybe one batch).
    for record in committed_records(log, "word-counts", PARTITIONS):
        assert record.key is not None and record.value is not None
        counts.setdefault(record.key.decode(), []).append(LONGS.deserialize(record.value))
    return counts


class Feeder:
    """Lines keep arriving through every fault, until :meth:`stop`. A batch counts once
    produce returned: it is then acknowledged by the in-sync replicas."""

    def __init__(self, log: KafkaLog) -> None:
        self.log = log
        self.expected: Counter[str] = Counter()
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, name="feed-lines", daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        batch = 0
        try:
            while not self._stop.is_set():
                lines = batch_lines(batch)
                for partition in range(PARTITIONS):
                    self.log.produce(
                        TopicPartition("lines", partition),
                        [Record(None, line.encode(), batch + 1) for line in lines[partition::2]],
                    )
                self.expected.update(" ".join(lines).split())
                batch += 1
                time.sleep(0.2)
        except BaseException as exc:  # reported by the test thread
            self.errors.append(exc)

    def stop(self) -> Counter[str]:
        self._stop.set()
        self._thread.join(60)
        assert not self.errors, self.errors
        return self.expected


def processing_resumes(instance: StreamsInstance, after: str, since: float) -> None:
    before = instance.processed
    wait_for(lambda: instance.processed > before or None, f"records processed after {after}", 90)
    print(f"processing resumed {time.monotonic() - since:.1f} s after {after}")


def elect_preferred_leaders(admin: AdminClient, topics: dict[str, int]) -> None:
    elected = admin.elect_leaders(
        ElectionType.PREFERRED,
        [KafkaPartition(topic, p) for topic, count in topics.items() for p in range(count)],
    )
    elected.result(timeout=30)


def settled_counts(log: KafkaLog, expected: Counter[str]) -> dict[str, list[int]]:
    """Every count published per word, once the last ones are ``expected`` (commit markers
    land after the commit returned) or 30 s passed."""
    deadline = time.monotonic() + 30
    while True:
        counts = published(log)
        if {w: v[-1] for w, v in counts.items()} == dict(expected):
            return counts
        if time.monotonic() > deadline:
            return counts
        time.sleep(0.2)


@pytest.mark.slow
def test_word_count_is_exact_while_a_broker_restarts_and_leaders_change(
    tmp_path: Path, kafka3: KafkaCluster, log: KafkaLog
) -> None:
    lines_topic = log.real_topic("lines")
    log.create_topic("lines", PARTITIONS)
    known_to_every_broker(kafka3, lines_topic)
    admin = AdminClient({"bootstrap.servers": kafka3.bootstrap})
    config = StreamsConfig.from_properties(
        {
            "application.id": APPLICATION,
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": 100,
        }
    )
    instance = StreamsInstance(word_count(), config, log)
    instance.start()
    feeder = Feeder(log)
    try:
        wait_for(lambda: instance.processed > 0 or None, "the first records processed", 120)
        victim = coordinator_broker(admin, [f"{APPLICATION}-{task}" for task in TASKS])
        led_before = leaders(admin, "__transaction_state")
        killed_at = time.monotonic()
        kafka3.stop_node(victim, kill=True)
        # Processing goes on on the two brokers left (min.insync.replicas=2 holds).
        processing_resumes(instance, f"broker {victim} was killed", killed_at)
        kafka3.start_node(victim)
        replicated = [lines_topic, "__transaction_state", "__consumer_offsets"]
        wait_for(
            lambda: all(in_sync(admin, topic) for topic in replicated) or None,
            f"broker {victim} back in the ISR of {replicated}",
            90,
        )
        led_after_restart = leaders(admin, "__transaction_state")
        # The restarted broker is the preferred leader of a third of the partitions:
        # electing it moves those leaders (and the coordinators on them) back.
        elect_preferred_leaders(
            admin, {lines_topic: PARTITIONS, "__transaction_state": 4, "__consumer_offsets": 4}
        )
        processing_resumes(instance, "the leader election", time.monotonic())
        expected = feeder.stop()
        stopped_at = time.monotonic()
        instance.wait_until_caught_up(180)
        print(f"caught up {time.monotonic() - stopped_at:.1f} s after the last line")
    finally:
        feeder.stop()
        instance.close()
    # The kill moved the leaders of the victim's __transaction_state partitions away,
    # the election moved them back.
    moved = [p for p, leader in led_before.items() if led_after_restart[p] != leader]
    assert moved and all(led_before[p] == victim for p in moved), (led_before, led_after_restart)
    assert leaders(admin, "__transaction_state") == led_before

    counts = settled_counts(log, expected)
    assert {word: values[-1] for word, values in counts.items()} == dict(expected)
    for word, values in counts.items():  # a transaction committed twice repeats a count
        assert values == sorted(set(values)), f"{word}: {values}"
