"""KIP-63's record cache: dedup of store writes and downstream forwards."""

from __future__ import annotations

from conftest import StoreFactory
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.processing import CachingKeyValueStore, Change, ThreadCache
from eddyline_runtime.state import InMemoryStore, TopicPartition

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
    config = StreamsConfig.from_properties(
        {"cache.max.bytes.buffering": 1000, "num.stream.threads": 4}
    )
    assert config.statestore_cache_max_bytes == 1000
    assert config.cache_bytes_per_thread == 250
    assert StreamsConfig.from_properties({}).statestore_cache_max_bytes == 10 * 1024 * 1024
