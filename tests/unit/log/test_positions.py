"""Where a group reads next: its committed offset, else the partition's beginning (not 0)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.log.positions import read_positions
from eddyline_runtime.partitions import TopicPartition

P0, P1, P2 = (TopicPartition("in", p) for p in range(3))


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("in", 3)
    for tp in (P0, P1, P2):
        log.produce(tp, [Record(None, b"v", 0)] * 6)
    yield log
    log.close()


def test_a_committed_offset_wins_and_a_partition_without_one_starts_at_its_beginning(
    log: SqliteLog,
) -> None:
    log.delete_records(P1, 4)
    log.delete_records(P2, 6)
    log.commit_offsets("app", {P0: 2})

    assert read_positions(log, "app", [P0, P1, P2]) == {P0: 2, P1: 4, P2: 6}
    assert read_positions(log, "other", [P0]) == {P0: 0}
