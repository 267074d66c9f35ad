"""KIP-816 end to end: a topology gains a sub-topology before the others, the app
restarts, and no store restores a single record from its changelog."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.task_manager import RestoreReport
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Topology
from eddyline_runtime.serde import serde_for
from tests.support.word_count import word_count

PARTITIONS = 2
LONGS = serde_for("long")


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("lines", PARTITIONS)
    log.create_topic("other", PARTITIONS)
    yield log
    log.close()


def produce(log: SqliteLog, lines: list[str], first_timestamp: int = 0) -> None:
    for partition in range(PARTITIONS):
        log.produce(
            TopicPartition("lines", partition),
            [
                Record(None, line.encode(), first_timestamp + i)
                for i, line in enumerate(lines[partition::PARTITIONS])
            ],
        )


def run(topology: Topology, log: SqliteLog, state_dir: Path) -> list[RestoreReport]:
    restored: list[RestoreReport] = []
    config = StreamsConfig.from_properties(
        {
            "application.id": "app",
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
        }
    )
    instance = StreamsInstance(topology, config, log, on_restore=[restored.append])
    instance.start()
    try:
        instance.wait_until_caught_up(60)
    finally:
        instance.close()
    return restored


def last_counts(log: SqliteLog) -> dict[str, int]:
    counts: dict[str, int] = {}
    for partition in range(log.topics()["word-counts"].partitions):
        tp = TopicPartition("word-counts", partition)
        for record in log.fetch(tp, log.beginning_offset(tp), 1_000_000).records:
            assert record.key is not None and record.value is not None
            counts[record.key.decode()] = LONGS.deserialize(record.value)
    return counts


def test_a_new_first_sub_topology_restarts_without_restoring_a_record(
    tmp_path: Path, log: SqliteLog
) -> None:
    state_dir = tmp_path / "state"
    produce(log, ["a b a", "b a c", "a a a", "c b"] * 50)
    run(word_count(), log, state_dir)
    assert [sub.stores for sub in word_count(new_first_sub_topology=False).subtopologies()][1] == (
        "counts",
    )
    assert {p.name for p in state_dir.iterdir()} == {f"1_{p}" for p in range(PARTITIONS)}

    produce(log, ["a d"], first_timestamp=1_000)
    restored = run(word_count(new_first_sub_topology=True), log, state_dir)

    # Every ordinal shifted by one: "counts" lives under 2_<p> now, moved, not rebuilt.
    assert len(restored) == PARTITIONS
    assert {str(r.task) for r in restored} == {f"2_{p}" for p in range(PARTITIONS)}
    assert [r.result.records for r in restored] == [0] * PARTITIONS
    assert {p.name for p in state_dir.iterdir()} == {f"2_{p}" for p in range(PARTITIONS)}
    assert last_counts(log) == {"a": 301, "b": 150, "c": 100, "d": 1}
