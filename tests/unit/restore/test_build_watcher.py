"""The restore build's progress watcher against a stand-in for Spark's context: the
reports it gives, and that progress never fails a build (no JVM here)."""

from __future__ import annotations

import threading
from collections import namedtuple
from typing import Any, cast

import pytest
from pyspark.sql import SparkSession

from eddyline_runtime.restore.build_progress import StageCounts
from eddyline_runtime.restore.spark import spark_build

# The fields PySpark's SparkJobInfo and SparkStageInfo have (pyspark/core/status.py).
JobInfo = namedtuple("JobInfo", "jobId stageIds status")
StageInfo = namedtuple(
    "StageInfo",
    "stageId currentAttemptId name numTasks numActiveTasks numCompletedTasks numFailedTasks",
)


class Tracker:
    def __init__(self, context: Context) -> None:
        self.context = context

    def getJobIdsForGroup(self, group: str) -> list[int]:  # noqa: N802 - Spark's name
        if self.context.broken:
            raise RuntimeError("py4j: the gateway went away")
        # By name, as Spark's status store answers: the group need not be set any more.
        return [7] if group in self.context.groups else []

    def getJobInfo(self, job: int) -> JobInfo:  # noqa: N802
        return JobInfo(job, [1, 2], "SUCCEEDED")

    def getStageInfo(self, stage: int) -> StageInfo:  # noqa: N802
        return StageInfo(stage, 0, "save", 4, 0, 4, 0)


class Context:
    def __init__(self, *, broken: bool = False) -> None:
        self.broken = broken
        self.group: str | None = None
        self.groups: list[str] = []

    def statusTracker(self) -> Tracker:  # noqa: N802
        return Tracker(self)

    def setJobGroup(self, group: str, description: str) -> None:  # noqa: N802
        self.group = group
        self.groups.append(group)

    def setLocalProperty(self, key: str, value: str | None) -> None:  # noqa: N802
        assert key == "spark.jobGroup.id"
        self.group = value


class Session:
    def __init__(self, context: Context) -> None:
        self.sparkContext = context


@pytest.fixture(autouse=True)
def watch_often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark_build, "_WATCH_SECONDS", 0.001)


def test_the_watcher_reports_nothing_first_and_the_finished_stages_last() -> None:
    context = Context()
    reports: list[list[StageCounts]] = []
    ran_in_group: list[str | None] = []
    spark_build.run_watched(
        cast(SparkSession, Session(context)),
        lambda: ran_in_group.append(context.group),
        reports.append,
    )
    assert ran_in_group[0] is not None  # the build ran in a group of its own
    assert context.group is None  # and the group is unset after it
    assert reports[0] == []
    assert reports[-1] == [StageCounts(1, 4, 4), StageCounts(2, 4, 4)]


def test_a_tracker_or_a_report_that_fails_never_fails_the_build() -> None:
    ran = threading.Event()

    def failing_report(stages: Any) -> None:
        raise OSError("the terminal went away")

    spark_build.run_watched(cast(SparkSession, Session(Context())), ran.set, failing_report)
    assert ran.is_set()
    reports: list[list[StageCounts]] = []
    spark_build.run_watched(
        cast(SparkSession, Session(Context(broken=True))), ran.set, reports.append
    )
    assert reports == [[]]  # the first report, then the broken tracker ended the watch
