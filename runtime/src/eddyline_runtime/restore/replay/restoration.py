"""Restoration: bring an active store up to its changelog's end, in batches.

A store that manages its offsets resumes after its committed changelog
offset, so after a crash only the tail is replayed (KIP-892); a store that
does not (in memory) replays from the changelog's start. Where replay starts,
and whether the store can be trusted at all, is decided once, in
:mod:`~eddyline_runtime.restore.replay.changelog_replay`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from eddyline_runtime.log import Log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.replay.changelog_replay import (
    DEFAULT_BATCH_RECORDS,
    ReplayStart,
    judge,
    mismatch_error,
    replay_batch,
)
from eddyline_runtime.state import StateStore


@dataclass(frozen=True, slots=True)
class RestoreResult:
    store: str
    changelog: TopicPartition
    first_offset: int
    end_offset: int
    records: int  # keyed records applied
    seconds: float

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("inf")


def restore(
    store: StateStore,
    log: Log,
    changelog: TopicPartition,
    *,
    batch_records: int = DEFAULT_BATCH_RECORDS,
    start: ReplayStart | None = None,
) -> RestoreResult:
    """Replay ``changelog`` into ``store`` from after its committed offset to the end.

    Raises :class:`~eddyline_runtime.restore.replay.ChangelogMismatchError` when the
    store does not fit the changelog (it committed past the end, or records
    after its offset are gone); nothing is applied then.
    """
    started = time.perf_counter()
    start = start or judge(store, log, changelog)
    if not start.trusted:
        raise mismatch_error(store.name, changelog, start)
    position, applied = start.first_offset, 0
    if (
        position < start.log_end
        and start.log_epoch is not None
        and store.changelog_epoch(changelog) == start.store_epoch
    ):
        # What it applies now was written in the epoch judged here (or one it continues):
        # a store left naming the earlier epoch it was built in, with an offset past that
        # epoch's end, would be judged REPLACED at its next open (docs/state.md, "Epochs").
        # A store whose epoch was recorded since it was judged (an active task's new
        # epoch, ``open_trusted``) keeps that one: it names what the task writes next.
        store.record_changelog_epoch(changelog, start.log_epoch)
    while position < start.log_end:
        records, next_position = replay_batch(
            store, log, changelog, position, max_records=batch_records
        )
        if next_position == position:
            break
        applied += records
        position = next_position
    return RestoreResult(
        store.name,
        changelog,
        start.first_offset,
        start.log_end,
        applied,
        time.perf_counter() - started,
    )
