"""``Materialized`` caching per store in a StreamsInstance on the SQLite log and RocksDB:
one store with the record cache, one without, in the same task, and a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Materialized, StreamsBuilder
from eddyline_runtime.serde import serde_for

LONGS = serde_for("long")


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    log = SqliteLog(tmp_path / "log.db")
    yield log
    log.close()


def two_counts() -> StreamsBuilder:
    """Words per line key, counted twice: in a cached store and in one without cache."""
    builder = StreamsBuilder()
    words = builder.stream("lines", key_serde="string", value_serde="string").flat_map_values(
        str.split
    )
    (
        words.group_by_key()
        .count("cached")
        .to_stream()
        .to("cached-out", key_serde="string", value_serde="long")
    )
    (
        words.group_by_key()
        .count(Materialized.as_("uncached").with_caching_disabled())
        .to_stream()
        .to("uncached-out", key_serde="string", value_serde="long")
    )
    return builder


def run(tmp_path: Path, log: SqliteLog) -> None:
    config = StreamsConfig.from_properties(
        {
            "application.id": "mat",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": "exactly_once_v2",
            # Everything between two commits: the cached store forwards each key once.
            "commit.interval.ms": 60_000,
        }
    )
    instance = StreamsInstance(two_counts().build(), config, log)
    instance.start()
    try:
        instance.wait_until_caught_up(60)
    finally:
        instance.close()


def produce(log: SqliteLog, lines: list[tuple[str, str]]) -> None:
    if "lines" not in log.topics():
        log.create_topic("lines", 1)
    log.produce(
        TopicPartition("lines", 0),
        [Record(key.encode(), line.encode(), i) for i, (key, line) in enumerate(lines)],
    )


def published(log: SqliteLog, topic: str) -> list[tuple[str, int]]:
    tp = TopicPartition(topic, 0)
    fetched = log.fetch(tp, log.beginning_offset(tp), 1_000_000).records
    return [
        (record.key.decode(), LONGS.deserialize(record.value))
        for record in fetched
        if record.key is not None and record.value is not None
    ]


def test_caching_is_per_store_and_survives_a_restart(tmp_path: Path, log: SqliteLog) -> None:
    produce(log, [("k", "a b"), ("j", "c"), ("k", "d")])
    run(tmp_path, log)
    assert published(log, "cached-out") == [("j", 1), ("k", 3)]
    assert published(log, "uncached-out") == [("k", 1), ("k", 2), ("j", 1), ("k", 3)]

    produce(log, [("k", "e f")])
    run(tmp_path, log)  # a restart: both stores resume from their committed counts
    assert published(log, "cached-out")[2:] == [("k", 5)]
    assert published(log, "uncached-out")[4:] == [("k", 4), ("k", 5)]
