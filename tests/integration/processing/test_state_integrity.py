"""Damage that is not a crash never makes the runtime serve wrong state.

Word count under exactly-once, stopped cleanly, then damaged for real: a
store's files deleted but its hidden ``.checkpoint``, RocksDB's ``CURRENT``
deleted, the changelog truncated in SQLite and grown back, records deleted
from the changelog's start, a store directory copied from another task. After
the restart every store must equal what its changelog says (rebuilt, with a
warning naming it), never the stale copy, never the stale copy plus a tail.
Where the changelog lost records the store applied, the task first stops until
the loss is accepted or the copy republished (docs/state.md); these tests
accept it as ``eddyline state accept-loss`` does, unless they test republishing.
"""

from __future__ import annotations

import logging
import marshal
import shutil
import sqlite3
import subprocess
import sys
from array import array
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsFailedError, StreamsInstance
from eddyline_runtime.engine.task_manager import RestoreReport
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.metrics import MetricName
from eddyline_runtime.partitions import TaskId, TopicPartition, partition_for_key
from eddyline_runtime.restore.replay import restore
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import InMemoryStore, RocksDBStore, StoreCorruptedError, store_directory
from eddyline_runtime.state.state_directory import (
    DECISION_LOSS_ACCEPTED,
    quarantine_directory,
    read_quarantine_note,
    record_decision,
    waiting_for_decision,
)
from tests.support.word_count import APP, INPUT, STORE, word_count

PARTITIONS = 2
COUNTING = 1  # word_count(): sub-topology 1 counts
CHANGELOG = f"{APP}-{STORE}-changelog"
LONGS = serde_for("long")
LINES = ["the quick brown fox", "jumps over the lazy dog", "the end"] * 40


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(INPUT, PARTITIONS)
    yield log
    log.close()


def produce(log: SqliteLog, lines: list[str]) -> None:
    for partition in range(PARTITIONS):
        log.produce(
            TopicPartition(INPUT, partition),
            [Record(None, line.encode(), i) for i, line in enumerate(lines[partition::PARTITIONS])],
        )


def run(log: SqliteLog, state_dir: Path, **settings: object) -> dict[TaskId, RestoreReport]:
    restored: list[RestoreReport] = []
    config = StreamsConfig.from_properties(
        {
            "application.id": APP,
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            **settings,
        }
    )
    instance = StreamsInstance(word_count(), config, log, on_restore=[restored.append])
    instance.start()
    try:
        instance.wait_until_caught_up(60)
    finally:
        instance.close()
    return {report.task: report for report in restored}


def accept_losses(state_dir: Path, log: SqliteLog) -> list[Path]:
    """What `eddyline state accept-loss` does, for every copy waiting for a decision."""
    folder = quarantine_directory(state_dir)
    decided = []
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        note = read_quarantine_note(entry)
        if note is not None and waiting_for_decision(note):
            record_decision(entry, DECISION_LOSS_ACCEPTED)
            changelog = note["changelog"]
            log.release_changelog(TopicPartition(changelog["topic"], changelog["partition"]))
            decided.append(entry)
    return decided


def run_accepting_losses(
    log: SqliteLog, state_dir: Path, **settings: object
) -> dict[TaskId, RestoreReport]:
    """Run; a task stopped by a changelog loss (one per start) has the loss accepted, and
    the run starts again."""
    for _ in range(PARTITIONS + 1):
        try:
            return run(log, state_dir, **settings)
        except StreamsFailedError as failed:
            assert "eddyline state accept-loss" in str(failed), failed
            assert accept_losses(state_dir, log), "stopped, but no copy waits for a decision"
    raise AssertionError(f"still stopped after accepting {PARTITIONS} losses")


def store_path(state_dir: Path, partition: int) -> Path:
    return store_directory(state_dir, TaskId(COUNTING, partition), STORE)


def store_contents(state_dir: Path, partition: int) -> dict[bytes, bytes]:
    with RocksDBStore(STORE, store_path(state_dir, partition)) as store:
        return dict(store.all())


