"""A read-only open of the embedded log: for readers beside a live log (Spark restore tasks)."""

from __future__ import annotations

import sqlite3
import threading
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


def reads_while_a_writer_holds_the_lock(path: Path, *, read_only: bool, patience: float) -> bool:
    """Whether opening the log at ``path`` and reading from it completes within ``patience``
    seconds while another connection holds SQLite's write lock (``BEGIN IMMEDIATE``).

    A reader that needs the write lock, to create tables or to write anything,
    waits until the lock is released: False. The lock is released before returning,
    and what the reader raised is raised here.
    """
    writer = sqlite3.connect(path, timeout=0, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    done = threading.Event()
    failures: list[BaseException] = []

    def open_and_read() -> None:
        try:
            reader = SqliteLog(path, read_only=read_only)
            try:
                assert list(reader.fetch_changes_between(TP, 0, 2).values) == [b"v1", b"v2"]
            finally:
                reader.close()
        except BaseException as failure:
            failures.append(failure)
        finally:
            done.set()

    thread = threading.Thread(target=open_and_read, daemon=True)
    thread.start()
    try:
        finished = done.wait(patience)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        thread.join(60)
    if failures:
        raise failures[0]
    return finished


def test_a_read_only_reader_never_needs_the_write_lock(live_log: SqliteLog) -> None:
    # Generous: a read-only reader never waits for the lock, however slow the machine.
    assert reads_while_a_writer_holds_the_lock(live_log.path, read_only=True, patience=20)
    # And it holds none once it has read: another writer takes the lock at once.
    reader = SqliteLog(live_log.path, read_only=True)
    reader.fetch_changes_between(TP, 0, 2)
    other = sqlite3.connect(live_log.path, timeout=0, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    other.execute("ROLLBACK")
    other.close()
    reader.close()
    live_log.close()


def test_the_write_lock_check_fails_for_a_read_write_open(live_log: SqliteLog) -> None:
    """The check above can fail: a read-write open takes the write lock (its schema)."""
    assert not reads_while_a_writer_holds_the_lock(live_log.path, read_only=False, patience=1)
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
