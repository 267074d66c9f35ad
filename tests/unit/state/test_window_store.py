"""Window and session stores over the transactional RocksDB store (KIP-892).

Boundaries follow Kafka Streams' segmented stores (``AbstractRocksDBSegmentedBytesStore``,
``WindowKeySchema``, ``SessionKeySchema``, ``Segments``): fetch ranges include both ends,
reads hide an entry whose segment-time is older than ``observed stream time - retention
+ 1``, and a segment older than the one holding ``observed - retention`` takes no writes
and is dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.errors import InvalidArgumentError
from eddyline_runtime.state import (
    KeyRange,
    KeyValue,
    RocksDBStore,
    StateStoreError,
    StoreReader,
    TopicPartition,
)
from eddyline_runtime.state.window_layout import (
    DEFAULT_CHANGELOG_ADDITIONAL_RETENTION_MS,
    Retention,
    changelog_retention_ms,
    decode_session_key,
    decode_window_key,
    session_key,
    window_key,
)
from eddyline_runtime.state.window_store import SegmentedSessionStore, SegmentedWindowStore
from tests.support.stores import StoreFactory

CHANGELOG = TopicPartition("app-windows-changelog", 0)
# Small segments so that tests cross them: retention 1000 ms, segments of 500 ms.
RETENTION = Retention.of(1000, 500)


def windows(store: SegmentedWindowStore, key: bytes, lo: int, hi: int) -> list[tuple[int, bytes]]:
    return list(store.fetch_range(key, lo, hi))


# -- layout and retention arithmetic ---------------------------------------------------


def test_layout_is_segment_then_kafka_window_key() -> None:
    raw = window_key(1000, b"k", 1234)
    assert raw == (
        (1000).to_bytes(8, "big") + b"k" + (1234).to_bytes(8, "big") + (0).to_bytes(4, "big")
    )
    assert decode_window_key(raw) == (b"k", 1234, 0)
    raw = session_key(500, b"user", 10, 900)
    # Kafka's SessionKeySchema: key, then end, then start.
    assert raw == (500).to_bytes(8, "big") + b"user" + (900).to_bytes(8, "big") + (10).to_bytes(
        8, "big"
    )
    assert decode_session_key(raw) == (b"user", 10, 900)


def test_retention_as_kafka_streams_computes_it() -> None:
    # The segment interval: max(retention / 2, 60 s).
    assert Retention.of(70_000) == Retention(70_000, 60_000)
    assert Retention.of(600_000) == Retention(600_000, 300_000)
    assert Retention.of(5_000) == Retention(5_000, 60_000)
    assert Retention.of(1_800_000) == Retention(1_800_000, 900_000)
    assert changelog_retention_ms(70_000) == 70_000 + 86_400_000
    assert DEFAULT_CHANGELOG_ADDITIONAL_RETENTION_MS == 86_400_000
    assert changelog_retention_ms(70_000, 1) == 70_001


# -- window store ----------------------------------------------------------------------


def test_several_windows_per_key_fetch_bounds_inclusive(store_factory: StoreFactory) -> None:
    store = SegmentedWindowStore(store_factory(), Retention.of(10_000, 500))
    for start in (0, 100, 200, 600, 1100):
        store.put(b"a", start, f"a@{start}".encode())
    store.put(b"b", 100, b"b@100")
    assert windows(store, b"a", 100, 600) == [(100, b"a@100"), (200, b"a@200"), (600, b"a@600")]
    assert windows(store, b"a", 101, 599) == [(200, b"a@200")]
    assert windows(store, b"a", 0, 10_000) == [
        (0, b"a@0"),
        (100, b"a@100"),
        (200, b"a@200"),
        (600, b"a@600"),
        (1100, b"a@1100"),
    ]
    assert windows(store, b"a", 300, 200) == []
    assert store.fetch(b"a", 200) == b"a@200"
    assert store.fetch(b"a", 201) is None
    assert store.fetch(b"b", 100) == b"b@100"
    assert list(store.fetch_all(100, 200)) == [
        (b"a", 100, b"a@100"),
        (b"a", 200, b"a@200"),
        (b"b", 100, b"b@100"),
    ]


def test_keys_sharing_a_prefix_do_not_mix(store_factory: StoreFactory) -> None:
    store = SegmentedWindowStore(store_factory(), RETENTION)
    # b"a" + 8 bytes of a start sorts inside b"a"'s own range of windows.
    longer = b"a" + (150).to_bytes(8, "big")
    store.put(b"a", 100, b"short")
    store.put(longer, 100, b"long")
    store.put(b"a", 200, b"short2")
    assert windows(store, b"a", 0, 400) == [(100, b"short"), (200, b"short2")]
    assert windows(store, longer, 0, 400) == [(100, b"long")]


def test_put_none_deletes_a_window(store_factory: StoreFactory) -> None:
    store = SegmentedWindowStore(store_factory(), RETENTION)
    store.put(b"a", 100, b"1")
    store.put(b"a", 100, None)
    assert store.fetch(b"a", 100) is None
    assert windows(store, b"a", 0, 400) == []


def test_retention_drops_whole_segments_and_hides_expired_windows(
    store_factory: StoreFactory,
) -> None:
    backing = store_factory()
    store = SegmentedWindowStore(backing, RETENTION)
    for start in (0, 400, 600, 999):
        store.put(b"k", start, b"v")
    assert store.observed_stream_time == 999
    # Observed 1600: everything before 1600 - 1000 + 1 = 601 is expired.
    store.put(b"k", 1600, b"v")
    assert store.observed_stream_time == 1600
    assert windows(store, b"k", 0, 2000) == [(999, b"v"), (1600, b"v")]
    assert store.fetch(b"k", 600) is None
    assert list(store.all()) == [(b"k", 999, b"v"), (b"k", 1600, b"v")]
    # Segment [0, 500) held only expired windows: its keys are gone from the store.
    # Segment [500, 1000) still holds live window 999, so expired 600 waits there, unseen.
    raw_starts = [decode_window_key(raw)[1] for raw, _ in backing.all()]
    assert raw_starts == [600, 999, 1600]
    # A write into the live segment [500, 1000) is kept, though reads hide its time;
    # one into the dropped segment [0, 500) is skipped and counted.
    assert store.put(b"k", 600, b"late")
    assert store.fetch(b"k", 600) is None
    assert not store.put(b"k", 499, b"late")
    assert store.expired_writes == 1
    # The boundary itself is live.
    store.put(b"k", 601, b"edge")
    assert store.fetch(b"k", 601) == b"edge"
    store.put(b"k", 2100, b"v")  # min live 1101: segment [500, 1000) goes
    assert [decode_window_key(raw)[1] for raw, _ in backing.all()] == [1600, 2100]


def test_a_segment_stays_live_until_observed_minus_retention_leaves_it(
    store_factory: StoreFactory,
) -> None:
    """Kafka's ``Segments.getOrCreateSegmentIfLive``: live while segment >= the segment of
    observed - retention; reads start at observed - retention + 1 all the same."""
    backing = store_factory()
    store = SegmentedWindowStore(backing, RETENTION)
    store.put(b"k", 0, b"v")
    store.put(b"k", 1499, b"v")  # 1499 - 1000 = 499: segment [0, 500) is still live
    assert [decode_window_key(raw)[1] for raw, _ in backing.all()] == [0, 1499]
    assert store.put(b"k", 10, b"kept")
    assert store.fetch(b"k", 10) is None  # older than 1499 - 1000 + 1 = 500
    assert windows(store, b"k", 0, 2000) == [(1499, b"v")]
    store.put(b"k", 1500, b"v")  # 500: segment [0, 500) is dropped
    assert [decode_window_key(raw)[1] for raw, _ in backing.all()] == [1499, 1500]
    assert not store.put(b"k", 10, b"late")
    assert store.expired_writes == 1


def test_uncommitted_windows_isolation_and_budget(store_factory: StoreFactory) -> None:
    backing = store_factory()
    store = SegmentedWindowStore(backing, RETENTION)
    committed = store.reader(IsolationLevel.READ_COMMITTED)
    uncommitted = store.reader(IsolationLevel.READ_UNCOMMITTED)
    store.put(b"k", 100, b"one")
    raw = window_key(0, b"k", 100)
    assert backing.approximate_num_uncommitted_bytes() == len(raw) + len(b"one")
    assert store.fetch(b"k", 100) == b"one"
    assert uncommitted.fetch(b"k", 100) == b"one"
    assert list(uncommitted.fetch_range(b"k", 0, 200)) == [(100, b"one")]
    assert committed.fetch(b"k", 100) is None
    assert list(committed.fetch_range(b"k", 0, 200)) == []
    assert list(committed.fetch_all(0, 200)) == []
    backing.commit({CHANGELOG: 0})
    assert backing.approximate_num_uncommitted_bytes() == 0
    assert committed.fetch(b"k", 100) == b"one"
    assert list(committed.fetch_all(0, 200)) == [(b"k", 100, b"one")]
    store.put(b"k", 100, b"two")
    assert committed.fetch(b"k", 100) == b"one"
    assert uncommitted.fetch(b"k", 100) == b"two"


def test_crash_keeps_committed_windows_drops_the_open_transaction(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    directory = tmp_path / "windows"
    backing = store_factory("windows", directory=directory)
    store = SegmentedWindowStore(backing, RETENTION)
    for start in (600, 999, 1600):
        store.put(b"k", start, b"c")
    backing.commit({CHANGELOG: 2})
    store.put(b"k", 1700, b"lost")
    store.put(b"k", 999, None)
    backing.close()  # no commit: a crash as far as the store is concerned

    reopened_backing = store_factory("windows", directory=directory)
    assert reopened_backing.committed_offset(CHANGELOG) == 2
    reopened = SegmentedWindowStore(reopened_backing, RETENTION)
    # Observed stream time comes back from the newest segment: 600 stays expired.
    assert reopened.observed_stream_time == 1600
    assert list(reopened.fetch_range(b"k", 0, 5000)) == [(999, b"c"), (1600, b"c")]
    assert reopened.fetch(b"k", 600) is None
    assert reopened.fetch(b"k", 1700) is None


def test_reopen_with_another_segment_interval_is_refused(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    directory = tmp_path / "windows"
    backing = store_factory("windows", directory=directory)
    store = SegmentedWindowStore(backing, Retention.of(1000, 500))
    store.put(b"k", 700, b"v")
    store.put(b"k", 900, b"v")
    backing.commit({})
    backing.close()
    for other in (Retention.of(1000, 300), Retention.of(1000, 250)):
        reopened = SegmentedWindowStore(store_factory("windows", directory=directory), other)
        with pytest.raises(StateStoreError, match="written with another retention"):
            reopened.fetch(b"k", 700)
        reopened._backing.close()  # type: ignore[attr-defined]


def test_a_key_value_store_is_not_read_as_windows(store_factory: StoreFactory) -> None:
    backing = store_factory()
    backing.put(b"word", b"3")
    with pytest.raises(StateStoreError, match="not a window or session store key"):
        SegmentedWindowStore(backing, RETENTION).fetch(b"word", 0)


def test_negative_timestamps_are_refused_with_the_store_named(store_factory: StoreFactory) -> None:
    store = SegmentedWindowStore(store_factory("w"), RETENTION)
    with pytest.raises(InvalidArgumentError, match='"w": window start -1'):
        store.put(b"k", -1, b"v")


class _Logged:
    """A backing store that keeps the changelog records its writes would send."""

    def __init__(self, store: RocksDBStore) -> None:
        self.name = store.name
        self.store = store
        self.changelog: list[tuple[bytes, bytes | None]] = []

    def get(self, key: bytes) -> bytes | None:
        return self.store.get(key)

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        return self.store.scan(key_range)

    def put(self, key: bytes, value: bytes) -> None:
        self.store.put(key, value)
        self.changelog.append((key, value))

    def delete(self, key: bytes) -> bytes | None:
        self.changelog.append((key, None))
        return self.store.delete(key)

    def reader(self, isolation: IsolationLevel | str | None = None) -> StoreReader:
        return self.store.reader(isolation)


def test_changelog_replayed_into_a_plain_store_is_byte_for_byte(
    store_factory: StoreFactory,
) -> None:
    logged = _Logged(store_factory("active"))
    store = SegmentedWindowStore(logged, RETENTION)
    for start, key in ((0, b"a"), (300, b"b"), (700, b"a"), (1200, b"c"), (1900, b"a")):
        store.put(key, start, f"{key!r}{start}".encode())
    store.put(b"c", 1200, None)
    logged.store.commit({CHANGELOG: len(logged.changelog) - 1})
    replica = store_factory("standby")
    replica.restore_batch(logged.changelog, {CHANGELOG: len(logged.changelog) - 1})
    assert list(replica.all()) == list(logged.store.all())
    # The replayed bytes read back as the same windows.
    assert list(SegmentedWindowStore(replica, RETENTION).all()) == list(store.all())


# -- session store ---------------------------------------------------------------------


def test_sessions_found_by_overlap_for_merging(store_factory: StoreFactory) -> None:
    store = SegmentedSessionStore(store_factory(), Retention.of(10_000, 500))
    store.put(b"u", 0, 100, b"s1")
    store.put(b"u", 300, 450, b"s2")
    store.put(b"u", 700, 700, b"s3")
    store.put(b"v", 0, 900, b"other")
    # A record at 500 with gap 100 merges with sessions ending >= 400 starting <= 600.
    assert list(store.find_sessions(b"u", 400, 600)) == [(b"u", 300, 450, b"s2")]
    # Both ends inclusive.
    assert [s[1:3] for s in store.find_sessions(b"u", 100, 700)] == [
        (0, 100),
        (300, 450),
        (700, 700),
    ]
    assert list(store.find_sessions(b"u", 101, 299)) == []
    assert store.fetch_session(b"u", 300, 450) == b"s2"
    assert store.fetch_session(b"u", 300, 451) is None
    store.remove(b"u", 300, 450)
    assert [s[1:3] for s in store.fetch(b"u")] == [(0, 100), (700, 700)]
    assert [s[:3] for s in store.find_all_sessions(0, 10_000)] == [
        (b"u", 0, 100),  # segment [0, 500)
        (b"u", 700, 700),  # segment [500, 1000), in key order
        (b"v", 0, 900),
    ]
    with pytest.raises(StateStoreError, match="cannot end"):
        store.put(b"u", 10, 5, b"x")


def test_sessions_expire_by_their_end(store_factory: StoreFactory) -> None:
    backing = store_factory()
    store = SegmentedSessionStore(backing, RETENTION)
    store.put(b"u", 0, 450, b"old")
    store.put(b"u", 100, 700, b"long")
    store.put(b"u", 1500, 1600, b"new")  # min live 601
    assert [s[1:3] for s in store.fetch(b"u")] == [(100, 700), (1500, 1600)]
    assert [decode_session_key(raw)[1:] for raw, _ in backing.all()] == [(100, 700), (1500, 1600)]
    # Its end's segment [500, 1000) is live: written, though reads hide it (600 < 601).
    assert store.put(b"u", 0, 600, b"late")
    assert store.fetch_session(b"u", 0, 600) is None
    assert store.expired_writes == 0
    assert not store.put(b"u", 0, 499, b"late")  # segment [0, 500) is gone
    assert store.expired_writes == 1


def test_session_isolation_and_reopen(store_factory: StoreFactory, tmp_path: Path) -> None:
    directory = tmp_path / "sessions"
    backing = store_factory("sessions", directory=directory)
    store = SegmentedSessionStore(backing, RETENTION)
    committed = store.reader(IsolationLevel.READ_COMMITTED)
    store.put(b"u", 10, 20, b"a")
    assert list(committed.fetch(b"u")) == []
    assert list(store.reader(IsolationLevel.READ_UNCOMMITTED).fetch(b"u")) == [(b"u", 10, 20, b"a")]
    backing.commit({CHANGELOG: 0})
    assert list(committed.fetch(b"u")) == [(b"u", 10, 20, b"a")]
    store.remove(b"u", 10, 20)
    store.put(b"u", 10, 40, b"merged")
    backing.close()
    reopened = SegmentedSessionStore(store_factory("sessions", directory=directory), RETENTION)
    assert list(reopened.fetch(b"u")) == [(b"u", 10, 20, b"a")]
    assert reopened.observed_stream_time == 20
