"""How far a store copy trails its changelog, as interactive queries report it (KIP-535).

Here, beside replay, because restoring active stores and standby replicas are
what make the lag; the engine hands it to queries
(:class:`~eddyline_runtime.engine.queryable.LocalStorePartition`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def wall_clock_ms() -> int:
    """The wall-clock time in ms since the epoch: what ``caught_up_at_ms`` and a query's
    staleness are measured in (one process's clock on both sides, so no clock skew)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class LagInfo:
    """How far a local store partition trails its changelog (KIP-535).

    ``current_offset_position`` is the next changelog offset the store would
    apply (its committed offset + 1), ``end_offset_position`` the changelog's
    end as last seen; an active, running task reports a lag of 0.

    ``caught_up_at_ms`` is the same lag in time (KIP-535's time lag): the
    wall-clock time of the last changelog end this copy was seen to have applied
    everything up to, so its data then included every write its task had
    committed. Before a copy first catches up after it opened (restoring, or
    replaying a backlog) it is the time the copy was last known complete when it
    was closed cleanly (state/as_of_marker.py), else None. A running active copy's
    is the time of its last commit. Not part of equality: two reads of the same
    offsets are the same lag.
    """

    current_offset_position: int
    end_offset_position: int
    caught_up_at_ms: int | None = field(default=None, compare=False)

    @property
    def offset_lag(self) -> int:
        return max(self.end_offset_position - self.current_offset_position, 0)
