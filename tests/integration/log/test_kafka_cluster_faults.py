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
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka import ElectionType
from confluent_kafka.admin import AdminClient

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import StreamsBuilder, Topology
from eddyline_runtime.serde import serde_for
from tests.support.kafka.broker import KafkaCluster
from tests.support.waiting import wait_for

LONGS = serde_for("long")
PARTITIONS = 2
LINES_PER_BATCH = 10
APPLICATION = "wc3"
TASKS = [f"{sub}_{partition}" for sub in (0, 1) for partition in range(PARTITIONS)]


def word_count() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("lines", value_serde="string")
        .flat_map_values(str.split)
        .group_by(lambda _, word: word, value_serde="string")
        .count("counts")
        .to_stream()
        .to("word-counts", key_serde="string", value_serde="long")
    )
    return builder.build()


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
    for partition in range(PARTITIONS):
        tp = TopicPartition("word-counts", partition)
        for record in log.fetch(tp, log.beginning_offset(tp), max_records=1_000_000).records:
            assert record.key is not None and record.value is not None
            counts.setdefault(record.key.decode(), []).append(LONGS.deserialize(record.value))
    return counts


@pytest.mark.slow
def test_word_count_is_exact_while_a_broker_restarts_and_leaders_change(
    tmp_path: Path, kafka3: KafkaCluster, log: KafkaLog
) -> None:
    log.create_topic("lines", PARTITIONS)
    known_to_every_broker(kafka3, log.real_topic("lines"))
    expected: Counter[str] = Counter()
    stop_feeding = threading.Event()
    feed_errors: list[BaseException] = []

    def feed() -> None:
        """Lines keep arriving through every fault, until the test says stop. A batch
        counts once produce returned: it is then acknowledged by the in-sync replicas."""
        batch = 0
        try:
            while not stop_feeding.is_set():
                lines = batch_lines(batch)
                for partition in range(PARTITIONS):
                    log.produce(
                        TopicPartition("lines", partition),
                        [Record(None, line.encode(), batch + 1) for line in lines[partition::2]],
                    )
                expected.update(" ".join(lines).split())
                batch += 1
                time.sleep(0.2)
        except BaseException as exc:  # reported by the test thread
            feed_errors.append(exc)

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
    feeder = threading.Thread(target=feed, name="feed-lines", daemon=True)
    try:
        feeder.start()
        wait_for(lambda: instance.processed > 0 or None, "the first records processed", 120)
        victim = coordinator_broker(admin, [f"{APPLICATION}-{task}" for task in TASKS])
        led_before = leaders(admin, "__transaction_state")
        before = instance.processed
        killed_at = time.monotonic()
        kafka3.stop_node(victim, kill=True)
        # Processing goes on on the two brokers left (min.insync.replicas=2 holds).
        wait_for(
            lambda: instance.processed > before or None,
            f"records processed after broker {victim} was killed",
            90,
        )
        print(f"processing resumed {time.monotonic() - killed_at:.1f} s after the kill")
        kafka3.start_node(victim)
        # The restarted broker is the preferred leader of a third of the partitions:
        # electing it moves those leaders (and the coordinators on them) back.
        lines_topic = log.real_topic("lines")
        replicated = [lines_topic, "__transaction_state", "__consumer_offsets"]
        wait_for(
            lambda: all(in_sync(admin, topic) for topic in replicated) or None,
            f"broker {victim} back in the ISR of {replicated}",
            90,
        )
        led_after_restart = leaders(admin, "__transaction_state")
        elected = admin.elect_leaders(
            ElectionType.PREFERRED,
            [KafkaPartition(lines_topic, p) for p in range(PARTITIONS)]
            + [KafkaPartition("__transaction_state", p) for p in range(4)]
            + [KafkaPartition("__consumer_offsets", p) for p in range(4)],
        )
        elected.result(timeout=30)
        elected_at, before = time.monotonic(), instance.processed
        wait_for(
            lambda: instance.processed > before or None,
            "records processed after the leader election",
            90,
        )
        print(f"processing resumed {time.monotonic() - elected_at:.1f} s after the election")
        stop_feeding.set()
        feeder.join(60)
        assert not feed_errors, feed_errors
        stopped_at = time.monotonic()
        instance.wait_until_caught_up(180)
        print(f"caught up {time.monotonic() - stopped_at:.1f} s after the last line")
    finally:
        stop_feeding.set()
        instance.close()
    # The kill moved the leaders of the victim's __transaction_state partitions away,
    # the election moved them back.
    moved = [p for p, leader in led_before.items() if led_after_restart[p] != leader]
    assert moved and all(led_before[p] == victim for p in moved), (led_before, led_after_restart)
    assert leaders(admin, "__transaction_state") == led_before

    deadline = time.monotonic() + 30
    while True:
        counts = published(log)
        latest = {word: values[-1] for word, values in counts.items()}
        if latest == dict(expected) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert latest == dict(expected)
    for word, values in counts.items():  # a transaction committed twice repeats a count
        assert values == sorted(set(values)), f"{word}: {values}"
