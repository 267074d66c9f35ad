"""The runtime end to end on the Kafka adapter, over librdkafka's mock cluster.

Word count under at-least-once: the stream thread's fetch loop, KIP-695 lag,
plain produces, group offsets and a restart that restores a wiped store from
its changelog through ``fetch_changes``, all through real librdkafka clients.

The mock cluster has no CreateTopics or DescribeConfigs, so topics are created
through its C API (``MockControl``) and the cleanup policy the adapter would
read with DescribeConfigs is remembered from creation, and the partition
epoch (DescribeTopics' topic id) is unknown (None, as for a log that cannot
tell), and no record is checked against a size limit (DescribeConfigs' max.message.bytes):
the only stand-ins here. Exactly-once is not run: the mock's transactions are not Kafka's.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.task_manager import RestoreReport
from eddyline_runtime.log import Record, TopicSpec
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.log.kafka_settings import kafka_log_settings
from eddyline_runtime.log.record_size import RecordSizeLimit
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.serde import serde_for
from tests.support.kafka.mock_cluster import MockCluster, MockControl
from tests.support.word_count import word_count

LONGS = serde_for("long")
LINES = ["a b a", "b a c", "a a a", "c b"]
EXPECTED = Counter(" ".join(LINES).split())
_runs = itertools.count()


class MockClusterLog(KafkaLog):
    """KafkaLog whose topic creation goes through the mock's C API (see the module doc)."""

    def __init__(self, cluster: MockCluster, control: MockControl, prefix: str) -> None:
        super().__init__(kafka_log_settings(cluster.url, {}), topic_prefix=prefix)
        self._control = control

    def create_topic(self, name: str, partitions: int, *, compacted: bool = False) -> TopicSpec:
        real = self.real_topic(name)
        if real not in self.topic_admin.refresh():
            self._control.create_topic(real, partitions)
            self.topic_admin.compacted[real] = compacted
            deadline = time.monotonic() + 10
            while real not in self.topic_admin.refresh() and time.monotonic() < deadline:
                time.sleep(0.01)
        return super().create_topic(name, partitions, compacted=compacted)

    def partition_epoch(self, tp: TopicPartition) -> str | None:  # type: ignore[override]
        return None  # the mock answers no DescribeTopics

    def record_size_limit(self, topic: str) -> RecordSizeLimit | None:
        return None  # nor DescribeConfigs: no record is checked against a size limit


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[MockCluster, MockControl]]:
    cluster = MockCluster()
    yield cluster, MockControl(cluster)
    cluster.close()


@pytest.fixture
def log(cluster: tuple[MockCluster, MockControl]) -> Iterator[MockClusterLog]:
    log = MockClusterLog(*cluster, prefix=f"runtime{next(_runs)}.")
    yield log
    log.close()


def config(tmp_path: Path, guarantee: str = "at_least_once") -> StreamsConfig:
    return StreamsConfig.from_properties(
        {
            "application.id": "app",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": guarantee,
            "commit.interval.ms": 100,
        }
    )


def produce_lines(log: KafkaLog, lines: list[str]) -> None:
    log.create_topic("lines", 2)
    for partition in range(2):
        log.produce(
            TopicPartition("lines", partition),
            [Record(None, line.encode(), i + 1) for i, line in enumerate(lines[partition::2])],
        )


def latest_counts(log: KafkaLog) -> dict[str, int]:
    """Each word's last count in the output, read to the end of every partition: a fetch
    gives what has arrived from the broker so far, maybe not the whole partition (one
    fetch here once returned the first run's records without the second run's)."""
    latest: dict[str, int] = {}
    for partition in range(2):
        tp = TopicPartition("word-counts", partition)
        position, end = log.beginning_offset(tp), log.end_offset(tp)
        while position < end and (records := log.fetch(tp, position).records):
            for record in records:
                assert record.key is not None and record.value is not None
                latest[record.key.decode()] = LONGS.deserialize(record.value)
                position = record.offset + 1
    return latest


def run_until_caught_up(instance: StreamsInstance) -> None:
    instance.start()
    try:
        instance.wait_until_caught_up(60)
    finally:
        instance.close()


@pytest.mark.slow
def test_word_count_runs_on_the_kafka_adapter_and_restores_from_its_changelog(
    tmp_path: Path, log: MockClusterLog
) -> None:
    produce_lines(log, LINES)
    run_until_caught_up(StreamsInstance(word_count(), config(tmp_path), log))
    assert latest_counts(log) == dict(EXPECTED)
    assert log.topics()["app-counts-changelog"] == TopicSpec("app-counts-changelog", 2, True)

    for task in ("1_0", "1_1"):  # wipe the stores: the changelog rebuilds them
        for path in sorted((tmp_path / "state" / task / "counts").iterdir()):
            path.unlink()
    produce_lines(log, ["b"])
    restores: list[RestoreReport] = []
    run_until_caught_up(
        StreamsInstance(word_count(), config(tmp_path), log, on_restore=[restores.append])
    )
    assert sum(report.result.records for report in restores) >= len(EXPECTED)
    assert latest_counts(log) == dict(EXPECTED + Counter(["b"]))


@pytest.mark.slow
def test_under_exactly_once_a_task_that_consumed_everything_is_caught_up(
    tmp_path: Path, log: MockClusterLog
) -> None:
    """Each transaction ends in a commit marker that takes an offset: a task whose
    position is past every committed record is caught up all the same. (The mock's
    transactions are not Kafka's; this checks the offsets' wiring, not exactly-once.)"""
    produce_lines(log, LINES)
    instance = StreamsInstance(word_count(), config(tmp_path, "exactly_once_v2"), log)
    run_until_caught_up(instance)
    assert latest_counts(log) == dict(EXPECTED)
    changelog = TopicPartition("app-counts-changelog", 0)
    assert log.end_offset(changelog) <= log.fetch(changelog, 0).end_offset + 1
