"""Restoration replays only the changelog tail after a store's committed offset."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.replay import ChangelogBehindStoreError, restore
from eddyline_runtime.state import InMemoryStore
from tests.support.stores import StoreFactory

CHANGELOG = TopicPartition("app-counts-changelog", 0)


def record_at(offset: int) -> Record:
    """Key offset % 1000; every 9th record deletes it."""
    key = b"k%03d" % (offset % 1000)
    return Record(key, None if offset % 9 == 0 else b"v%d" % offset, offset)


def expected_after(count: int) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for offset in range(count):
        record = record_at(offset)
        assert record.key is not None
        if record.value is None:
            state.pop(record.key, None)
        else:
            state[record.key] = record.value
    return state


@pytest.fixture
def log(tmp_path: Path) -> SqliteLog:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 1, compacted=True)
    log.produce(CHANGELOG, [record_at(o) for o in range(25_000)])
    return log


def test_restore_rebuilds_the_store_in_batches(log: SqliteLog, store_factory: StoreFactory) -> None:
    store = store_factory()
    result = restore(store, log, CHANGELOG, batch_records=4_000)
    assert result.records == 25_000
    assert dict(store.all()) == expected_after(25_000)
    assert store.committed_offset(CHANGELOG) == 24_999


def test_restart_replays_only_the_tail(
    log: SqliteLog, store_factory: StoreFactory, tmp_path: Path
) -> None:
    directory = tmp_path / "store"
    store = store_factory(directory=directory)
    restore(store, log, CHANGELOG)
    store.close()
    log.produce(CHANGELOG, [record_at(o) for o in range(25_000, 25_300)])
    reopened = store_factory(directory=directory)
    result = restore(reopened, log, CHANGELOG)
    assert (result.first_offset, result.records) == (25_000, 300)
    assert dict(reopened.all()) == expected_after(25_300)
    assert restore(reopened, log, CHANGELOG).records == 0


def test_restore_after_compaction_gives_the_same_state(
    log: SqliteLog, store_factory: StoreFactory
) -> None:
    assert log.compact(CHANGELOG.topic) > 0
    store = store_factory()
    restore(store, log, CHANGELOG)
    assert dict(store.all()) == expected_after(25_000)


def test_in_memory_stores_replay_from_the_beginning(log: SqliteLog) -> None:
    store = InMemoryStore("counts")
    assert restore(store, log, CHANGELOG).records == 25_000
    assert dict(store.all()) == expected_after(25_000)


def test_a_store_ahead_of_its_changelog_says_how_to_recover(
    log: SqliteLog, store_factory: StoreFactory
) -> None:
    store = store_factory()
    store.put(b"k", b"v")
    store.commit({CHANGELOG: 99_999})
    with pytest.raises(ChangelogBehindStoreError, match="delete the store's directory"):
        restore(store, log, CHANGELOG)
