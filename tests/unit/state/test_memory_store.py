"""The in-memory store: same interface, not transactional, no managed offsets."""

from __future__ import annotations

import pytest

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.state import InMemoryStore, StoreClosedError, TopicPartition

CHANGELOG = TopicPartition("app-m-changelog", 0)


def test_writes_apply_at_once_for_every_reader() -> None:
    store = InMemoryStore("m")
    store.put_all([(b"b", b"2"), (b"a", b"1"), (b"c", b"3")])
    store.delete(b"c")
    for level in IsolationLevel:
        assert list(store.reader(level).all()) == [(b"a", b"1"), (b"b", b"2")]
    assert store.approximate_num_uncommitted_bytes() == 0


def test_scans_are_ordered_and_bounded() -> None:
    store = InMemoryStore("m")
    for key in (b"a1", b"a2", b"b", b"\xff", b"a\xff"):
        store.put(key, b"v")
    assert [k for k, _ in store.range(b"a2", b"b")] == [b"a2", b"a\xff", b"b"]
    assert [k for k, _ in store.prefix_scan(b"a")] == [b"a1", b"a2", b"a\xff"]
    store.put(b"a0", b"v")  # a new key after a scan still sorts in
    assert [k for k, _ in store.prefix_scan(b"a")] == [b"a0", b"a1", b"a2", b"a\xff"]


def test_offsets_are_not_managed_and_close_drops_the_data() -> None:
    store = InMemoryStore("m")
    assert not store.persistent
    assert not store.manages_offsets
    store.put(b"k", b"v")
    store.commit({CHANGELOG: 5})
    assert store.committed_offset(CHANGELOG) is None
    store.close()
    with pytest.raises(StoreClosedError):
        store.get(b"k")
