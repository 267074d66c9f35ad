"""Store lifetime, argument checks and Kafka's key-value API, for both store kinds.

Closing a store ends every iterator still open on it (RocksDB keeps a
database, and its LOCK, open while any iterator lives), from the owner's
scans and from other threads' readers alike; and the newer parts of Kafka's
``KeyValueStore`` interface (``putIfAbsent``, ``delete`` returning the old
value) behave the same on RocksDB and in memory.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.state import (
    InMemoryStore,
    RocksDBStore,
    StateStore,
    StoreClosedError,
    StoreLockedError,
    TopicPartition,
)

CHANGELOG = TopicPartition("app-counts-changelog", 0)


@pytest.fixture(params=["rocksdb", "memory"])
def open_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[], StateStore]]:
    opened: list[StateStore] = []

    def make() -> StateStore:
        store: StateStore = (
            RocksDBStore("counts", tmp_path / "0_0" / "counts")
            if request.param == "rocksdb"
            else InMemoryStore("counts")
        )
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def filled(make: Callable[[], StateStore]) -> StateStore:
    store = make()
    store.put_all([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")])
    store.commit({CHANGELOG: 2})
    return store


def test_closing_a_store_ends_the_owners_open_iterators(
    open_store: Callable[[], StateStore],
) -> None:
    store = filled(open_store)
    iterator = store.all()
    assert next(iterator) == (b"a", b"1")
    store.put(b"d", b"4")  # uncommitted: the close discards it
    store.close()
    with pytest.raises(StoreClosedError, match='"counts" is closed'):
        next(iterator)


@pytest.mark.parametrize("isolation", list(IsolationLevel))
def test_closing_a_store_ends_other_threads_iterators(
    open_store: Callable[[], StateStore], isolation: IsolationLevel
) -> None:
    store = filled(open_store)
    iterator = store.reader(isolation).range(b"a", b"c")
    assert next(iterator) == (b"a", b"1")
    store.close()
    with pytest.raises(StoreClosedError):
        next(iterator)


def test_a_store_reopens_in_the_same_process_while_an_old_iterator_is_still_referenced(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "0_0" / "counts"
    store = RocksDBStore("counts", directory)
    store.put(b"a", b"1")
    store.commit({CHANGELOG: 0})
    iterator = store.reader(IsolationLevel.READ_COMMITTED).all()
    assert next(iterator) == (b"a", b"1")
    store.close()
    # The iterator object is still alive here; the database must not be.
    reopened = RocksDBStore("counts", directory)
    try:
        assert reopened.get(b"a") == b"1"
    finally:
        reopened.close()
    with pytest.raises(StoreClosedError):
        next(iterator)


def test_an_iterator_in_use_on_another_thread_when_the_store_closes_fails_cleanly(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "0_0" / "counts"
    store = RocksDBStore("counts", directory)
    store.put_all([(b"k%05d" % i, b"v") for i in range(20_000)])
    store.commit({CHANGELOG: 19_999})
    started, outcome = threading.Event(), []

    def scan() -> None:
        read = 0
        try:
            for _ in store.reader(IsolationLevel.READ_COMMITTED).all():
                read += 1
                started.set()
            outcome.append(f"finished after {read}")
        except StoreClosedError:
            outcome.append("closed")

    reader = threading.Thread(target=scan)
    reader.start()
    started.wait(5)
    store.close()
    reader.join(10)
    assert outcome in (["closed"], ["finished after 20000"])
    RocksDBStore("counts", directory).close()  # nothing left holding the database


def test_a_lock_held_by_this_process_is_reported_as_this_process(tmp_path: Path) -> None:
    directory = tmp_path / "0_0" / "counts"
    first = RocksDBStore("counts", directory)
    try:
        with pytest.raises(StoreLockedError, match=f"this process \\(pid {os.getpid()}\\)"):
            RocksDBStore("counts", directory)
    finally:
        first.close()


def test_none_and_str_keys_raise_type_error_naming_the_store(
    open_store: Callable[[], StateStore],
) -> None:
    store = filled(open_store)
    reader = store.reader()
    for operation in (
        lambda: store.get(None),  # type: ignore[arg-type]
        lambda: store.delete(None),  # type: ignore[arg-type]
        lambda: store.prefix_scan(None),  # type: ignore[arg-type]
        lambda: store.range("a", None),  # type: ignore[arg-type]
        lambda: reader.get(None),  # type: ignore[arg-type]
        lambda: reader.prefix_scan(None),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError, match=r'state store "counts".*bytes key'):
            operation()


def test_a_range_with_from_after_to_is_empty_and_warns(
    open_store: Callable[[], StateStore], caplog: pytest.LogCaptureFixture
) -> None:
    store = filled(open_store)
    with caplog.at_level(logging.WARNING):
        assert list(store.range(b"c", b"a")) == []
        assert list(store.reader().range(b"c", b"a")) == []
    warnings = [r.getMessage() for r in caplog.records if "from > to" in r.getMessage()]
    assert len(warnings) == 2 and '"counts"' in warnings[0]
    assert list(store.range(b"a", b"a")) == [(b"a", b"1")]


def test_put_if_absent_writes_only_a_missing_key(open_store: Callable[[], StateStore]) -> None:
    store = filled(open_store)
    assert store.put_if_absent(b"a", b"9") == b"1"
    assert store.get(b"a") == b"1"
    assert store.put_if_absent(b"z", b"26") is None
    assert store.get(b"z") == b"26"


def test_delete_returns_the_value_it_deleted(open_store: Callable[[], StateStore]) -> None:
    store = filled(open_store)
    store.put(b"b", b"22")  # uncommitted: delete returns the owner's own write
    assert store.delete(b"b") == b"22"
    assert store.delete(b"b") is None
    assert store.delete(b"a") == b"1"
    assert store.delete(b"never") is None
    assert [key for key, _ in store.all()] == [b"c"]