def changelog_replay(log: SqliteLog, partition: int) -> dict[bytes, bytes]:
    """What a store rebuilt from the changelog as it is now holds."""
    rebuilt = InMemoryStore(STORE)
    restore(rebuilt, log, TopicPartition(CHANGELOG, partition))
    return dict(rebuilt.all())


def counts(contents: dict[bytes, bytes]) -> dict[str, int]:
    return {key.decode(): LONGS.deserialize(value) for key, value in contents.items()}


def expected_counts(lines: list[str], partition: int) -> dict[str, int]:
    every = Counter(word for line in lines for word in line.split())
    mine = {k for k, _ in changelog_keys(partition, every)}
    return {word: n for word, n in every.items() if word in mine}


def changelog_keys(partition: int, every: Counter[str]) -> list[tuple[str, int]]:

    return [
        (w, n) for w, n in every.items() if partition_for_key(w.encode(), PARTITIONS) == partition
    ]


def committed_offset(state_dir: Path, partition: int) -> int:
    with RocksDBStore(STORE, store_path(state_dir, partition)) as store:
        offset = store.committed_offset(TopicPartition(CHANGELOG, partition))
    assert offset is not None
    return offset


@pytest.fixture
def counted(tmp_path: Path, log: SqliteLog) -> Path:
    """The word count run once over LINES; returns its state.dir."""
    state_dir = tmp_path / "state"
    produce(log, LINES)
    run(log, state_dir)
    assert counts(store_contents(state_dir, 0)) == expected_counts(LINES, 0)
    return state_dir


def test_a_store_whose_files_were_deleted_but_its_checkpoint_is_rebuilt_in_full(
    counted: Path, log: SqliteLog, caplog: pytest.LogCaptureFixture
) -> None:
    directory = store_path(counted, 0)
    for entry in directory.iterdir():
        if entry.name != ".checkpoint":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    produce(log, ["the end"])
    with caplog.at_level(logging.WARNING):
        restored = run(log, counted)
    assert "ignoring .checkpoint" in caplog.text
    assert restored[TaskId(COUNTING, 0)].result.first_offset == 0  # a full replay
    assert counts(store_contents(counted, 0)) == expected_counts([*LINES, "the end"], 0)


def test_a_store_whose_rocksdb_current_file_was_deleted_is_never_trusted_as_caught_up(
    counted: Path, log: SqliteLog
) -> None:
    (store_path(counted, 0) / "CURRENT").unlink()
    # The first open fails loudly, naming the store as corrupted ...
    with pytest.raises(StreamsFailedError) as failed:
        run(log, counted)
    assert isinstance(failed.value.__cause__, StoreCorruptedError) or "corrupted" in str(
        failed.value
    )
    # ... and the open after it (what a restarting replica does) rebuilds it in full.
    restored = run(log, counted)
    assert restored[TaskId(COUNTING, 0)].result.first_offset == 0
    assert counts(store_contents(counted, 0)) == expected_counts(LINES, 0)


def truncate_in_sqlite(log_path: Path, partition: int, to_offset: int) -> None:
    """What an unclean leader election (or a tool) does: cut the changelog's end back."""
    log = SqliteLog(log_path)
    try:
        log.truncate(TopicPartition(CHANGELOG, partition), to_offset)
    finally:
        log.close()


