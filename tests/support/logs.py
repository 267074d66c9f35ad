"""A real SQLite log whose standby replay can be paused, so tests can hold a standby behind,
and whose restorations can be held, so tests can look at a copy while it restores.

Standby replay paused: only fetches a standby's replay makes are held back (an
active task's restoration, which reads the same changelog through the same log,
is not). Restoration held: every other fetch waits until released. Which fetches
are a replay's is said explicitly: the ``pausable_standby_replay``
fixture wraps ``StandbyTask.replay`` so that, while it runs on a
:class:`PausableLog`, that log's fetches on this thread are marked as replay.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from eddyline_runtime.log import ChangeBatch, Log, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.replay.standby_task import StandbyTask


class PausableLog(SqliteLog):
    """A SqliteLog whose standby replay can be paused (restoration is never paused).

    Set ``standby_replay_paused`` to hold replay back; the test must use the
    ``pausable_standby_replay`` fixture, which marks the replay's fetches. Clear
    ``restoration_released`` to make restorations' fetches wait (``restoration_waiting``
    says one does) until it is set again; a test that clears it sets it before it ends.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.standby_replay_paused = threading.Event()
        self.restoration_released = threading.Event()
        self.restoration_released.set()
        self.restoration_waiting = threading.Event()
        self._replaying = threading.local()

    @contextlib.contextmanager
    def standby_replay(self) -> Iterator[None]:
        """Marks this thread's fetches, until the block ends, as a standby's replay."""
        self._replaying.active = True
        try:
            yield
        finally:
            self._replaying.active = False

    def fetch_changes(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> ChangeBatch:
        replaying = getattr(self._replaying, "active", False)
        if replaying and self.standby_replay_paused.is_set():
            return ChangeBatch([], -1)  # as if nothing had been fetched yet
        if not replaying and not self.restoration_released.is_set():
            self.restoration_waiting.set()
            self.restoration_released.wait(60)
        return super().fetch_changes(tp, offset, max_records)


@pytest.fixture(scope="session")
def pausable_standby_replay() -> Iterator[None]:
    """Standby replay on a :class:`PausableLog` runs inside its ``standby_replay()`` block.

    Every other log is replayed as before; a missing ``StandbyTask.replay`` fails
    here, by name, instead of silently never pausing.
    """
    replay = StandbyTask.replay

    def marked_replay(task: StandbyTask, log: Log) -> int:
        if isinstance(log, PausableLog):
            with log.standby_replay():
                return replay(task, log)
        return replay(task, log)

    with mock.patch.object(StandbyTask, "replay", marked_replay):
        yield
