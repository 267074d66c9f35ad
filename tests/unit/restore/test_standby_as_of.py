"""A standby closed cleanly keeps the time it last had its whole changelog, and after a
restart reports it while it replays what came since (state/as_of_marker.py), instead of
not knowing its staleness until it catches up."""

from __future__ import annotations

from pathlib import Path

from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.restore.replay import StandbyTask, open_trusted
from eddyline_runtime.restore.replay.lag import wall_clock_ms
from eddyline_runtime.state import RocksDBStore, store_directory

CHANGELOG = TopicPartition("app-counts-changelog", 0)
TASK = TaskId(1, 0)


def records(first: int, count: int) -> list[Record]:
    return [Record(b"k%d" % i, b"v", i) for i in range(first, first + count)]


def standby(log: SqliteLog, directory: Path) -> StandbyTask:
    store, _ = open_trusted(
        lambda: RocksDBStore("counts", directory),
        log,
        CHANGELOG,
        copy=f"standby of task {TASK}",
        state_dir=directory.parent,
    )
    task = StandbyTask(TASK, {"counts": store}, {"counts": CHANGELOG})
    task.start(log)
    return task


def test_a_standby_reopened_behind_reports_when_it_last_had_everything(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 1, compacted=True)
    directory = store_directory(tmp_path / "state", TASK, "counts")
    log.produce(CHANGELOG, records(0, 10))
    first = standby(log, directory)
    first.replay(log)
    caught_up = first.lag("counts").caught_up_at_ms
    assert caught_up is not None
    first.close()
    # The active wrote on while this member restarted.
    log.produce(CHANGELOG, records(10, 5))
    second = standby(log, directory)
    lag = second.lag("counts")
    assert (lag.offset_lag, lag.caught_up_at_ms) == (5, caught_up)
    # Caught up again, the copy is as current as its latest read of the end.
    before = wall_clock_ms()
    second.replay(log)
    assert second.lag("counts").offset_lag == 0
    latest = second.lag("counts").caught_up_at_ms
    assert latest is not None and latest >= before
    second.close()
    log.close()


def test_a_standby_that_never_caught_up_keeps_no_time(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 1, compacted=True)
    directory = store_directory(tmp_path / "state", TASK, "counts")
    log.produce(CHANGELOG, records(0, 10))
    first = standby(log, directory)  # opened behind, closed before any replay
    assert first.lag("counts").caught_up_at_ms is None
    first.close()
    second = standby(log, directory)
    assert second.lag("counts").caught_up_at_ms is None
    second.close()
    log.close()
