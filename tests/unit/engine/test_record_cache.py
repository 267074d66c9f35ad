"""KIP-63's record cache: dedup of store writes and downstream forwards."""

from __future__ import annotations

import threading

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.record_cache import CachingKeyValueStore, ThreadCache
from eddyline_runtime.engine.task_store import ChangeloggingStore
from eddyline_runtime.processing import Change, RecordContext
from eddyline_runtime.state import InMemoryStore, StoreClosedError, TopicPartition
from tests.support.stores import StoreFactory

CHANGELOG = TopicPartition("sum-changelog", 0)


def summing(store: CachingKeyValueStore, key: bytes, amount: int) -> None:
    """What an aggregation does per record: read, add, write."""
    current = store.get(key)
    store.put(key, str(int(current or b"0") + amount).encode())


def test_the_kip_example_forwards_k1_once_per_commit(store_factory: StoreFactory) -> None:
    forwarded: list[tuple[bytes, Change]] = []
    store = store_factory("sums")
    cache = ThreadCache(10 * 1024 * 1024)
    cached = CachingKeyValueStore(store, cache, lambda k, c: forwarded.append((k, c)))
    for key, value in [(b"K1", 1), (b"K2", 5), (b"K1", 10), (b"K1", 100)]:
        summing(cached, key, value)
    assert forwarded == []
    assert store.get(b"K1") is None  # nothing written to the store yet
    cache.flush()
    store.commit({CHANGELOG: 3})
    # Kafka's order: by each key's last write (K1's came after K2's).
    assert forwarded == [(b"K2", Change(b"5", None)), (b"K1", Change(b"111", None))]
    assert cache.forwards_saved == 2
    summing(cached, b"K1", 1)
    cache.flush()
    assert forwarded[-1] == (b"K1", Change(b"112", b"111"))


def test_a_cache_of_zero_bytes_forwards_every_update() -> None:
    forwarded: list[tuple[bytes, Change]] = []
    cached = CachingKeyValueStore(
        InMemoryStore("sums"), ThreadCache(0), lambda k, c: forwarded.append((k, c))
    )
    for value in (1, 10, 100):
        summing(cached, b"K1", value)
    assert forwarded == [
        (b"K1", Change(b"1", None)),
        (b"K1", Change(b"11", b"1")),
        (b"K1", Change(b"111", b"11")),
    ]


def test_evicting_a_dirty_entry_flushes_it_first_then_the_rest_in_last_write_order() -> None:
    forwarded: list[bytes] = []
    # Room for two entries of 2-byte keys and 1-byte values.
    cache = ThreadCache(6)
    cached = CachingKeyValueStore(InMemoryStore("s"), cache, lambda k, c: forwarded.append(k))
    cached.put(b"k2", b"a")
    cached.put(b"k1", b"b")
    cached.put(b"k2", b"c")  # k2's last write is now after k1's
    assert forwarded == []
    cached.put(b"k3", b"d")  # over budget: the LRU entry (k1) is dirty -> flush all dirty
    assert forwarded == [b"k1", b"k2", b"k3"]
    assert cached.get(b"k1") == b"b"  # evicted from the cache, read back from the store


def test_lru_order_follows_reads() -> None:
    forwarded: list[bytes] = []
    store = InMemoryStore("s")
    cache = ThreadCache(6)
    cached = CachingKeyValueStore(store, cache, lambda k, c: forwarded.append(k))
    cached.put(b"k1", b"a")
    cached.put(b"k2", b"b")
    cache.flush()
    cached.get(b"k1")  # k2 is now least recently used
    cached.put(b"k3", b"c")
    assert cache.misses == 0
    assert cached.get(b"k1") == b"a"
    assert cache.hits == 2
    cached.get(b"k2")
    assert cache.misses == 1


def test_cache_size_comes_from_config_with_the_deprecated_alias() -> None:
    with pytest.warns(FutureWarning, match="cache.max.bytes.buffering"):
        config = StreamsConfig.from_properties(
            {"cache.max.bytes.buffering": 1000, "num.stream.threads": 4}
        )
    assert config.statestore_cache_max_bytes == 1000
    assert config.cache_bytes_per_thread == 250
    assert StreamsConfig.from_properties({}).statestore_cache_max_bytes == 10 * 1024 * 1024


