"""A read-only open of the embedded log: for readers beside a live log (Spark restore tasks)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from eddyline_runtime.log import LogError, Record, SqliteLog, open_log
from eddyline_runtime.partitions import TopicPartition

TP = TopicPartition("app-store-changelog", 0)


@pytest.fixture
def live_log(tmp_path: Path) -> SqliteLog:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(TP.topic, 1, compacted=True)
    log.produce(TP, [Record(b"k", b"v1", 1), Record(b"k", b"v2", 2)])
    return log


def test_a_read_only_log_reads_what_the_live_log_wrote(live_log: SqliteLog) -> None:
    reader = open_log(f"sqlite:///{live_log.path}", read_only=True)
    assert reader.end_offset(TP) == 2
    assert list(reader.fetch_changes_between(TP, 0, 2).values) == [b"v1", b"v2"]
    live_log.produce(TP, [Record(b"k", b"v3", 3)])
    assert reader.end_offset(TP) == 3
    reader.close()
    live_log.close()


def test_a_read_only_reader_never_holds_the_write_lock(live_log: SqliteLog) -> None:
    reader = SqliteLog(live_log.path, read_only=True)
    reader.fetch_changes_between(TP, 0, 2)
    # Another writer takes the write lock at once (no busy wait): nobody holds it.
    other = sqlite3.connect(live_log.path, timeout=0, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    other.execute("ROLLBACK")
    other.close()
    reader.close()
    live_log.close()


def test_a_read_only_log_refuses_every_write(live_log: SqliteLog) -> None:
    reader = SqliteLog(live_log.path, read_only=True)
    with pytest.raises(LogError, match="read-only"):
        reader.produce(TP, [Record(b"k", b"v", 1)])
    with pytest.raises(LogError, match="read-only"):
        reader.create_topic("other", 1)
    with pytest.raises(LogError, match="read-only"):
        reader.transactional_producer("id")
    assert live_log.end_offset(TP) == 2
    reader.close()
    live_log.close()


def test_a_read_only_open_of_a_missing_log_says_so_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "log.db"
    with pytest.raises(LogError, match=r"does not exist.*never creates"):
        SqliteLog(path, read_only=True)
    assert not path.parent.exists()


def test_a_read_only_open_of_a_file_that_is_no_log_says_so(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("not a database")
    with pytest.raises(LogError, match="could not be opened read-only"):
        SqliteLog(path, read_only=True)
