"""The embedded log: partitioned topics in one SQLite file (``sqlite:///path``).

It is the default log for local runs and tests. Several processes on one
machine share it safely: SQLite in WAL mode lets readers run beside the one
writer, and every write is one short ``BEGIN IMMEDIATE`` transaction.

Exactly-once: a transactional producer keeps its open transaction in memory
and applies it at commit as **one** SQLite transaction that checks the
producer's epoch (fencing), appends every record, and stores the input
offsets. Readers therefore only ever see committed transactions, so every read
is ``read_committed``, and the end offset is the last stable offset. Offsets
are assigned at commit, which is why commit returns them.

Storage: records are kept in batch rows (``record_batches``, see
:mod:`~eddyline_runtime.log.record_batch`), up to 1,024 consecutive records
of one partition per row, as a Kafka segment keeps record batches: a commit
inserts a row per partition, a fetch reads a row per 1,024 records, and
offsets stay per record (reads, record deletion and truncation may start
inside a batch). Logs written one row per record are converted on open.

Durability: ``synchronous=NORMAL`` in WAL mode survives any process crash; a
machine crash may lose the last transactions, never part of one.

Retention: a topic given ``retention.ms`` (:meth:`SqliteLog.set_topic_retention`)
loses its oldest records only in :meth:`SqliteLog.enforce_retention`, which
the runtime calls after commits; nothing is deleted behind a caller's back,
so what a test sees depends only on the ``now`` it passes.

Read-only opens (``SqliteLog(path, read_only=True)``) are for readers beside a
live log that must not slow its writers down, such as Spark restore tasks:
they open the file with ``mode=ro``, never take the write lock, create no
table, and refuse every write.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, count, repeat
from pathlib import Path
from typing import Any, NamedTuple

from eddyline_runtime.log.errors import (
    InvalidTopicError,
    LogError,
    OffsetOutOfRangeError,
    ProducerFencedError,
    TopicConflictError,
    TransactionStateError,
    UnknownTopicError,
)
from eddyline_runtime.log.port import (
    ChangeBatch,
    CommittedTransaction,
    FetchedColumns,
    FetchResult,
    Headers,
    Log,
    OffsetChanges,
    OffsetsInSendOrder,
    Record,
    RecordColumns,
    TopicSpec,
    TransactionalProducer,
)
from eddyline_runtime.log.record_batch import (
    MAX_BATCH_RECORDS,
    SELECT_COLUMNS,
    DamagedBatchError,
    DecodedBatch,
    encode_batch,
)
from eddyline_runtime.log.record_size import RecordSizeLimit
from eddyline_runtime.partitions import TopicPartition

# How long a writer waits for another process's write transaction (they are
# short: one commit's inserts) before SQLite reports the database as locked.
_BUSY_TIMEOUT_SECONDS = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    partitions INTEGER NOT NULL,
    compacted INTEGER NOT NULL,
    uuid TEXT DEFAULT (lower(hex(randomblob(16)))),
    retention_ms INTEGER
);
CREATE TABLE IF NOT EXISTS partitions (
    topic_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    log_start INTEGER NOT NULL DEFAULT 0,
    next_offset INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL DEFAULT 0,
    epoch_tag TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (topic_id, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS record_batches (
    topic_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    base_offset INTEGER NOT NULL,
    record_count INTEGER NOT NULL,
    offsets BLOB,
    keys BLOB NOT NULL,
    vals BLOB NOT NULL,
    timestamps BLOB NOT NULL,
    headers TEXT,
    PRIMARY KEY (topic_id, partition, last_offset)
);
CREATE TABLE IF NOT EXISTS group_offsets (
    grp TEXT NOT NULL,
    topic_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (grp, topic_id, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS producers (
    transactional_id TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL
);
"""

# Logs written before topics had ids and partitions had epochs gain both.
_MIGRATIONS = {
    ("topics", "uuid"): (
        "ALTER TABLE topics ADD COLUMN uuid TEXT",
        "UPDATE topics SET uuid = lower(hex(randomblob(16))) WHERE uuid IS NULL",
    ),
    ("partitions", "epoch"): (
        "ALTER TABLE partitions ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0",
    ),
    # Topic retention (NULL: records are kept forever).
    ("topics", "retention_ms"): ("ALTER TABLE topics ADD COLUMN retention_ms INTEGER",),
    # The current epoch's random tag ('' for epochs begun before tags existed).
    ("partitions", "epoch_tag"): (
        "ALTER TABLE partitions ADD COLUMN epoch_tag TEXT NOT NULL DEFAULT ''",
    ),
}

