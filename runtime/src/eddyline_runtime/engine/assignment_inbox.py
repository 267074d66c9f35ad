"""The assignment a stream thread should run, handed to it between two iterations.

Another thread (the instance applying a new membership) posts an assignment;
the stream thread takes it at the top of its loop. One more rule lives here:
a task fenced away from this member while still assigned to it is taken back
shortly after (:meth:`AssignmentInbox.reclaim`). The fencing member may act
on an older membership (a pod that started before the newest generation
reached it); dropping the task for good would leave it with no active member
while the assignment lasts. Taking it back fences that member in turn; if it
is this member's assignment that is old, the newer one arrives within the
delay and moves the task away, so the two never keep fencing each other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection

from eddyline_runtime.partitions import TaskId

# Longer than a membership update takes to arrive, so an old assignment is replaced first.
RECLAIM_FENCED_SECONDS = 1.0
# How long a member given a task lets its copy catch up once the previous owner let the task
# go (released it, became unreachable, or left the membership) before promoting the copy
# anyway (engine/task_release.py). The copy needs one more replay round, and on Kafka the
# old owner's final commit's markers to land: well under a second, so 5 s has room on a busy
# node and is short against the lag a task's inputs gather while nobody runs it.
RELEASE_WAIT_SECONDS = 5.0
# The longest a member waits for a previous owner that still answers and reports the task as
# running. That owner is still processing it (its output keeps flowing), so waiting stalls
# nothing; but a release can take longer than RELEASE_WAIT_SECONDS on a loaded node (the
# membership delivery, a flushed cache, its final commit: issue 38's soak saw it). The bound
# is for a stuck owner and stays inside a leaving pod's hand-over time (its termination grace
# period, 30 s by default); past it the log's fencing takes the task from it as before.
RELEASE_HOLD_LIMIT_SECONDS = 25.0

TaskSets = tuple[frozenset[TaskId], frozenset[TaskId]]  # (active, standby)


class AssignmentInbox:
    def __init__(self, active: Collection[TaskId], standby: Collection[TaskId]) -> None:
        self._lock = threading.Lock()
        self._pending: TaskSets | None = (frozenset(active), frozenset(standby))
        # The assignment last taken, and when to take it again after a fence.
        self._taken: TaskSets = self._pending
        self._reclaim_at: float | None = None

    def post(self, active: Collection[TaskId], standby: Collection[TaskId]) -> None:
        """Run these tasks from the thread's next iteration on (a rebalance)."""
        with self._lock:
            self._pending = (frozenset(active), frozenset(standby))

    def take(self) -> TaskSets | None:
        """The assignment to apply now: a posted one, or the last one again once a fenced
        task of it is due to be taken back; None when nothing changed."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None and self._reclaim_at is not None:
                if time.monotonic() < self._reclaim_at:
                    return None
                pending = self._taken  # take back what is still ours
            if pending is None:
                return None
            self._taken, self._reclaim_at = pending, None
            return pending

    def standby_assigned(self, task_id: TaskId) -> bool:
        """``task_id`` is a standby of the assignment posted, or of the one the thread took
        last (it may still be applying it: creating the active tasks comes first)."""
        with self._lock:
            return task_id in (self._pending or self._taken)[1]

    @property
    def waiting(self) -> bool:
        """An assignment is posted, or a fenced task is to be taken back: the thread does
        not yet run everything it will."""
        with self._lock:
            return self._pending is not None or self._reclaim_at is not None

    def reclaim(self, task_id: TaskId) -> None:
        """``task_id`` was fenced away: take it back shortly if it is still assigned here."""
        with self._lock:
            if task_id in self._taken[0]:
                self._reclaim_at = time.monotonic() + RECLAIM_FENCED_SECONDS
