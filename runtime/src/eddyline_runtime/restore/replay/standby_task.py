"""A standby task: a warm copy of another member's task state (KIP-535's standby replicas).

It opens the task's stores on this member and keeps replaying their
changelogs (``read_committed``: the log only ever returns committed records),
in batches through ``restore_batch``, so each store commits its data with the
offset of the last record it includes, like a restoring active store. It
never writes to the log. When the active member is lost, the assignor makes
this member active for the task, and restoration then replays only the tail
this copy has not applied yet.

Each batch's offset is committed with the changelog epoch in force for the
whole read of its records (``replay_stamped_batch``; docs/state.md, "Epochs"),
and the copy is judged by its store's own epoch: the one rule that lets its
promotion tell a new writer's records from a changelog that lost some.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from eddyline_runtime.log import Log
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.restore.replay.changelog_replay import (
    judge,
    mismatch_error,
    recorded_epoch_end,
    replay_stamped_batch,
    replay_start,
)
from eddyline_runtime.restore.replay.lag import LagInfo, wall_clock_ms
from eddyline_runtime.state import StateStore

# Records per changelog fetch: one WriteBatch each.
_REPLAY_BATCH = 10_000


class StandbyTask:
    def __init__(
        self,
        task_id: TaskId,
        stores: Mapping[str, StateStore],
        changelogs: Mapping[str, TopicPartition],
    ) -> None:
        self.id = task_id
        self.stores = dict(stores)
        self.changelogs = dict(changelogs)
        # Next changelog offset to apply per store: a store that manages its
        # offsets resumes after its committed one; an in-memory store starts over.
        self._positions: dict[str, int] = {}
        self._end_offsets: dict[str, int] = {}
        # The epoch each copy's applied records are named by: the store's own (what it
        # commits with its offset), or the changelog's for a store that keeps none.
        self._epochs: dict[str, str | None] = {}
        # When each store was last seen to have applied its changelog up to the end read
        # then (LagInfo.caught_up_at_ms): the time is taken *before* the end is read, so
        # every commit the store includes was made by then.
        self._caught_up_at: dict[str, int] = {}
        self.replayed = 0

    def start(self, log: Log) -> None:
        for name, tp in self.changelogs.items():
            read_at = wall_clock_ms()
            start = judge(self.stores[name], log, tp)
            if not start.trusted:
                # Never serve such a copy as "caught up" (restoration refuses it too).
                raise mismatch_error(name, tp, start, copy=f"standby of task {self.id}")
            self._positions[name] = start.first_offset
            self._end_offsets[name] = start.log_end
            # What the store recorded (open_trusted: the changelog's epoch when it opened),
            # never the changelog's now: a writer may have begun an epoch since, and a copy
            # judged by that one while it commits the earlier would never stamp the new one
            # (its offsets past the earlier epoch's end are then judged a loss).
            recorded = self.stores[name].changelog_epoch(tp)
            self._epochs[name] = start.log_epoch if recorded is None else recorded
            as_of = self.stores[name].recorded_as_of_ms
            if start.first_offset >= start.log_end:
                self._caught_up_at[name] = read_at
            elif as_of is not None:
                # Behind, but as current as when it was last closed cleanly (its data only
                # grows from there): state/as_of_marker.py.
                self._caught_up_at[name] = as_of

    def replay(self, log: Log) -> int:
        """Apply what each changelog gained since the last call; returns records applied.

        Raises :class:`~eddyline_runtime.restore.replay.ChangelogMismatchError` when a
        changelog moved behind what this copy applied, or became another
        incarnation (truncated or recreated): the copy must be rebuilt.
        """
        applied = 0
        for name, tp in self.changelogs.items():
            position = self._positions[name]
            read_at = wall_clock_ms()
            end = log.end_offset(tp)
            self._end_offsets[name] = end
            if position == end:
                self._caught_up_at[name] = read_at
                continue  # nothing new (the epoch is only asked when there is)
            # The copy has applied everything before ``position``: judge that as a
            # committed offset, with the epoch its records are named by, by the one rule.
            recorded = self._epochs[name]
            # Past the end the copy is AHEAD whatever the epoch (judged as such, not asked).
            epoch = log.partition_epoch(tp) if position < end else recorded
            start = replay_start(
                position - 1,
                log.beginning_offset(tp),
                end,
                store_epoch=recorded,
                log_epoch=epoch,
                # A new writer (the active moved or restarted) began an epoch: the copy
                # stays trusted if that began after what it applied (KIP-101).
                store_epoch_end=recorded_epoch_end(
                    recorded, epoch, partial(log.epoch_end_offset, tp)
                ),
            )
            if not start.trusted:
                raise mismatch_error(name, tp, start, copy=f"standby of task {self.id}")
            # Committed with ``epoch`` only if no epoch began while the batch was read.
            batch = replay_stamped_batch(
                self.stores[name], log, tp, position, epoch=epoch, max_records=_REPLAY_BATCH
            )
            if batch.epoch_began:
                continue  # judged again, against the epoch then, at the next call
            records, self._positions[name] = batch.records, batch.next_position
            if batch.next_position == position:
                # Nothing came though the end read above lies ahead. On Kafka a commit's
                # marker (or aborted records) takes an offset but is never delivered, and
                # the fetch that found only that has told the log where committed data
                # ends: ask again, or the copy reports a lag of 1 after every commit until
                # its next replay (one round trip, once per commit read).
                read_at = wall_clock_ms()
                end = self._end_offsets[name] = log.end_offset(tp)
            elif epoch is not None:
                self._epochs[name] = epoch
            if self._positions[name] >= end:
                self._caught_up_at[name] = read_at
            applied += records
        self.replayed += applied
        return applied

    def lag(self, store: str) -> LagInfo:
        return LagInfo(
            self._positions.get(store, 0),
            self._end_offsets.get(store, 0),
            self._caught_up_at.get(store),
        )

    def close(self) -> None:
        for name, store in self.stores.items():
            store.note_as_of(self._caught_up_at.get(name))
            store.close()