# A partition's epoch history: each epoch and the first offset written in it
# (Kafka's leader-epoch cache, KIP-101). A store that committed offset O in
# epoch E still holds what the log holds if no later epoch starts at or below
# O (:meth:`SqliteLog.epoch_end_offset`). Epoch 0 starts at offset 0 and has no
# row. Changes to the history are made by the database's own triggers (so a
# hand edit in SQL cannot dodge them), and by ``start_epoch``.
#
# Each epoch has a random tag beside its number: a log put back from a backup
# and grown again numbers its new epochs as the lost history did, and the tag
# tells them apart (docs/state.md, "Epochs").
_EPOCH_HISTORY = """
CREATE TABLE IF NOT EXISTS partition_epochs (
    topic_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,
    tag TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (topic_id, partition, epoch)
) WITHOUT ROWID
"""
_EPOCH_HISTORY_TAG = "ALTER TABLE partition_epochs ADD COLUMN tag TEXT NOT NULL DEFAULT ''"
# A new epoch's tag, made by SQLite itself so the triggers make them too.
_NEW_TAG = "lower(hex(randomblob(8)))"
# Changelog partitions no writer may rebuild a store from until the user decides
# (``hold_changelog``): a copy found that they lost records it applied.
_HOLDS = """
CREATE TABLE IF NOT EXISTS partition_holds (
    topic_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (topic_id, partition)
) WITHOUT ROWID
"""
# Rows here, inside one write transaction, tell the triggers that the adapter
# itself is rewriting a partition's batches without changing any record
# (compaction; the straddling batch a truncation keeps): no new epoch for that.
_REWRITES = """
CREATE TABLE IF NOT EXISTS log_rewrites (
    topic_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition)
) WITHOUT ROWID
"""
# The triggers, replaced on every open so a log written by an earlier version
# gets the current ones. Every change that can give an offset other records
# starts a new epoch at the first offset it touches:
# * the end moving back (truncation, however it is done, even by hand in SQL);
# * a batch inserted below the partition's end, or a stored batch's records
#   changed in place, without the adapter marking it a rewrite: records
#   replaced where the end never moved back.
_TRIGGERS = {
    "partition_truncated": """
CREATE TRIGGER partition_truncated
AFTER UPDATE OF next_offset ON partitions
WHEN NEW.next_offset < OLD.next_offset
BEGIN
    UPDATE partitions SET epoch = OLD.epoch + 1, epoch_tag = lower(hex(randomblob(8)))
    WHERE topic_id = NEW.topic_id AND partition = NEW.partition;
    INSERT OR REPLACE INTO partition_epochs (topic_id, partition, epoch, start_offset, tag)
    SELECT topic_id, partition, epoch, NEW.next_offset, epoch_tag
    FROM partitions WHERE topic_id = NEW.topic_id AND partition = NEW.partition;
END
""",
    "records_replaced": """
CREATE TRIGGER records_replaced
AFTER INSERT ON record_batches
WHEN NEW.base_offset < (
        SELECT next_offset FROM partitions
        WHERE topic_id = NEW.topic_id AND partition = NEW.partition)
    AND NOT EXISTS (
        SELECT 1 FROM log_rewrites
        WHERE topic_id = NEW.topic_id AND partition = NEW.partition)
BEGIN
    UPDATE partitions SET epoch = epoch + 1, epoch_tag = lower(hex(randomblob(8)))
    WHERE topic_id = NEW.topic_id AND partition = NEW.partition;
    INSERT OR REPLACE INTO partition_epochs (topic_id, partition, epoch, start_offset, tag)
    SELECT topic_id, partition, epoch, NEW.base_offset, epoch_tag
    FROM partitions WHERE topic_id = NEW.topic_id AND partition = NEW.partition;
END
""",
    "records_changed": """
CREATE TRIGGER records_changed
AFTER UPDATE OF base_offset, offsets, keys, vals, timestamps, headers ON record_batches
WHEN NOT EXISTS (
        SELECT 1 FROM log_rewrites
        WHERE topic_id = NEW.topic_id AND partition = NEW.partition)
BEGIN
    UPDATE partitions SET epoch = epoch + 1, epoch_tag = lower(hex(randomblob(8)))
    WHERE topic_id = NEW.topic_id AND partition = NEW.partition;
    INSERT OR REPLACE INTO partition_epochs (topic_id, partition, epoch, start_offset, tag)
    SELECT topic_id, partition, epoch, NEW.base_offset, epoch_tag
    FROM partitions WHERE topic_id = NEW.topic_id AND partition = NEW.partition;
END
""",
}


