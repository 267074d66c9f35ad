"""The record cache of KIP-63: one cache deduplicates store writes and downstream updates.

Each stream thread owns a :class:`ThreadCache` of ``statestore.cache.max.bytes``
/ ``num.stream.threads`` bytes, shared by the stores of its tasks through one
:class:`NamedCache` per store. A :class:`CachingKeyValueStore` in front of a
store writes updates into the cache as *dirty* entries and forwards nothing;
when the cache is flushed (every commit) or must evict a dirty entry, each
dirty key is written to the store once and forwarded downstream once, as
``Change(new, old)`` where ``old`` is what the store held before. So three
updates to K1 between two commits cost one store write and one forward, and a
cache of 0 bytes forwards every update.

Rules, as in Kafka Streams' ``NamedCache`` and ``CachingKeyValueStore``:

* each named cache is an LRU by bytes (key + value); reads and writes refresh;
* dirty keys flush in the order of their *last* write since the last flush
  (put A, B, A flushes B, then A);
* evicting a dirty entry flushes that cache's whole dirty set, the evicted
  key first, so downstream never sees a key's later update before an earlier
  key's;
* when the thread's total exceeds its budget, the cache being written evicts
  its least recently used entries;
* every dirty entry keeps the record context (timestamp, headers) of the
  record that last wrote it, and its flush is forwarded with that context;
* a key deleted in the cache that the store does not hold either (absent
  before and after the flush interval) is neither written nor forwarded.

Other threads (READ_UNCOMMITTED interactive queries) may read a cache's dirty
entries through :meth:`NamedCache.dirty_value` and
:meth:`NamedCache.dirty_snapshot` while the owner writes. That is safe for the
same reason as the store's transaction buffer: the owner installs a fresh
dirty dict at each flush instead of clearing the old one, and keeps the old
one visible as ``flushing`` until every entry of it reached the store, so a
reader that looks at the dirty dict, then the flushing one, then the store,
always finds a key's newest value in one of them. The single dict operations
a reader performs (``get``, ``copy``) are one C call each under the GIL.
"""

from __future__ import annotations

from bisect import insort
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import NamedTuple, Protocol

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.processing.topology import Change, RecordContext
from eddyline_runtime.state import KeyRange, KeyValue, StoreClosedError
from eddyline_runtime.state.transaction_buffer import merge_sorted


class DirtyEntry(NamedTuple):
    key: bytes
    value: bytes | None  # None: a delete
    context: RecordContext | None


# Called with a store's dirty entries, in flush order, when they are flushed.
FlushListener = Callable[[list[DirtyEntry]], None]


class CacheBackingStore(Protocol):
    """What the cache writes through to: a state store, or the task's logging layer."""

    name: str

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> object: ...

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]: ...


# Up to this many keys dirtied since the last ordered read, it inserts them one by one.
_INSORT_MAX = 32

# A dirty value with the record context of the write that made it dirty.
_Cached = tuple[bytes | None, RecordContext | None]


