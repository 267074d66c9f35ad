"""How far a Spark restore build is, from its stages' task counts (no Spark import here).

A build is one Spark query: a first stage reads the changelog's offset ranges, one task
per range (:mod:`~eddyline_runtime.restore.spark.offset_ranges`), then shuffle stages
keep each key's latest version, sort, and write SST files. The driver sees only task
counts per stage (Spark's status tracker), so the read is reported in changelog offsets
as the share of read tasks finished times the offsets the build covers (ranges are
even, so this is within one range of the truth), and the rest in tasks done (with no
total: see :func:`build_progress`).
:func:`~eddyline_runtime.restore.spark.spark_build.build` polls the tracker and hands
each :class:`BuildProgress` to its ``on_progress``; ``eddyline restore build`` draws it
with :class:`~eddyline_runtime.progress.ProgressLine`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

READING: Final = "reading changelog"
WRITING: Final = "sorting and writing SST files"
STARTING: Final = "starting"
# The read's unit: changelog offsets (the label says which log), gaps of compaction included.
OFFSETS: Final = "offsets"


@dataclass(frozen=True, slots=True)
class StageCounts:
    """One Spark stage of the build's jobs: its id, its tasks, how many finished."""

    stage_id: int
    tasks: int
    completed: int


@dataclass(frozen=True, slots=True)
class BuildProgress:
    """``done`` of ``total`` ``unit`` in ``phase`` (``total`` None: not known)."""

    phase: str
    done: int
    total: int | None
    unit: str


def build_progress(stages: Iterable[StageCounts], offsets: int) -> BuildProgress:
    """The progress of a build covering ``offsets`` changelog offsets, given the stages
    its jobs have run so far (a stage that several jobs share may appear more than once).

    The read stage is the build's first (lowest id): Spark numbers stages as it
    submits them, and every later stage reads its shuffle output.
    """
    by_id = {stage.stage_id: stage for stage in stages}
    if not by_id:
        return BuildProgress(STARTING, 0, offsets, OFFSETS)
    read = by_id[min(by_id)]
    if read.completed < read.tasks:
        done = offsets * read.completed // read.tasks if read.tasks else 0
        return BuildProgress(READING, done, offsets, OFFSETS)
    rest = [stage for stage_id, stage in by_id.items() if stage_id != read.stage_id]
    # No total: Spark lists stages it will skip (adaptive execution plans each shuffle
    # as a job of its own, and a later job lists the finished shuffle again under a new
    # id) with their tasks, and the tracker cannot tell skipped from pending; a total
    # with them would never be reached.
    return BuildProgress(WRITING, sum(min(s.completed, s.tasks) for s in rest), None, "tasks")
