"""Readers on other threads while the owner writes and commits (KIP-892's deferred case).

The owner runs transactions ``t = 1, 2, ...``; transaction ``t`` sets every
key ``k000``..``k099`` to ``t``, in key order, and puts ``extra`` when ``t``
is even and deletes it when odd. Any consistent snapshot therefore has a shape
we can check without knowing when it was taken:

* READ_COMMITTED: all keys hold one value ``c``; ``extra`` exists iff ``c`` is even;
* READ_UNCOMMITTED: keys ``k000``..``k(j-1)`` hold ``u`` and the rest ``u - 1``
  (the open transaction wrote the first ``j``; in transaction 1 the rest are absent).

Readers iterate slowly, yielding the GIL between items, so that a view that
followed the owner instead of holding its snapshot would break the shape.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import pytest

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.state import RocksDBStore, TopicPartition
from tests.support.stores import StoreFactory

KEYS = [b"k%03d" % i for i in range(100)]
CHANGELOG = TopicPartition("concurrency-changelog", 0)
RUN_SECONDS = 2.0


@pytest.fixture(autouse=True)
def frequent_thread_switches() -> Iterator[None]:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(previous)


def owner_loop(store: RocksDBStore, stop: threading.Event) -> int:
    transaction, offset = 0, 0
    while not stop.is_set():
        transaction += 1
        value = b"%d" % transaction
        for key in KEYS:
            store.put(key, value)
            offset += 1
        if transaction % 2 == 0:
            store.put(b"extra", value)
        else:
            store.delete(b"extra")
        store.commit({CHANGELOG: offset})
    return transaction


def run_owner_beside(
    store: RocksDBStore,
    readers: list[threading.Thread],
    stop: threading.Event,
    failures: list[BaseException],
) -> int:
    """Run the owner for RUN_SECONDS while ``readers`` run (they stop on ``stop`` and put
    what failed them in ``failures``); raises their first failure, else returns how many
    transactions the owner committed."""
    for thread in readers:
        thread.start()
    result: list[int] = []
    owner = threading.Thread(target=lambda: result.append(owner_loop(store, stop)))
    owner.start()
    time.sleep(RUN_SECONDS)
    stop.set()
    owner.join()
    for thread in readers:
        thread.join()
    if failures:
        raise failures[0]
    return result[0]


def slow_items(entries: Iterator[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    taken = []
    for entry in entries:
        taken.append(entry)
        time.sleep(0)  # let the owner run mid-iteration
    return taken


def check_committed(entries: list[tuple[bytes, bytes]], *, covers_extra: bool) -> None:
    data = dict(entries)
    values = {data.get(key) for key in KEYS}
    if values == {None}:
        return  # before the first commit
    assert len(values) == 1, f"torn READ_COMMITTED snapshot: {entries}"
    (value,) = values
    assert value is not None
    if covers_extra:
        assert (b"extra" in data) == (int(value) % 2 == 0), f"extra torn from {value!r}"


def check_uncommitted(entries: list[tuple[bytes, bytes]], *, covers_extra: bool) -> None:
    data = dict(entries)
    values = [int(data[key]) for key in KEYS if key in data]
    if not values:
        return
    newest = values[0]
    # In transaction 1 the keys not yet written do not exist at all.
    assert len(values) == len(KEYS) or newest == 1, f"keys vanished: {values}"
    boundary = next((i for i, v in enumerate(values) if v != newest), len(values))
    assert all(v == newest for v in values[:boundary])
    assert all(v == newest - 1 for v in values[boundary:]), f"not one instant: {values}"


def test_readers_see_one_consistent_snapshot_while_the_owner_commits(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    stop = threading.Event()
    failures: list[BaseException] = []
    checks = {IsolationLevel.READ_COMMITTED: 0, IsolationLevel.READ_UNCOMMITTED: 0}

    def reader_loop(isolation: IsolationLevel) -> None:
        check = check_committed if isolation is IsolationLevel.READ_COMMITTED else check_uncommitted
        try:
            while not stop.is_set():
                reader = store.reader(isolation)
                check(slow_items(reader.all()), covers_extra=True)
                check(slow_items(reader.range(b"k000", b"k099")), covers_extra=False)
                reader.get(b"k050")
                checks[isolation] += 1
        except BaseException as error:
            failures.append(error)
            stop.set()

    readers = [
        threading.Thread(target=reader_loop, args=(isolation,))
        for isolation in IsolationLevel
        for _ in range(2)
    ]
    transactions = run_owner_beside(store, readers, stop, failures)
    assert transactions > 5, "the owner barely committed; the test proved little"
    assert all(count > 5 for count in checks.values()), checks


def test_uncommitted_reader_snapshot_ignores_later_writes(store_factory: StoreFactory) -> None:
    store = store_factory()
    store.put(b"a", b"1")
    store.commit({CHANGELOG: 0})
    store.put(b"b", b"2")
    iterator = store.reader(IsolationLevel.READ_UNCOMMITTED).all()
    store.put(b"c", b"3")
    store.delete(b"a")
    store.commit({CHANGELOG: 2})
    assert list(iterator) == [(b"a", b"1"), (b"b", b"2")]


def test_a_committed_get_reads_its_value_with_the_changelog_offset_of_that_commit(
    store_factory: StoreFactory,
) -> None:
    # A query's answer says which changelog record its value includes: read apart, a
    # commit between the two would pair a value with an older offset (an answer a client
    # checking it against the changelog finds wrong). Transaction t ends at offset 100 * t.
    store = store_factory()
    stop = threading.Event()
    failures: list[BaseException] = []
    checked = [0]

    def reader_loop() -> None:
        try:
            while not stop.is_set():
                reader = store.reader(IsolationLevel.READ_COMMITTED)
                value, offsets = reader.get_with_changelog_offsets(b"k050")
                if value is None:
                    assert offsets == {}, offsets
                    continue
                assert offsets == {CHANGELOG: len(KEYS) * int(value)}, (value, offsets)
                checked[0] += 1
        except BaseException as error:
            failures.append(error)
            stop.set()

    readers = [threading.Thread(target=reader_loop) for _ in range(2)]
    transactions = run_owner_beside(store, readers, stop, failures)
    assert transactions > 5 and checked[0] > 5, (transactions, checked)
    # Uncommitted reads may include writes past any committed offset: no offsets claimed.
    assert (
        store.reader(IsolationLevel.READ_UNCOMMITTED).get_with_changelog_offsets(b"k050")[1] is None
    )