class SqliteLog(Log):
    """A :class:`Log` in one SQLite file; safe across threads and processes."""

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._local = threading.local()
        self._topic_ids: dict[str, tuple[int, TopicSpec]] = {}
        if read_only:
            if not self.path.is_file():
                raise LogError(
                    f"log {self.url} does not exist, so it cannot be opened read-only; "
                    "check the path (a read-only open never creates the log)"
                )
            self._connection()  # fail here, not at the first read, if it cannot be opened
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise LogError(
                f"cannot create the directory of log {self.url}: {error.strerror} "
                f"({error.filename}); point the log URL at a writable directory"
            ) from None
        try:
            with self._write() as db:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(statement)
                for (table, column), statements in _MIGRATIONS.items():
                    columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                    if column not in columns:
                        for statement in statements:
                            db.execute(statement)
                db.execute(_EPOCH_HISTORY)
                history = {row[1] for row in db.execute("PRAGMA table_info(partition_epochs)")}
                if "tag" not in history:
                    db.execute(_EPOCH_HISTORY_TAG)
                db.execute(_REWRITES)
                db.execute(_HOLDS)
                for name, trigger in _TRIGGERS.items():
                    installed = db.execute(
                        "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?",
                        (name,),
                    ).fetchone()
                    if installed is None or installed[0] != trigger.strip():
                        db.execute(f"DROP TRIGGER IF EXISTS {name}")
                        db.execute(trigger)
                _convert_record_rows(db)
        except sqlite3.DatabaseError as error:
            self.close()
            raise LogError(
                f"{self.path} is not an eddyline log (SQLite: {error}); point the log URL at a "
                "log file, or at a path that does not exist yet to start a new log"
            ) from None

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    # -- connections and transactions ---------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection (sqlite3 connections are not shared across threads)."""
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            if self.read_only:
                # WAL mode is a property of the file: a read-only connection
                # reads beside the writers without setting it (a write).
                uri = f"file:{urllib.parse.quote(str(self.path.resolve()))}?mode=ro"
                try:
                    connection = sqlite3.connect(
                        uri, uri=True, timeout=_BUSY_TIMEOUT_SECONDS, isolation_level=None
                    )
                    connection.execute("SELECT 1 FROM partitions LIMIT 1")
                    connection.execute("SELECT 1 FROM record_batches LIMIT 1")
                except sqlite3.Error as exc:
                    if "record_batches" in str(exc):
                        raise LogError(
                            f"log {self.url} was written by an earlier eddyline (one row per "
                            "record), which a read-only open cannot convert; open it once "
                            "read-write (any eddyline run on it does) to convert it"
                        ) from exc
                    raise LogError(
                        f"log {self.url} could not be opened read-only: {exc}; check that the "
                        "file is an eddyline log and readable (its directory too: SQLite "
                        "needs the -shm file beside it)"
                    ) from exc
            else:
                connection = sqlite3.connect(
                    self.path, timeout=_BUSY_TIMEOUT_SECONDS, isolation_level=None
                )
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")
            self._local.connection = connection
        return connection

    def _write(self) -> _Transaction:
        if self.read_only:
            raise LogError(
                f"log {self.url} was opened read-only, so it cannot be written; open it "
                "without read_only=True to write"
            )
        return _Transaction(self._connection(), "BEGIN IMMEDIATE", self.path)

    def _read(self) -> _Transaction:
        return _Transaction(self._connection(), "BEGIN", self.path)

    # -- topics --------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int, *, compacted: bool = False) -> TopicSpec:
        if partitions < 1:
            raise InvalidTopicError(name, f"needs at least 1 partition, got {partitions}")
        requested = TopicSpec(name, partitions, compacted)
        with self._write() as db:
            row = db.execute(
                "SELECT partitions, compacted FROM topics WHERE name = ?", (name,)
            ).fetchone()
            if row is not None:
                existing = TopicSpec(name, row[0], bool(row[1]))
                if existing != requested:
                    raise TopicConflictError(name, _describe(existing), _describe(requested))
                return existing
            topic_id = db.execute(
                "INSERT INTO topics (name, partitions, compacted) VALUES (?, ?, ?)",
                (name, partitions, int(compacted)),
            ).lastrowid
            db.executemany(
                "INSERT INTO partitions (topic_id, partition) VALUES (?, ?)",
                [(topic_id, p) for p in range(partitions)],
            )
        return requested

    def topics(self) -> Mapping[str, TopicSpec]:
        with self._read() as db:
            rows = db.execute("SELECT name, partitions, compacted FROM topics").fetchall()
        return {name: TopicSpec(name, count, bool(compacted)) for name, count, compacted in rows}

    def _existing_partition_row(self, db: sqlite3.Connection, tp: TopicPartition) -> _PartitionRow:
        """``tp``'s row, or the error naming the topics there are."""
        row = _partition_row(db, tp)
        if row is None:
            self._topic(db, tp)  # raises, naming the topics there are
            raise UnknownTopicError(f"partition {tp}", [])
        return row

    def _topic(self, db: sqlite3.Connection, tp: TopicPartition) -> int:
        """The topic's id, after checking the partition exists."""
        known = self._topic_ids.get(tp.topic)
        if known is None:
            row = db.execute(
                "SELECT id, partitions, compacted FROM topics WHERE name = ?", (tp.topic,)
            ).fetchone()
            if row is None:
                names = [r[0] for r in db.execute("SELECT name FROM topics")]
                raise UnknownTopicError(f'topic "{tp.topic}"', names)
            # Topics are never deleted or resized, so their ids can be cached.
            known = (row[0], TopicSpec(tp.topic, row[1], bool(row[2])))
            self._topic_ids[tp.topic] = known
        topic_id, spec = known
        if not 0 <= tp.partition < spec.partitions:
            names = [r[0] for r in db.execute("SELECT name FROM topics")]
            raise UnknownTopicError(
                f"partition {tp} (topic has {spec.partitions} partitions)", names
            )
        return topic_id

    # -- retention -----------------------------------------------------------------

    def set_topic_retention(self, topic: str, retention_ms: int | None) -> None:
        if retention_ms is not None and (type(retention_ms) is not int or retention_ms < 0):
            raise InvalidTopicError(
                topic, f"retention.ms must be a number of milliseconds >= 0, got {retention_ms!r}"
            )
        with self._write() as db:
            self._topic(db, TopicPartition(topic, 0))
            db.execute("UPDATE topics SET retention_ms = ? WHERE name = ?", (retention_ms, topic))

    def topic_retention(self, topic: str) -> int | None:
        with self._read() as db:
            self._topic(db, TopicPartition(topic, 0))
            row = db.execute("SELECT retention_ms FROM topics WHERE name = ?", (topic,)).fetchone()
        retention: int | None = row[0]
        return retention

    def record_size_limit(self, topic: str) -> RecordSizeLimit | None:
        """SQLite's ``SQLITE_LIMIT_LENGTH`` (1 GB unless SQLite was built otherwise): the
        largest blob a column holds, so a record whose key or value is larger cannot be
        stored. Compared with Kafka's size estimate, which counts more than the larger of
        key and value: conservative. Records stored together in one batch row are limited
        together too, which this does not see (the write then fails as before)."""
        with self._read() as db:
            self._topic(db, TopicPartition(topic, 0))
        limit = self._connection().getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
        return RecordSizeLimit(limit, "SQLITE_LIMIT_LENGTH")

    def enforce_retention(self, now_ms: int) -> int:
        """Delete, in each partition of a topic with retention, the longest run of records
        from its start whose timestamps are all below ``now_ms - retention.ms``.

        As a broker deletes whole old segments: a newer record stops the run, so
        an older one behind it waits (offsets stay consecutive from the start).
        """
        removed = 0
        with self._write() as db:
            topics = db.execute(
                "SELECT id, name, partitions, retention_ms FROM topics "
                "WHERE retention_ms IS NOT NULL"
            ).fetchall()
            for topic_id, name, partitions, retention_ms in topics:
                cutoff = now_ms - retention_ms
                for partition in range(partitions):
                    tp = TopicPartition(name, partition)
                    first_kept = _first_not_older(db, topic_id, tp, cutoff)
                    if first_kept is not None:
                        removed += _delete_below(db, topic_id, tp, first_kept)
        return removed

    # -- records -------------------------------------------------------------------

    def produce(self, tp: TopicPartition, records: Sequence[Record]) -> list[int]:
        with self._write() as db:
            first = _append(db, self._topic(db, tp), tp.partition, RecordColumns.of(records))
        return list(range(first, first + len(records)))

    def produce_columns(
        self,
        tp: TopicPartition,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[Headers] | None = None,
    ) -> int:
        columns = RecordColumns()
        columns.extend(keys, values, timestamps, headers)
        with self._write() as db:
            first = _append(db, self._topic(db, tp), tp.partition, columns)
        return first + len(columns) - 1

    def fetch_columns(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> FetchedColumns:
        with self._read() as db:
            topic_id, end = self._start_reading(db, tp, offset, max_records)
            read = _read_records(db, topic_id, tp, offset, max_records=max_records)
        return FetchedColumns(
            read.offsets, read.keys, read.values, read.timestamps, end, read.headers
        )

    def fetch(self, tp: TopicPartition, offset: int, max_records: int = 10_000) -> FetchResult:
        with self._read() as db:
            topic_id, end = self._start_reading(db, tp, offset, max_records)
            read = _read_records(db, topic_id, tp, offset, max_records=max_records)
        headers = read.headers or repeat((), len(read.offsets))
        records = list(map(Record, read.keys, read.values, read.timestamps, headers, read.offsets))
        return FetchResult(records, end)

    def fetch_changes(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> ChangeBatch:
        with self._read() as db:
            topic_id, _ = self._start_reading(db, tp, offset, max_records)
            read = _read_records(
                db, topic_id, tp, offset, max_records=max_records, timestamps=False
            )
        if not read.offsets:
            return ChangeBatch([], -1)
        entries: list[Any] = list(zip(read.keys, read.values, strict=True))
        if None in read.keys:
            entries = [entry for entry in entries if entry[0] is not None]
        return ChangeBatch(entries, read.offsets[-1])

    def fetch_changes_between(
        self, tp: TopicPartition, start: int, end: int, max_records: int = 10_000
    ) -> OffsetChanges:
        if end <= start:
            return OffsetChanges((), (), (), -1)
        with self._read() as db:
            topic_id, _ = self._start_reading(db, tp, start, max_records)
            read = _read_records(
                db,
                topic_id,
                tp,
                start,
                stop=end,
                max_records=max_records,
                timestamps=False,
            )
        if not read.offsets:
            return OffsetChanges((), (), (), -1)
        # Keyless records are read too (not returned): last_offset counts them as read.
        last = read.offsets[-1]
        if None not in read.keys:
            return OffsetChanges(read.offsets, read.keys, read.values, last)  # type: ignore[arg-type]
        keyed = [key is not None for key in read.keys]
        if not any(keyed):
            return OffsetChanges((), (), (), last)
        return OffsetChanges(
            list(compress(read.offsets, keyed)),
            list(compress(read.keys, keyed)),  # type: ignore[arg-type]
            list(compress(read.values, keyed)),
            last,
        )

    def _start_reading(
        self, db: sqlite3.Connection, tp: TopicPartition, offset: int, max_records: int
    ) -> tuple[int, int]:
        """Check a fetch's arguments; the topic id and the partition's end offset."""
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        topic_id = self._topic(db, tp)
        beginning, end = _bounds(db, topic_id, tp.partition)
        if not beginning <= offset <= end:
            raise OffsetOutOfRangeError(tp, offset, beginning, end)
        return topic_id, end

    def beginning_offset(self, tp: TopicPartition) -> int:
        with self._read() as db:
            return _bounds(db, self._topic(db, tp), tp.partition)[0]

    def end_offset(self, tp: TopicPartition) -> int:
        with self._read() as db:
            return _bounds(db, self._topic(db, tp), tp.partition)[1]

    def partition_epoch(self, tp: TopicPartition) -> str:
        """The topic's id and the partition's epoch, as ``<topic id>:<epoch>.<tag>``
        (``<topic id>:<epoch>`` for an epoch begun before epochs had tags).
        """
        with self._read() as db:
            row = self._existing_partition_row(db, tp)
        return _epoch_name(row.uuid, row.epoch, row.epoch_tag)

    def epoch_end_offset(self, tp: TopicPartition, epoch: str) -> int | None:
        """The first offset written after ``epoch`` ended: a later epoch's start, or the end.

        None for an epoch of another incarnation of the topic, one the history
        does not hold (it ended before this log kept a history), or one whose
        tag is not the history's: the same number begun in a history this log
        lost (a log put back from a backup), so nothing here says where it ended.
        """
        incarnation, _, numbered = epoch.partition(":")
        number, _, tag = numbered.partition(".")
        if not number.isdigit():
            return None
        with self._read() as db:
            row = _partition_row(db, tp)
            if row is None or row.uuid != incarnation or int(number) > row.epoch:
                return None
            if int(number) == row.epoch:
                # The current epoch runs to the end, if it is the one the copy saw.
                return row.next_offset if tag == row.epoch_tag else None
            began = db.execute(
                "SELECT tag FROM partition_epochs WHERE topic_id = ? AND partition = ? "
                "AND epoch = ?",
                (row.topic_id, tp.partition, int(number)),
            ).fetchone()
            # Epoch 0, and epochs begun before the history kept tags, have the tag ''.
            if (began[0] if began is not None else "") != tag:
                return None
            later = db.execute(
                "SELECT epoch, start_offset FROM partition_epochs WHERE topic_id = ? "
                "AND partition = ? AND epoch > ? ORDER BY epoch",
                (row.topic_id, tp.partition, int(number)),
            ).fetchall()
        # Only a history holding the very next epoch says where this one ended; an
        # epoch started later by a truncation may begin above that point.
        if not later or later[0][0] != int(number) + 1:
            return None
        return int(min(start for _, start in later))

    def epoch_at(self, tp: TopicPartition, offset: int) -> str | None:
        """The epoch that wrote the record now at ``offset``: the latest epoch of the
        history that began at or below it (an epoch begun by a truncation below ``offset``
        replaced what was there). None when the partition does not hold ``offset``.

        One read transaction, so the answer fits the end it was asked against. When the
        history does not reach back to ``offset`` (epochs begun before this log kept a
        history), the epoch now: a copy stamped with it is then judged another epoch's
        once a writer begins, never wrongly trusted.
        """
        with self._read() as db:
            uuid, topic_id, current, next_offset, current_tag = self._existing_partition_row(db, tp)
            if not 0 <= offset < next_offset:
                return None
            began = db.execute(
                "SELECT epoch, tag FROM partition_epochs WHERE topic_id = ? AND partition = ? "
                "AND start_offset <= ? ORDER BY epoch DESC LIMIT 1",
                (topic_id, tp.partition, offset),
            ).fetchone()
            # Epoch 0 has no row: it wrote ``offset`` when no later epoch began at or below
            # it, if the history holds every epoch after it (it starts at epoch 1).
            complete = current == 0 or (
                db.execute(
                    "SELECT 1 FROM partition_epochs WHERE topic_id = ? AND partition = ? "
                    "AND epoch = 1",
                    (topic_id, tp.partition),
                ).fetchone()
                is not None
            )
        if began is not None:
            number, tag = int(began[0]), str(began[1])
        elif complete:
            number, tag = 0, ""
        else:
            number, tag = int(current), str(current_tag)
        if number == current:
            tag = str(current_tag)  # the row and the partition name the same epoch
        return _epoch_name(str(uuid), number, tag)

    def record_divergence(self, tp: TopicPartition) -> None:
        """A copy saw offsets this partition no longer holds: start a new epoch at its end.

        Records written from here on are not the ones that copy (or any other
        that saw the lost records) applied, so such copies are judged another
        epoch's, not trusted to resume.
        """
        self.start_epoch(tp)

    def hold_changelog(self, tp: TopicPartition, reason: str) -> None:
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO partition_holds VALUES (?, ?, ?)",
                (self._topic(db, tp), tp.partition, reason),
            )

    def changelog_hold(self, tp: TopicPartition) -> str | None:
        with self._read() as db:
            row = db.execute(
                "SELECT reason FROM partition_holds WHERE topic_id = ? AND partition = ?",
                (self._topic(db, tp), tp.partition),
            ).fetchone()
        return None if row is None else str(row[0])

    def release_changelog(self, tp: TopicPartition) -> None:
        with self._write() as db:
            db.execute(
                "DELETE FROM partition_holds WHERE topic_id = ? AND partition = ?",
                (self._topic(db, tp), tp.partition),
            )

    def start_epoch(self, tp: TopicPartition, *, fence: TransactionalProducer | None = None) -> str:
        """Begin a new epoch, with a new tag, at the partition's end; returns its name.
        With ``fence``, only while that producer is its transactional id's newest (checked
        in the same write transaction, as its commit checks it)."""
        with self._write() as db:
            if fence is not None:
                if not isinstance(fence, _SqliteTransactionalProducer):
                    raise TypeError(f"a producer of another log fences nothing here: {fence!r}")
                fence.check_not_fenced(db)
            topic_id = self._topic(db, tp)
            db.execute(
                f"UPDATE partitions SET epoch = epoch + 1, epoch_tag = {_NEW_TAG} "
                "WHERE topic_id = ? AND partition = ?",
                (topic_id, tp.partition),
            )
            db.execute(
                "INSERT OR REPLACE INTO partition_epochs (topic_id, partition, epoch, "
                "start_offset, tag) SELECT topic_id, partition, epoch, next_offset, epoch_tag "
                "FROM partitions WHERE topic_id = ? AND partition = ?",
                (topic_id, tp.partition),
            )
            row = db.execute(
                "SELECT t.uuid, p.epoch, p.epoch_tag FROM topics t JOIN partitions p "
                "ON p.topic_id = t.id WHERE t.id = ? AND p.partition = ?",
                (topic_id, tp.partition),
            ).fetchone()
        return _epoch_name(row[0], row[1], row[2])

    # -- consumer group offsets ------------------------------------------------------

    def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        found: dict[TopicPartition, int] = {}
        with self._read() as db:
            for tp in partitions:
                row = db.execute(
                    "SELECT next_offset FROM group_offsets "
                    "WHERE grp = ? AND topic_id = ? AND partition = ?",
                    (group, self._topic(db, tp), tp.partition),
                ).fetchone()
                if row is not None:
                    found[tp] = row[0]
        return found

    def commit_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        with self._write() as db:
            self._store_offsets(db, group, offsets)

    def _store_offsets(
        self, db: sqlite3.Connection, group: str, offsets: Mapping[TopicPartition, int]
    ) -> None:
        db.executemany(
            "INSERT INTO group_offsets (grp, topic_id, partition, next_offset) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (grp, topic_id, partition) "
            "DO UPDATE SET next_offset = excluded.next_offset",
            [(group, self._topic(db, tp), tp.partition, offset) for tp, offset in offsets.items()],
        )

    # -- transactions, compaction --------------------------------------------------

    def transactional_producer(self, transactional_id: str) -> TransactionalProducer:
        with self._write() as db:
            epoch = db.execute(
                "INSERT INTO producers (transactional_id, epoch) VALUES (?, 0) "
                "ON CONFLICT (transactional_id) DO UPDATE SET epoch = epoch + 1 "
                "RETURNING epoch",
                (transactional_id,),
            ).fetchone()[0]
        return _SqliteTransactionalProducer(self, transactional_id, epoch)

    # -- what a broker's cleaner and retention do (not on the port) ----------------

    def compact(self, topic: str) -> int:
        """Keep only the latest record per key in a compacted topic; returns records removed.

        Keyless records stay. A partition that loses records is rewritten from
        its start, its batches now naming their (no longer consecutive) offsets.
        """
        removed = 0
        with self._write() as db:
            topic_id = self._topic(db, TopicPartition(topic, 0))
            spec = self._topic_ids[topic][1]
            if not spec.compacted:
                raise LogError(
                    f'topic "{topic}" is not compacted, so compact() would drop history; '
                    "create changelog topics with compacted=True"
                )
            for partition in range(spec.partitions):
                start, end = _bounds(db, topic_id, partition)
                tp = TopicPartition(topic, partition)
                read = _read_records(db, topic_id, tp, start, max_records=max(end - start, 1))
                latest = {key: index for index, key in enumerate(read.keys) if key is not None}
                keep = [key is None or latest[key] == index for index, key in enumerate(read.keys)]
                dropped = keep.count(False)
                if not dropped:
                    continue
                removed += dropped
                kept = RecordColumns()
                kept.extend(
                    list(compress(read.keys, keep)),
                    list(compress(read.values, keep)),
                    list(compress(read.timestamps, keep)),
                    None if read.headers is None else list(compress(read.headers, keep)),
                )
                db.execute(
                    "DELETE FROM record_batches WHERE topic_id = ? AND partition = ?",
                    (topic_id, partition),
                )
                offsets = list(compress(read.offsets, keep))
                with _rewriting(db, topic_id, partition):
                    _insert_batches(db, topic_id, partition, offsets, kept)
        return removed

    def delete_records(self, tp: TopicPartition, before_offset: int) -> int:
        """Move the partition's start to ``before_offset``, deleting what lies below it.

        Kafka's DeleteRecords (what retention does to old segments): offsets
        keep their meaning, the end stays, the start never moves back.
        Returns the records removed. An offset beyond the end is refused. A
        batch holding the new start stays whole, its records below it unread.
        """
        with self._write() as db:
            topic_id = self._topic(db, tp)
            start, end = _bounds(db, topic_id, tp.partition)
            if before_offset > end:
                raise OffsetOutOfRangeError(tp, before_offset, start, end)
            return _delete_below(db, topic_id, tp, before_offset)

    def truncate(self, tp: TopicPartition, end_offset: int) -> int:
        """Cut the partition back to end at ``end_offset``; returns the records removed.

        What an unclean leader election does to a Kafka partition: records
        at and after ``end_offset`` are gone and the offsets are given again.
        The partition's epoch moves on (the database's trigger sees the end
        move back), so readers can tell the new records from the old ones.
        """
        with self._write() as db:
            topic_id = self._topic(db, tp)
            end = _bounds(db, topic_id, tp.partition)[1]
            if not 0 <= end_offset <= end:
                raise OffsetOutOfRangeError(tp, end_offset, 0, end)
            if end_offset == end:
                return 0
            cut = _batches(db, topic_id, tp.partition, end_offset, max_records=end - end_offset)
            # The batch holding end_offset keeps what lies below it.
            straddling = db.execute(
                f"SELECT {SELECT_COLUMNS} FROM record_batches WHERE topic_id = ? "
                "AND partition = ? AND base_offset < ? AND last_offset >= ?",
                (topic_id, tp.partition, end_offset, end_offset),
            ).fetchone()
            db.execute(
                "DELETE FROM record_batches WHERE topic_id = ? AND partition = ? "
                "AND last_offset >= ?",
                (topic_id, tp.partition, end_offset),
            )
            if straddling is not None:
                batch = DecodedBatch(straddling)
                kept = batch.index_of(end_offset)
                columns = RecordColumns()
                columns.extend(
                    batch.keys(0, kept),
                    batch.values(0, kept),
                    batch.timestamps(0, kept),
                    batch.headers(0, kept),
                )
                with _rewriting(db, topic_id, tp.partition):
                    _insert_batches(db, topic_id, tp.partition, batch.offsets(0, kept), columns)
            db.execute(
                "UPDATE partitions SET next_offset = ?, log_start = min(log_start, ?) "
                "WHERE topic_id = ? AND partition = ?",
                (end_offset, end_offset, topic_id, tp.partition),
            )
        return sum(last - first for _, first, last in cut)

    def close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None


class _SqliteTransactionalProducer(TransactionalProducer):
    """Buffers one transaction per partition, in memory, and applies it at commit.

    Records are kept per partition (what the database insert wants); the
    send order is kept as one partition reference per record, so the
    per-record offsets of :class:`CommittedTransaction` are only worked out
    if someone reads them (the stream thread reads ``last_offsets`` only).
    """

    def __init__(self, log: SqliteLog, transactional_id: str, epoch: int) -> None:
        self._log = log
        self.transactional_id = transactional_id
        self.epoch = epoch
        self._batches: dict[TopicPartition, RecordColumns] | None = None
        self._order: list[TopicPartition] = []
        self._offsets: dict[str, dict[TopicPartition, int]] = {}

    def begin(self) -> None:
        if self._batches is not None:
            raise TransactionStateError(
                f'transactional id "{self.transactional_id}": a transaction is already open; '
                "commit or abort it first"
            )
        self._batches = {}
        self._order = []
        self._offsets = {}

    def send(self, tp: TopicPartition, record: Record) -> None:
        self.send_batch(tp, (record,))

    def send_batch(self, tp: TopicPartition, records: Sequence[Record]) -> None:
        self._columns(tp).extend_records(records)
        self._order.extend(repeat(tp, len(records)))

    def send_columns(
        self,
        tp: TopicPartition,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[Headers] | None = None,
    ) -> None:
        self._columns(tp).extend(keys, values, timestamps, headers)
        self._order.extend(repeat(tp, len(keys)))

    def _columns(self, tp: TopicPartition) -> RecordColumns:
        batches = self._open("send")
        columns = batches.get(tp)
        if columns is None:
            columns = batches[tp] = RecordColumns()
        return columns

    def send_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        self._open("send offsets")
        self._offsets.setdefault(group, {}).update(offsets)

    def check_not_fenced(self, db: sqlite3.Connection) -> None:
        """Inside a write transaction: raise ProducerFencedError if a newer producer of this
        transactional id has started."""
        current = db.execute(
            "SELECT epoch FROM producers WHERE transactional_id = ?", (self.transactional_id,)
        ).fetchone()[0]
        if current != self.epoch:
            raise ProducerFencedError(self.transactional_id, self.epoch, current)

    def commit(self) -> CommittedTransaction:
        batches = self._open("commit")
        log = self._log
        with log._write() as db:
            try:
                self.check_not_fenced(db)
            except ProducerFencedError:
                self._batches = None
                raise
            firsts = {
                tp: _append(db, log._topic(db, tp), tp.partition, records)
                for tp, records in batches.items()
                if records
            }
            for group, group_offsets in self._offsets.items():
                log._store_offsets(db, group, group_offsets)
        self._batches = None
        last = {tp: firsts[tp] + len(batches[tp]) - 1 for tp in firsts}
        return CommittedTransaction(
            OffsetsInSendOrder(self._order, {tp: count(first) for tp, first in firsts.items()}),
            last,
        )

    def abort(self) -> None:
        self._open("abort")
        self._batches = None
        self._offsets = {}

    def close(self) -> None:
        self._batches = None

    def _open(self, action: str) -> dict[TopicPartition, RecordColumns]:
        if self._batches is None:
            raise TransactionStateError(
                f'transactional id "{self.transactional_id}": cannot {action} without an open '
                "transaction; call begin() first"
            )
        return self._batches


class _Transaction:
    """``with`` block around one SQLite transaction: commit on success, roll back on error."""

    def __init__(self, connection: sqlite3.Connection, begin: str, path: Path) -> None:
        self._connection = connection
        self._begin = begin
        self._path = path

    def __enter__(self) -> sqlite3.Connection:
        self._connection.execute(self._begin)
        return self._connection

    def __exit__(self, exc_type: object, error: BaseException | None, _: object) -> None:
        if error is None:
            try:
                self._connection.execute("COMMIT")
            except sqlite3.Error as failed:
                self._rollback()
                full = _disk_full(self._path, failed)
                if full is not None:
                    raise full from failed
                raise
            return
        # SQLite rolls a transaction back by itself on some errors (a full disk among
        # them): a ROLLBACK then fails with "no transaction is active" and would hide
        # the error that matters.
        self._rollback()
        if isinstance(error, sqlite3.Error):
            full = _disk_full(self._path, error)
            if full is not None:
                raise full from error

    def _rollback(self) -> None:
        if self._connection.in_transaction:
            self._connection.execute("ROLLBACK")


def _disk_full(path: Path, error: sqlite3.Error) -> LogError | None:
    """A LogError naming the log and the way out when ``error`` is SQLite's full disk."""
    if getattr(error, "sqlite_errorcode", None) != sqlite3.SQLITE_FULL:
        return None
    return LogError(
        f"log {path}: the disk is full (SQLite: {error}); nothing of this write was "
        f"committed. Free space on the file system of {path.parent} (or move the log), "
        "then restart"
    )


_INSERT_BATCH = (
    "INSERT INTO record_batches (topic_id, partition, last_offset, base_offset, record_count, "
    "offsets, keys, vals, timestamps, headers) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _append(db: sqlite3.Connection, topic_id: int, partition: int, columns: RecordColumns) -> int:
    """Append in the caller's write transaction; returns the first offset given
    (the records get consecutive offsets from it)."""
    first: int = db.execute(
        "SELECT next_offset FROM partitions WHERE topic_id = ? AND partition = ?",
        (topic_id, partition),
    ).fetchone()[0]
    _insert_batches(db, topic_id, partition, range(first, first + len(columns)), columns)
    db.execute(
        "UPDATE partitions SET next_offset = ? WHERE topic_id = ? AND partition = ?",
        (first + len(columns), topic_id, partition),
    )
    return first


def _insert_batches(
    db: sqlite3.Connection,
    topic_id: int,
    partition: int,
    offsets: Sequence[int],
    columns: RecordColumns,
) -> None:
    """Store records with the given rising offsets, MAX_BATCH_RECORDS per batch row."""
    rows = []
    for start in range(0, len(offsets), MAX_BATCH_RECORDS):
        stop = start + MAX_BATCH_RECORDS
        batch = encode_batch(
            offsets[start:stop],
            columns.keys[start:stop],
            columns.values[start:stop],
            columns.timestamps[start:stop],
            None if columns.headers is None else columns.headers[start:stop],
        )
        rows.append(
            (
                topic_id,
                partition,
                batch.last_offset,
                batch.base_offset,
                batch.record_count,
                batch.offsets,
                batch.keys,
                batch.values,
                batch.timestamps,
                batch.headers,
            )
        )
    db.executemany(_INSERT_BATCH, rows)


@dataclass(slots=True)
class _RecordsRead:
    """Records read from stored batches, as columns."""

    offsets: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    headers: list[Headers] | None = None  # None while no record read has any


def _read_records(
    db: sqlite3.Connection,
    topic_id: int,
    tp: TopicPartition,
    start: int,
    *,
    stop: int | None = None,
    max_records: int,
    timestamps: bool = True,
) -> _RecordsRead:
    """At most ``max_records`` records from ``start`` on (below ``stop``, if given)."""
    read = _RecordsRead()
    found = _batches(db, topic_id, tp.partition, start, stop=stop, max_records=max_records)
    for batch, first, last in found:
        try:
            if read.headers is None and (headers := batch.headers(first, last)) is not None:
                read.headers = [()] * len(read.offsets)
                read.headers.extend(headers)
            elif read.headers is not None:
                read.headers.extend(batch.headers(first, last) or repeat((), last - first))
            read.offsets.extend(batch.offsets(first, last))
            read.keys.extend(batch.keys(first, last))
            read.values.extend(batch.values(first, last))
            if timestamps:
                read.timestamps.extend(batch.timestamps(first, last))
        except DamagedBatchError as error:
            raise LogError(
                f"the records of {tp} stored from offset {batch.base_offset} on are damaged "
                f"({error}): the log file was changed outside eddyline; restore it from a "
                "copy, or delete the partition's records up to past the damage"
            ) from error
    return read


def _batches(
    db: sqlite3.Connection,
    topic_id: int,
    partition: int,
    start: int,
    *,
    stop: int | None = None,
    max_records: int,
) -> list[tuple[DecodedBatch, int, int]]:
    """The stored batches holding the first ``max_records`` records at or after
    ``start`` (and below ``stop``), each with the index range of those records."""
    found: list[tuple[DecodedBatch, int, int]] = []
    remaining = max_records
    # The first batch whose last offset reaches start holds start (or what follows it).
    cursor = db.execute(
        f"SELECT {SELECT_COLUMNS} FROM record_batches "
        "WHERE topic_id = ? AND partition = ? AND last_offset >= ? ORDER BY last_offset",
        (topic_id, partition, start),
    )
    try:
        for row in cursor:
            batch = DecodedBatch(row)
            if stop is not None and batch.base_offset >= stop:
                break
            first = batch.index_of(start)
            last = batch.record_count if stop is None else batch.index_of(stop)
            last = min(last, first + remaining)
            if last > first:
                found.append((batch, first, last))
                remaining -= last - first
                if not remaining:
                    break
    finally:
        cursor.close()
    return found


@contextlib.contextmanager
def _rewriting(db: sqlite3.Connection, topic_id: int, partition: int) -> Iterator[None]:
    """Within the caller's write transaction: the adapter rewrites batches of a partition
    without changing any record, so the triggers start no epoch for it."""
    db.execute("INSERT OR IGNORE INTO log_rewrites VALUES (?, ?)", (topic_id, partition))
    try:
        yield
    finally:
        db.execute(
            "DELETE FROM log_rewrites WHERE topic_id = ? AND partition = ?", (topic_id, partition)
        )


def _delete_below(
    db: sqlite3.Connection, topic_id: int, tp: TopicPartition, before_offset: int
) -> int:
    """Move the start of ``tp`` to ``before_offset`` (<= its end) in the caller's write
    transaction; returns the records removed."""
    start, end = _bounds(db, topic_id, tp.partition)
    if before_offset <= start:
        return 0
    below = _batches(db, topic_id, tp.partition, start, stop=before_offset, max_records=end - start)
    removed = sum(last - first for _, first, last in below)
    db.execute(
        "DELETE FROM record_batches WHERE topic_id = ? AND partition = ? AND last_offset < ?",
        (topic_id, tp.partition, before_offset),
    )
    db.execute(
        "UPDATE partitions SET log_start = ? WHERE topic_id = ? AND partition = ?",
        (before_offset, topic_id, tp.partition),
    )
    return removed


def _first_not_older(
    db: sqlite3.Connection, topic_id: int, tp: TopicPartition, cutoff: int
) -> int | None:
    """The offset of the first record of ``tp`` with timestamp >= ``cutoff`` (the
    partition's end when every record is older); None when there is nothing to delete."""
    start, end = _bounds(db, topic_id, tp.partition)
    if start == end:
        return None
    cursor = db.execute(
        f"SELECT {SELECT_COLUMNS} FROM record_batches "
        "WHERE topic_id = ? AND partition = ? AND last_offset >= ? ORDER BY last_offset",
        (topic_id, tp.partition, start),
    )
    older = False
    try:
        for row in cursor:
            batch = DecodedBatch(row)
            first = batch.index_of(start)
            offsets = batch.offsets(first, batch.record_count)
            for offset, timestamp in zip(
                offsets, batch.timestamps(first, batch.record_count), strict=True
            ):
                if timestamp >= cutoff:
                    return offset if older else None
                older = True
    finally:
        cursor.close()
    return end if older else None


def _convert_record_rows(db: sqlite3.Connection) -> None:
    """Move the records of a log written one row per record into batch rows.

    Logs written before record batches kept a ``records`` table; it is
    converted (in the opening write transaction, so all or nothing) and dropped.
    """
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'records'").fetchone() is None:
        return
    partitions = db.execute("SELECT DISTINCT topic_id, partition FROM records").fetchall()
    for topic_id, partition in partitions:
        rows = db.execute(
            "SELECT offset, key, value, timestamp, headers FROM records "
            "WHERE topic_id = ? AND partition = ? ORDER BY offset",
            (topic_id, partition),
        ).fetchall()
        columns = RecordColumns()
        columns.extend(
            [row[1] for row in rows],
            [row[2] for row in rows],
            [row[3] for row in rows],
            [_decode_row_headers(row[4]) for row in rows],
        )
        with _rewriting(db, topic_id, partition):
            _insert_batches(db, topic_id, partition, [row[0] for row in rows], columns)
    db.execute("DROP TABLE records")


def _decode_row_headers(encoded: str | None) -> Headers:
    """A record's headers as the one-row-per-record format stored them."""
    if not encoded:
        return ()
    return tuple((name, bytes.fromhex(value)) for name, value in json.loads(encoded))


class _PartitionRow(NamedTuple):
    """What the epoch lookups read of one partition, found by topic name."""

    uuid: str  # the topic's incarnation
    topic_id: int
    epoch: int
    next_offset: int
    epoch_tag: str


def _partition_row(db: sqlite3.Connection, tp: TopicPartition) -> _PartitionRow | None:
    """Looked up by name, never through the cached topic id: a topic deleted and
    created again (by another process, say) is another incarnation."""
    row = db.execute(
        "SELECT t.uuid, t.id, p.epoch, p.next_offset, p.epoch_tag FROM topics t "
        "JOIN partitions p ON p.topic_id = t.id WHERE t.name = ? AND p.partition = ?",
        (tp.topic, tp.partition),
    ).fetchone()
    if row is None:
        return None
    uuid, topic_id, epoch, next_offset, tag = row
    return _PartitionRow(str(uuid), int(topic_id), int(epoch), int(next_offset), str(tag))


def _epoch_name(incarnation: str, epoch: int, tag: str) -> str:
    """``<topic incarnation>:<epoch>.<tag>``; without ``.<tag>`` for an untagged epoch."""
    return f"{incarnation}:{epoch}.{tag}" if tag else f"{incarnation}:{epoch}"


def _bounds(db: sqlite3.Connection, topic_id: int, partition: int) -> tuple[int, int]:
    row = db.execute(
        "SELECT log_start, next_offset FROM partitions WHERE topic_id = ? AND partition = ?",
        (topic_id, partition),
    ).fetchone()
    return row[0], row[1]


def _describe(spec: TopicSpec) -> str:
    kind = "compacted" if spec.compacted else "not compacted"
    return f"{spec.partitions} partitions, {kind}"
