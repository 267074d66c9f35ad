"""Topic retention on the embedded log: ``retention.ms`` (cleanup ``compact,delete``).

The embedded log deletes only in ``enforce_retention(now_ms)``, so each case
below is a function of the timestamps and ``now_ms`` it gives.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eddyline_runtime.log import InvalidTopicError, Record, SqliteLog
from eddyline_runtime.log.port import Log
from eddyline_runtime.partitions import TopicPartition

CHANGELOG = TopicPartition("app-windows-changelog", 0)


@pytest.fixture
def log(tmp_path: Path) -> SqliteLog:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 2, compacted=True)
    return log


def offsets(log: SqliteLog, tp: TopicPartition = CHANGELOG) -> list[int]:
    return [r.offset for r in log.fetch(tp, log.beginning_offset(tp)).records]


def test_records_older_than_retention_are_deleted_from_the_start(log: SqliteLog) -> None:
    log.produce(CHANGELOG, [Record(b"k%d" % t, b"v", t) for t in (100, 200, 300, 400)])
    log.set_topic_retention(CHANGELOG.topic, 1000)
    assert log.topic_retention(CHANGELOG.topic) == 1000
    # now 1200: records with timestamp < 200 go; 200 itself is not older than the cutoff.
    assert log.enforce_retention(1200) == 1
    assert log.beginning_offset(CHANGELOG) == 1
    assert offsets(log) == [1, 2, 3]
    assert log.enforce_retention(1200) == 0
    assert log.enforce_retention(1_000_000) == 3
    assert log.beginning_offset(CHANGELOG) == log.end_offset(CHANGELOG) == 4
    # Offsets keep counting from the end.
    assert log.produce(CHANGELOG, [Record(b"k", b"v", 1_000_000)]) == [4]


def test_a_newer_record_holds_back_older_ones_behind_it(log: SqliteLog) -> None:
    log.produce(CHANGELOG, [Record(b"a", b"v", t) for t in (100, 5000, 150, 160)])
    log.set_topic_retention(CHANGELOG.topic, 1000)
    assert log.enforce_retention(2000) == 1
    assert offsets(log) == [1, 2, 3]


def test_retention_across_batches_and_partitions(log: SqliteLog) -> None:
    other = TopicPartition(CHANGELOG.topic, 1)
    log.produce(CHANGELOG, [Record(b"k", b"v", t) for t in range(3000)])
    log.produce(other, [Record(b"k", b"v", 10)])
    log.set_topic_retention(CHANGELOG.topic, 500)
    # cutoff 2050 - 500 = 1550: timestamps 0..1549 go, crossing 1,024-record batches.
    assert log.enforce_retention(2050) == 1550 + 1
    assert log.beginning_offset(CHANGELOG) == 1550
    assert offsets(log)[:2] == [1550, 1551]
    assert log.beginning_offset(other) == 1 == log.end_offset(other)


def test_no_retention_keeps_everything_and_none_clears_it(log: SqliteLog) -> None:
    log.create_topic("app-input", 1)
    log.produce(TopicPartition("app-input", 0), [Record(b"k", b"v", 1)])
    log.produce(CHANGELOG, [Record(b"k", b"v", 1)])
    assert log.topic_retention("app-input") is None
    log.set_topic_retention(CHANGELOG.topic, 10)
    log.set_topic_retention(CHANGELOG.topic, None)
    assert log.enforce_retention(10**12) == 0
    assert log.beginning_offset(TopicPartition("app-input", 0)) == 0


def test_retention_survives_reopen_and_bad_values_are_refused(
    log: SqliteLog, tmp_path: Path
) -> None:
    log.set_topic_retention(CHANGELOG.topic, 1000)
    with pytest.raises(InvalidTopicError, match=r"retention\.ms"):
        log.set_topic_retention(CHANGELOG.topic, -1)
    log.close()
    assert SqliteLog(tmp_path / "log.db").topic_retention(CHANGELOG.topic) == 1000


def test_compaction_and_retention_together(log: SqliteLog) -> None:
    log.produce(
        CHANGELOG, [Record(b"a", b"1", 100), Record(b"b", b"1", 200), Record(b"a", b"2", 900)]
    )
    log.set_topic_retention(CHANGELOG.topic, 500)
    assert log.compact(CHANGELOG.topic) == 1
    # cutoff 1000 - 500 = 500: b@200 goes; a@900 stays.
    assert log.enforce_retention(1000) == 1
    assert log.beginning_offset(CHANGELOG) == 2
    assert [(r.key, r.value) for r in log.fetch(CHANGELOG, 2).records] == [(b"a", b"2")]


def test_the_port_default_keeps_records_and_says_so(
    log: SqliteLog, caplog: pytest.LogCaptureFixture
) -> None:
    # A log adapter without retention support: the port's defaults.
    caplog.set_level(logging.WARNING)
    Log.set_topic_retention(log, CHANGELOG.topic, 1000)
    assert "does not apply topic retention" in caplog.text
    assert Log.topic_retention(log, CHANGELOG.topic) is None
    assert Log.enforce_retention(log, 10**12) == 0