class NamedCache:
    """One store's part of a thread cache."""

    def __init__(self, name: str, thread_cache: ThreadCache) -> None:
        self.name = name
        self._thread_cache = thread_cache
        # key -> value (None: a cached delete); order is LRU first. Owner thread only.
        self._entries: OrderedDict[bytes, bytes | None] = OrderedDict()
        # Dirty key -> (value, context), in last-write order (move_to_end keeps
        # the key in the dict, so a reader's get never misses it in between).
        # Replaced, never cleared, at each flush; readers may get() and copy().
        self.dirty: OrderedDict[bytes, _Cached] = OrderedDict()
        # The dirty keys as of the last ordered read, sorted, and those dirtied since
        # (in write order): a scan then costs the keys in its range, not every dirty key.
        self._dirty_sorted: list[bytes] = []
        self._dirty_new: list[bytes] = []
        # The dict being flushed, until its entries all reached the store.
        self.flushing: OrderedDict[bytes, _Cached] | None = None
        self._listener: FlushListener | None = None
        self.dropped = False
        self.num_bytes = 0
        self.hits = 0
        self.misses = 0
        self.forwards_saved = 0
        self.overwrites = 0  # puts (dirty or clean) that replaced a cached entry
        self.evictions = 0
        self.flushes = 0

    def set_flush_listener(self, listener: FlushListener) -> None:
        self._listener = listener

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: bytes) -> tuple[bool, bytes | None]:
        """(found, value); a found None is a cached delete."""
        entries = self._entries
        if key in entries:
            entries.move_to_end(key)
            self.hits += 1
            return True, entries[key]
        self.misses += 1
        return False, None

    def put_dirty(self, key: bytes, value: bytes | None, context: RecordContext | None) -> None:
        """Record an update; it reaches the store and downstream on flush or eviction."""
        if self.dropped:
            raise StoreClosedError(self.name, "put")
        dirty = self.dirty
        if key in dirty:
            self.forwards_saved += 1
            dirty[key] = (value, context)
            dirty.move_to_end(key)
        else:
            dirty[key] = (value, context)
            self._dirty_new.append(key)
        self._store(key, value)
        thread_cache = self._thread_cache
        if thread_cache.num_bytes > thread_cache.max_bytes:
            thread_cache.make_room(self)

    def put_clean(self, key: bytes, value: bytes | None) -> None:
        """Cache a value read from the store (no forward owed)."""
        if key not in self.dirty:
            self._store(key, value)
            self._thread_cache.make_room(self)

    def flush(self, evicted: DirtyEntry | None = None) -> None:
        """Hand every dirty entry to the listener (``evicted`` first, then in last-write
        order); they become clean."""
        dirty = self.dirty
        if not dirty and evicted is None:
            return
        self.flushes += 1
        entries = [] if evicted is None else [evicted]
        entries += [
            DirtyEntry(key, value, context)
            for key, (value, context) in dirty.items()
            if evicted is None or key != evicted.key
        ]
        # Readers must keep finding these entries until the store has them:
        # publish the old dict as `flushing` before installing a fresh one.
        self.flushing = dirty
        self.dirty = OrderedDict()
        self._dirty_sorted = []
        self._dirty_new = []
        try:
            if self._listener is not None:
                self._listener(entries)
        finally:
            self.flushing = None

    def evict_one(self) -> bool:
        """Drop the least recently used entry; if it is dirty, flush the dirty set first
        with the evicted entry leading."""
        if not self._entries:
            return False
        key, value = self._entries.popitem(last=False)
        size = _size(key, value)
        self.num_bytes -= size
        self._thread_cache.num_bytes -= size
        self.evictions += 1
        dirty = self.dirty.get(key)
        if dirty is not None:
            self.flush(DirtyEntry(key, dirty[0], dirty[1]))
        return True

    def dirty_keys_in(self, key_range: KeyRange) -> list[bytes]:
        """The dirty keys inside ``key_range``, sorted (a copy); owner only."""
        new_keys = self._dirty_new
        if new_keys:
            sorted_keys = self._dirty_sorted
            if len(new_keys) <= _INSORT_MAX:
                for key in new_keys:
                    insort(sorted_keys, key)
            else:
                sorted_keys.extend(new_keys)
                sorted_keys.sort()
            self._dirty_new = []
        return list(key_range.slice_of(self._dirty_sorted))

    # -- for other threads (READ_UNCOMMITTED readers) --------------------------------

    def dirty_value(self, key: bytes) -> tuple[bool, bytes | None]:
        """(found, value) of ``key`` among the dirty entries; any thread."""
        # Dirty first, then flushing: see the module docstring for why the order matters.
        dirty = self.dirty
        flushing = self.flushing
        cached = dirty.get(key)
        if cached is None and flushing is not None:
            cached = flushing.get(key)
        if cached is None:
            return False, None
        return True, cached[0]

    def dirty_snapshot(self) -> dict[bytes, bytes | None]:
        """A private copy of the dirty entries (key -> value, None for a delete); any thread."""
        dirty = self.dirty
        flushing = self.flushing
        copied = dict(dirty.copy())
        if flushing is not None:
            for key, cached in flushing.copy().items():
                copied.setdefault(key, cached)
        return {key: cached[0] for key, cached in copied.items()}

    def _store(self, key: bytes, value: bytes | None) -> None:
        # Sizes inline: this runs once per cached write.
        entries = self._entries
        change = 0 if value is None else len(value)
        if key in entries:
            self.overwrites += 1
            previous = entries[key]
            if previous is not None:
                change -= len(previous)
        else:
            change += len(key)
        entries[key] = value
        entries.move_to_end(key)
        self.num_bytes += change
        self._thread_cache.num_bytes += change


