"""Resolving a topology against the log: task counts, internal and changelog topics."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.engine.record_collector import RecordCollector
from eddyline_runtime.engine.topics import TopologyLayoutError, resolve_topics
from eddyline_runtime.log import Record, SqliteLog, TopicConflictError
from eddyline_runtime.log.port import RecordColumns
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing import StreamsBuilder
from tests.support.kafka.fake_clients import FakeBroker, fake_log
from tests.support.word_count import word_count_builder as word_count


def test_word_count_layout(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("lines", 3)
    builder = word_count()
    layout = resolve_topics(builder.build(), "wc", log)
    repartition = builder.internal_topics[0]
    assert layout.physical[repartition] == f"wc-{repartition}"
    assert layout.physical["lines"] == "lines"
    assert layout.partitions == {0: 3, 1: 3}
    assert layout.tasks() == [TaskId(s, p) for s in (0, 1) for p in range(3)]
    topics = log.topics()
    assert topics[f"wc-{repartition}"].partitions == 3
    assert topics["wc-counts-changelog"].partitions == 3
    assert topics["wc-counts-changelog"].compacted
    assert topics["word-counts"].partitions == 3  # missing outputs are created
    assert layout.changelog_partition("counts", TaskId(1, 2)) == TopicPartition(
        "wc-counts-changelog", 2
    )
    assert layout.input_partitions(TaskId(1, 0)) == [TopicPartition(f"wc-{repartition}", 0)]
    # Resolving again (a restart) finds everything in place.
    assert resolve_topics(builder.build(), "wc", log).partitions == layout.partitions


def test_a_missing_input_topic_is_named_with_the_way_out(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    with pytest.raises(TopologyLayoutError, match=r"lines do not exist.*create-topic"):
        resolve_topics(word_count().build(), "wc", log)


def test_a_join_of_topics_with_different_partition_counts_is_refused(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("clicks", 4)
    log.create_topic("users", 2)
    builder = StreamsBuilder()
    users = builder.table("users", "users-store")
    builder.stream("clicks").join(users, lambda click, user: click).to("out")
    with pytest.raises(TopologyLayoutError, match=r"users \(2\), clicks \(4\).*co-partitioned"):
        resolve_topics(builder.build(), "join", log)


def test_foreign_key_join_topics_are_co_partitioned_with_their_readers(tmp_path: Path) -> None:
    """The two sub-topologies of a foreign-key join write each other's inputs: the
    subscription topic takes the right table's count, the response topic the left's
    (Kafka's co-partitioning of them), not their writers'."""
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("orders", 4)
    log.create_topic("customers", 2)
    builder = StreamsBuilder()
    orders = builder.table("orders", "orders-store", key_serde="string", value_serde="json")
    customers = builder.table("customers", "customers-store", key_serde="string")
    orders.join(customers, lambda order: order["customer"], lambda o, c: c, name="enrich")
    layout = resolve_topics(builder.build(), "app", log)
    assert layout.partitions == {0: 4, 1: 2}
    topics = log.topics()
    assert topics["app-enrich-subscription-registration-topic"].partitions == 2
    assert topics["app-enrich-subscription-response-topic"].partitions == 4
    assert topics["app-enrich-subscription-store-changelog"].partitions == 2


def test_a_changelog_with_another_partition_count_is_a_conflict(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("lines", 2)
    log.create_topic("wc-counts-changelog", 5, compacted=True)
    with pytest.raises(TopicConflictError):
        resolve_topics(word_count().build(), "wc", log)


def test_task_ids_read_and_print_as_kafka_streams_names_them() -> None:
    assert str(TaskId(1, 12)) == "1_12"
    assert TaskId.parse("1_12") == TaskId(1, 12)
    with pytest.raises(ValueError, match="<sub-topology>_<partition>"):
        TaskId.parse("one")


class _CountingTask:
    """What the record collector asks of a task: the outputs its sinks produced."""

    def __init__(self, topic: str, words: list[bytes]) -> None:
        self._outputs = {topic: RecordColumns.of([Record(w, b"1", 0) for w in words])}

    def drain_output_columns(self) -> dict[str, RecordColumns]:
        outputs, self._outputs = self._outputs, {}
        return outputs


def test_topics_other_members_created_a_moment_ago_are_in_the_layout() -> None:
    """Pods starting together race to create the internal and output topics. On Kafka the
    loser's metadata may not list the winner's topic yet; a layout without it failed the
    stream thread at its first output with only ``KeyError: 'word-counts'``."""
    broker = FakeBroker()
    broker.topics["lines"] = (4, {"cleanup.policy": "delete"})
    broker.created_elsewhere("word-counts", 4, unlisted_for=5)
    builder = word_count()
    layout = resolve_topics(builder.build(), "wc", fake_log(broker))
    # The commit's first step for the counting task (it raised the KeyError).
    batches: dict[TopicPartition, RecordColumns] = {}
    words = [b"alpha", b"beta", b"gamma", b"delta"]
    collector = RecordCollector(fake_log(broker), layout)
    assert collector.collect(_CountingTask("word-counts", words), batches) == 4  # type: ignore[arg-type]
    assert {tp.topic for tp in batches} == {"word-counts"}
    assert sum(len(columns) for columns in batches.values()) == 4
    repartition = f"wc-{builder.internal_topics[0]}"
    assert layout.topic_partitions == {
        "lines": 4,
        repartition: 4,
        "word-counts": 4,
        "wc-counts-changelog": 4,
    }
