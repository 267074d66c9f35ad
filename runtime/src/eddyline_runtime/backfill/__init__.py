"""Backfill: a store's state built from its input's history by the app's own task code
(``docs/backfill.md``). ``task_history`` runs one task partition's history through the
engine's StreamTask and writes the stores it ends with as SSTs in the restore layout;
``spark_job`` runs every task partition as one Spark task."""

from eddyline_runtime.backfill.task_history import (
    BackfillError,
    BackfillPlan,
    NotBackfillableError,
    TaskBackfill,
    backfill_layout,
    run_task_history,
    write_manifests,
)

__all__ = [
    "BackfillError",
    "BackfillPlan",
    "NotBackfillableError",
    "TaskBackfill",
    "backfill_layout",
    "run_task_history",
    "write_manifests",
]
