"""The SQLite log stores records in batch rows (``log/record_batch.py``).

The log contract tests say what a reader sees; these pin what the batch
format adds underneath: reads that start, stop and end inside a batch, byte
columns with None and empty items, headers on some records only, batches
with the offset gaps compaction leaves, record deletion and truncation
inside a batch, and logs written one row per record converted on open.
"""

from __future__ import annotations

import marshal
import sqlite3
from pathlib import Path

import pytest

from eddyline_runtime.log import LogError, OffsetOutOfRangeError, Record, SqliteLog
from eddyline_runtime.log.record_batch import MAX_BATCH_RECORDS, DecodedBatch, encode_batch
from eddyline_runtime.partitions import TopicPartition

TP = TopicPartition("topic", 0)
CHANGELOG = TopicPartition("changelog", 0)


@pytest.fixture
def log(tmp_path: Path) -> SqliteLog:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("topic", 1)
    log.create_topic("changelog", 1, compacted=True)
    return log


def batch_rows(log: SqliteLog, tp: TopicPartition) -> list[tuple[int, int]]:
    with sqlite3.connect(log.path) as db:
        return db.execute(
            "SELECT base_offset, last_offset FROM record_batches b JOIN topics t "
            "ON t.id = b.topic_id WHERE t.name = ? AND b.partition = ? ORDER BY last_offset",
            (tp.topic, tp.partition),
        ).fetchall()


def test_a_batch_round_trips_none_and_empty_items_and_sparse_headers() -> None:
    keys: list[bytes | None] = [b"a", None, b"", b"dd", None]
    values: list[bytes | None] = [b"", b"v", None, b"x" * 300, b"e"]
    headers = [(), (("h", b"\x00\xff"),), (), (), (("a", b""), ("b", b"2"))]
    offsets = [3, 4, 9, 10, 40]
    encoded = encode_batch(offsets, keys, values, [1, -2, 3, 2**40, 0], headers)
    row = (
        encoded.base_offset,
        encoded.record_count,
        encoded.offsets,
        encoded.keys,
        encoded.values,
        encoded.timestamps,
        encoded.headers,
    )
    batch = DecodedBatch(row)
    assert (batch.base_offset, batch.record_count) == (3, 5)
    assert list(batch.offsets(0, 5)) == offsets
    assert batch.keys(0, 5) == keys and batch.values(0, 5) == values
    assert batch.keys(1, 4) == keys[1:4] and batch.values(2, 3) == [None]
    assert batch.timestamps(1, 4) == [-2, 3, 2**40]
    assert batch.headers(0, 5) == headers and batch.headers(1, 2) == [headers[1]]
    assert batch.index_of(5) == 2 and batch.index_of(41) == 5 and batch.index_of(0) == 0


def test_consecutive_offsets_are_implied_and_headerless_batches_store_none() -> None:
    encoded = encode_batch(range(7, 10), [b"a"] * 3, [b"b"] * 3, [0, 0, 0], None)
    assert encoded.offsets is None and encoded.headers is None
    assert (encoded.base_offset, encoded.last_offset, encoded.record_count) == (7, 9, 3)


def test_large_appends_are_split_into_batches_and_read_back_across_them(log: SqliteLog) -> None:
    total = 2 * MAX_BATCH_RECORDS + 10
    log.produce(TP, [Record(b"k%d" % i, b"v%d" % i, i) for i in range(total)])
    assert len(batch_rows(log, TP)) == 3
    # A read starting and ending inside batches returns exactly the asked records.
    start = MAX_BATCH_RECORDS - 5
    fetched = log.fetch(TP, start, MAX_BATCH_RECORDS + 10)
    assert [r.offset for r in fetched.records] == list(range(start, start + MAX_BATCH_RECORDS + 10))
    assert [r.value for r in fetched.records[:2]] == [b"v%d" % start, b"v%d" % (start + 1)]
    assert fetched.end_offset == total
    columns = log.fetch_columns(TP, total - 3, 100)
    assert list(columns.offsets) == [total - 3, total - 2, total - 1]
    assert list(columns.timestamps) == [total - 3, total - 2, total - 1]
    assert log.fetch_columns(TP, total, 100).offsets == []


def test_headers_on_some_records_of_some_batches_come_back_on_those_only(log: SqliteLog) -> None:
    log.produce(TP, [Record(b"a", b"1", 0), Record(b"b", b"2", 0)])
    log.produce(TP, [Record(b"c", b"3", 0, (("trace", b"t1"),)), Record(b"d", b"4", 0)])
    records = log.fetch(TP, 0).records
    assert [r.headers for r in records] == [(), (), (("trace", b"t1"),), ()]
    assert log.fetch_columns(TP, 0, 2).headers is None  # none in the records read
    assert list(log.fetch_columns(TP, 1).headers or []) == [(), (("trace", b"t1"),), ()]


def test_changes_skip_keyless_records_but_count_them_as_read(log: SqliteLog) -> None:
    log.produce(
        CHANGELOG,
        [
            Record(b"a", b"1", 0),
            Record(None, b"x", 0),
            Record(b"b", None, 0),
            Record(None, b"y", 0),
        ],
    )
    changes = log.fetch_changes(CHANGELOG, 0)
    assert list(changes.entries) == [(b"a", b"1"), (b"b", None)] and changes.last_offset == 3
    between = log.fetch_changes_between(CHANGELOG, 1, 4)
    assert (list(between.offsets), list(between.keys), list(between.values)) == (
        [2],
        [b"b"],
        [None],
    )
    assert between.last_offset == 3
    keyless = log.fetch_changes_between(CHANGELOG, 3, 4)
    assert list(keyless.keys) == [] and keyless.last_offset == 3


