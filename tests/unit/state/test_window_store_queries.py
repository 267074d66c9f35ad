"""Key-range and backward reads of window and session stores (Kafka's ReadOnlyWindowStore
and ReadOnlySessionStore): across segment boundaries, retention and isolation levels.

Forward key-range reads are ordered by key, then time, across segments (a plain scan is
segment first); backward reads are exactly the reverse of the forward answer.
"""

from __future__ import annotations

import pytest

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.state import TopicPartition
from eddyline_runtime.state.window_layout import Retention
from eddyline_runtime.state.window_store import (
    DetachedSessionReader,
    DetachedWindowReader,
    SegmentedSessionStore,
    SegmentedWindowStore,
)
from tests.support.stores import StoreFactory

CHANGELOG = TopicPartition("app-windows-changelog", 0)
# Segments of 500 ms, so windows at 100, 600 and 1100 sit in three segments.
WIDE = Retention.of(10_000, 500)
MAX_TIME = (1 << 63) - 1


def filled_windows(store: SegmentedWindowStore) -> None:
    # Written newest segment first and keys out of order: the order must come from the read.
    for key in (b"c", b"a", b"b", b"ab"):
        for start in (1100, 600, 100):
            store.put(key, start, key + b"@" + str(start).encode())


def test_window_key_range_is_ordered_by_key_then_start_across_segments(
    store_factory: StoreFactory,
) -> None:
    store = SegmentedWindowStore(store_factory(), WIDE)
    filled_windows(store)
    found = [(key, start) for key, start, _ in store.fetch_key_range(b"a", b"b", 0, 2000)]
    assert found == [
        (b"a", 100), (b"a", 600), (b"a", 1100),
        (b"ab", 100), (b"ab", 600), (b"ab", 1100),
        (b"b", 100), (b"b", 600), (b"b", 1100),
    ]  # fmt: skip
    # The plain scan is segment first; the key-range read is not.
    assert [e[:2] for e in store.fetch_all(0, 2000)][:4] == [
        (b"a", 100), (b"ab", 100), (b"b", 100), (b"c", 100)
    ]  # fmt: skip
    backward = list(store.backward_fetch_key_range(b"a", b"b", 0, 2000))
    assert backward == list(reversed(list(store.fetch_key_range(b"a", b"b", 0, 2000))))
    assert backward[0][:2] == (b"b", 1100)


def test_window_key_range_bounds_are_inclusive_and_open_when_none(
    store_factory: StoreFactory,
) -> None:
    store = SegmentedWindowStore(store_factory(), WIDE)
    filled_windows(store)

    def keys(key_from: bytes | None, key_to: bytes | None, lo: int, hi: int) -> list[bytes]:
        return sorted({key for key, _, _ in store.fetch_key_range(key_from, key_to, lo, hi)})

    assert keys(b"ab", b"b", 0, 2000) == [b"ab", b"b"]
    assert keys(None, b"ab", 0, 2000) == [b"a", b"ab"]
    assert keys(b"b", None, 0, 2000) == [b"b", b"c"]
    assert keys(None, None, 0, 2000) == [b"a", b"ab", b"b", b"c"]
    # A bound that is no stored key, and one between a key and its extension.
    assert keys(b"a\x00", b"bz", 0, 2000) == [b"ab", b"b"]
    assert keys(b"c", b"a", 0, 2000) == []  # from > to: empty, as Kafka answers
    # Times are window starts, both ends inclusive, across the 500 ms segment edge.
    assert [s for _, s, _ in store.fetch_key_range(b"a", b"a", 600, 1100)] == [600, 1100]
    assert [s for _, s, _ in store.fetch_key_range(b"a", b"a", 101, 599)] == []
    assert [s for _, s, _ in store.fetch_key_range(b"a", b"a", 100, 100)] == [100]


def test_window_backward_reads_are_exact_reverses(store_factory: StoreFactory) -> None:
    store = SegmentedWindowStore(store_factory(), WIDE)
    filled_windows(store)
    assert list(store.backward_fetch_range(b"a", 0, 2000)) == [
        (1100, b"a@1100"), (600, b"a@600"), (100, b"a@100")
    ]  # fmt: skip
    assert list(store.backward_fetch_range(b"a", 101, 1099)) == [(600, b"a@600")]
    assert list(store.backward_fetch_all(100, 600)) == list(
        reversed(list(store.fetch_all(100, 600)))
    )
    assert list(store.backward_all()) == list(reversed(list(store.all())))


