"""How far a store copy trails its changelog, as interactive queries report it (KIP-535).

Here, beside replay, because restoring active stores and standby replicas are
what make the lag; the engine hands it to queries
(:class:`~eddyline_runtime.engine.queryable.LocalStorePartition`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LagInfo:
    """How far a local store partition trails its changelog (KIP-535).

    ``current_offset_position`` is the next changelog offset the store would
    apply (its committed offset + 1), ``end_offset_position`` the changelog's
    end as last seen; an active, running task reports a lag of 0.
    """

    current_offset_position: int
    end_offset_position: int

    @property
    def offset_lag(self) -> int:
        return max(self.end_offset_position - self.current_offset_position, 0)
