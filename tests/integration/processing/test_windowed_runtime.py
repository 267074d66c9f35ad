"""A windowed count end to end: SQLite log, RocksDB window store, exactly-once.

Checks what the unit tests cannot: the window store's changelog gets its
``retention.ms`` (store retention + ``windowstore.changelog.additional.retention.ms``)
when the topology is laid out, stream threads ask the embedded log to apply it
after commits, late records are dropped and counted in the task metric
``dropped-records-total``, and a restart continues the committed windows.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import SessionWindows, StreamsBuilder, TimeWindows, Topology

MINUTE = 60_000
CHANGELOG = "app-clicks-per-minute-changelog"


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("clicks", 1)
    yield log
    log.close()


def clicks_per_minute() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("clicks", key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(TimeWindows.of_size_with_grace(MINUTE, 10_000))
        .count("clicks-per-minute")
        .to_stream()
        .map(lambda window, count: (str(window), str(count)))
        .to("counts", key_serde="string", value_serde="string")
    )
    return builder.build()


def config(tmp_path: Path, **settings: Any) -> StreamsConfig:
    return StreamsConfig.from_properties(
        {
            "application.id": "app",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": "exactly_once_v2",
            "statestore.cache.max.bytes": "0",
            **settings,
        }
    )


def run(log: SqliteLog, settings: StreamsConfig) -> StreamsInstance:
    instance = StreamsInstance(clicks_per_minute(), settings, log)
    instance.start()
    try:
        instance.wait_until_caught_up(60)
    finally:
        instance.close()
    return instance


def latest_counts(log: SqliteLog) -> dict[str, str]:
    tp = TopicPartition("counts", 0)
    records = log.fetch(tp, log.beginning_offset(tp), 1_000_000).records
    latest: dict[str, str] = {}
    for record in records:
        assert record.key is not None
        if record.value is None:  # a merged session's removal
            latest.pop(record.key.decode(), None)
        else:
            latest[record.key.decode()] = record.value.decode()
    return latest


def dropped(instance: StreamsInstance) -> float:
    return sum(
        value
        for name, value in instance.final_metrics.items()
        if (name.group, name.name) == ("stream-task-metrics", "dropped-records-total")
    )


def test_windowed_count_with_changelog_retention_and_late_records(
    log: SqliteLog, tmp_path: Path
) -> None:
    # Minutes aligned to the epoch, ten minutes ago: older than the changelog's
    # retention.ms of 70 s (window 60 s + grace 10 s, no additional retention).
    base = (time.time_ns() // 1_000_000 // MINUTE - 10) * MINUTE
    clicks = TopicPartition("clicks", 0)
    log.produce(
        clicks,
        [
            Record(b"u", b"c", base + 1_000),
            Record(b"u", b"c", base + 59_999),  # end exclusive: still the first minute
            Record(b"v", b"c", base + 3_000),
            Record(b"u", b"c", base + MINUTE),
            Record(b"w", b"c", base + 3 * MINUTE + 5_000),  # closes the first two minutes
            Record(b"u", b"c", base + 5_000),  # beyond grace: dropped
            Record(b"u", b"c", base + 2 * MINUTE + 1),  # late, but within grace of its minute
        ],
    )
    settings = config(
        tmp_path,
        **{
            "windowstore.changelog.additional.retention.ms": "0",
            "log.retention.check.interval.ms": "0",
        },
    )
    first = run(log, settings)

    def key(name: str, minute: int) -> str:
        return f"[{name}@{base + minute * MINUTE}/{base + (minute + 1) * MINUTE}]"

    assert latest_counts(log) == {
        key("u", 0): "2",
        key("v", 0): "1",
        key("u", 1): "1",
        key("w", 3): "1",
        key("u", 2): "1",
    }
    assert dropped(first) == 1
    assert log.topic_retention(CHANGELOG) == MINUTE + 10_000
    assert log.topics()[CHANGELOG].compacted
    # The changelog's records are ten minutes old: the commit's retention check deleted them.
    changelog = TopicPartition(CHANGELOG, 0)
    assert log.end_offset(changelog) > 0
    assert log.beginning_offset(changelog) == log.end_offset(changelog)

    # A restart on the same state continues the committed windows.
    log.produce(clicks, [Record(b"w", b"c", base + 3 * MINUTE + 30_000)])
    second = run(log, settings)
    assert latest_counts(log)[key("w", 3)] == "2"
    assert dropped(second) == 0


def test_the_default_additional_retention_keeps_a_day(log: SqliteLog, tmp_path: Path) -> None:
    now = time.time_ns() // 1_000_000
    log.produce(TopicPartition("clicks", 0), [Record(b"u", b"c", now)])
    run(log, config(tmp_path, **{"log.retention.check.interval.ms": "0"}))
    assert log.topic_retention(CHANGELOG) == MINUTE + 10_000 + 86_400_000
    assert log.beginning_offset(TopicPartition(CHANGELOG, 0)) == 0


def test_a_lost_window_store_is_restored_from_its_changelog(log: SqliteLog, tmp_path: Path) -> None:
    base = (time.time_ns() // 1_000_000 // MINUTE - 5) * MINUTE
    clicks = TopicPartition("clicks", 0)
    # Minute 0 expires from the store (retention 70 s, segments of 60 s) once minute 3 is
    # written: its segment is dropped, and the drop's deletes go to the changelog too.
    log.produce(clicks, [Record(b"u", b"c", base + t) for t in (1_000, 2_000, 190_000, 200_000)])
    settings = config(tmp_path)
    run(log, settings)
    changelog = TopicPartition(CHANGELOG, 0)
    tombstones = [r for r in log.fetch(changelog, 0).records if r.value is None]
    assert len(tombstones) == 1  # the window of minute 0
    shutil.rmtree(tmp_path / "state")  # the disk is gone
    log.produce(clicks, [Record(b"u", b"c", base + 210_000), Record(b"u", b"c", base + 3_000)])
    second = run(log, settings)
    window = f"[u@{base + 3 * MINUTE}/{base + 4 * MINUTE}]"
    assert latest_counts(log)[window] == "3"  # 2 restored + 1
    assert dropped(second) == 1  # minute 0 stays closed after the restore


def test_session_count_end_to_end(log: SqliteLog, tmp_path: Path) -> None:
    builder = StreamsBuilder()
    (
        builder.stream("clicks", key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(SessionWindows.of_inactivity_gap_with_grace(30 * MINUTE, 60 * MINUTE))
        .count("sessions")
        .to_stream()
        .map(lambda window, count: (str(window), None if count is None else str(count)))
        .to("counts", key_serde="string", value_serde="string")
    )
    base = (time.time_ns() // 1_000_000 // MINUTE - 120) * MINUTE
    log.produce(
        TopicPartition("clicks", 0),
        [
            Record(b"u", b"c", base),
            Record(b"u", b"c", base + 10 * MINUTE),
            Record(b"u", b"c", base + 70 * MINUTE),  # a new session: the gap passed
            Record(b"u", b"c", base + 5 * MINUTE),  # late, within grace and the first session
        ],
    )
    instance = StreamsInstance(builder.build(), config(tmp_path), log)
    instance.start()
    try:
        instance.wait_until_caught_up(60)
    finally:
        instance.close()
    first = f"[u@{base}/{base + 10 * MINUTE}]"
    second = f"[u@{base + 70 * MINUTE}/{base + 70 * MINUTE}]"
    assert latest_counts(log) == {first: "3", second: "1"}
    # Session retention is gap + grace; the changelog keeps a day more.
    assert log.topic_retention("app-sessions-changelog") == 90 * MINUTE + 86_400_000
