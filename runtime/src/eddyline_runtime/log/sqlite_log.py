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

Durability: ``synchronous=NORMAL`` in WAL mode survives any process crash; a
machine crash may lose the last transactions, never part of one.

Read-only opens (``SqliteLog(path, read_only=True)``) are for readers beside a
live log that must not slow its writers down, such as Spark restore tasks:
they open the file with ``mode=ro``, never take the write lock, create no
table, and refuse every write.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain, count, islice, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

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
    TopicSpec,
    TransactionalProducer,
    check_columns,
)
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
    uuid TEXT DEFAULT (lower(hex(randomblob(16))))
);
CREATE TABLE IF NOT EXISTS partitions (
    topic_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    log_start INTEGER NOT NULL DEFAULT 0,
    next_offset INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    topic_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    key BLOB,
    value BLOB,
    timestamp INTEGER NOT NULL,
    headers TEXT,
    PRIMARY KEY (topic_id, partition, offset)
) WITHOUT ROWID;
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
}

# A partition's end moving back (truncation, however it was done: even by hand
# in SQL) starts a new epoch, so offsets from before it are never mistaken for
# offsets after it. The trigger lives in the database, not in this adapter.
_TRUNCATION_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS partition_truncated
AFTER UPDATE OF next_offset ON partitions
WHEN NEW.next_offset < OLD.next_offset
BEGIN
    UPDATE partitions SET epoch = OLD.epoch + 1
    WHERE topic_id = NEW.topic_id AND partition = NEW.partition;