def test_window_key_range_hides_expired_windows(store_factory: StoreFactory) -> None:
    backing = store_factory()
    store = SegmentedWindowStore(backing, Retention.of(1000, 500))
    for key in (b"a", b"b"):
        for start in (0, 400, 600, 999):
            store.put(key, start, b"v")
    # Observed 1600: window starts before 601 are expired; segment [500, 1000) still
    # holds the expired 600 beside the live 999.
    store.put(b"a", 1600, b"v")
    assert [(k, s) for k, s, _ in store.fetch_key_range(None, None, 0, 5000)] == [
        (b"a", 999), (b"a", 1600), (b"b", 999)
    ]  # fmt: skip
    assert [(k, s) for k, s, _ in store.backward_fetch_key_range(b"b", b"b", 0, 5000)] == [
        (b"b", 999)
    ]
    assert list(store.fetch_key_range(b"a", b"b", 0, 600)) == []


def test_window_key_range_readers_keep_their_isolation_level(store_factory: StoreFactory) -> None:
    backing = store_factory()
    store = SegmentedWindowStore(backing, WIDE)
    committed = store.reader(IsolationLevel.READ_COMMITTED)
    uncommitted = store.reader(IsolationLevel.READ_UNCOMMITTED)
    store.put(b"a", 100, b"one")
    backing.commit({CHANGELOG: 0})
    store.put(b"b", 600, b"open")  # in another segment, not committed
    store.put(b"a", 100, b"two")
    assert list(committed.fetch_key_range(None, None, 0, 2000)) == [(b"a", 100, b"one")]
    assert list(committed.backward_fetch_key_range(None, None, 0, 2000)) == [(b"a", 100, b"one")]
    assert list(committed.backward_fetch_range(b"a", 0, 2000)) == [(100, b"one")]
    detached = DetachedWindowReader(backing.reader(IsolationLevel.READ_COMMITTED), WIDE)
    assert list(detached.fetch_key_range(b"a", b"b", 0, 2000)) == [(b"a", 100, b"one")]
    assert list(uncommitted.fetch_key_range(None, None, 0, 2000)) == [
        (b"a", 100, b"two"), (b"b", 600, b"open")
    ]  # fmt: skip
    assert list(store.backward_fetch_key_range(None, None, 0, 2000)) == [
        (b"b", 600, b"open"), (b"a", 100, b"two")
    ]  # fmt: skip


def test_key_range_bounds_are_checked(store_factory: StoreFactory) -> None:
    store = SegmentedWindowStore(store_factory(), WIDE)
    with pytest.raises(TypeError, match="fetch_key_range takes a bytes key"):
        list(store.fetch_key_range("a", None, 0, 10))  # type: ignore[arg-type]
    sessions = SegmentedSessionStore(store_factory("sessions"), WIDE)
    with pytest.raises(TypeError, match="find_key_range_sessions takes a bytes key"):
        list(sessions.find_key_range_sessions(None, 7, 0, 10))  # type: ignore[arg-type]


# -- sessions -----------------------------------------------------------------------------


def filled_sessions(store: SegmentedSessionStore) -> None:
    for key in (b"v", b"u", b"uu"):
        store.put(key, 1000, 1200, key + b"3")  # segment [1000, 1500)
        store.put(key, 300, 700, key + b"2")  # segment [500, 1000)
        store.put(key, 0, 100, key + b"1")  # segment [0, 500)


def test_session_key_range_is_ordered_by_key_then_end_across_segments(
    store_factory: StoreFactory,
) -> None:
    store = SegmentedSessionStore(store_factory(), WIDE)
    filled_sessions(store)
    found = [(k, s, e) for k, s, e, _ in store.find_key_range_sessions(b"u", b"uu", 0, MAX_TIME)]
    assert found == [
        (b"u", 0, 100), (b"u", 300, 700), (b"u", 1000, 1200),
        (b"uu", 0, 100), (b"uu", 300, 700), (b"uu", 1000, 1200),
    ]  # fmt: skip
    # Kafka's findSessions bounds: end >= earliest end, start <= latest start, inclusive.
    bounded = store.find_key_range_sessions(None, None, 100, 300)
    assert [(k, s, e) for k, s, e, _ in bounded] == [
        (b"u", 0, 100), (b"u", 300, 700),
        (b"uu", 0, 100), (b"uu", 300, 700),
        (b"v", 0, 100), (b"v", 300, 700),
    ]  # fmt: skip
    assert list(store.find_key_range_sessions(b"v", b"u", 0, MAX_TIME)) == []
    backward = list(store.backward_find_key_range_sessions(b"u", None, 0, MAX_TIME))
    assert backward == list(reversed(list(store.find_key_range_sessions(b"u", None, 0, MAX_TIME))))
    assert backward[0][:3] == (b"v", 1000, 1200)


