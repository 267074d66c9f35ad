"""When a stream thread must commit because it holds too much uncommitted (KIP-892).

``statestore.uncommitted.max.bytes`` bounds the memory all uncommitted
transaction buffers may hold; each stream thread gets 1/``num.stream.threads``
of it (:attr:`UncommittedBytesBudget.share`, the one place that split is
made). What a thread holds is, per active task, its stores'
``approximate_num_uncommitted_bytes()`` plus the changelog and output records
kept for the next commit (``StreamTask.uncommitted_bytes``). The thread uses
its budget twice per processing iteration:

* before processing, it gives each task the room left under its share, and a
  task stops within one record of it;
* after processing, it reports what it holds (:meth:`~UncommittedBytesBudget.after_iteration`):
  at or over its share a commit is requested; below it, but likely to cross
  it during the next iteration (judged from the growth of recent
  iterations), the thread commits pre-emptively, so a large iteration does
  not overshoot the limit by a lot.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from eddyline_runtime.config import UNLIMITED, StreamsConfig
from eddyline_runtime.state.store import StateStore

# Weight of the newest iteration in the smoothed growth estimate: high enough
# to follow a change of pace within a few iterations.
_GROWTH_SMOOTHING = 0.3


class CommitReason(enum.StrEnum):
    LIMIT_EXCEEDED = "uncommitted bytes reached the thread's share"
    PREDICTED_TO_EXCEED = "the next iteration would likely cross the thread's share"


class UncommittedBytesBudget:
    """One stream thread's share of the uncommitted-bytes limit, from settings StreamsConfig
    has validated (the limit at least -1, at least one thread)."""

    def __init__(self, config: StreamsConfig) -> None:
        max_bytes = config.statestore_uncommitted_max_bytes
        self.share: int | None = (
            None if max_bytes == UNLIMITED else max_bytes // config.num_stream_threads
        )
        self._previous_bytes = 0
        self._expected_growth = 0.0

    @property
    def expected_growth(self) -> float:
        """Bytes the next iteration is expected to add (the larger of the last and the average)."""
        return self._expected_growth

    def after_iteration(self, uncommitted_bytes: int) -> CommitReason | None:
        """Record one iteration's outcome; say whether the thread should commit now."""
        growth = max(uncommitted_bytes - self._previous_bytes, 0)
        self._previous_bytes = uncommitted_bytes
        smoothed = (1 - _GROWTH_SMOOTHING) * self._expected_growth + _GROWTH_SMOOTHING * growth
        self._expected_growth = max(float(growth), smoothed)
        if self.share is None:
            return None
        if uncommitted_bytes >= self.share:
            return CommitReason.LIMIT_EXCEEDED
        if uncommitted_bytes + self._expected_growth > self.share:
            return CommitReason.PREDICTED_TO_EXCEED
        return None

    def committed(self) -> None:
        """The thread committed: its buffers are empty again."""
        self._previous_bytes = 0


def uncommitted_bytes(stores: Iterable[StateStore]) -> int:
    """What ``stores`` buffer uncommitted in total (a thread's measure adds its tasks'
    pending changelog and output records, ``StreamTask.uncommitted_bytes``)."""
    return sum(store.approximate_num_uncommitted_bytes() for store in stores)
