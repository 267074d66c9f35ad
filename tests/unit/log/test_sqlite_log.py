"""What the embedded SQLite log does beyond the log contract: compaction and record deletion.

Neither is on the log port: a Kafka broker compacts on its own schedule, and
the runtime never asks for either. Tests use them to shape changelogs the way
a broker's cleaner and retention would (records gone below the log start,
latest record per key kept).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from eddyline_runtime.log import LogError, OffsetOutOfRangeError, Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from tests.unit.log.test_log_contract import IN, fetch_all, rec, values


@pytest.fixture
def log(tmp_path: Path) -> SqliteLog:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("app-input", 2)
    return log


def test_compact_keeps_only_the_latest_record_per_key(log: SqliteLog) -> None:
    log.create_topic("store-changelog", 1, compacted=True)
    changelog = TopicPartition("store-changelog", 0)
    log.produce(
        changelog,
        [
            Record(b"x", b"x1", 10),  # 0 kept: only record of x
            Record(b"a", b"a1", 11),  # 1
            Record(b"b", b"b1", 12),  # 2
            Record(b"a", b"a2", 13),  # 3
            Record(b"b", b"b2", 14, (("h", b"v"),)),  # 4 kept
            Record(b"a", None, 15),  # 5 kept: a tombstone is the latest record of a
        ],
    )
    assert log.compact("store-changelog") == 3
    assert list(log.fetch(changelog, 0).records) == [
        Record(b"x", b"x1", 10, (), 0),
        Record(b"b", b"b2", 14, (("h", b"v"),), 4),
        Record(b"a", None, 15, (), 5),
    ]
    assert log.end_offset(changelog) == 6
    assert log.compact("store-changelog") == 0


def test_fetch_from_a_compacted_away_offset_returns_the_next_remaining_records(
    log: SqliteLog,
) -> None:
    log.create_topic("store-changelog", 1, compacted=True)
    changelog = TopicPartition("store-changelog", 0)
    log.produce(changelog, [rec(b"%d" % i, key=b"k%d" % (i % 3)) for i in range(9)])
    assert log.compact("store-changelog") == 6
    result = log.fetch(changelog, 1)
    assert [(r.offset, r.key, r.value) for r in result.records] == [
        (6, b"k0", b"6"),
        (7, b"k1", b"7"),
        (8, b"k2", b"8"),
    ]
    assert result.end_offset == 9
    assert [r.offset for r in log.fetch(changelog, 7, max_records=1).records] == [7]


def test_compaction_is_per_partition_and_appending_continues_after_it(log: SqliteLog) -> None:
    log.create_topic("store-changelog", 2, compacted=True)
    p0, p1 = TopicPartition("store-changelog", 0), TopicPartition("store-changelog", 1)
    log.produce(p0, [rec(b"0-old", key=b"a"), rec(b"0-new", key=b"a")])
    log.produce(p1, [rec(b"1-only", key=b"a")])
    assert log.compact("store-changelog") == 1
    assert [(r.offset, r.value) for r in fetch_all(log, p0)] == [(1, b"0-new")]
    assert [(r.offset, r.value) for r in fetch_all(log, p1)] == [(0, b"1-only")]
    assert log.produce(p0, [rec(b"0-newest", key=b"a")]) == [2]
    assert values(log.fetch(p0, 1)) == [b"0-new", b"0-newest"]


def test_compact_leaves_other_topics_alone(log: SqliteLog) -> None:
    log.create_topic("store-changelog", 1, compacted=True)
    log.produce(IN, [rec(b"1"), rec(b"2")])
    log.compact("store-changelog")
    assert values(log.fetch(IN, 0)) == [b"1", b"2"]


def test_compacting_a_topic_that_is_not_compacted_is_refused(log: SqliteLog) -> None:
    log.create_topic("events", 1)
    log.produce(TopicPartition("events", 0), [rec(b"1"), rec(b"2")])
    with pytest.raises(LogError, match="not compacted"):
        log.compact("events")
    assert len(fetch_all(log, TopicPartition("events", 0))) == 2


def test_delete_records_moves_the_log_start_and_keeps_the_end(log: SqliteLog) -> None:
    log.produce(IN, [rec(b"%d" % i) for i in range(10)])
    assert log.delete_records(IN, 4) == 4
    assert (log.beginning_offset(IN), log.end_offset(IN)) == (4, 10)
    assert [r.offset for r in fetch_all(log, IN)] == list(range(4, 10))
    with pytest.raises(OffsetOutOfRangeError):
        log.fetch(IN, 3)
    assert log.delete_records(IN, 2) == 0  # the start never moves back
    assert log.beginning_offset(IN) == 4
    assert log.produce(IN, [rec(b"10")]) == [10]


def test_delete_records_beyond_the_end_is_refused(log: SqliteLog) -> None:
    log.produce(IN, [rec(b"0")])
    with pytest.raises(OffsetOutOfRangeError, match=r"valid: 0\.\.1"):
        log.delete_records(IN, 2)
    assert log.delete_records(IN, 1) == 1
    assert (log.beginning_offset(IN), log.end_offset(IN)) == (1, 1)


# The partition epoch: what a store keeps beside its committed changelog offset


def test_the_epoch_stays_through_appends_compaction_and_record_deletion(
    log: SqliteLog,
) -> None:
    log.create_topic("store-changelog", 1, compacted=True)
    changelog = TopicPartition("store-changelog", 0)
    epoch = log.partition_epoch(changelog)
    log.produce(changelog, [rec(b"%d" % i, key=b"k%d" % (i % 2)) for i in range(6)])
    log.compact("store-changelog")
    log.delete_records(changelog, 5)
    assert log.partition_epoch(changelog) == epoch
    assert log.partition_epoch(TopicPartition("store-changelog", 0)) != log.partition_epoch(IN)


def test_truncating_a_partition_by_hand_in_sqlite_starts_a_new_epoch(
    log: SqliteLog, tmp_path: Path
) -> None:
    for i in range(10):  # a batch row each, so SQL can cut between any two
        log.produce(IN, [rec(b"%d" % i)])
    before = log.partition_epoch(IN)
    with sqlite3.connect(tmp_path / "log.db") as db:
        db.execute("DELETE FROM record_batches WHERE partition = 0 AND last_offset >= 4")
        db.execute("UPDATE partitions SET next_offset = 4 WHERE partition = 0")
    after = log.partition_epoch(IN)
    assert after != before
    log.produce(IN, [rec(b"again")] * 10)  # growing back past 10 does not restore the epoch
    assert log.partition_epoch(IN) == after
    assert log.partition_epoch(TopicPartition("app-input", 1)) != after


def test_a_topic_created_again_is_another_incarnation(tmp_path: Path) -> None:
    first = SqliteLog(tmp_path / "a.db")
    first.create_topic("changelog", 1, compacted=True)
    epoch = first.partition_epoch(TopicPartition("changelog", 0))
    first.close()
    (tmp_path / "a.db").unlink()
    second = SqliteLog(tmp_path / "a.db")
    second.create_topic("changelog", 1, compacted=True)
    assert second.partition_epoch(TopicPartition("changelog", 0)) != epoch


def test_a_log_written_before_epochs_existed_gains_them(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the schema of earlier versions
        db.execute(
            "CREATE TABLE topics (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,"
            " partitions INTEGER NOT NULL, compacted INTEGER NOT NULL)"
        )
        db.execute(
            "CREATE TABLE partitions (topic_id INTEGER NOT NULL, partition INTEGER NOT NULL,"
            " log_start INTEGER NOT NULL DEFAULT 0, next_offset INTEGER NOT NULL DEFAULT 0,"
            " PRIMARY KEY (topic_id, partition)) WITHOUT ROWID"
        )
        db.execute("INSERT INTO topics VALUES (1, 'old', 1, 0)")
        db.execute("INSERT INTO partitions (topic_id, partition) VALUES (1, 0)")
    log = SqliteLog(path)
    epoch = log.partition_epoch(TopicPartition("old", 0))
    assert epoch.endswith(":0") and len(epoch) > 10
    assert SqliteLog(path).partition_epoch(TopicPartition("old", 0)) == epoch


def test_a_log_put_back_from_a_backup_names_its_new_epochs_apart_from_the_lost_ones(
    tmp_path: Path,
) -> None:
    """The restored log numbers its next epoch as the lost history did; the tag tells them
    apart, and the epoch the backup ended in ends where the restored log's writer began."""
    path, backup = tmp_path / "log.db", tmp_path / "backup.db"
    tp = TopicPartition("changelog", 0)
    log = SqliteLog(path)
    log.create_topic("changelog", 1)
    log.produce(tp, [rec(b"k")] * 10)
    at_backup = log.partition_epoch(tp)
    log.close()
    with sqlite3.connect(path) as live, sqlite3.connect(backup) as copy:
        live.backup(copy)
    log = SqliteLog(path)
    lost = log.start_epoch(tp)  # a writer began after the backup, and wrote on
    log.produce(tp, [rec(b"k")] * 10)
    log.close()
    with sqlite3.connect(backup) as copy, sqlite3.connect(path) as live:
        copy.backup(live)
    log = SqliteLog(path)
    try:
        assert log.epoch_end_offset(tp, at_backup) == 10  # until a writer begins: the end
        regrown = log.start_epoch(tp)
        log.produce(tp, [rec(b"other")] * 30)
        assert lost is not None and regrown is not None
        assert regrown != lost and regrown.split(".")[0] == lost.split(".")[0]
        assert log.epoch_end_offset(tp, lost) is None  # not this log's history: REPLACED
        assert log.epoch_end_offset(tp, at_backup) == 10  # a copy past 10 is REPLACED
        assert log.epoch_end_offset(tp, regrown) == 40
    finally:
        log.close()