def test_a_changelog_truncated_and_grown_back_past_the_store_rebuilds_the_store(
    counted: Path, log: SqliteLog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    committed = committed_offset(counted, 0)
    changelog = TopicPartition(CHANGELOG, 0)
    truncate_in_sqlite(tmp_path / "log.db", 0, committed - 5)
    # Another writer's records take the offsets the store had already seen.
    log.produce(changelog, [Record(b"zz%d" % i, LONGS.serialize(i), 0) for i in range(20)])
    assert log.end_offset(changelog) > committed + 1
    with pytest.raises(StreamsFailedError) as stopped:
        run(log, counted)
    assert '"counts" (task 1_0)' in str(stopped.value) and "truncated" in str(stopped.value)
    run_accepting_losses(log, counted)
    assert store_contents(counted, 0) == changelog_replay(log, 0)


def test_a_changelog_that_lost_the_records_after_the_store_rebuilds_the_store(
    counted: Path, log: SqliteLog
) -> None:
    committed = committed_offset(counted, 0)
    changelog = TopicPartition(CHANGELOG, 0)
    log.produce(changelog, [Record(b"zz%d" % i, LONGS.serialize(i), 0) for i in range(20)])
    log.delete_records(changelog, committed + 10)  # retention took records the store lacks
    restored = run(log, counted)
    assert restored[TaskId(COUNTING, 0)].result.first_offset == committed + 10
    assert store_contents(counted, 0) == changelog_replay(log, 0)


def test_a_store_directory_copied_from_another_task_is_rebuilt_not_treated_as_new(
    counted: Path, log: SqliteLog, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.rmtree(store_path(counted, 0))
    shutil.copytree(store_path(counted, 1), store_path(counted, 0))
    (store_path(counted, 0) / "eddyline.lock").unlink()
    with caplog.at_level(logging.WARNING):
        run(log, counted)
    assert "holds no offset for its changelog" in caplog.text
    assert counts(store_contents(counted, 0)) == expected_counts(LINES, 0)
    assert store_contents(counted, 0) == changelog_replay(log, 0)


# -- the copy a rebuild sets aside, and writing it back ----------------------------------


def test_a_truncation_sets_the_old_copy_aside_stops_and_republish_restores_what_was_lost(
    counted: Path, log: SqliteLog, tmp_path: Path
) -> None:
    """Tail truncation lost counts the store still held: the store is the best copy left.

    The rebuild must not delete it (it used to: 26,055 word occurrences gone with exit 0
    and a warning), nor publish lower counts from the changelog (it did: 8,363 occurrences
    lost); it goes to the quarantine with a note, the task stops with an error naming it,
    and ``eddyline state republish`` writes it back into the changelog.
    """
    before = store_contents(counted, 0)
    committed = committed_offset(counted, 0)
    truncate_in_sqlite(tmp_path / "log.db", 0, committed - 3)
    assert changelog_replay(log, 0) != before  # the changelog alone lost counts
    with pytest.raises(StreamsFailedError) as stopped:
        run(log, counted)
    entries = [e for e in quarantine_directory(counted).iterdir() if read_quarantine_note(e)]
    assert len(entries) == 1, entries
    entry = entries[0]
    note = read_quarantine_note(entry)
    assert note is not None
    assert note["store"] == STORE and note["verdict"] == "replaced"
    assert note["changelog"] == {"topic": CHANGELOG, "partition": 0}
    assert note["committed"] == committed and note["decision"] == "pending"
    message = str(stopped.value)
    assert '"counts"' in message and str(entry) in message
    assert "eddyline state republish" in message
    with RocksDBStore(STORE, entry) as kept:  # the old copy, whole
        assert dict(kept.all()) == before

    republished = subprocess.run(
        [
            *(sys.executable, "-m", "eddyline_runtime.cli", "state", "republish", str(entry)),
            *("--log", f"sqlite:///{tmp_path / 'log.db'}"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert republished.returncode == 0, republished.stderr
    assert f"republished {len(before)} records" in republished.stdout
    assert (read_quarantine_note(entry) or {})["decision"] == "republished"
    run(log, counted)
    assert store_contents(counted, 0) == before  # what the truncation took is back
    assert counts(store_contents(counted, 0)) == expected_counts(LINES, 0)


def test_stores_set_aside_are_kept_within_the_configured_count(
    counted: Path, log: SqliteLog, tmp_path: Path
) -> None:
    for entry_number in range(3):
        committed = committed_offset(counted, 0)
        truncate_in_sqlite(tmp_path / "log.db", 0, committed)  # the last record lost
        produce(log, [f"round{entry_number} again"])
        run_accepting_losses(log, counted)
    kept = [e for e in quarantine_directory(counted).iterdir() if read_quarantine_note(e)]
    assert len(kept) == 3
    newest = max(kept, key=lambda e: (read_quarantine_note(e) or {})["set_aside_at"])
    config = StreamsConfig.from_properties(
        {
            "application.id": APP,
            "state.dir": str(counted),
            "processing.guarantee": "exactly_once_v2",
            "state.quarantine.max.stores": 1,
        }
    )
    instance = StreamsInstance(word_count(), config, log)
    instance.start()
    try:
        instance.wait_until_caught_up(60)
        assert (
            instance.metrics.snapshot()[
                MetricName.of("stream-metrics", "state-set-aside-stores-total")
            ]
            == 0.0
        )
    finally:
        instance.close()
    left = [e for e in quarantine_directory(counted).iterdir() if read_quarantine_note(e)]
    assert left == [newest]


def delete_topic_in_sqlite(log_path: Path, topic: str) -> None:
    """What `kafka-topics --delete` does to a changelog, done in the embedded log's file."""
    with sqlite3.connect(log_path) as db:
        (topic_id,) = db.execute("SELECT id FROM topics WHERE name = ?", (topic,)).fetchone()
        for table in ("record_batches", "partitions", "group_offsets"):
            db.execute(f"DELETE FROM {table} WHERE topic_id = ?", (topic_id,))
        db.execute("DELETE FROM topics WHERE id = ?", (topic_id,))


def test_a_changelog_topic_deleted_and_created_again_is_refused_unless_allowed(
    counted: Path, log: SqliteLog, tmp_path: Path
) -> None:
    """A whole changelog gone is an operator's mistake more often than an incident (it cost
    111,028 word occurrences with exit 0): refuse, name the setting, touch nothing."""
    before = store_contents(counted, 0)
    log.close()
    delete_topic_in_sqlite(tmp_path / "log.db", CHANGELOG)
    fresh = SqliteLog(tmp_path / "log.db")
    try:
        with pytest.raises(StreamsFailedError) as refused:
            run(fresh, counted)
        assert "state.rebuild.after.changelog.recreated=true" in str(refused.value)
        assert store_contents(counted, 0) == before  # nothing moved, nothing rebuilt
        assert not quarantine_directory(counted).exists()
        run(fresh, counted, **{"state.rebuild.after.changelog.recreated": True})
        assert store_contents(counted, 0) == changelog_replay(fresh, 0)
        kept_aside = sorted(quarantine_directory(counted).iterdir())  # one per partition
        assert [e.name[:4] for e in kept_aside] == ["1_0-", "1_1-"]
        with RocksDBStore(STORE, kept_aside[0]) as kept:
            assert dict(kept.all()) == before
    finally:
        fresh.close()


# -- a changelog that diverged without its end moving back -------------------------------


def rewrite_tail_in_sqlite(log_path: Path, partition: int, extra: int) -> None:
    """In one SQLite transaction: replace the partition's last batch by other records at the
    same offsets, plus ``extra`` more, so the end never moves back (no truncation seen)."""
    with sqlite3.connect(log_path) as db:
        topic_id, next_offset = db.execute(
            "SELECT t.id, p.next_offset FROM topics t JOIN partitions p ON p.topic_id = t.id "
            "WHERE t.name = ? AND p.partition = ?",
            (CHANGELOG, partition),
        ).fetchone()
        base, count = db.execute(
            "SELECT base_offset, record_count FROM record_batches WHERE topic_id = ? "
            "AND partition = ? ORDER BY last_offset DESC LIMIT 1",
            (topic_id, partition),
        ).fetchone()
        db.execute(
            "DELETE FROM record_batches WHERE topic_id = ? AND partition = ? AND base_offset = ?",
            (topic_id, partition, base),
        )
        total = count + extra
        keys = [b"rewritten-%d" % i for i in range(total)]
        values = [LONGS.serialize(1000 + i) for i in range(total)]
        db.execute(
            "INSERT INTO record_batches (topic_id, partition, last_offset, base_offset, "
            "record_count, offsets, keys, vals, timestamps, headers) "
            "VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?, NULL)",
            (
                topic_id,
                partition,
                base + total - 1,
                base,
                total,
                marshal.dumps(keys, 4),
                marshal.dumps(values, 4),
                array("q", [0] * total).tobytes(),
            ),
        )
        db.execute(
            "UPDATE partitions SET next_offset = ? WHERE topic_id = ? AND partition = ?",
            (max(next_offset, base + total), topic_id, partition),
        )


def test_records_rewritten_in_place_without_the_end_moving_back_rebuild_the_store(
    counted: Path, log: SqliteLog, tmp_path: Path
) -> None:
    """The store committed at the old end must not resume on top of records it never applied
    (it did: 100 keys differed from a replay)."""
    rewrite_tail_in_sqlite(tmp_path / "log.db", 0, extra=10)
    run_accepting_losses(log, counted)
    assert store_contents(counted, 0) == changelog_replay(log, 0)
    assert any(b"rewritten-" in key for key in store_contents(counted, 0))


def test_a_routine_compaction_and_a_truncation_after_the_store_keep_the_store(
    counted: Path, log: SqliteLog, tmp_path: Path
) -> None:
    """Neither changes a record the store applied: no rebuild, only the tail is replayed."""
    committed = committed_offset(counted, 0)
    changelog = TopicPartition(CHANGELOG, 0)
    log.compact(CHANGELOG)
    log.produce(changelog, [Record(b"later", LONGS.serialize(7), 0) for _ in range(3)])
    truncate_in_sqlite(tmp_path / "log.db", 0, committed + 2)  # cut after the store's offset
    restored = run(log, counted)
    report = restored[TaskId(COUNTING, 0)]
    assert report.result.first_offset == committed + 1  # resumed, not rebuilt
    assert not quarantine_directory(counted).exists()
    assert store_contents(counted, 0) == changelog_replay(log, 0)


def test_copies_that_saw_records_a_restored_backup_lost_are_not_adopted(
    counted: Path, tmp_path: Path
) -> None:
    """A log.db put back from a backup: one copy finds itself ahead and is rebuilt, growing the
    changelog past the offsets another copy saw; that copy must not be adopted (counts were
    published backwards, 7 -> 12 -> 7)."""
    log_path, backup = tmp_path / "log.db", tmp_path / "backup.db"
    with sqlite3.connect(log_path) as live, sqlite3.connect(backup) as copy:
        live.backup(copy)
    other = tmp_path / "other-state"
    log = SqliteLog(log_path)
    produce(log, ["future lines the backup never saw"] * 30)
    run(log, counted)
    log.close()
    shutil.copytree(counted, other)  # a second copy that saw the future (replica 1's)
    for lock in other.rglob("eddyline.lock"):
        lock.unlink()
    with sqlite3.connect(backup) as copy, sqlite3.connect(log_path) as live:
        copy.backup(live)  # the log goes back in time
    log = SqliteLog(log_path)
    try:
        produce(log, [f"new{i} words{i % 7}" for i in range(200)])
        run_accepting_losses(log, counted)  # ahead of the log: rebuilt, the changelog regrows
        assert store_contents(counted, 0) == changelog_replay(log, 0)
        assert log.end_offset(TopicPartition(CHANGELOG, 0)) > committed_offset(other, 0)
        with pytest.raises(StreamsFailedError, match="eddyline state accept-loss"):
            run(log, other)  # not adopted: stopped until the loss is accepted
        run_accepting_losses(log, other)
        assert store_contents(other, 0) == changelog_replay(log, 0)  # rebuilt, not adopted
    finally:
        log.close()
