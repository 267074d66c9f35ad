"""A Spark restore build's progress from its stages' task counts (no Spark needed)."""

from __future__ import annotations

from eddyline_runtime.restore.build_progress import (
    READING,
    STARTING,
    WRITING,
    BuildProgress,
    StageCounts,
    build_progress,
)

OFFSETS = 12_000  # e.g. 3 partitions of 4,000, read in 8 ranges


def test_before_any_stage_the_build_is_starting_with_its_offsets_as_the_total() -> None:
    assert build_progress([], OFFSETS) == BuildProgress(STARTING, 0, OFFSETS, "offsets")


def test_the_read_is_the_share_of_read_tasks_done_times_the_offsets() -> None:
    stages = [StageCounts(stage_id=4, tasks=8, completed=2)]
    assert build_progress(stages, OFFSETS) == BuildProgress(READING, 3_000, OFFSETS, "offsets")


def test_the_read_stage_is_the_first_one_whatever_order_spark_lists_them_in() -> None:
    # Later stages may already be listed (planned, not started) while the read runs.
    stages = [StageCounts(6, 4, 0), StageCounts(5, 4, 0), StageCounts(4, 8, 6)]
    assert build_progress(stages, OFFSETS).phase == READING
    assert build_progress(stages, OFFSETS).done == 9_000


def test_after_the_read_the_write_counts_the_other_stages_tasks_done_with_no_total() -> None:
    # Stage 4 appears twice (two jobs list it); stage 7 is a finished shuffle listed again
    # by a later job, to be skipped: its 8 tasks never run, so they make no total.
    stages = [
        StageCounts(4, 8, 8),
        StageCounts(5, 4, 4),
        StageCounts(4, 8, 8),
        StageCounts(6, 4, 1),
        StageCounts(7, 8, 0),
    ]
    assert build_progress(stages, OFFSETS) == BuildProgress(WRITING, 5, None, "tasks")


def test_an_empty_changelog_reads_nothing_and_divides_by_nothing() -> None:
    assert build_progress([StageCounts(0, 0, 0)], 0).phase == WRITING
    assert build_progress([StageCounts(0, 1, 0)], 0) == BuildProgress(READING, 0, 0, "offsets")