def test_a_full_disk_is_reported_as_such_and_the_log_keeps_working(log: SqliteLog) -> None:
    """SQLite rolls back by itself when the disk fills; the adapter's own ROLLBACK then failed
    with "cannot rollback - no transaction is active", hiding the reason."""
    tp = TopicPartition("full", 0)
    log.create_topic("full", 1)
    log.produce(tp, [Record(b"k", b"first", 0)])
    connection = log._connection()  # the thread's connection: its page limit stands for a disk
    pages = connection.execute("PRAGMA page_count").fetchone()[0]
    connection.execute(f"PRAGMA max_page_count = {pages + 2}")
    big = [Record(None, bytes(1000), 0) for _ in range(2_000)]
    with pytest.raises(LogError) as refused:
        log.produce(tp, big)
    message = str(refused.value)
    assert "the disk is full" in message and "Free space" in message, message
    assert "cannot rollback" not in message
    connection.execute("PRAGMA max_page_count = 1073741823")  # space freed
    log.produce(tp, [Record(b"k", b"second", 0)])
    assert [r.value for r in log.fetch(tp, 0, 10).records] == [b"first", b"second"]


def test_the_epoch_history_says_where_each_epoch_ended(log: SqliteLog, tmp_path: Path) -> None:
    """KIP-101's question on the embedded log: until which offset does an epoch's data hold?"""
    tp = TopicPartition("hist", 0)
    log.create_topic("hist", 1, compacted=True)
    log.produce(tp, [Record(b"k%d" % (i % 3), b"v%d" % i, 0) for i in range(10)])
    first = log.partition_epoch(tp)
    assert first is not None
    assert log.epoch_end_offset(tp, first) == 10  # the current epoch runs to the end
    log.compact("hist")  # rewrites batches, changes no record: same epoch
    log.produce(tp, [Record(b"k9", b"later", 0)])
    assert log.partition_epoch(tp) == first
    log.truncate(tp, 8)
    second = log.partition_epoch(tp)
    assert second != first
    assert log.epoch_end_offset(tp, first) == 8
    log.record_divergence(tp)  # a copy saw offsets the log lost
    third = log.partition_epoch(tp)
    assert third not in (first, second)
    assert log.epoch_end_offset(tp, second) == 8
    assert log.epoch_end_offset(tp, first) == 8
    assert log.epoch_end_offset(tp, "another-topic:0") is None
    # A hand edit that rewrites a record in place starts an epoch at that batch.
    with sqlite3.connect(tmp_path / "log.db") as db:
        db.execute(
            "UPDATE record_batches SET timestamps = timestamps WHERE partition = 0 AND "
            "topic_id = (SELECT id FROM topics WHERE name = 'hist')"
        )
    assert log.partition_epoch(tp) not in (first, second, third)
    # Its first batch starts at offset 7, the first record compaction kept.
    assert log.epoch_end_offset(tp, third) == 7


