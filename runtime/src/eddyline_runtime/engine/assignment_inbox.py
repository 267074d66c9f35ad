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
# The longest a member given a task waits for its previous owner to release it before
# promoting its copy anyway (engine/task_release.py). A release costs the old owner one
# membership delivery (a ConfigMap watch event: well under a second) plus its final commit
# and closing the task (a flushed cache: a second at most on a loaded node), and the new
# owner's copy one more replay round. 5 s covers that with room on a busy node, and stays
# far inside a leaving pod's hand-over time (its termination grace period, 30 s by default)
# and short against the lag a task's inputs gather meanwhile: a release slower than that is
# a stuck owner, which the log's fencing handles as before.
RELEASE_WAIT_SECONDS = 5.0

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

    def reclaim(self, task_id: TaskId) -> None:
        """``task_id`` was fenced away: take it back shortly if it is still assigned here."""
        with self._lock:
            if task_id in self._taken[0]:
                self._reclaim_at = time.monotonic() + RECLAIM_FENCED_SECONDS