def test_dirty_keys_flush_in_last_write_order() -> None:
    forwarded: list[bytes] = []
    cache = ThreadCache(1024)
    cached = CachingKeyValueStore(InMemoryStore("s"), cache, lambda k, c: forwarded.append(k))
    cached.put(b"A", b"1")
    cached.put(b"B", b"1")
    cached.put(b"A", b"2")
    cache.flush()
    assert forwarded == [b"B", b"A"]  # Kafka's NamedCache: put A, B, A flushes B, A


def test_each_flushed_entry_keeps_the_context_of_the_write_that_made_it() -> None:
    flushed: list[tuple[bytes, int | None]] = []
    cache = ThreadCache(1024)
    cached = CachingKeyValueStore(
        InMemoryStore("s"),
        cache,
        lambda k, c: flushed.append((k, None if c.context is None else c.context.timestamp)),
    )
    cached.put(b"a", b"1", RecordContext(10, (("trace", b"x"),)))
    cached.put(b"b", b"1", RecordContext(40))
    cache.flush()
    assert flushed == [(b"a", 10), (b"b", 40)]


def test_deleting_a_key_the_store_never_had_writes_and_forwards_nothing() -> None:
    forwarded: list[tuple[bytes, Change]] = []
    store = InMemoryStore("s")
    cache = ThreadCache(1024)
    cached = CachingKeyValueStore(store, cache, lambda k, c: forwarded.append((k, c)))
    cached.delete(b"never")
    cached.put(b"brief", b"1")
    cached.delete(b"brief")  # absent before the interval and after it
    cached.put(b"kept", b"1")
    cache.flush()
    assert forwarded == [(b"kept", Change(b"1", None))]
    cached.delete(b"kept")
    cache.flush()
    assert forwarded[-1] == (b"kept", Change(None, b"1"))


def test_a_deleted_never_existing_key_reaches_no_changelog_without_a_listener() -> None:
    store = InMemoryStore("s")
    logging = ChangeloggingStore(store, CHANGELOG)
    cache = ThreadCache(1024)
    cached = CachingKeyValueStore(logging, cache)
    cached.delete(b"never")
    cache.flush()
    assert logging.drain_changelog() == []


def test_overwrites_and_evictions_are_counted() -> None:
    cache = ThreadCache(6)  # two entries of a 2-byte key and a 1-byte value
    cached = CachingKeyValueStore(InMemoryStore("s"), cache, lambda k, c: None)
    cached.put(b"k1", b"a")
    cached.put(b"k1", b"b")
    cached.put(b"k2", b"c")
    cached.put(b"k3", b"d")  # evicts k1
    assert (cache.overwrites, cache.evictions) == (1, 1)
    cache.drop("s")  # a closed task's counts stay in the totals
    assert (cache.overwrites, cache.evictions) == (1, 1)


def test_a_dropped_cache_refuses_writes_and_leaves_the_byte_total_alone() -> None:
    cache = ThreadCache(1024)
    cached = CachingKeyValueStore(InMemoryStore("s"), cache)
    cached.put(b"k", b"v")
    cache.drop("s")
    assert cache.num_bytes == 0
    with pytest.raises(StoreClosedError):
        cached.put(b"k2", b"v")
    assert cache.num_bytes == 0


def test_other_threads_find_every_dirty_entry_while_the_owner_writes_and_flushes() -> None:
    """A reader looks in the dirty dict, the flushing dict, then the store: a key
    whose value is written and flushed concurrently is never missing."""
    store = InMemoryStore("s")
    cache = ThreadCache(10 * 1024 * 1024)
    cached = CachingKeyValueStore(store, cache, lambda k, c: None)
    named = cached.named_cache
    cached.put(b"k", b"0")
    stop = threading.Event()
    misses: list[int] = []

    def read() -> None:
        while not stop.is_set():
            found, value = named.dirty_value(b"k")
            if not found:
                value = store.get(b"k")
            if value is None:
                misses.append(1)
            snapshot = named.dirty_snapshot()
            if b"k" not in snapshot and store.get(b"k") is None:
                misses.append(1)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(20_000):
            cached.put(b"k", str(i).encode())
            cached.put(b"other%d" % (i % 50), b"x")
            if i % 7 == 0:
                cache.flush()
    finally:
        stop.set()
        reader.join()
    assert misses == []