def test_epoch_at_names_the_epoch_that_wrote_each_offset(log: SqliteLog) -> None:
    """What a Spark build is stamped with: the epoch that wrote its last offset, never the
    one a writer began at the end after it (docs/state.md, "Epochs")."""
    tp = TopicPartition("hist", 0)
    log.create_topic("hist", 1, compacted=True)
    zero = log.partition_epoch(tp)
    log.produce(tp, [rec(b"%d" % i) for i in range(5)])  # 0..4 in epoch 0
    first = log.start_epoch(tp)  # a writer begins at 5
    log.produce(tp, [rec(b"%d" % i) for i in range(5)])  # 5..9
    second = log.start_epoch(tp)  # another begins at 10, writes nothing yet
    assert [log.epoch_at(tp, offset) for offset in (0, 4, 5, 9)] == [zero, zero, first, first]
    assert log.epoch_end_offset(tp, first) == 10 and second == log.partition_epoch(tp)
    assert log.epoch_at(tp, 10) is None  # not written yet: no epoch wrote it
    log.truncate(tp, 7)  # 7..9 are gone; offsets from 7 belong to the truncation's epoch
    log.produce(tp, [rec(b"again")] * 3)
    again = log.partition_epoch(tp)
    assert [log.epoch_at(tp, offset) for offset in (6, 7, 9)] == [first, again, again]
    assert log.epoch_at(tp, -1) is None


def test_epoch_at_before_the_history_began_answers_the_epoch_now(tmp_path: Path) -> None:
    """A log whose early epochs have no history row: which epoch wrote an old offset is
    unknown, so the epoch now is named (a copy stamped with it is refused, not trusted,
    once a writer begins)."""
    log = SqliteLog(tmp_path / "log.db")
    tp = TopicPartition("old", 0)
    log.create_topic("old", 1)
    log.produce(tp, [rec(b"%d" % i) for i in range(4)])
    log.start_epoch(tp)
    log.start_epoch(tp)
    log.close()
    with sqlite3.connect(tmp_path / "log.db") as db:  # as if epoch 1 ended before history
        db.execute("DELETE FROM partition_epochs WHERE epoch = 1")
    log = SqliteLog(tmp_path / "log.db")
    try:
        assert log.epoch_at(tp, 2) == log.partition_epoch(tp)
    finally:
        log.close()
