"""A real SQLite log whose standby replay can be paused, so tests can hold a standby behind.

Only fetches made on behalf of :meth:`StandbyTask.replay` are paused (an
active task's restoration never is): the fetch looks a few frames up its
call stack for that method.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import FrameType

from eddyline_runtime.log import ChangeBatch, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.replay.standby_task import StandbyTask

# StandbyTask.replay -> restore.replay_batch -> Log.fetch_changes
_FRAMES_TO_LOOK_UP = 3


def _called_from_standby_replay() -> bool:
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_FRAMES_TO_LOOK_UP):
        if frame is None:
            return False
        if frame.f_code is StandbyTask.replay.__code__:
            return True
        frame = frame.f_back
    return False


class PausableLog(SqliteLog):
    """A SqliteLog whose standby replay can be paused (restoration is never paused)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.standby_replay_paused = threading.Event()

    def fetch_changes(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> ChangeBatch:
        if self.standby_replay_paused.is_set() and _called_from_standby_replay():
            return ChangeBatch([], -1)  # as if nothing had been fetched yet
        return super().fetch_changes(tp, offset, max_records)
