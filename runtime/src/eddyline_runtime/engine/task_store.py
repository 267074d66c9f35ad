"""A state store as a task's processors see it: record cache, then changelog, then store.

Writes from a processor go, in order, through

1. the record cache (KIP-63), when the thread has one: updates stay dirty in
   memory and reach the layers below once per key per flush;
2. the changelog layer: every write that reaches it is applied to the store's
   open transaction and remembered as a changelog record to send with the
   task's next commit (the last write of a key wins: the changelog topic is
   compacted, so the earlier ones would only be replayed to be overwritten);
3. the transactional store (KIP-892), committed after the log transaction
   holding those changelog records.

Reads see the processor's own writes at every layer. Other threads read
through :meth:`TaskStore.reader`: at ``READ_UNCOMMITTED`` that view includes
the cache's dirty entries (KIP-892's isolation levels hold whatever the cache
holds back), at ``READ_COMMITTED`` only the store's committed data.

Once its task is closed, every operation on a :class:`TaskStore` raises
:class:`~eddyline_runtime.state.StoreClosedError`: a processor (or a query)
that kept a reference cannot write into a cache or store nobody will commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.engine.record_cache import (
    CachingKeyValueStore,
    NamedCache,
    ThreadCache,
)
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing.topology import Change, RecordContext
from eddyline_runtime.state import (
    KeyRange,
    KeyValue,
    ReadableKeyValueStore,
    StateStore,
    StoreClosedError,
    StoreReader,
)
from eddyline_runtime.state.store import check_key
from eddyline_runtime.state.transaction_buffer import merge_sorted

# Receives each update the cache flushes: the key and Change(new, old).
ChangeListener = Callable[[bytes, Change], None]


class RecordContextHolder(Protocol):
    """Where the record being processed is described: the task's topology.

    The store stamps each cached write with it, and swaps in a flushed
    entry's context while that entry is forwarded.
    """

    @property
    def record_context(self) -> RecordContext: ...

    def swap_record_context(self, context: RecordContext) -> RecordContext:
        """Describe the record being processed as ``context``; returns the previous one."""
        ...


class ChangeloggingStore:
    """Applies writes to the store and keeps them as the changelog records of the next commit."""

    def __init__(self, store: StateStore, changelog: TopicPartition | None) -> None:
        self.name = store.name
        self.store = store
        self.changelog = changelog
        # key -> value (None: a delete), in first-write order since the last commit.
        self._pending: dict[bytes, bytes | None] = {}
        self.pending_bytes = 0

    def get(self, key: bytes) -> bytes | None:
        return self.store.get(key)

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        return self.store.scan(key_range)

    def put(self, key: bytes, value: bytes) -> None:
        self.store.put(key, value)
        if self.changelog is not None:
            self._pending[key] = value
            self.pending_bytes += len(key) + len(value)

    def delete(self, key: bytes) -> None:
        self.store.delete(key)
        if self.changelog is not None:
            self._pending[key] = None
            self.pending_bytes += len(key)

    def drain_changelog(self) -> list[tuple[bytes, bytes | None]]:
        """The changelog records of the writes since the last drain."""
        pending, self._pending = self._pending, {}
        self.pending_bytes = 0
        return list(pending.items())


class TaskStore(ReadableKeyValueStore):
    """The store object ``ProcessorContext.get_state_store`` returns inside the runtime."""

    def __init__(
        self,
        store: StateStore,
        *,
        changelog: TopicPartition | None,
        cache: ThreadCache | None,
        cache_name: str,
    ) -> None:
        self.name = store.name
        self.store = store
        self.logging = ChangeloggingStore(store, changelog)
        self._cached = (
            CachingKeyValueStore(self.logging, cache, cache_name=cache_name)
            if cache is not None and cache.max_bytes > 0
            else None
        )
        # The cached path's hot calls go straight to the named cache.
        self._named = None if self._cached is None else self._cached.named_cache
        self._context: RecordContextHolder | None = None
        self._closed = False

    @property
    def cached(self) -> bool:
        return self._cached is not None

    @property
    def is_open(self) -> bool:
        return not self._closed and self.store.is_open

    def bind(self, holder: RecordContextHolder) -> None:
        """Stamp cached writes with ``holder``'s record context (the task's topology)."""
        self._context = holder

    def set_flush_listener(self, listener: ChangeListener) -> bool:
        """Forward updates as the cache flushes them; False when there is no cache.

        A DSL aggregation calls this once: with a cache it forwards on flush
        (three updates of a key before a commit forward once), without one it
        forwards each update itself. While ``listener`` runs, the record
        context is that of the write that made the entry dirty, so what it
        forwards carries that record's timestamp and headers.
        """
        if self._cached is None:
            return False

        def forward(key: bytes, change: Change) -> None:
            holder = self._context
            if holder is None or change.context is None:
                listener(key, change)
                return
            saved = holder.swap_record_context(change.context)
            try:
                listener(key, change)
            finally:
                holder.swap_record_context(saved)

        self._cached.set_forward(forward)
        return True

    def get(self, key: bytes) -> bytes | None:
        if self._closed:
            raise StoreClosedError(self.name, "get")
        if type(key) is not bytes:
            check_key(self.name, "get", key)
        named = self._named
        if named is None:
            return self.store.get(key)
        found, value = named.lookup(key)
        if found:
            return value
        value = self.logging.get(key)
        named.put_clean(key, value)
        return value

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        if self._closed:
            raise StoreClosedError(self.name, "iterate")
        if self._cached is not None:
            return self._cached.scan(key_range)
        return self.store.scan(key_range)

    def put(self, key: bytes, value: bytes) -> None:
        if self._closed:
            raise StoreClosedError(self.name, "put")
        if type(key) is not bytes or type(value) is not bytes:
            raise TypeError(
                f'state store "{self.name}" takes bytes keys and values, got '
                f"{type(key).__name__} and {type(value).__name__}; serialize them first "
                "(eddyline_runtime.serde)"
            )
        named = self._named
        if named is not None:
            holder = self._context
            named.put_dirty(key, value, None if holder is None else holder.record_context)
        else:
            self.logging.put(key, value)

    def delete(self, key: bytes) -> bytes | None:
        """Delete ``key``; returns the value it had (None: it had none, and nothing is
        written to the store or its changelog)."""
        old = self.get(key)  # raises if closed or not bytes
        if old is None:
            return None
        if self._cached is not None:
            holder = self._context
            self._cached.delete(key, None if holder is None else holder.record_context)
        else:
            self.logging.delete(key)
        return old

    def put_if_absent(self, key: bytes, value: bytes) -> bytes | None:
        """Write ``key`` only if it has no value; returns the value it had (None: written)."""
        current = self.get(key)
        if current is None:
            self.put(key, value)
        return current

    def put_all(self, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        for key, value in entries:
            if value is None:
                self.delete(key)
            else:
                self.put(key, value)

    def flush(self) -> None:
        """Push the cache's dirty entries down to the store and the changelog."""
        if self._closed:
            raise StoreClosedError(self.name, "flush")
        if self._cached is not None:
            self._cached.flush()

    def reader(self, isolation: IsolationLevel | str | None = None) -> StoreReader:
        """A view for other threads; at READ_UNCOMMITTED it includes the cache's dirty entries."""
        inner = self.store.reader(isolation)
        if self._cached is None or inner.isolation is not IsolationLevel.READ_UNCOMMITTED:
            return inner
        return _CacheOverlayReader(self, inner, self._cached.named_cache)

    def close(self) -> None:
        """Close the store; from now on every operation raises StoreClosedError."""
        self._closed = True
        self.store.close()


class _CacheOverlayReader(StoreReader):
    """READ_UNCOMMITTED for other threads: the cache's dirty entries over the store's reader.

    The cache is read before the store, so an entry being flushed is found in
    one or the other (see record_cache's module docstring).
    """

    def __init__(self, owner: TaskStore, inner: StoreReader, cache: NamedCache) -> None:
        self._owner = owner
        self._inner = inner
        self._cache = cache
        self.name = inner.name
        self.isolation = inner.isolation

    def _check_open(self, operation: str) -> None:
        if not self._owner.is_open or self._cache.dropped:
            raise StoreClosedError(self.name, operation)

    def get(self, key: bytes) -> bytes | None:
        self._check_open("get")
        check_key(self.name, "get", key)
        found, value = self._cache.dirty_value(key)
        if found:
            return value
        return self._inner.get(key)

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        self._check_open("iterate")
        if key_range.empty:
            return iter(())
        dirty = self._cache.dirty_snapshot()
        stored = self._inner.scan(key_range)
        keys = sorted(key for key in dirty if key in key_range)
        return self._owner.store.own_iterator(merge_sorted(keys, dirty, stored))

    def position(self) -> Mapping[TopicPartition, int]:
        return self._inner.position()
