"""Restore: bringing state stores up to their changelogs.

It sits between the processing engine and the stores and log it reads:
``processing`` > ``restore`` > ``state`` | ``log``. It owns the one rule for
where changelog replay starts (:func:`replay_start`, with its verdicts), the
batched replay step, and active restoration; standby tasks and lag reports
use the same rule. It never imports the processing engine, so restore jobs
that run outside an instance can use it.

Spark restore builds live in :mod:`eddyline_runtime.restore.spark_build` and
the modules it imports (the only ones that import ``pyspark``, never imported
from here); ingesting what they built is :mod:`eddyline_runtime.restore.sst_restore`,
which needs no Spark.
"""

from eddyline_runtime.restore.changelog_replay import (
    DEFAULT_BATCH_RECORDS,
    ChangelogBehindStoreError,
    ChangelogGapError,
    ChangelogMismatchError,
    ChangelogReplacedError,
    ForeignStoreError,
    ReplayStart,
    ReplayVerdict,
    judge,
    mismatch_error,
    next_offset_after,
    open_trusted,
    replay_batch,
    replay_start,
)
from eddyline_runtime.restore.restoration import RestoreResult, restore

__all__ = [
    "DEFAULT_BATCH_RECORDS",
    "ChangelogBehindStoreError",
    "ChangelogGapError",
    "ChangelogMismatchError",
    "ChangelogReplacedError",
    "ForeignStoreError",
    "ReplayStart",
    "ReplayVerdict",
    "RestoreResult",
    "judge",
    "mismatch_error",
    "next_offset_after",
    "open_trusted",
    "replay_batch",
    "replay_start",
    "restore",
]
