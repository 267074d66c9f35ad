"""The embedded log's record size limit: SQLite's own, SQLITE_LIMIT_LENGTH.

SQLite stores no blob larger than SQLITE_LIMIT_LENGTH (1 GB unless built
otherwise); the log reports it as ``record_size_limit`` so the sink hands a
larger record to the production handler instead of failing the write.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from eddyline_runtime.log import Record, SqliteLog, UnknownTopicError
from eddyline_runtime.log.record_size import RecordSizeLimit, record_size_upper_bound
from eddyline_runtime.partitions import TopicPartition

OUT = TopicPartition("out", 0)


@pytest.fixture
def log(tmp_path: Path) -> SqliteLog:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("out", 1)
    return log


def test_the_limit_is_sqlites_blob_limit(log: SqliteLog) -> None:
    default = sqlite3.connect(":memory:").getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
    assert log.record_size_limit("out") == RecordSizeLimit(default, "SQLITE_LIMIT_LENGTH")


def test_an_unknown_topic_is_named(log: SqliteLog) -> None:
    with pytest.raises(UnknownTopicError, match='topic "nope" does not exist'):
        log.record_size_limit("nope")


def test_what_fits_the_limit_is_stored_and_what_does_not_is_refused_by_sqlite(
    log: SqliteLog,
) -> None:
    """The limit is real: lowered on this thread's connection (the one that writes), a
    record whose estimate fits it is stored, and one whose value alone is over it is
    refused by SQLite itself, which is what the sink's check keeps from the log."""
    log._connection().setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 4_000)
    limit = log.record_size_limit("out")
    assert limit is not None
    assert limit.max_bytes == 4_000
    fits = b"x" * (limit.max_bytes - 100)
    assert record_size_upper_bound(None, fits) <= limit.max_bytes
    log.produce(OUT, [Record(None, fits, 1)])
    assert [record.value for record in log.fetch(OUT, 0).records] == [fits]
    with pytest.raises(sqlite3.DataError, match="too big"):
        log.produce(OUT, [Record(None, b"x" * (limit.max_bytes + 1), 2)])