def test_compaction_leaves_gaps_that_reads_inside_a_batch_skip(log: SqliteLog) -> None:
    log.produce(CHANGELOG, [Record(b"k%d" % (i % 3), b"%d" % i, i) for i in range(30)])
    assert log.compact("changelog") == 27
    assert [(r.offset, r.key) for r in log.fetch(CHANGELOG, 0).records] == [
        (27, b"k0"),
        (28, b"k1"),
        (29, b"k2"),
    ]
    assert [r.offset for r in log.fetch(CHANGELOG, 28).records] == [28, 29]
    assert [r.offset for r in log.fetch(CHANGELOG, 5, 1).records] == [27]
    between = log.fetch_changes_between(CHANGELOG, 0, 29)
    assert list(between.offsets) == [27, 28] and between.last_offset == 28
    log.produce(CHANGELOG, [Record(b"k0", b"new", 0)])  # appends continue at the end
    assert [r.offset for r in log.fetch(CHANGELOG, 0).records] == [27, 28, 29, 30]


def test_delete_records_inside_a_batch_hides_what_lies_below_the_new_start(
    log: SqliteLog,
) -> None:
    log.produce(TP, [Record(b"k", b"%d" % i, 0) for i in range(10)])
    assert log.delete_records(TP, 4) == 4
    assert log.beginning_offset(TP) == 4
    assert [r.value for r in log.fetch(TP, 4).records] == [b"%d" % i for i in range(4, 10)]
    with pytest.raises(OffsetOutOfRangeError):
        log.fetch(TP, 3)
    assert log.delete_records(TP, 4) == 0
    assert log.delete_records(TP, 10) == 6 and batch_rows(log, TP) == []


def test_truncate_inside_a_batch_keeps_what_lies_below_and_gives_offsets_again(
    log: SqliteLog,
) -> None:
    log.produce(TP, [Record(b"k", b"old%d" % i, 0) for i in range(10)])
    epoch = log.partition_epoch(TP)
    assert log.truncate(TP, 6) == 4
    assert log.end_offset(TP) == 6 and log.partition_epoch(TP) != epoch
    log.produce(TP, [Record(b"k", b"new%d" % i, 0) for i in range(3)])
    assert [r.value for r in log.fetch(TP, 4).records] == [
        b"old4",
        b"old5",
        b"new0",
        b"new1",
        b"new2",
    ]
    assert log.truncate(TP, 9) == 0
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate(TP, 10)


def write_one_row_per_record_log(path: Path) -> None:
    """A log as eddyline wrote it before record batches."""
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE topics (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,"
            " partitions INTEGER NOT NULL, compacted INTEGER NOT NULL, uuid TEXT)"
        )
        db.execute(
            "CREATE TABLE partitions (topic_id INTEGER NOT NULL, partition INTEGER NOT NULL,"
            " log_start INTEGER NOT NULL DEFAULT 0, next_offset INTEGER NOT NULL DEFAULT 0,"
            " epoch INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (topic_id, partition)) WITHOUT ROWID"
        )
        db.execute(
            "CREATE TABLE records (topic_id INTEGER NOT NULL, partition INTEGER NOT NULL,"
            " offset INTEGER NOT NULL, key BLOB, value BLOB, timestamp INTEGER NOT NULL,"
            " headers TEXT, PRIMARY KEY (topic_id, partition, offset)) WITHOUT ROWID"
        )
        db.execute("INSERT INTO topics VALUES (1, 'old', 2, 1, 'abc')")
        db.execute("INSERT INTO partitions VALUES (1, 0, 0, 4, 0), (1, 1, 0, 0, 0)")
        db.executemany(
            "INSERT INTO records VALUES (1, 0, ?, ?, ?, ?, ?)",
            [
                (0, b"a", b"1", 10, None),
                (2, b"b", None, 11, '[["h", "ff"]]'),  # offset 1 was compacted away
                (3, None, b"3", 12, None),
            ],
        )


def test_a_log_written_one_row_per_record_is_converted_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write_one_row_per_record_log(path)
    with pytest.raises(LogError, match=r"earlier eddyline.*open it once read-write"):
        SqliteLog(path, read_only=True)
    log = SqliteLog(path)
    old = TopicPartition("old", 0)
    assert [
        (r.offset, r.key, r.value, r.timestamp, r.headers) for r in log.fetch(old, 0).records
    ] == [
        (0, b"a", b"1", 10, ()),
        (2, b"b", None, 11, (("h", b"\xff"),)),
        (3, None, b"3", 12, ()),
    ]
    assert log.produce(old, [Record(b"c", b"4", 13)]) == [4]
    with sqlite3.connect(path) as db:
        assert (
            db.execute("SELECT name FROM sqlite_master WHERE name = 'records'").fetchone() is None
        )
    assert [r.offset for r in SqliteLog(path, read_only=True).fetch(old, 1).records] == [2, 3, 4]


def test_a_damaged_column_fails_the_read_with_an_error_that_says_so(log: SqliteLog) -> None:
    log.produce(TP, [Record(b"k%d" % i, b"v", 0) for i in range(3)])
    with sqlite3.connect(log.path) as db:
        db.execute("UPDATE record_batches SET vals = substr(vals, 1, 7)")
    with pytest.raises(LogError, match=r"records of topic-0 stored from offset 0 on are damaged"):
        log.fetch(TP, 0)
    with sqlite3.connect(log.path) as db:
        db.execute("UPDATE record_batches SET keys = ?", (marshal.dumps([b"one"]),))
    with pytest.raises(LogError, match="one item per record"):
        log.fetch_columns(TP, 0)
