"""A versioned store (KIP-889) rebuilt on the state paths: changelog replay and a Spark build.

The active store's writes go to a real changelog topic (the SQLite log) as the engine's
changelog layer sends them (raw keys of the versioned layout, tombstones for deletes).
Then the store is rebuilt twice, by the replay standbys and restores use
(``restore.replay.restore``) and by a Spark restore build (compact per raw key, SSTs,
ingest), and each copy answers every ``get(key, as_of)`` and ``versions(key)`` as the
active store does. Nothing in those paths knows the store is versioned: this test is
what says that is enough.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.ingest.sst_restore import ingest_latest_manifest
from eddyline_runtime.restore.replay import restore
from eddyline_runtime.restore.spark.spark_build import build, spark_session
from eddyline_runtime.state import (
    KeyRange,
    KeyValue,
    RocksDBStore,
    StoreReader,
    VersionedKeyValueStore,
)

pytestmark = pytest.mark.slow

APP, STORE = "app", "prices"
CHANGELOG = TopicPartition(f"{APP}-{STORE}-changelog", 0)
HISTORY = 2_000
KEYS = [b"a", b"ab", b"b", b"\x00", b"\xff\x01"]


class _ChangelogWriter:
    """A backing store that also produces each write to the changelog topic (as the
    engine's changelog layer does), committing both every ``batch`` writes."""

    def __init__(self, store: RocksDBStore, log: SqliteLog) -> None:
        self.name = store.name
        self.store = store
        self.log = log
        self.pending: list[Record] = []

    def get(self, key: bytes) -> bytes | None:
        return self.store.get(key)

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        return self.store.scan(key_range)

    def put(self, key: bytes, value: bytes) -> None:
        self.store.put(key, value)
        self.pending.append(Record(key, value, 0))

    def delete(self, key: bytes) -> bytes | None:
        self.pending.append(Record(key, None, 0))
        return self.store.delete(key)

    def reader(self, isolation: object = None) -> StoreReader:
        return self.store.reader(isolation)  # type: ignore[arg-type]

    def commit(self) -> None:
        if self.pending:
            self.log.produce(CHANGELOG, self.pending)
            self.pending = []
        self.store.commit({CHANGELOG: self.log.end_offset(CHANGELOG) - 1})


def _answers(store: VersionedKeyValueStore, until: int) -> list[object]:
    answers: list[object] = []
    for key in KEYS:
        answers.append(store.get(key))
        answers.append(store.versions(key))
        answers.extend(store.get(key, t) for t in range(0, until, 37))
    return answers


@pytest.fixture
def active(tmp_path: Path) -> Iterator[tuple[SqliteLog, VersionedKeyValueStore, int]]:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 1, compacted=True)
    backing = RocksDBStore(STORE, tmp_path / "active" / STORE)
    writer = _ChangelogWriter(backing, log)
    store = VersionedKeyValueStore(writer, HISTORY)  # type: ignore[arg-type]
    rng = random.Random(7)
    now = 0
    for i in range(3_000):
        now += rng.randrange(0, 5)
        # A fifth of the puts out of order, some beyond the history retention (dropped).
        late = rng.random() < 0.2
        t = max(0, now - rng.randrange(0, HISTORY + 500)) if late else now
        value = None if rng.random() < 0.15 else f"v{i}".encode()
        store.put(rng.choice(KEYS), value, t)
        if i % 200 == 199:
            writer.commit()
    writer.commit()
    try:
        yield log, store, now + 100
    finally:
        backing.close()
        log.close()


def test_a_replayed_versioned_store_answers_as_the_active_one(
    active: tuple[SqliteLog, VersionedKeyValueStore, int], tmp_path: Path
) -> None:
    log, store, until = active
    with RocksDBStore(STORE, tmp_path / "replay" / STORE) as replica:
        restore(replica, log, CHANGELOG)
        assert _answers(VersionedKeyValueStore(replica, HISTORY), until) == _answers(store, until)


def test_a_spark_built_versioned_store_answers_as_the_active_one(
    active: tuple[SqliteLog, VersionedKeyValueStore, int], tmp_path: Path
) -> None:
    log, store, until = active
    spark: SparkSession = spark_session("local[2]")
    try:
        build(
            spark,
            application=APP,
            store=STORE,
            changelog_topic=CHANGELOG.topic,
            partitions=[0],
            output=tmp_path / "out",
            log_url=log.url,
        )
    finally:
        spark.stop()
    attempt = ingest_latest_manifest(
        tmp_path / "out",
        application=APP,
        store=STORE,
        changelog=CHANGELOG,
        directory=tmp_path / "sst" / STORE,
        log_start=log.beginning_offset(CHANGELOG),
        log_end=log.end_offset(CHANGELOG),
    )
    assert attempt.refusals == () and attempt.result is not None
    with RocksDBStore(STORE, tmp_path / "sst" / STORE) as built:
        assert built.committed_offset(CHANGELOG) == log.end_offset(CHANGELOG) - 1
        assert _answers(VersionedKeyValueStore(built, HISTORY), until) == _answers(store, until)
