"""``Materialized`` caching per store in a StreamsInstance on the SQLite log and RocksDB:
one store with the record cache, one without, in the same task, and a restart."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.errors import ConfigError
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Materialized, StreamsBuilder, TopologyError
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


def config(tmp_path: Path, **settings: Any) -> StreamsConfig:
    return StreamsConfig.from_properties(
        {
            "application.id": "mat",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": "exactly_once_v2",
            # Everything between two commits: the cached store forwards each key once.
            "commit.interval.ms": 60_000,
            **settings,
        }
    )


def run(
    tmp_path: Path, log: SqliteLog, builder: StreamsBuilder | None = None, **settings: Any
) -> None:
    topology = (builder or two_counts()).build()
    instance = StreamsInstance(topology, config(tmp_path, **settings), log)
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


# -- logging disabled -----------------------------------------------------------------


def unlogged_count() -> StreamsBuilder:
    builder = StreamsBuilder()
    (
        builder.stream("lines", key_serde="string", value_serde="string")
        .flat_map_values(str.split)
        .group_by_key()
        .count(Materialized.as_("local").with_logging_disabled())
        .to_stream()
        .to("local-out", key_serde="string", value_serde="long")
    )
    return builder


def test_an_unlogged_store_has_no_changelog_and_survives_a_clean_restart(
    tmp_path: Path, log: SqliteLog
) -> None:
    produce(log, [("k", "a b")])
    run(tmp_path, log, unlogged_count(), **{"processing.guarantee": "at_least_once"})
    assert "mat-local-changelog" not in log.topics()
    produce(log, [("k", "c")])
    run(tmp_path, log, unlogged_count(), **{"processing.guarantee": "at_least_once"})
    # The count went on from the store on disk: 3, not 1.
    assert published(log, "local-out") == [("k", 2), ("k", 3)]


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        (
            {"processing.guarantee": "at_least_once", "num.standby.replicas": 1},
            'invalid value 1 for "num.standby.replicas": accepted values are 0 while store '
            '"local" has logging disabled',
        ),
        (
            {},
            "invalid value 'exactly_once_v2' for \"processing.guarantee\": accepted values "
            'are at_least_once while store "local" has logging disabled',
        ),
    ],
)
def test_an_unlogged_store_is_refused_where_a_changelog_is_needed(
    tmp_path: Path, log: SqliteLog, settings: dict[str, Any], refusal: str
) -> None:
    instance = StreamsInstance(unlogged_count().build(), config(tmp_path, **settings), log)
    with pytest.raises(ConfigError) as refused:
        instance.start()
    assert str(refused.value).startswith(refusal)
    assert "enable its logging" in str(refused.value)


def test_an_instance_refuses_generated_names_with_explicit_naming_before_touching_state(
    tmp_path: Path, log: SqliteLog
) -> None:
    """KIP-1111 on the real start path: refused before relocation or any store opens."""
    builder = StreamsBuilder()
    lines = builder.stream("lines", key_serde="string", value_serde="string")
    lines.group_by(lambda key, value: value).count("per-line")
    settings = {"ensure.explicit.internal.resource.naming": True}
    instance = StreamsInstance(builder.build(), config(tmp_path, **settings), log)
    with pytest.raises(TopologyError, match="repartition topic\\(s\\) has not been named"):
        instance.start()
    instance.close()
    state = tmp_path / "state"
    assert not [p for p in state.rglob("*") if re.fullmatch(r"\d+_\d+", p.name)]
