"""Backfill: a store's state built from its input's history by the app's own task code
(``docs/backfill.md``). ``task_history`` runs one task partition's history through the
engine's StreamTask and writes the stores it ends with as SSTs in the restore layout;
``changelog_writer`` writes each built store partition's contents to its changelog;
``spark_job`` runs every task partition as one Spark task."""

from eddyline_runtime.backfill.changelog_writer import (
    ChangelogWrite,
    ChangelogWriteError,
    write_store_changelog,
)
from eddyline_runtime.backfill.task_history import (
    BackfillError,
    BackfillPlan,
    NotBackfillableError,
    TaskBackfill,
    backfill_layout,
    ensure_changelogs,
    run_task_history,
    write_manifests,
)

__all__ = [
    "BackfillError",
    "BackfillPlan",
    "ChangelogWrite",
    "ChangelogWriteError",
    "NotBackfillableError",
    "TaskBackfill",
    "backfill_layout",
    "ensure_changelogs",
    "run_task_history",
    "write_manifests",
    "write_store_changelog",
]