END
"""


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._write() as db:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(statement)
                for (table, column), statements in _MIGRATIONS.items():
                    columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                    if column not in columns:
                        for statement in statements:
                            db.execute(statement)
                db.execute(_TRUNCATION_TRIGGER)
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
                except sqlite3.Error as exc:
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
        return _Transaction(self._connection(), "BEGIN IMMEDIATE")

    def _read(self) -> _Transaction:
        return _Transaction(self._connection(), "BEGIN")

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

    # -- records -------------------------------------------------------------------

    def produce(self, tp: TopicPartition, records: Sequence[Record]) -> list[int]:
        with self._write() as db:
            first = _append(db, self._topic(db, tp), tp.partition, _Columns.of(records))
        return list(range(first, first + len(records)))

    def produce_columns(
        self,
        tp: TopicPartition,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[Headers] | None = None,
    ) -> int:
        columns = _Columns()
        columns.extend(keys, values, timestamps, headers)
        with self._write() as db:
            first = _append(db, self._topic(db, tp), tp.partition, columns)
        return first + len(columns) - 1

    def fetch_columns(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> FetchedColumns:
        if type(self).fetch is not SqliteLog.fetch:
            # A subclass changed what a fetch returns (tests model slow brokers so):
            # the columns must come from it too.
            return super().fetch_columns(tp, offset, max_records)
        with self._read() as db:
            topic_id, end = self._start_reading(db, tp, offset, max_records)
            rows = db.execute(
                "SELECT offset, key, value, timestamp, headers FROM records "
                "WHERE topic_id = ? AND partition = ? AND offset >= ? ORDER BY offset LIMIT ?",
                (topic_id, tp.partition, offset, max_records),
            ).fetchall()
        if not rows:
            return FetchedColumns((), (), (), (), end)
        # Transposed in C, without an object per row. Not zip(*rows): that makes an
        # iterator object per row, and enough of them outlive a young garbage
        # collection to trigger full ones over the whole heap.
        offsets, keys, values, timestamps, encoded = _transpose(rows, 5)
        # Headers are decoded only when a record has some (NULL otherwise).
        headers = list(map(_decode_headers, encoded)) if any(encoded) else None
        return FetchedColumns(offsets, keys, values, timestamps, end, headers)

    def fetch(self, tp: TopicPartition, offset: int, max_records: int = 10_000) -> FetchResult:
        with self._read() as db:
            topic_id, end = self._start_reading(db, tp, offset, max_records)
            rows = db.execute(
                "SELECT offset, key, value, timestamp, headers FROM records "
                "WHERE topic_id = ? AND partition = ? AND offset >= ? ORDER BY offset LIMIT ?",
                (topic_id, tp.partition, offset, max_records),
            ).fetchall()
        records = [
            Record(
                key, value, timestamp, _decode_headers(headers) if headers else (), record_offset
            )
            for record_offset, key, value, timestamp, headers in rows
        ]
        return FetchResult(records, end)

    def fetch_changes(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> ChangeBatch:
        with self._read() as db:
            topic_id, _ = self._start_reading(db, tp, offset, max_records)
            where = (topic_id, tp.partition, offset)
            last = db.execute(
                "SELECT max(offset) FROM (SELECT offset FROM records WHERE topic_id = ? "
                "AND partition = ? AND offset >= ? ORDER BY offset LIMIT ?)",
                (*where, max_records),
            ).fetchone()[0]
            if last is None:
                return ChangeBatch([], -1)
            # fetchall() already yields (key, value) tuples: no per-row Python work.
            entries = db.execute(
                "SELECT key, value FROM records WHERE topic_id = ? AND partition = ? "
                "AND offset >= ? AND offset <= ? AND key IS NOT NULL ORDER BY offset",
                (*where, last),
            ).fetchall()
        return ChangeBatch(entries, last)

    def fetch_changes_between(
        self, tp: TopicPartition, start: int, end: int, max_records: int = 10_000
    ) -> OffsetChanges:
        if end <= start:
            return OffsetChanges((), (), (), -1)
        with self._read() as db:
            topic_id, _ = self._start_reading(db, tp, start, max_records)
            # One index range scan of the primary key; keyless records are
            # read too (not returned), so last_offset counts them as read.
            rows = db.execute(
                "SELECT offset, key, value FROM records WHERE topic_id = ? AND partition = ? "
                "AND offset >= ? AND offset < ? ORDER BY offset LIMIT ?",
                (topic_id, tp.partition, start, end, max_records),
            ).fetchall()
        if not rows:
            return OffsetChanges((), (), (), -1)
        last: int = rows[-1][0]
        keyed = [row for row in rows if row[1] is not None]
        if not keyed:
            return OffsetChanges((), (), (), last)
        offsets, keys, values = zip(*keyed, strict=True)
        return OffsetChanges(offsets, keys, values, last)

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
        """The topic's id and the partition's truncation epoch, as ``<topic id>:<epoch>``.

        Looked up by name, never through the cached topic id: a topic deleted
        and created again (by another process, say) is another incarnation.
        """
        with self._read() as db:
            row = db.execute(
                "SELECT t.uuid, p.epoch FROM topics t JOIN partitions p ON p.topic_id = t.id"
                " WHERE t.name = ? AND p.partition = ?",
                (tp.topic, tp.partition),
            ).fetchone()
            if row is None:
                self._topic(db, tp)  # raises, naming the topics there are
                raise UnknownTopicError(f"partition {tp}", [])
        return f"{row[0]}:{row[1]}"

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
        """Keep only the latest record per key in a compacted topic; returns records removed."""
        with self._write() as db:
            topic_id = self._topic(db, TopicPartition(topic, 0))
            if not self._topic_ids[topic][1].compacted:
                raise LogError(
                    f'topic "{topic}" is not compacted, so compact() would drop history; '
                    "create changelog topics with compacted=True"
                )
            # The latest offset per key goes into an indexed temporary table
            # first: a NOT IN over the grouped subquery rescans it for every
            # row (minutes for a million-record changelog).
            db.execute(
                "CREATE TEMP TABLE IF NOT EXISTS compaction_keep ("
                " partition INTEGER NOT NULL, offset INTEGER NOT NULL,"
                " PRIMARY KEY (partition, offset)) WITHOUT ROWID"
            )
            db.execute("DELETE FROM compaction_keep")
            db.execute(
                "INSERT INTO compaction_keep SELECT partition, MAX(offset) FROM records"
                " WHERE topic_id = ?1 AND key IS NOT NULL GROUP BY partition, key",
                (topic_id,),
            )
            removed = db.execute(
                "DELETE FROM records WHERE topic_id = ?1 AND key IS NOT NULL AND NOT EXISTS ("
                " SELECT 1 FROM compaction_keep k"
                " WHERE k.partition = records.partition AND k.offset = records.offset)",
                (topic_id,),
            ).rowcount
            db.execute("DELETE FROM compaction_keep")
        return removed

    def delete_records(self, tp: TopicPartition, before_offset: int) -> int:
        """Move the partition's start to ``before_offset``, deleting what lies below it.

        Kafka's DeleteRecords (what retention does to old segments): offsets
        keep their meaning, the end stays, the start never moves back.
        Returns the records removed. An offset beyond the end is refused.
        """
        with self._write() as db:
            topic_id = self._topic(db, tp)
            start, end = _bounds(db, topic_id, tp.partition)
            if before_offset > end:
                raise OffsetOutOfRangeError(tp, before_offset, start, end)
            if before_offset <= start:
                return 0
            removed = db.execute(
                "DELETE FROM records WHERE topic_id = ? AND partition = ? AND offset < ?",
                (topic_id, tp.partition, before_offset),
            ).rowcount
            db.execute(
                "UPDATE partitions SET log_start = ? WHERE topic_id = ? AND partition = ?",
                (before_offset, topic_id, tp.partition),
            )
        return int(removed)

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
        self._batches: dict[TopicPartition, _Columns] | None = None
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

    def _columns(self, tp: TopicPartition) -> _Columns:
        batches = self._open("send")
        columns = batches.get(tp)
        if columns is None:
            columns = batches[tp] = _Columns()
        return columns

    def send_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        self._open("send offsets")
        self._offsets.setdefault(group, {}).update(offsets)

    def commit(self) -> CommittedTransaction:
        batches = self._open("commit")
        log = self._log
        with log._write() as db:
            current = db.execute(
                "SELECT epoch FROM producers WHERE transactional_id = ?", (self.transactional_id,)
            ).fetchone()[0]
            if current != self.epoch:
                self._batches = None
                raise ProducerFencedError(self.transactional_id, self.epoch, current)
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

    def _open(self, action: str) -> dict[TopicPartition, _Columns]:
        if self._batches is None:
            raise TransactionStateError(
                f'transactional id "{self.transactional_id}": cannot {action} without an open '
                "transaction; call begin() first"
            )
        return self._batches


class _Transaction:
    """``with`` block around one SQLite transaction: commit on success, roll back on error."""

    def __init__(self, connection: sqlite3.Connection, begin: str) -> None:
        self._connection = connection
        self._begin = begin

    def __enter__(self) -> sqlite3.Connection:
        self._connection.execute(self._begin)
        return self._connection

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._connection.execute("ROLLBACK" if exc_type is not None else "COMMIT")


class _Columns:
    """Records to append, as the columns of the insert (headers already encoded)."""

    __slots__ = ("headers", "keys", "timestamps", "values")

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []
        # None while no record has headers: the insert then binds NULL for all of them.
        self.headers: list[str | None] | None = None

    @classmethod
    def of(cls, records: Sequence[Record]) -> _Columns:
        columns = cls()
        columns.extend_records(records)
        return columns

    def __len__(self) -> int:
        return len(self.keys)

    def extend(
        self,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[Headers] | None = None,
    ) -> None:
        check_columns(keys, values, timestamps)
        if headers is not None and len(headers) != len(keys):
            raise ValueError(
                f"columns of one batch must have one entry per record: {len(keys)} keys, "
                f"{len(headers)} headers"
            )
        if headers is not None and any(headers):
            if self.headers is None:
                self.headers = [None] * len(self.keys)
            self.headers.extend(map(_encode_headers, headers))
        elif self.headers is not None:
            self.headers.extend(repeat(None, len(keys)))
        self.keys.extend(keys)
        self.values.extend(values)
        self.timestamps.extend(timestamps)

    def extend_records(self, records: Sequence[Record]) -> None:
        if self.headers is None and any(r.headers for r in records):
            self.headers = [None] * len(self.keys)
        if self.headers is not None:
            self.headers.extend(_encode_headers(r.headers) for r in records)
        self.keys.extend(r.key for r in records)
        self.values.extend(r.value for r in records)
        self.timestamps.extend(r.timestamp for r in records)


_INSERT = (
    "INSERT INTO records (topic_id, partition, offset, key, value, timestamp, headers) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
# Records without headers go in this many rows per INSERT statement: SQLite then
# runs one statement per 256 rows instead of one per row, about 35% less CPU per
# record than executemany (the topic and partition are bound once, as ?1 and ?2).
_ROWS_PER_INSERT = 256
_MULTI_ROW_INSERT = (
    "INSERT INTO records (topic_id, partition, offset, key, value, timestamp, headers) VALUES "
    + ",".join(
        f"(?1, ?2, ?{3 + 4 * row}, ?{4 + 4 * row}, ?{5 + 4 * row}, ?{6 + 4 * row}, NULL)"
        for row in range(_ROWS_PER_INSERT)
    )
)


def _append(db: sqlite3.Connection, topic_id: int, partition: int, columns: _Columns) -> int:
    """Append in the caller's write transaction; returns the first offset given
    (the records get consecutive offsets from it)."""
    first: int = db.execute(
        "SELECT next_offset FROM partitions WHERE topic_id = ? AND partition = ?",
        (topic_id, partition),
    ).fetchone()[0]
    # The rows are zipped from the columns in C: no Python work per record.
    if columns.headers is not None:
        db.executemany(
            _INSERT,
            zip(
                repeat(topic_id),
                repeat(partition),
                count(first),
                columns.keys,
                columns.values,
                columns.timestamps,
                columns.headers,
            ),
        )
    else:
        rows = zip(count(first), columns.keys, columns.values, columns.timestamps)
        full_statements, rest = divmod(len(columns), _ROWS_PER_INSERT)
        for _ in range(full_statements):
            parameters: list[Any] = [topic_id, partition]
            parameters.extend(chain.from_iterable(islice(rows, _ROWS_PER_INSERT)))
            db.execute(_MULTI_ROW_INSERT, parameters)
        if rest:
            done = full_statements * _ROWS_PER_INSERT
            db.executemany(
                _INSERT,
                zip(
                    repeat(topic_id),
                    repeat(partition),
                    count(first + done),
                    columns.keys[done:],
                    columns.values[done:],
                    columns.timestamps[done:],
                    repeat(None),
                ),
            )
    db.execute(
        "UPDATE partitions SET next_offset = ? WHERE topic_id = ? AND partition = ?",
        (first + len(columns), topic_id, partition),
    )
    return first


def _transpose(rows: list[Any], width: int) -> list[list[Any]]:
    """The columns of ``rows`` (tuples of ``width`` values)."""
    return [list(map(itemgetter(column), rows)) for column in range(width)]


def _bounds(db: sqlite3.Connection, topic_id: int, partition: int) -> tuple[int, int]:
    row = db.execute(
        "SELECT log_start, next_offset FROM partitions WHERE topic_id = ? AND partition = ?",
        (topic_id, partition),
    ).fetchone()
    return row[0], row[1]


def _encode_headers(headers: Headers) -> str | None:
    return json.dumps([[name, value.hex()] for name, value in headers]) if headers else None


def _decode_headers(encoded: str | None) -> Headers:
    if not encoded:
        return ()
    pairs: Iterable[Any] = json.loads(encoded)
    return tuple((name, bytes.fromhex(value)) for name, value in pairs)


def _describe(spec: TopicSpec) -> str:
    kind = "compacted" if spec.compacted else "not compacted"
    return f"{spec.partitions} partitions, {kind}"
