"""Versioned key-value stores (KIP-889) over the transactional RocksDB store (KIP-892).

The behaviours follow Kafka Streams' ``RocksDBVersionedStoreTest`` (named per test) and
``VersionedKeyValueStoreIntegrationTest`` (restore from the changelog, queries by
timestamp): a put older than ``observed - history retention`` is dropped and answers
NOT_PUT, ``get(key, as_of)`` older than that is null, tombstones are versions, and an
out-of-order put splits the version it lands in.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
from eddyline_runtime.state.versioned_store import (
    PUT_RETURN_CODE_NOT_PUT,
    PUT_RETURN_CODE_VALID_TO_UNDEFINED,
    VersionedKeyValueStore,
    VersionedRecord,
    VersionedStoreReader,
    changelog_min_compaction_lag_ms,
)
from tests.support.stores import StoreFactory

CHANGELOG = TopicPartition("app-prices-changelog", 0)
HISTORY = 300_000  # RocksDBVersionedStoreTest's HISTORY_RETENTION
BASE = 10_000  # a base timestamp above the retention, as there


def as_of(store: VersionedKeyValueStore, key: bytes, timestamp: int) -> bytes | None:
    record = store.get(key, timestamp)
    return None if record is None else record.value


def test_put_latest_and_get_it_and_as_of(store_factory: StoreFactory) -> None:
    # shouldPutLatest
    store = VersionedKeyValueStore(store_factory("prices"), HISTORY)
    assert store.put(b"k", b"v", BASE) == PUT_RETURN_CODE_VALID_TO_UNDEFINED
    assert store.put(b"k", b"v2", BASE + 1) == PUT_RETURN_CODE_VALID_TO_UNDEFINED
    assert store.get(b"k") == VersionedRecord(b"v2", BASE + 1)
    assert store.get(b"k", BASE) == VersionedRecord(b"v", BASE, BASE + 1)
    assert store.get(b"k", BASE + 1) == VersionedRecord(b"v2", BASE + 1)
    assert store.get(b"k", BASE + 2) == VersionedRecord(b"v2", BASE + 1)
    assert store.get(b"k", BASE - 1) is None
    assert store.get(b"other") is None


def test_tombstone_as_latest_is_a_version(store_factory: StoreFactory) -> None:
    # shouldPutNullAsLatest
    store = VersionedKeyValueStore(store_factory("prices"), HISTORY)
    assert store.put(b"k", None, BASE) == PUT_RETURN_CODE_VALID_TO_UNDEFINED
    assert store.get(b"k") is None
    assert store.get(b"k", BASE) is None
    store.put(b"k", b"v", BASE + 1)
    assert store.get(b"k", BASE) is None
    assert store.get(b"k", BASE + 1) == VersionedRecord(b"v", BASE + 1)
    store.put(b"k", None, BASE + 2)
    assert store.get(b"k") is None
    assert store.get(b"k", BASE + 1) == VersionedRecord(b"v", BASE + 1, BASE + 2)
    assert store.get(b"k", BASE + 5) is None


def test_put_at_an_existing_timestamp_replaces_that_version(store_factory: StoreFactory) -> None:
    # shouldPutRepeatTimestampAsLatest / shouldPutRepeatTimestamps
    store = VersionedKeyValueStore(store_factory("prices"), HISTORY)
    store.put(b"k", b"a", BASE)
    store.put(b"k", b"b", BASE)
    assert store.get(b"k") == VersionedRecord(b"b", BASE)
    store.put(b"k", b"c", BASE + 10)
    assert store.put(b"k", b"a2", BASE) == BASE + 10
    assert store.get(b"k", BASE + 5) == VersionedRecord(b"a2", BASE, BASE + 10)
    assert store.put(b"k", None, BASE) == BASE + 10
    assert store.get(b"k", BASE + 5) is None
    assert store.get(b"k") == VersionedRecord(b"c", BASE + 10)


def test_out_of_order_puts_split_the_version_they_land_in(store_factory: StoreFactory) -> None:
    # shouldPutOlderWithNonNullLatest / shouldPutOlderWithNullLatest
    store = VersionedKeyValueStore(store_factory("prices"), HISTORY)
    store.put(b"k", b"v40", BASE + 40)
    assert store.put(b"k", b"v10", BASE + 10) == BASE + 40
    assert store.put(b"k", b"v20", BASE + 20) == BASE + 40
    assert store.put(b"k", b"v30", BASE + 30) == BASE + 40
    # Before the oldest version: valid until the oldest starts.
    assert store.put(b"k", b"v5", BASE + 5) == BASE + 10
    assert [as_of(store, b"k", BASE + t) for t in (4, 5, 9, 10, 19, 20, 29, 30, 39, 40)] == [
        None,
        b"v5",
        b"v5",
        b"v10",
        b"v10",
        b"v20",
        b"v20",
        b"v30",
        b"v30",
        b"v40",
    ]
    assert store.get(b"k", BASE + 25) == VersionedRecord(b"v20", BASE + 20, BASE + 30)
    # Null latest: an out-of-order put still ends where the tombstone starts.
    store.put(b"n", None, BASE + 50)
    assert store.put(b"n", b"x", BASE + 20) == BASE + 50
    assert store.get(b"n", BASE + 49) == VersionedRecord(b"x", BASE + 20, BASE + 50)
    assert store.get(b"n", BASE + 50) is None


def test_out_of_order_tombstone_bounds_a_later_out_of_order_put(
    store_factory: StoreFactory,
) -> None:
    # A tombstone is a version: a put before it must stop where it starts.
    store = VersionedKeyValueStore(store_factory("prices"), HISTORY)
    store.put(b"k", b"v100", BASE + 100)
    assert store.put(b"k", None, BASE + 50) == BASE + 100
    assert store.put(b"k", b"v30", BASE + 30) == BASE + 50
    assert as_of(store, b"k", BASE + 40) == b"v30"
    assert as_of(store, b"k", BASE + 60) is None
    assert as_of(store, b"k", BASE + 100) == b"v100"


def test_put_older_than_history_retention_is_not_put(store_factory: StoreFactory) -> None:
    # shouldNotPutExpired (grace period = history retention)
    store = VersionedKeyValueStore(store_factory("prices"), HISTORY)
    store.put(b"k", b"v", BASE + HISTORY)
    assert store.put(b"k", b"old", BASE - 1) == PUT_RETURN_CODE_NOT_PUT
    assert store.expired_writes == 1
    assert store.get(b"k", BASE) is None
    # Exactly at the boundary it is still put.
    assert store.put(b"k", b"edge", BASE) == BASE + HISTORY
    assert as_of(store, b"k", BASE) == b"edge"


def test_get_as_of_older_than_history_retention_is_null(store_factory: StoreFactory) -> None:
    # shouldNotGetExpired / shouldGetFromOlderSegments
    store = VersionedKeyValueStore(store_factory("prices"), HISTORY)
    store.put(b"k", b"v1", BASE)
    store.put(b"k", b"v2", BASE + 10)
    store.put(b"other", b"x", BASE + 10 + HISTORY)  # advances observed stream time
    assert store.observed_stream_time == BASE + 10 + HISTORY
    assert store.get(b"k", BASE + 9) is None  # older than observed - retention
    assert store.get(b"k", BASE + 10) == VersionedRecord(b"v2", BASE + 10)
    # The latest version is answered whatever its age.
    assert store.get(b"k") == VersionedRecord(b"v2", BASE + 10)


def test_unreachable_history_is_deleted_when_the_key_is_written(
    store_factory: StoreFactory,
) -> None:
    backing = store_factory("prices")
    store = VersionedKeyValueStore(backing, 100)
    for t in (0, 10, 20, 30):
        store.put(b"k", f"v{t}".encode(), BASE + t)
    assert len(list(backing.scan(KeyRange.prefix(b"\x02")))) == 3
    store.put(b"k", b"late", BASE + 125)  # cutoff BASE + 25: [10, 20) and [0, 10) go
    history = list(backing.scan(KeyRange.prefix(b"\x02")))
    assert len(history) == 2  # [20, 30) and [30, 125)
    assert as_of(store, b"k", BASE + 25) == b"v20"
    assert store.versions(b"k", ascending=True) == [
        VersionedRecord(b"v20", BASE + 20, BASE + 30),
        VersionedRecord(b"v30", BASE + 30, BASE + 125),
        VersionedRecord(b"late", BASE + 125),
    ]


def test_zero_history_retention_keeps_only_the_latest(store_factory: StoreFactory) -> None:
    # shouldAllowZeroHistoryRetention
    backing = store_factory("prices")
    store = VersionedKeyValueStore(backing, 0)
    store.put(b"k", b"a", BASE)
    store.put(b"k", b"b", BASE + 1)
    assert store.get(b"k") == VersionedRecord(b"b", BASE + 1)
    assert store.get(b"k", BASE + 1) == VersionedRecord(b"b", BASE + 1)
    assert store.get(b"k", BASE) is None
    assert store.put(b"k", b"late", BASE) == PUT_RETURN_CODE_NOT_PUT
    assert list(backing.scan(KeyRange.prefix(b"\x02"))) == []


def test_delete_answers_the_version_it_ends(store_factory: StoreFactory) -> None:
    # shouldDelete / shouldReturnNullIfDeletedAndExpired
    store = VersionedKeyValueStore(store_factory("prices"), HISTORY)
    store.put(b"k", b"v", BASE)
    assert store.delete(b"k", BASE + 5) == VersionedRecord(b"v", BASE)
    assert store.get(b"k") is None
    assert store.get(b"k", BASE + 4) == VersionedRecord(b"v", BASE, BASE + 5)
    assert store.delete(b"k", BASE + 6) is None  # already a tombstone
    store.put(b"x", b"far", BASE + 2 * HISTORY)
    assert store.delete(b"k", BASE) is None  # expired: nothing written
    assert store.expired_writes == 1


def test_versions_between_times_kip_968(store_factory: StoreFactory) -> None:
    # MultiVersionedKeyQuery: versions valid at some time in [from, to], tombstones out.
    store = VersionedKeyValueStore(store_factory("prices"), HISTORY)
    for t, value in ((10, b"a"), (20, None), (30, b"c"), (40, b"d")):
        store.put(b"k", value, BASE + t)
    assert store.versions(b"k", BASE + 15, BASE + 35) == [
        VersionedRecord(b"c", BASE + 30, BASE + 40),
        VersionedRecord(b"a", BASE + 10, BASE + 20),
    ]
    assert store.versions(b"k", BASE + 20, BASE + 29) == []
    assert store.versions(b"k", BASE + 40, BASE + 40, ascending=True) == [
        VersionedRecord(b"d", BASE + 40)
    ]
    with pytest.raises(InvalidArgumentError, match='"prices": from time 5 is after to time 4'):
        store.versions(b"k", 5, 4)


def test_other_threads_read_committed_versions_only(store_factory: StoreFactory) -> None:
    # KIP-892 through the versioned view: uncommitted versions invisible at READ_COMMITTED.
    backing = store_factory("prices")
    store = VersionedKeyValueStore(backing, HISTORY)
    committed = store.reader(IsolationLevel.READ_COMMITTED)
    uncommitted = store.reader(IsolationLevel.READ_UNCOMMITTED)
    store.put(b"k", b"v1", BASE)
    assert committed.get(b"k") is None
    assert committed.observed_stream_time == -1
    assert uncommitted.get(b"k", BASE) == VersionedRecord(b"v1", BASE)
    backing.commit({CHANGELOG: 0})
    store.put(b"k", b"v2", BASE + 10)
    assert committed.get(b"k") == VersionedRecord(b"v1", BASE)
    assert committed.get(b"k", BASE + 10) == VersionedRecord(b"v1", BASE)
    assert uncommitted.get(b"k", BASE + 10) == VersionedRecord(b"v2", BASE + 10)
    assert isinstance(committed, VersionedStoreReader)


def test_crash_keeps_committed_versions_and_observed_time(store_factory: StoreFactory) -> None:
    backing = store_factory("prices")
    store = VersionedKeyValueStore(backing, HISTORY)
    store.put(b"k", b"v1", BASE)
    store.put(b"k", b"v2", BASE + 10)
    backing.commit({CHANGELOG: 3})
    store.put(b"k", b"lost", BASE + HISTORY * 3)
    directory = backing.directory
    backing.close()  # no commit: a crash as far as the store is concerned
    reopened_backing = store_factory("prices", directory=directory)
    reopened = VersionedKeyValueStore(reopened_backing, HISTORY)
    assert reopened_backing.committed_offset(CHANGELOG) == 3
    assert reopened.observed_stream_time == BASE + 10
    assert reopened.get(b"k") == VersionedRecord(b"v2", BASE + 10)
    assert reopened.get(b"k", BASE + 5) == VersionedRecord(b"v1", BASE, BASE + 10)
    # The recovered observed time still drops what is too old.
    reopened.put(b"x", b"y", BASE + 10 + HISTORY)
    assert reopened.put(b"k", b"old", BASE + 9) == PUT_RETURN_CODE_NOT_PUT


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


def test_changelog_restore_rebuilds_the_same_versions(store_factory: StoreFactory) -> None:
    # VersionedKeyValueStoreIntegrationTest.shouldRestore: a replica replaying the
    # changelog (raw keys) answers every as-of query as the active store does, and a
    # compacted changelog (last record per raw key) rebuilds the same store.
    logged = _Logged(store_factory("active"))
    store = VersionedKeyValueStore(logged, 100)
    puts = [(b"a", b"1", 50), (b"a", b"2", 80), (b"b", b"x", 60), (b"a", None, 120)]
    puts += [(b"a", b"late", 70), (b"b", b"y", 200), (b"a", b"3", 210), (b"b", None, 150)]
    for key, value, t in puts:
        store.put(key, value, t)
    last = len(logged.changelog) - 1
    logged.store.commit({CHANGELOG: last})
    replica = store_factory("standby")
    replica.restore_batch(logged.changelog, {CHANGELOG: last})
    assert list(replica.all()) == list(logged.store.all())
    compacted_records = dict(logged.changelog)
    compacted = store_factory("compacted")
    compacted.restore_batch(list(compacted_records.items()), {CHANGELOG: last})
    assert list(compacted.all()) == list(logged.store.all())
    restored = VersionedKeyValueStore(replica, 100)
    assert restored.observed_stream_time == 210
    for key in (b"a", b"b"):
        for t in range(0, 260, 5):
            assert restored.get(key, t) == store.get(key, t), (key, t)
        assert restored.get(key) == store.get(key)


def test_changelog_min_compaction_lag_as_kafka_streams_sets_it() -> None:
    assert changelog_min_compaction_lag_ms(HISTORY) == HISTORY + 86_400_000


def test_bad_arguments_are_refused_with_the_store_named(store_factory: StoreFactory) -> None:
    with pytest.raises(InvalidArgumentError, match='"prices": history retention -1'):
        VersionedKeyValueStore(store_factory("prices"), -1)
    store = VersionedKeyValueStore(store_factory("p2"), HISTORY)
    with pytest.raises(InvalidArgumentError, match='"p2": timestamp -5 is not a timestamp'):
        store.put(b"k", b"v", -5)
    with pytest.raises(TypeError, match='"p2": put takes a bytes key'):
        store.put("k", b"v", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match='"p2": put takes a bytes value or None'):
        store.put(b"k", "v", 1)  # type: ignore[arg-type]


def test_a_store_written_as_a_plain_key_value_store_is_refused(
    store_factory: StoreFactory,
) -> None:
    backing = store_factory("counts")
    backing.put(b"\x01k", b"\x00")  # a plain key-value entry where a version would be
    with pytest.raises(StateStoreError, match='"counts" holds a value that is not a versioned'):
        VersionedKeyValueStore(backing, HISTORY).get(b"k")


# Hypothesis runs the test body many times under one fixture: a fresh store name each time.
_MODEL_STORES = itertools.count()


def _model_as_of(
    puts: dict[tuple[bytes, int], bytes | None], key: bytes, timestamp: int
) -> bytes | None:
    """The reference answer: the value of the newest accepted put of ``key`` at or before
    ``timestamp`` (a later put at the same time replaced it)."""
    times = [t for (k, t) in puts if k == key and t <= timestamp]
    return puts[(key, max(times))] if times else None


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([b"a", b"ab", b"b"]),
            st.one_of(st.none(), st.binary(max_size=3)),
            st.integers(min_value=0, max_value=400),
        ),
        max_size=40,
    )
)
def test_every_as_of_answer_matches_a_reference_model(
    store_factory: StoreFactory, ops: list[tuple[bytes, bytes | None, int]]
) -> None:
    # Any order of puts: each accepted put is a version until the next one of its key.
    store = VersionedKeyValueStore(store_factory(f"model-{next(_MODEL_STORES)}"), 100)
    accepted: dict[tuple[bytes, int], bytes | None] = {}
    observed = -1
    for key, value, t in ops:
        answer = store.put(key, value, t)
        if t < observed - 100:
            assert answer == PUT_RETURN_CODE_NOT_PUT
            continue
        assert answer != PUT_RETURN_CODE_NOT_PUT
        accepted[(key, t)] = value
        observed = max(observed, t)
    for key in (b"a", b"ab", b"b"):
        for t in range(0, 420, 7):
            record = store.get(key, t)
            expected = None if t < observed - 100 else _model_as_of(accepted, key, t)
            assert (None if record is None else record.value) == expected, (key, t)
