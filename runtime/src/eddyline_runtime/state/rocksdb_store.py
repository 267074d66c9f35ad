"""A transactional state store on RocksDB (KIP-892), through rocksdict.

On disk, one RocksDB database per store directory with two column families:

* ``default`` holds the data (as pre-KIP-892 stores did, so they upgrade in place);
* ``offsets`` holds the changelog offsets the data includes and the KIP-796
  input position, under the keys built by :func:`_offset_key`.

Writes wait in a :class:`~eddyline_runtime.state.transaction_buffer.TransactionBuffer`
until :meth:`RocksDBStore.commit`, which writes the buffered data, the
changelog offsets and the position in **one** ``WriteBatch``. RocksDB applies
a batch atomically, and the database is opened with *atomic flush*, so
whatever part of it reaches disk, data and offsets reach it together: after a
crash the offsets found describe exactly the data found.

Durability: every commit's batch goes through RocksDB's write-ahead log,
written but not synced (a ``write()`` into the page cache, no ``fsync``), so a
*process* crash (SIGKILL, OOM kill) loses no acknowledged commit: reopening
replays the log, batch by batch, and lands exactly on the last commit. A
*machine* crash loses what the page cache had not written; RocksDB then
recovers a consistent prefix of batches (point-in-time recovery), and we bound
that prefix's staleness by syncing the log once the not-yet-synced tail
outgrows :class:`DurabilityBound`. Memtables are never flushed on commit (the
KIP-1035 regression); RocksDB flushes them when full, atomically across the
column families. Why not the KIP's WAL-off design: it needs a manual flush of
both column families as one unit, which rocksdict cannot ask for (it flushes
one column family per call), and a kill between two flushes leaves data ahead
of its offsets; our crash test caught exactly that.

Memory: with a budget (``memory.limit.bytes`` x ``rocksdb.memory.limit.share``,
the limit coming from the downward API), every store of the process shares
one block cache and one write buffer manager (:class:`RocksDBMemory`), so a
pod with many stores does not grow a memtable and a cache per store until it
is OOM-killed. Memtables are charged to the cache (RocksDB's "cost memtables
to block cache"): the cache (half the budget) holds blocks, index and filter
blocks included, and the manager (a quarter) makes RocksDB flush the largest
memtables once they outgrow it; the last quarter is headroom for memtables
still waiting for their flush. Their reported usages (``Cache.get_usage()`` +
``WriteBufferManager.get_usage()``) stay within the budget. Without a budget each
store keeps RocksDB's own per-database defaults, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

from rocksdict import (
    BlockBasedOptions,
    Cache,
    DbClosedError,
    DBRecoveryMode,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

from eddyline_runtime.config import IsolationLevel, StreamsConfig
from eddyline_runtime.errors import InvalidArgumentError
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.metrics import MetricName, MetricsRegistry, Sensor
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state.as_of_marker import take_as_of, write_as_of
from eddyline_runtime.state.errors import (
    InvalidChangelogOffsetError,
    StateStoreError,
    StoreClosedError,
    StoreCommitError,
    StoreCorruptedError,
    StoreLockedError,
)
from eddyline_runtime.state.offset_checkpoint import (
    CHECKPOINT_FILE_NAME,
    POSITION_FILE_NAME,
    read_changelog_offsets,
    read_offsets,
    write_offsets,
)
from eddyline_runtime.state.state_directory import (
    DirectoryLock,
    DiskUsage,
    empty_trash,
    move_to_trash,
    quarantine_entry,
    remove_staging_directories,
    write_quarantine_note,
)
from eddyline_runtime.state.store import KeyValue, StateStore, StoreReader, check_key
from eddyline_runtime.state.transaction_buffer import ABSENT, TransactionBuffer, merge_sorted

logger = logging.getLogger(__name__)

OFFSETS_COLUMN_FAMILY: Final = "offsets"
STATE_METRICS_GROUP: Final = "stream-state-metrics"

# Offsets column family keys: a kind byte, the partition, then the topic.
_CHANGELOG_KIND: Final = b"c"
_POSITION_KIND: Final = b"p"
_EPOCH_KIND: Final = b"e"  # the changelog incarnation (Log.partition_epoch) of an offset
_OFFSET_KINDS: Final = frozenset((_CHANGELOG_KIND, _POSITION_KIND, _EPOCH_KIND))
# Written when eddyline creates the database: offsets are eddyline's from then on,
# so a legacy .checkpoint file never speaks for it.
_FORMAT_KEY: Final = b"m:format"
_FORMAT: Final = b"eddyline/1"
# The file RocksDB writes when it creates a database: absent before an open
# means this open creates it (new, or recreated after its files were lost).
_ROCKSDB_CURRENT_FILE: Final = "CURRENT"
_PARTITION: Final = struct.Struct(">i")
_OFFSET: Final = struct.Struct(">q")
# Memtable size. Inserting a commit's batch costs more the larger the
# memtable's skiplist (cache misses); with 100-byte values, 8 MiB wrote ~1.5x
# faster than RocksDB's 64 MiB default here (tests/bench), and RocksDB
# flushes the smaller memtables on its background thread, off the commit path.
_WRITE_BUFFER_BYTES: Final = 8 * 1024 * 1024
# With a memory budget: see _open_database.
_BOUNDED_ARENA_BLOCK_BYTES: Final = 64 * 1024
_BOUNDED_BACKGROUND_JOBS: Final = 4


@dataclass(frozen=True, slots=True)
class DurabilityBound:
    """How far the synced state may trail the last commit; checked at each commit.

    A process crash loses nothing either way (see the module docstring); this
    bounds what a machine crash can lose, which restoration then replays from
    the changelog.

    ``max_records``: changelog records (or, for a commit without offsets,
    buffered writes) committed since the last sync. 100,000 records replay in
    about 0.2 s at the runtime's restore rate (>= 500k records/s), inside
    KIP-892's "restore under EOS in under a second"; a sync of the log costs
    one ``fsync``, so at 10k records per commit it is paid every ~10 commits.

    ``max_seconds``: time since the last sync, so a slow trickle of commits
    still reaches the disk; 30 s matches the at-least-once commit interval.
    """

    max_records: int = 100_000
    max_seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.max_records < 0 or self.max_seconds < 0:
            raise InvalidArgumentError(
                f"DurabilityBound({self.max_records}, {self.max_seconds}): both must be >= 0 "
                "(0 syncs every commit)"
            )


@dataclass(frozen=True, slots=True)
class RocksDBMemoryUsage:
    """What the shared cache and write buffer manager report, against their budget."""

    cache_bytes: int
    write_buffer_bytes: int
    budget_bytes: int

    @property
    def total_bytes(self) -> int:
        # Memtables are charged to the cache too, so this counts them twice: an upper bound.
        return self.cache_bytes + self.write_buffer_bytes


class RocksDBMemory:
    """The process's one block cache and one write buffer manager (see the module docstring).

    Get it through :func:`shared_memory`: stores opened with a budget all use the same
    one, so the bound holds for the process however many stores it opens.
    """

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise InvalidArgumentError(
                f"a RocksDB memory budget is a number of bytes > 0, not {budget_bytes}; "
                "set memory.limit.bytes (or EDDYLINE_MEMORY_LIMIT_BYTES) to the container's "
                "memory limit, or leave it unset for no bound"
            )
        self.budget_bytes = budget_bytes
        self.cache = Cache(self._cache_bytes(budget_bytes))
        # No stall: past the limit RocksDB flushes the largest memtables instead. Stalling
        # writers deadlocked 64 stores here: every open memtable keeps an arena block
        # charged, so usage never fell back under the limit and no write went through.
        self.write_buffers = WriteBufferManager.new_write_buffer_manager_with_cache(
            self._write_buffer_bytes(budget_bytes), False, self.cache
        )

    # Shares of the budget. Memtables past the manager's limit are flushed, not refused,
    # so they overshoot it until the flushes finish (measured up to twice with 64 stores
    # on a loaded machine): the quarter left over is that headroom.
    @staticmethod
    def _cache_bytes(budget: int) -> int:
        return budget // 2

    @staticmethod
    def _write_buffer_bytes(budget: int) -> int:
        return budget // 4

    def resize(self, budget_bytes: int) -> None:
        """Apply a new budget (a later open asked for another one): the last one wins."""
        self.budget_bytes = budget_bytes
        self.cache.set_capacity(self._cache_bytes(budget_bytes))
        self.write_buffers.set_buffer_size(self._write_buffer_bytes(budget_bytes))

    def usage(self) -> RocksDBMemoryUsage:
        """What RocksDB reports it holds: the cache's usage and the memtables'."""
        return RocksDBMemoryUsage(
            cache_bytes=int(self.cache.get_usage()),
            write_buffer_bytes=int(self.write_buffers.get_usage()),
            budget_bytes=self.budget_bytes,
        )

    def table_options(self) -> BlockBasedOptions:
        table = BlockBasedOptions()
        table.set_block_cache(self.cache)
        # Index and filter blocks in the cache too, so they count against the budget.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        return table


_shared_memory: RocksDBMemory | None = None
_shared_memory_lock = threading.Lock()


def shared_memory(budget_bytes: int) -> RocksDBMemory:
    """The process's :class:`RocksDBMemory`, created on first use with ``budget_bytes``."""
    global _shared_memory  # noqa: PLW0603 - one per process, on purpose
    with _shared_memory_lock:
        if _shared_memory is None:
            _shared_memory = RocksDBMemory(budget_bytes)
        elif _shared_memory.budget_bytes != budget_bytes:
            _shared_memory.resize(budget_bytes)
        return _shared_memory