class ThreadCache:
    """A stream thread's record cache: a byte budget shared by its stores' named caches."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ConfigError("statestore.cache.max.bytes", max_bytes, "0 or more bytes")
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._caches: dict[str, NamedCache] = {}
        # Counts of caches already dropped, so totals never go backwards.
        self._dropped_counts = {"overwrites": 0, "evictions": 0}

    def named_cache(self, name: str) -> NamedCache:
        cache = self._caches.get(name)
        if cache is None:
            cache = self._caches[name] = NamedCache(name, self)
        return cache

    def drop(self, name: str) -> None:
        """Forget a closed task's cache, dirty entries included (they were committed or
        are abandoned with the task); using it afterwards raises StoreClosedError."""
        cache = self._caches.pop(name, None)
        if cache is not None:
            cache.dropped = True
            self.num_bytes -= cache.num_bytes
            self._dropped_counts["overwrites"] += cache.overwrites
            self._dropped_counts["evictions"] += cache.evictions

    def make_room(self, writing: NamedCache) -> None:
        """Evict from the cache being written, then from the others, until within budget."""
        if self.num_bytes <= self.max_bytes:
            return
        while self.num_bytes > self.max_bytes and writing.evict_one():
            pass
        for other in list(self._caches.values()):
            while self.num_bytes > self.max_bytes and other.evict_one():
                pass

    def flush(self) -> None:
        """Flush every named cache (the thread is about to commit)."""
        for cache in list(self._caches.values()):
            cache.flush()

    @property
    def hits(self) -> int:
        return sum(c.hits for c in self._caches.values())

    @property
    def misses(self) -> int:
        return sum(c.misses for c in self._caches.values())

    @property
    def forwards_saved(self) -> int:
        return sum(c.forwards_saved for c in self._caches.values())

    @property
    def overwrites(self) -> int:
        """Puts that replaced a cached entry (Kafka's ``NamedCache.overwrites``)."""
        return self._dropped_counts["overwrites"] + sum(c.overwrites for c in self._caches.values())

    @property
    def evictions(self) -> int:
        """Entries evicted to stay within the byte budget (Kafka's ``NamedCache.evicts``)."""
        return self._dropped_counts["evictions"] + sum(c.evictions for c in self._caches.values())


class CachingKeyValueStore:
    """A store seen through its named cache: reads hit the cache, writes become dirty.

    ``forward`` receives ``(key, Change(new, old, context))`` for each flushed
    update; it may be set later (:meth:`set_forward`) or not at all. Call
    :meth:`flush` before committing the underlying store.
    """

    def __init__(
        self,
        store: CacheBackingStore,
        cache: ThreadCache,
        forward: Callable[[bytes, Change], None] | None = None,
        *,
        cache_name: str | None = None,
    ) -> None:
        self.store = store
        self._forward = forward
        # Stores of different tasks share a thread cache: the runtime names each one's part.
        self.named_cache = cache.named_cache(cache_name or store.name)
        self.named_cache.set_flush_listener(self._write_through)

    def set_forward(self, forward: Callable[[bytes, Change], None]) -> None:
        self._forward = forward

    def get(self, key: bytes) -> bytes | None:
        found, value = self.named_cache.lookup(key)
        if found:
            return value
        value = self.store.get(key)
        self.named_cache.put_clean(key, value)
        return value

    def put(self, key: bytes, value: bytes, context: RecordContext | None = None) -> None:
        self.named_cache.put_dirty(key, value, context)

    def delete(self, key: bytes, context: RecordContext | None = None) -> None:
        self.named_cache.put_dirty(key, None, context)

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        """Ordered reads see dirty entries merged over the store's, without flushing them
        (Kafka's merged cache iterator): a session store scans for every record, and a
        flush per scan would forward every dirty key each time."""
        keys = self.named_cache.dirty_keys_in(key_range)
        if not keys:
            return self.store.scan(key_range)
        dirty = self.named_cache.dirty
        # The values as of now: the caller may write while it iterates.
        values = {key: dirty[key][0] for key in keys}
        return merge_sorted(keys, values, self.store.scan(key_range))

    def flush(self) -> None:
        self.named_cache.flush()

    def _write_through(self, dirty: list[DirtyEntry]) -> None:
        store, forward = self.store, self._forward
        for key, value, context in dirty:
            # The old value is read when someone receives it, or to tell whether
            # a delete deletes anything.
            old = store.get(key) if forward is not None or value is None else None
            if value is None:
                if old is None:
                    continue  # absent before and after: nothing to write or forward
                store.delete(key)
            else:
                store.put(key, value)
            if forward is not None:
                forward(key, Change(value, old, context))


def _size(key: bytes, value: bytes | None) -> int:
    return len(key) + (0 if value is None else len(value))
