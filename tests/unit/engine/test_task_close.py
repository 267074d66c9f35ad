"""What a task's stores keep, when it closes, of how current their data was.

The time goes into the store's ``.as-of`` marker (state/as_of_marker.py), and the copy's next
open reports it as its staleness until it catches up again: it must be the time the data
really included every committed write, never a later one.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from eddyline_runtime.engine.partition_group import PartitionGroup
from eddyline_runtime.engine.task import StreamTask
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.restore.replay.lag import LagInfo
from eddyline_runtime.state import store_directory
from tests.support.stores import StoreFactory

CHANGELOG = TopicPartition("app-counts-changelog", 0)
TASK = TaskId(0, 0)
RECORDED_MS = 1_000  # a clean close's time, kept from the store's previous run
STANDBY_CAUGHT_UP_MS = 2_000  # the standby's last time at its changelog's end


class ClosableTopology:
    def close(self) -> None:
        pass


def open_task(store_factory: StoreFactory, directory: Path) -> StreamTask:
    task_store = TaskStore(
        store_factory(directory=directory), changelog=CHANGELOG, cache=None, cache_name="counts"
    )
    return StreamTask(
        TASK,
        topology=cast(TaskTopology, ClosableTopology()),
        stores={"counts": task_store},
        partitions=PartitionGroup(
            [], max_task_idle_ms=0, current_lag=lambda tp: None, clock_ms=lambda: 0
        ),
        logical_topics={},
    )


@pytest.fixture
def directory(store_factory: StoreFactory, tmp_path: Path) -> Path:
    """A store with committed data, closed cleanly at RECORDED_MS."""
    path = store_directory(tmp_path / "copy", TASK, "counts")
    store = store_factory(directory=path)
    store.put(b"k", b"v")
    store.commit({CHANGELOG: 7})
    store.note_as_of(RECORDED_MS)
    store.close()
    return path


def reopened_as_of(store_factory: StoreFactory, directory: Path) -> int | None:
    store = store_factory(directory=directory)
    try:
        return store.recorded_as_of_ms
    finally:
        store.close()


def test_a_task_closed_mid_restore_keeps_its_restores_time_not_the_stores_older_one(
    store_factory: StoreFactory, directory: Path
) -> None:
    # A standby promoted in place restores its tail; it knew it had everything at
    # STANDBY_CAUGHT_UP_MS, later than what its store recorded. Closed before the restore
    # ends (no commit yet), the task keeps that later time for the next open.
    task = open_task(store_factory, directory)
    task.restoring("counts", LagInfo(8, 12, caught_up_at_ms=STANDBY_CAUGHT_UP_MS))
    task.close()
    assert reopened_as_of(store_factory, directory) == STANDBY_CAUGHT_UP_MS


def test_a_task_closed_mid_restore_without_a_known_time_keeps_what_its_store_recorded(
    store_factory: StoreFactory, directory: Path
) -> None:
    task = open_task(store_factory, directory)
    task.restoring("counts", LagInfo(8, 12))
    task.close()
    assert reopened_as_of(store_factory, directory) == RECORDED_MS


def test_a_started_task_keeps_the_time_of_its_last_commit(
    store_factory: StoreFactory, directory: Path
) -> None:
    task = open_task(store_factory, directory)
    task.start({})
    started = task.committed_at_ms
    assert started is not None and started > STANDBY_CAUGHT_UP_MS
    task.close()
    assert reopened_as_of(store_factory, directory) == started
