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

Rules, as in Kafka Streams:

* each named cache is an LRU by bytes (key + value); reads and writes refresh;
* dirty keys flush in the order they first became dirty since the last flush;
* evicting a dirty entry flushes that cache's whole dirty set first, so
  downstream never sees a key's later update before an earlier key's;
* when the thread's total exceeds its budget, the cache being written evicts
  its least recently used entries.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Protocol

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.processing.topology import Change
from eddyline_runtime.state import KeyRange, KeyValue

# Called with a store's dirty entries, in dirty order, when they are flushed.
FlushListener = Callable[[list[tuple[bytes, bytes | None]]], None]


class CacheBackingStore(Protocol):
    """What the cache writes through to: a state store, or the task's logging layer."""

    name: str

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]: ...


class NamedCache:
    """One store's part of a thread cache."""

    def __init__(self, name: str, thread_cache: ThreadCache) -> None:
        self.name = name
        self._thread_cache = thread_cache
        # key -> value (None: a cached delete); order is LRU first.
        self._entries: OrderedDict[bytes, bytes | None] = OrderedDict()
        # Dirty keys in the order they became dirty (dict keeps insertion order).
        self._dirty: dict[bytes, None] = {}
        self._listener: FlushListener | None = None
        self.num_bytes = 0
        self.hits = 0
        self.misses = 0
        self.forwards_saved = 0

    def set_flush_listener(self, listener: FlushListener) -> None:
        self._listener = listener

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: bytes) -> tuple[bool, bytes | None]:
        """(found, value); a found None is a cached delete."""
        if key in self._entries:
            self._entries.move_to_end(key)
            self.hits += 1
            return True, self._entries[key]
        self.misses += 1
        return False, None

    def put_dirty(self, key: bytes, value: bytes | None) -> None:
        """Record an update; it reaches the store and downstream on flush or eviction."""
        if key in self._dirty:
            self.forwards_saved += 1
        else:
            self._dirty[key] = None
        self._store(key, value)
        self._thread_cache.make_room(self)

    def put_clean(self, key: bytes, value: bytes | None) -> None:
        """Cache a value read from the store (no forward owed)."""
        if key not in self._dirty:
            self._store(key, value)
            self._thread_cache.make_room(self)

    def flush(self) -> None:
        """Hand every dirty entry, in dirty order, to the listener; they become clean."""
        if not self._dirty:
            return
        dirty = [(key, self._entries[key]) for key in self._dirty]
        self._dirty = {}
        if self._listener is not None:
            self._listener(dirty)

    def evict_one(self) -> bool:
        """Drop the least recently used entry, flushing the dirty set first if it is dirty."""
        if not self._entries:
            return False
        key = next(iter(self._entries))
        if key in self._dirty:
            self.flush()
        value = self._entries.pop(key)
        self.num_bytes -= _size(key, value)
        self._thread_cache.num_bytes -= _size(key, value)
        return True

    def dirty_keys_in(self, key_range: KeyRange) -> list[bytes]:
        return sorted(key for key in self._dirty if key in key_range)

    def _store(self, key: bytes, value: bytes | None) -> None:
        previous_size = _size(key, self._entries[key]) if key in self._entries else 0
        self._entries[key] = value
        self._entries.move_to_end(key)
        change = _size(key, value) - previous_size
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

    def named_cache(self, name: str) -> NamedCache:
        cache = self._caches.get(name)
        if cache is None:
            cache = self._caches[name] = NamedCache(name, self)
        return cache

    def drop(self, name: str) -> None:
        """Forget a closed task's cache, dirty entries included (they were committed or
        are abandoned with the task)."""
        cache = self._caches.pop(name, None)
        if cache is not None:
            self.num_bytes -= cache.num_bytes

    def make_room(self, writing: NamedCache) -> None:
        """Evict from the cache being written, then from the others, until within budget."""
        while self.num_bytes > self.max_bytes and writing.evict_one():
            pass
        for other in self._caches.values():
            while self.num_bytes > self.max_bytes and other.evict_one():
                pass

    def flush(self) -> None:
        """Flush every named cache (the thread is about to commit)."""
        for cache in self._caches.values():
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


class CachingKeyValueStore:
    """A store seen through its named cache: reads hit the cache, writes become dirty.

    ``forward`` receives ``(key, Change(new, old))`` for each flushed update;
    it may be set later (:meth:`set_forward`) or not at all. Call
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
        self._cache = cache.named_cache(cache_name or store.name)
        self._cache.set_flush_listener(self._write_through)

    def set_forward(self, forward: Callable[[bytes, Change], None]) -> None:
        self._forward = forward

    def get(self, key: bytes) -> bytes | None:
        found, value = self._cache.lookup(key)
        if found:
            return value
        value = self.store.get(key)
        self._cache.put_clean(key, value)
        return value

    def put(self, key: bytes, value: bytes) -> None:
        self._cache.put_dirty(key, value)

    def delete(self, key: bytes) -> None:
        self._cache.put_dirty(key, None)

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        """Ordered reads see dirty entries: flush them first, then read the store."""
        if self._cache.dirty_keys_in(key_range):
            self._cache.flush()
        return self.store.scan(key_range)

    def flush(self) -> None:
        self._cache.flush()

    def _write_through(self, dirty: list[tuple[bytes, bytes | None]]) -> None:
        store, forward = self.store, self._forward
        for key, value in dirty:
            # The old value is read only when someone receives it.
            old = store.get(key) if forward is not None else None
            if value is None:
                store.delete(key)
            else:
                store.put(key, value)
            if forward is not None:
                forward(key, Change(value, old))


def _size(key: bytes, value: bytes | None) -> int:
    return len(key) + (0 if value is None else len(value))
