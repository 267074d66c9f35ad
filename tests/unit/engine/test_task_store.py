"""A task's store as processors and queries see it: cache over changelog over store."""

from __future__ import annotations

import pytest

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.processing import Change
from eddyline_runtime.state import InMemoryStore, StoreClosedError, TopicPartition
from tests.support.stores import StoreFactory

CHANGELOG = TopicPartition("app-counts-changelog", 0)


def cached_store(store_factory: StoreFactory, cache: ThreadCache) -> TaskStore:
    return TaskStore(store_factory(), changelog=CHANGELOG, cache=cache, cache_name="0_0/counts")


def test_read_uncommitted_readers_see_the_caches_dirty_entries(
    store_factory: StoreFactory,
) -> None:
    cache = ThreadCache(1024 * 1024)
    store = cached_store(store_factory, cache)
    store.put(b"committed", b"1")
    cache.flush()
    store.store.commit({CHANGELOG: 0})
    store.put(b"dirty", b"2")  # in the cache only
    store.put(b"committed", b"3")
    store.delete(b"committed")  # a dirty tombstone hides the stored value

    uncommitted = store.reader(IsolationLevel.READ_UNCOMMITTED)
    assert uncommitted.get(b"dirty") == b"2"
    assert uncommitted.get(b"committed") is None
    assert list(uncommitted.all()) == [(b"dirty", b"2")]
    committed = store.reader(IsolationLevel.READ_COMMITTED)
    assert committed.get(b"dirty") is None
    assert list(committed.all()) == [(b"committed", b"1")]


def test_a_closed_task_store_refuses_every_operation(store_factory: StoreFactory) -> None:
    cache = ThreadCache(1024 * 1024)
    store = cached_store(store_factory, cache)
    store.put(b"k", b"v")
    reader = store.reader(IsolationLevel.READ_UNCOMMITTED)
    cache.drop("0_0/counts")  # what the stream thread does when it closes the task
    store.close()
    for operation in (
        lambda: store.get(b"k"),
        lambda: store.put(b"k", b"v2"),
        lambda: store.delete(b"k"),
        lambda: store.put_all([(b"k", b"v3")]),
        lambda: store.put_if_absent(b"n", b"v"),
        lambda: list(store.all()),
        store.flush,
        lambda: reader.get(b"k"),
        lambda: list(reader.all()),
    ):
        with pytest.raises(StoreClosedError, match='"counts" is closed'):
            operation()
    assert cache.num_bytes == 0


def test_delete_returns_the_old_value_through_the_cache(store_factory: StoreFactory) -> None:
    forwarded: list[tuple[bytes, Change]] = []
    cache = ThreadCache(1024 * 1024)
    store = cached_store(store_factory, cache)
    store.set_flush_listener(lambda key, change: forwarded.append((key, change)))
    store.put(b"k", b"1")
    assert store.delete(b"k") == b"1"
    assert store.delete(b"k") is None
    assert store.delete(b"never") is None
    assert store.put_if_absent(b"p", b"1") is None
    assert store.put_if_absent(b"p", b"2") == b"1"
    cache.flush()
    assert forwarded == [(b"p", Change(b"1", None))]
    assert store.logging.drain_changelog() == [(b"p", b"1")]


def test_an_uncached_delete_of_a_missing_key_writes_no_tombstone() -> None:
    store = TaskStore(InMemoryStore("counts"), changelog=CHANGELOG, cache=None, cache_name="c")
    assert store.delete(b"never") is None
    store.put(b"k", b"1")
    assert store.delete(b"k") == b"1"
    assert store.logging.drain_changelog() == [(b"k", None)]


def test_an_in_memory_stores_pending_changelog_records_count_as_uncommitted_bytes() -> None:
    """A decision, not a defect fix: the store buffers nothing, but the changelog records
    its writes produce wait for the commit, and that memory counts against the budget."""
    store = TaskStore(InMemoryStore("counts"), changelog=CHANGELOG, cache=None, cache_name="c")
    store.put(b"key", b"value")
    assert store.store.approximate_num_uncommitted_bytes() == 0
    assert store.logging.pending_bytes == len(b"key") + len(b"value")
