"""Word count under ``exactly_once_v2`` on three Kafka brokers while they fail.

The three-node KRaft cluster (``kafka_cluster3``, started only for these
tests) holds every topic with three replicas and ``min.insync.replicas=2``.
While the word count runs and input keeps arriving, one broker is stopped
and started again (its partitions' leaders and any coordinator on it move
to the others, then it catches up), and another is SIGKILLed (an unclean
stop: leaders elected among the in-sync replicas) and started again. Every
count must still be published exactly once: nothing lost, nothing
duplicated.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_kafka_broker_runtime import published, settled_counts, word_count

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.log import Record
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing.instance import StreamsInstance
from support.kafka.broker import KafkaCluster

PARTITIONS = 2
CHUNKS = [[f"w{(i * 7 + c) % 13} w{i % 5} w{c}" for i in range(2_000)] for c in range(5)]


@pytest.fixture
def log(kafka3: KafkaCluster) -> Iterator[KafkaLog]:
    log = KafkaLog.open(
        f"kafka://{kafka3.bootstrap}",
        {"replication.factor": "3", "min.insync.replicas": "2"},
        topic_prefix=f"faults-{uuid.uuid4().hex[:8]}.",
    )
    yield log
    log.close()


def produce(log: KafkaLog, lines: list[str]) -> None:
    for partition in range(PARTITIONS):
        log.produce(
            TopicPartition("lines", partition),
            [Record(None, line.encode(), i + 1) for i, line in enumerate(lines[partition::2])],
        )


def leaders(log: KafkaLog, topic: str) -> dict[int, int]:
    metadata = log.topic_admin.client().list_topics(log.real_topic(topic), timeout=10)
    return {p: meta.leader for p, meta in metadata.topics[log.real_topic(topic)].partitions.items()}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_word_count_stays_exact_through_a_broker_restart_and_a_leader_change(
    tmp_path: Path, kafka3: KafkaCluster, log: KafkaLog
) -> None:
    log.create_topic("lines", PARTITIONS)
    produce(log, CHUNKS[0])
    config = StreamsConfig.from_properties(
        {
            "application.id": "faults",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": 100,
        }
    )
    instance = StreamsInstance(word_count(), config, log)
    instance.start()
    try:
        instance.wait_until_caught_up(60)
        # A clean restart of the broker leading the first input partition.
        restarted = leaders(log, "lines")[0]
        kafka3.stop_node(restarted)
        produce(log, CHUNKS[1])
        time.sleep(2)  # the word count runs on two brokers meanwhile
        kafka3.start_node(restarted)
        produce(log, CHUNKS[2])
        instance.wait_until_caught_up(60)
        # SIGKILL the broker now leading the changelog's first partition: its leaders
        # move to the other in-sync replicas.
        killed = leaders(log, "faults-counts-changelog")[0]
        kafka3.stop_node(killed, kill=True)
        produce(log, CHUNKS[3])
        assert _moved(log, killed), f"no leader but node {killed} for the changelog"
        time.sleep(2)
        kafka3.start_node(killed)
        produce(log, CHUNKS[4])
        instance.wait_until_caught_up(90)
    finally:
        instance.close()
    expected = Counter(" ".join(line for chunk in CHUNKS for line in chunk).split())
    assert settled_counts(log, expected, timeout=60) == dict(expected)
    for word, counts in published(log).items():  # a duplicated commit would repeat a count
        assert counts == sorted(set(counts)), f"{word}: {counts}"


def _moved(log: KafkaLog, killed: int, timeout: float = 30) -> bool:
    """Whether the changelog's first partition gets a leader other than ``killed``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if leaders(log, "faults-counts-changelog")[0] not in (killed, -1):
            return True
        time.sleep(0.2)
    return False