def memory_usage() -> RocksDBMemoryUsage | None:
    """What the shared cache and write buffers report (None: no budget in this process)."""
    with _shared_memory_lock:
        return None if _shared_memory is None else _shared_memory.usage()


@dataclass(frozen=True, slots=True)
class RocksDBStoreOptions:
    """Per-store options; the runtime builds them from StreamsConfig."""

    # The isolation of reader(None): default.state.isolation.level as resolved by config.
    default_isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED
    durability: DurabilityBound = field(default_factory=DurabilityBound)
    # What every RocksDB store of the process may use together (None: unbounded).
    memory_budget_bytes: int | None = None

    @classmethod
    def from_config(cls, config: StreamsConfig) -> RocksDBStoreOptions:
        """The options every store of a pod gets from its StreamsConfig."""
        budget = None
        if config.memory_limit_bytes > 0:
            budget = int(config.memory_limit_bytes * config.rocksdb_memory_limit_share)
        return cls(default_isolation=config.effective_isolation_level, memory_budget_bytes=budget)


class RocksDBStore(StateStore):
    """A persistent, transactional key-value store that manages its own offsets.

    Open it with the constructor; the owner thread then writes, reads and
    commits; other threads read through :meth:`reader`. ``close()`` discards
    uncommitted writes, makes everything committed durable, and writes
    ``.checkpoint`` for tools that read offsets without opening the store.
    """

    def __init__(
        self,
        name: str,
        directory: Path | str,
        options: RocksDBStoreOptions | None = None,
        *,
        metrics: MetricsRegistry | None = None,
        metric_tags: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.directory = Path(directory)
        self.options = options or RocksDBStoreOptions()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as error:
            in_the_way = next(
                (p for p in (self.directory, *self.directory.parents) if p.is_file()),
                self.directory,
            )
            raise StateStoreError(
                name,
                f'state store "{name}" cannot have its directory {self.directory}: '
                f"{in_the_way} is a file, not a directory; move it out of the state "
                "directory (eddyline keeps only its own directories there)",
            ) from error
        self._dir_lock = DirectoryLock.acquire(name, self.directory)
        self._disk_usage = DiskUsage(self.directory)
        empty_trash(self.directory)
        for leftover in remove_staging_directories(self.directory):
            logger.info(
                'state store "%s": removed %s, left by an interrupted ingest', name, leftover
            )
        created = not (self.directory / _ROCKSDB_CURRENT_FILE).exists()
        # Write-ahead log on, not synced per write: see the module docstring.
        self._write_options = WriteOptions()
        self._buffer = TransactionBuffer()
        # Held by a commit while it writes the database and swaps the buffer,
        # and by a reader while it captures buffer + database: never by puts.
        self._commit_lock = threading.Lock()
        self._closed = False
        try:
            self._db = _open_database(
                name,
                self.directory,
                None
                if self.options.memory_budget_bytes is None
                else shared_memory(self.options.memory_budget_bytes),
            )
        except BaseException:
            self._dir_lock.release()
            raise
        self._offsets_db = self._db.get_column_family(OFFSETS_COLUMN_FAMILY)
        self._offsets_handle = self._db.get_column_family_handle(OFFSETS_COLUMN_FAMILY)
        self._committed_epochs: dict[TopicPartition, str] = {}
        self._pending_epochs: dict[TopicPartition, str] = {}
        try:
            self._committed_offsets, self._committed_position, formatted = self._load_offsets()
            self._adopt_legacy_offset_files(created=created, formatted=formatted)
            self._write_checkpoint_file()
            self._recorded_as_of = take_as_of(self.directory, self._committed_offsets)
            self._noted_as_of: int | None = None
        except BaseException:
            # Leave nothing held: the caller may fix the cause and open again.
            self._release()
            raise
        self._durable_offsets = dict(self._committed_offsets)
        self._undurable_records = 0
        self._last_durable_at = time.monotonic()

        self._commit_sensor = Sensor()
        self._metrics = metrics
        self._metric_tags = {**(metric_tags or {}), "rocksdb-state-id": name}
        if metrics is not None:
            _register_commit_metrics(metrics, self._commit_sensor, self._metric_tags)
            if self.options.memory_budget_bytes is not None:
                _register_memory_metrics(metrics, shared_memory(self.options.memory_budget_bytes))

    # -- the contract -------------------------------------------------------------

    @property
    def persistent(self) -> bool:
        return True

    @property
    def manages_offsets(self) -> bool:
        return True

    @property
    def is_open(self) -> bool:
        return not self._closed

    def put(self, key: bytes, value: bytes) -> None:
        if self._closed:
            raise StoreClosedError(self.name, "put")
        if type(key) is not bytes or type(value) is not bytes:
            raise _not_bytes(self.name, "put", key, value)
        self._buffer.put(key, value)

    def delete(self, key: bytes) -> bytes | None:
        if self._closed:
            raise StoreClosedError(self.name, "delete")
        check_key(self.name, "delete", key)
        old = self.get(key)
        self._buffer.put(key, None)
        return old

    def put_all(self, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Buffer many writes (None deletes) without reading the values they replace."""
        if self._closed:
            raise StoreClosedError(self.name, "put_all")
        buffer_put = self._buffer.put
        for key, value in entries:
            if type(key) is not bytes or (value is not None and type(value) is not bytes):
                raise _not_bytes(self.name, "put_all", key, value)
            buffer_put(key, value)

    def get(self, key: bytes) -> bytes | None:
        if self._closed:
            raise StoreClosedError(self.name, "get")
        check_key(self.name, "get", key)
        buffered = self._buffer.writes.get(key, ABSENT)
        if buffered is ABSENT:
            return self._db.get(key)
        return buffered

    def commit(self, changelog_offsets: Mapping[TopicPartition, int]) -> None:
        if self._closed:
            raise StoreClosedError(self.name, "commit")
        started = time.perf_counter_ns()
        advanced = self._advanced_offsets(changelog_offsets)
        buffer = self._buffer
        if buffer.writes or advanced or buffer.positions or self._pending_epochs:
            self._write(buffer.writes.items(), len(buffer.writes), advanced, buffer.positions)
        self._commit_sensor.record(time.perf_counter_ns() - started)

    def restore_batch(
        self,
        entries: Sequence[tuple[bytes, bytes | None]],
        changelog_offsets: Mapping[TopicPartition, int],
    ) -> None:
        """Apply changelog records straight to the database: one batch, no buffer copy."""
        if self._closed:
            raise StoreClosedError(self.name, "restore")
        if self._buffer.writes:
            raise StateStoreError(
                self.name,
                f'state store "{self.name}" has uncommitted writes; restoration runs before '
                "processing starts: commit or close first",
            )
        self._write(entries, len(entries), self._advanced_offsets(changelog_offsets), {})

    def _advanced_offsets(
        self, changelog_offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """The offsets that differ from those committed, after checking they are offsets."""
        for partition, offset in changelog_offsets.items():
            if type(offset) is not int or offset < 0:
                raise InvalidChangelogOffsetError(self.name, partition, offset)
        return {
            tp: offset
            for tp, offset in changelog_offsets.items()
            if self._committed_offsets.get(tp) != offset
        }

    def _write(
        self,
        entries: Iterable[tuple[bytes, bytes | None]],
        count: int,
        advanced: Mapping[TopicPartition, int],
        positions: Mapping[TopicPartition, int],
    ) -> None:
        """Data, changelog offsets and position in one WriteBatch; then a new buffer."""
        batch = WriteBatch(raw_mode=True)
        put, delete = batch.put, batch.delete
        for key, value in entries:
            if value is None:
                delete(key)
            else:
                put(key, value)
        for tp, offset in advanced.items():
            put(_offset_key(_CHANGELOG_KIND, tp), _OFFSET.pack(offset), self._offsets_handle)
        for tp, offset in positions.items():
            put(_offset_key(_POSITION_KIND, tp), _OFFSET.pack(offset), self._offsets_handle)
        epochs, self._pending_epochs = self._pending_epochs, {}
        for tp, epoch in epochs.items():
            put(_offset_key(_EPOCH_KIND, tp), epoch.encode(), self._offsets_handle)
        with self._commit_lock:
            try:
                self._db.write(batch, self._write_options)
            except Exception as exc:
                raise StoreCommitError(self.name, self.directory, str(exc)) from exc
            # Readers may now find these writes in the database, so the
            # buffer generation can go (see transaction_buffer).
            self._committed_position.update(positions)
            self._buffer.reset()
            self._committed_offsets.update(advanced)
            self._committed_epochs.update(epochs)
        self._after_commit(count, advanced)

    def committed_offset(self, partition: TopicPartition) -> int | None:
        return self._committed_offsets.get(partition)

    def note_as_of(self, as_of_ms: int | None) -> None:
        self._noted_as_of = as_of_ms

    @property
    def recorded_as_of_ms(self) -> int | None:
        return self._recorded_as_of

    def committed_changelogs(self) -> Collection[TopicPartition]:
        return tuple(self._committed_offsets)

    def changelog_epoch(self, partition: TopicPartition) -> str | None:
        return self._pending_epochs.get(partition, self._committed_epochs.get(partition))

    def record_changelog_epoch(self, partition: TopicPartition, epoch: str) -> None:
        if self._closed:
            raise StoreClosedError(self.name, "record a changelog epoch")
        if self._committed_epochs.get(partition) != epoch:
            self._pending_epochs[partition] = epoch

    def disk_bytes(self) -> int:
        """The store directory's bytes on disk (SST files, write-ahead log, manifest), walked
        at most every ``DISK_USAGE_MAX_AGE_S``: what the copy costs its volume, which is what
        a size in ``kubectl eddyline status`` is for (docs/operator.md, "kubectl eddyline")."""
        return self._disk_usage.bytes()

    def approximate_num_uncommitted_bytes(self) -> int:
        return self._buffer.num_bytes

    def update_position(self, partition: TopicPartition, offset: int) -> None:
        if self._closed:
            raise StoreClosedError(self.name, "update its position")
        self._buffer.positions[partition] = offset

    def position(
        self, isolation: IsolationLevel | str = IsolationLevel.READ_UNCOMMITTED
    ) -> Mapping[TopicPartition, int]:
        committed = dict(self._committed_position)
        if IsolationLevel.parse(isolation, key="isolation") is IsolationLevel.READ_COMMITTED:
            return committed
        return {**committed, **self._buffer.positions}

    def reader(self, isolation: IsolationLevel | str | None = None) -> StoreReader:
        level = (
            self.options.default_isolation
            if isolation is None
            else IsolationLevel.parse(isolation, key="isolation")
        )
        return _RocksDBReader(self, level)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Iterators hold the database open (and its LOCK held): end them first.
        self.close_iterators()
        try:
            self._buffer.reset()
            self._flush_memtables()
            self._write_checkpoint_file()
            if self._noted_as_of is not None and self._committed_offsets:
                write_as_of(self.directory, self._committed_offsets, self._noted_as_of)
        finally:
            self._release()
            if self._metrics is not None:
                self._metrics.unregister_tagged(self._metric_tags)

    def wipe(self) -> None:
        """Close and delete the store's directory; restoration rebuilds it from its changelog.

        The directory leaves its place in one rename while this store still
        holds its lock, so nothing opens it half deleted.
        """
        if not self._closed:
            self._buffer.reset()
            try:
                self._close_database()
                trash = move_to_trash(self.directory)
            finally:
                self._dir_lock.release()
                if self._metrics is not None:
                    self._metrics.unregister_tagged(self._metric_tags)
            shutil.rmtree(trash, ignore_errors=True)

    def set_aside(self, reason: str, note: Mapping[str, Any] | None = None) -> Path | None:
        """Close the store and move its directory into the state directory's quarantine.

        One ``rename(2)`` while this store still holds its lock: the store is
        whole in its place or whole in the quarantine, never half moved. The
        ``note`` is written into the directory before it moves, so the copy
        never sits in the quarantine without it (a crash before the rename
        leaves the store in place, to be judged again).
        """
        if self._closed:
            raise StoreClosedError(self.name, "set aside")
        self._buffer.reset()
        entry = quarantine_entry(self.directory, self.name, reason)
        try:
            self._close_database()
            if note is not None:
                write_quarantine_note(self.directory, note)
            entry.parent.mkdir(parents=True, exist_ok=True)
            os.rename(self.directory, entry)
        finally:
            self._dir_lock.release()
            if self._metrics is not None:
                self._metrics.unregister_tagged(self._metric_tags)
        return entry

    def _release(self) -> None:
        """Close RocksDB and drop the directory lock."""
        try:
            self._close_database()
        finally:
            self._dir_lock.release()

    def _close_database(self) -> None:
        self._closed = True
        self._offsets_db.close()
        self._db.close()
        # RocksDB stays open while any handle on it lives; drop ours so a
        # reopen in this process finds the database closed.
        with contextlib.suppress(AttributeError):
            del self._offsets_handle

    # -- durability ------------------------------------------------------------------

    @property
    def durable_offsets(self) -> Mapping[TopicPartition, int]:
        """Changelog offsets synced to disk: even a machine crash reopens at these or later."""
        return dict(self._durable_offsets)

    def _after_commit(self, num_writes: int, advanced: Mapping[TopicPartition, int]) -> None:
        """Sync the log if the committed-but-not-synced tail has outgrown the bound."""
        advance = max(
            (offset - self._durable_offsets.get(tp, -1) for tp, offset in advanced.items()),
            default=0,
        )
        self._undurable_records = max(self._undurable_records + num_writes, advance)
        bound = self.options.durability
        if (
            self._undurable_records > bound.max_records
            or time.monotonic() - self._last_durable_at > bound.max_seconds
        ):
            self._sync()

    def _sync(self) -> None:
        self._db.flush_wal(sync=True)
        self._mark_durable()

    def _flush_memtables(self) -> None:
        """Write memtables to SST files, so a reopen has no log to replay.

        Safe in any order: a column family's log records are replayed until
        that column family has flushed past them.
        """
        self._db.flush(wait=True)
        self._offsets_db.flush(wait=True)
        self._mark_durable()

    def _mark_durable(self) -> None:
        self._durable_offsets = dict(self._committed_offsets)
        self._undurable_records = 0
        self._last_durable_at = time.monotonic()

    # -- offsets on disk -----------------------------------------------------------

    def _load_offsets(
        self,
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int], bool]:
        """Changelog offsets, positions and epochs; and whether eddyline formatted the database."""
        changelog: dict[TopicPartition, int] = {}
        position: dict[TopicPartition, int] = {}
        formatted = False
        for raw_key, raw_value in self._offsets_db.items():
            key, value = cast(bytes, raw_key), cast(bytes, raw_value)
            if key == _FORMAT_KEY:
                formatted = True
                continue
            kind = key[:1]
            if kind not in _OFFSET_KINDS:
                # A later release's entry (metadata under ``m:``, say): this release has
                # no use for it, and reading it as an offset would invent a position
                # after a rollback. Kept as it is, so rolling forward again finds it.
                continue
            tp = _decode_offset_key(key)
            if kind == _EPOCH_KIND:
                self._committed_epochs[tp] = value.decode()
            else:
                (changelog if kind == _CHANGELOG_KIND else position)[tp] = _OFFSET.unpack(value)[0]
        return changelog, position, formatted

    def _adopt_legacy_offset_files(self, *, created: bool, formatted: bool) -> None:
        """KIP-892 upgrade: adopt offsets from .checkpoint / .position, then format the database.

        Only a database that existed before this open, that eddyline never
        formatted, and that holds data is a pre-KIP-892 store whose offsets
        live in those files. A database this open created (its files were
        deleted, or RocksDB recreated it) or one eddyline formatted never
        adopts them: its data is not what the files describe, and adopting
        them would skip the changelog records it lacks.
        """
        checkpoint_file = self.directory / CHECKPOINT_FILE_NAME
        position_file = self.directory / POSITION_FILE_NAME
        adopt = not (created or formatted)
        holds_data = adopt and next(iter(self._db.keys()), None) is not None
        imported_changelog: dict[TopicPartition, int] = {}
        imported_position: dict[TopicPartition, int] = {}
        if holds_data:
            if not self._committed_offsets:
                imported_changelog = read_changelog_offsets(checkpoint_file, self.name)
            if not self._committed_position:
                imported_position = dict(read_offsets(position_file))
        elif not self._committed_offsets and checkpoint_file.exists():
            if created:
                why = "the database was created by this open (its files were missing)"
            elif formatted:
                why = "eddyline formatted this database, which keeps its offsets inside itself"
            else:
                why = "the database holds no data"
            logger.warning(
                'state store "%s" at %s: ignoring %s, which does not describe this database '
                "(%s); the store is restored from its changelog",
                self.name,
                self.directory,
                CHECKPOINT_FILE_NAME,
                why,
            )
            checkpoint_file.unlink()
        if formatted:
            position_file.unlink(missing_ok=True)  # only the store's own position counts
            return
        batch = WriteBatch(raw_mode=True)
        for kind, offsets in (
            (_CHANGELOG_KIND, imported_changelog),
            (_POSITION_KIND, imported_position),
        ):
            for tp, offset in offsets.items():
                batch.put(_offset_key(kind, tp), _OFFSET.pack(offset), self._offsets_handle)
        batch.put(_FORMAT_KEY, _FORMAT, self._offsets_handle)
        self._db.write(batch, self._write_options)
        self._committed_offsets.update(imported_changelog)
        self._committed_position.update(imported_position)
        # The format mark, and imported offsets, must be durable before the files go.
        self._db.flush_wal(sync=True)
        position_file.unlink(missing_ok=True)

    def _write_checkpoint_file(self) -> None:
        if self._committed_offsets:
            write_offsets(self.directory / CHECKPOINT_FILE_NAME, self._committed_offsets)

    # -- reading ---------------------------------------------------------------------

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        if self._closed:
            raise StoreClosedError(self.name, "iterate")
        if key_range.empty:
            return iter(())
        buffer = self._buffer
        return self.own_iterator(
            merge_sorted(
                buffer.sorted_keys_in(key_range), buffer.writes, self._stored_items(key_range)
            )
        )

    def _stored_items(self, key_range: KeyRange) -> Iterator[KeyValue]:
        """Committed entries in range. The RocksDB iterator is created here, now, and
        pins the database as of this instant (an implicit snapshot)."""
        read_options = ReadOptions()
        if key_range.upper is not None:
            read_options.set_iterate_upper_bound(key_range.upper)
        # rocksdict's Snapshot.items() ignores the snapshot (0.3.29), so
        # consistency comes from the iterator's own implicit snapshot.
        items = self._db.items(from_key=key_range.lower, read_opt=read_options)
        return _pinned(cast(Iterator[KeyValue], items), read_options, key_range)


def _pinned(items: Iterator[KeyValue], *keep_alive: object) -> Iterator[KeyValue]:
    """Iterate ``items`` while holding ``keep_alive``.

    rocksdict's iterator does not own its upper bound: once the ReadOptions
    that set it are freed, the bound reads freed memory and iteration stops
    at whatever key it now spells (seen as ranges cut short under threads).
    """
    yield from items
    del keep_alive


class _RocksDBReader(StoreReader):
    """A read view for threads other than the owner (interactive queries)."""

    def __init__(self, store: RocksDBStore, isolation: IsolationLevel) -> None:
        self._store = store
        self.name = store.name
        self.isolation = isolation

    def get(self, key: bytes) -> bytes | None:
        store = self._store
        if store._closed:
            raise StoreClosedError(store.name, "get")
        check_key(store.name, "get", key)
        if self.isolation is IsolationLevel.READ_UNCOMMITTED:
            buffered = store._buffer.writes.get(key, ABSENT)
            if buffered is not ABSENT:
                return buffered
        try:
            return store._db.get(key)
        except DbClosedError:
            raise StoreClosedError(store.name, "get") from None

    def position(self) -> Mapping[TopicPartition, int]:
        return self._store.position(self.isolation)

    def get_with_changelog_offsets(
        self, key: bytes
    ) -> tuple[bytes | None, Mapping[TopicPartition, int] | None]:
        if self.isolation is not IsolationLevel.READ_COMMITTED:
            return self.get(key), None
        store = self._store
        if store._closed:
            raise StoreClosedError(store.name, "get")
        check_key(store.name, "get", key)
        # A commit writes the data and its offsets in one batch and updates the offsets
        # kept in memory under this lock: holding it, the two describe the same commit.
        with store._commit_lock:
            try:
                value = store._db.get(key)
            except DbClosedError:
                raise StoreClosedError(store.name, "get") from None
            return value, dict(store._committed_offsets)

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        store = self._store
        if store._closed:
            raise StoreClosedError(store.name, "iterate")
        if key_range.empty:
            return iter(())
        try:
            if self.isolation is IsolationLevel.READ_COMMITTED:
                return store.own_iterator(store._stored_items(key_range))
            # Buffer copy and database iterator must describe the same instant:
            # a commit between them would show its writes twice or not at all.
            with store._commit_lock:
                snapshot = store._buffer.snapshot()
                stored = store._stored_items(key_range)
        except DbClosedError:
            raise StoreClosedError(store.name, "iterate") from None
        return store.own_iterator(
            merge_sorted(snapshot.sorted_keys_in(key_range), snapshot.writes, stored)
        )


def _open_database(store: str, directory: Path, memory: RocksDBMemory | None = None) -> Rdict:
    options = Options(raw_mode=True)
    offsets = Options(raw_mode=True)
    if memory is not None:
        options.set_write_buffer_manager(memory.write_buffers)
        # Memtables take memory an arena block at a time (by default an eighth of the
        # write buffer size, 1 MiB): smaller blocks keep many idle stores' share small.
        options.set_arena_block_size(_BOUNDED_ARENA_BLOCK_BYTES)
        # RocksDB's flush threads are shared by every database of the process: more of
        # them, so memtables the manager asked to flush free their memory sooner.
        options.set_max_background_jobs(_BOUNDED_BACKGROUND_JOBS)
        offsets.set_arena_block_size(_BOUNDED_ARENA_BLOCK_BYTES)
        options.set_block_based_table_factory(memory.table_options())
        offsets.set_block_based_table_factory(memory.table_options())
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    # Flushes triggered by RocksDB itself (a full memtable) then write every
    # column family together, so offsets never land on disk without their data.
    options.set_atomic_flush(True)
    options.set_write_buffer_size(_WRITE_BUFFER_BYTES)
    # After a machine crash, recover the longest prefix of whole batches.
    options.set_wal_recovery_mode(DBRecoveryMode.point_in_time())
    try:
        return Rdict(
            str(directory),
            options,
            column_families={OFFSETS_COLUMN_FAMILY: offsets},
        )
    except Exception as exc:
        message = str(exc)
        if "Corruption" in message or ("MANIFEST" in message and "No such file" in message):
            raise StoreCorruptedError(store, directory, message) from exc
        if "LOCK" in message:
            # We hold the directory's flock, so RocksDB's own lock can only be
            # held by this process: an earlier open of the store not yet released.
            raise StoreLockedError(store, directory, os.getpid()) from exc
        raise StateStoreError(
            store, f'state store "{store}" at {directory} could not be opened: {message}'
        ) from exc


def _offset_key(kind: bytes, tp: TopicPartition) -> bytes:
    return kind + _PARTITION.pack(tp.partition) + tp.topic.encode()


def _decode_offset_key(key: bytes) -> TopicPartition:
    """The partition an offset entry (``<kind><partition><topic>``) is about."""
    partition = _PARTITION.unpack_from(key, 1)[0]
    return TopicPartition(key[1 + _PARTITION.size :].decode(), partition)


def _not_bytes(store: str, operation: str, key: object, value: object) -> TypeError:
    return TypeError(
        f'state store "{store}": {operation} takes bytes keys and values, got '
        f"{type(key).__name__} key and {type(value).__name__} value; serialize them first "
        "(the topology's serdes do this)"
    )


def _register_commit_metrics(
    registry: MetricsRegistry, sensor: Sensor, tags: Mapping[str, str]
) -> None:
    """KIP-892's store metrics; latencies in nanoseconds as Kafka's state metrics are."""
    for name, read, description in (
        ("commit-rate", sensor.rate, "The average number of store commits per second"),
        ("commit-latency-avg", sensor.avg, "The average store commit latency, in ns"),
        ("commit-latency-max", sensor.max, "The max store commit latency, in ns"),
    ):
        registry.register(
            MetricName.of(STATE_METRICS_GROUP, name, tags), read, description=description
        )


MEMORY_METRICS_GROUP: Final = "rocksdb-memory-metrics"


def _register_memory_metrics(registry: MetricsRegistry, memory: RocksDBMemory) -> None:
    """The process's shared RocksDB memory, untagged (one per process; registering again
    replaces the same gauges)."""
    for name, read, description in (
        (
            "block-cache-usage-bytes",
            lambda: float(memory.usage().cache_bytes),
            "Bytes the process's shared RocksDB block cache holds",
        ),
        (
            "write-buffer-usage-bytes",
            lambda: float(memory.usage().write_buffer_bytes),
            "Bytes the process's RocksDB memtables (write buffers) hold",
        ),
        (
            "budget-bytes",
            lambda: float(memory.budget_bytes),
            "The RocksDB memory budget shared by the process's stores, in bytes",
        ),
    ):
        registry.register(
            MetricName.of(MEMORY_METRICS_GROUP, name, {}), read, description=description
        )
