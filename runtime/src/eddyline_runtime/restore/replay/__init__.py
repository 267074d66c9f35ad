"""Pod-side replay: the one rule for where changelog replay starts, and what follows it.

:func:`replay_start` (with its verdicts, :mod:`.changelog_replay`) decides,
:func:`replay_batch` applies one fetched batch, :func:`restore` brings an
active store up to date, :class:`StandbyTask` keeps a warm copy replaying, and
:class:`LagInfo` says how far a copy trails.
"""

from eddyline_runtime.restore.replay.changelog_replay import (
    DEFAULT_BATCH_RECORDS,
    ChangelogBehindStoreError,
    ChangelogGapError,
    ChangelogHeldError,
    ChangelogLossError,
    ChangelogMismatchError,
    ChangelogReplacedError,
    ForeignStoreError,
    ReplayStart,
    ReplayVerdict,
    judge,
    loses_records,
    mismatch_error,
    next_offset_after,
    open_trusted,
    replay_batch,
    replay_start,
)
from eddyline_runtime.restore.replay.lag import LagInfo
from eddyline_runtime.restore.replay.restoration import RestoreResult, restore
from eddyline_runtime.restore.replay.standby_task import StandbyTask

__all__ = [
    "DEFAULT_BATCH_RECORDS",
    "ChangelogBehindStoreError",
    "ChangelogGapError",
    "ChangelogHeldError",
    "ChangelogLossError",
    "ChangelogMismatchError",
    "ChangelogReplacedError",
    "ForeignStoreError",
    "LagInfo",
    "ReplayStart",
    "ReplayVerdict",
    "RestoreResult",
    "StandbyTask",
    "judge",
    "loses_records",
    "mismatch_error",
    "next_offset_after",
    "open_trusted",
    "replay_batch",
    "replay_start",
    "restore",
]