def test_session_backward_reads_are_exact_reverses(store_factory: StoreFactory) -> None:
    store = SegmentedSessionStore(store_factory(), WIDE)
    filled_sessions(store)
    assert [s[1:3] for s in store.backward_fetch(b"u")] == [(1000, 1200), (300, 700), (0, 100)]
    assert [s[1:3] for s in store.backward_find_sessions(b"u", 100, 1000)] == [
        (1000, 1200), (300, 700), (0, 100)
    ]  # fmt: skip
    assert [s[1:3] for s in store.backward_find_sessions(b"u", 101, 999)] == [(300, 700)]


def test_session_key_range_hides_expired_and_uncommitted_sessions(
    store_factory: StoreFactory,
) -> None:
    backing = store_factory()
    store = SegmentedSessionStore(backing, Retention.of(1000, 500))
    store.put(b"u", 0, 450, b"old")
    store.put(b"v", 100, 700, b"long")
    backing.commit({CHANGELOG: 0})
    store.put(b"u", 1500, 1600, b"new")  # min live 601: the session ending at 450 expires
    committed = store.reader(IsolationLevel.READ_COMMITTED)
    assert [s[:3] for s in committed.find_key_range_sessions(None, None, 0, MAX_TIME)] == [
        (b"v", 100, 700)
    ]
    assert [s[:3] for s in store.find_key_range_sessions(None, None, 0, MAX_TIME)] == [
        (b"u", 1500, 1600), (b"v", 100, 700)
    ]  # fmt: skip
    detached = DetachedSessionReader(
        backing.reader(IsolationLevel.READ_UNCOMMITTED), store.retention
    )
    assert [s[:3] for s in detached.backward_find_key_range_sessions(b"u", b"v", 0, MAX_TIME)] == [
        (b"v", 100, 700), (b"u", 1500, 1600)
    ]  # fmt: skip


def test_keys_extending_another_key_with_time_like_bytes_keep_key_order(
    store_factory: StoreFactory,
) -> None:
    # Raw keys are ``key | start``: b"a"'s window at 400 sorts after b"a" + 200 as 8 bytes,
    # whose raw key falls between b"a"'s windows at 100 and 400.
    store = SegmentedWindowStore(store_factory(), WIDE)
    extended = b"a" + (200).to_bytes(8, "big")
    for key, start in ((b"a", 100), (b"a", 400), (extended, 300), (b"a", 1100), (b"b", 100)):
        store.put(key, start, b"v")
    forward = [(k, s) for k, s, _ in store.fetch_key_range(None, None, 0, 2000)]
    assert forward == [(b"a", 100), (b"a", 400), (b"a", 1100), (extended, 300), (b"b", 100)]
    assert [(k, s) for k, s, _ in store.backward_fetch_key_range(None, None, 0, 2000)] == (
        forward[::-1]
    )
    # b"a" is below this upper bound, though its raw keys sort above ``segment | key_to``.
    below = b"a" + (1).to_bytes(8, "big")
    assert [(k, s) for k, s, _ in store.fetch_key_range(None, below, 0, 2000)] == [
        (b"a", 100), (b"a", 400), (b"a", 1100)
    ]  # fmt: skip
    sessions = SegmentedSessionStore(store_factory("sessions"), WIDE)
    for key, start, end in ((b"a", 50, 100), (b"a", 400, 450), (extended, 300, 300)):
        sessions.put(key, start, end, b"v")
    found = [(k, e) for k, _, e, _ in sessions.find_key_range_sessions(None, None, 0, MAX_TIME)]
    assert found == [(b"a", 100), (b"a", 450), (extended, 300)]
    bounded = sessions.find_key_range_sessions(None, below, 0, MAX_TIME)
    assert [(k, e) for k, _, e, _ in bounded] == [(b"a", 100), (b"a", 450)]
