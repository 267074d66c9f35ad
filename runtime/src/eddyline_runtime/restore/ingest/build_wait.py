"""Tasks that wait for a Spark restore build (``restorePending``), and what tells them to stop.

On a cluster the operator launches a Spark restore build as a Kubernetes Job
when a pod reports a missing store whose changelog is long
(``restorePending``); the pod waits for a manifest that fits instead of
replaying record by record. Two things cross between them, both as files
under the build output directory the Job and the pods share:

* the manifests the build writes (:mod:`~eddyline_runtime.restore.manifest`);
* a **job result** per Job attempt (:mod:`~eddyline_runtime.restore.job_result`),
  written by ``eddyline restore job`` when the driver ended, successfully or
  not. A waiting task that sees a failed result for its partition, written
  after it began to wait, stops waiting and replays the changelog. A Job pod
  killed before it could write one is covered by the task's deadline.

An active task waits in :func:`wait_for_build` (it cannot run without its
store); a standby or warm-up replica polls a :class:`BuildWatch` once per
turn of its thread's loop, so the member's active tasks run on meanwhile.

This module is the waiting side; the Job itself is
:mod:`~eddyline_runtime.restore.spark.job_runner`. Nothing here imports Spark
or Kubernetes.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.ingest.sst_restore import IngestResult, ingest_latest_manifest
from eddyline_runtime.restore.job_result import JobState, job_results
from eddyline_runtime.restore.manifest import manifests_for

# How often a waiting task looks for a manifest or a failed Job: a build takes tens of
# seconds at least (the JVM alone starts in 10-25 s), so a quarter second adds nothing.
POLL_SECONDS: Final = 0.25


class WaitOutcome(enum.StrEnum):
    INGESTED = "ingested"  # a manifest fitted: the store exists, replay only the tail
    JOB_FAILED = "job-failed"  # a Job reported failure for this partition: replay everything
    DEADLINE = "deadline"  # no fitting manifest in time: replay everything
    STOPPED = "stopped"  # the instance is shutting down


@dataclass(frozen=True, slots=True)
class PendingRestore:
    """A task's store that waits for a Spark build (``restorePending`` in lags and layout)."""

    store: str
    changelog: TopicPartition
    log_start: int
    log_end: int
    since: float  # Unix time the wait began
    deadline: float  # Unix time it gives up and replays

    @property
    def records(self) -> int:
        """Changelog offsets a full replay would read."""
        return max(self.log_end - self.log_start, 0)


@dataclass(frozen=True, slots=True)
class WaitResult:
    outcome: WaitOutcome
    ingested: IngestResult | None
    refusals: Sequence[str]
    seconds: float
    message: str


def should_wait(threshold: int, log_start: int, log_end: int) -> bool:
    """Whether a missing store with this changelog waits for a build (threshold -1: never)."""
    return threshold >= 0 and log_end - log_start > threshold


class BuildWatch:
    """One missing store's look-outs for a Spark build, one poll at a time, never blocking.

    :func:`wait_for_build` polls it in a loop (an active task, which cannot
    run without its store); a standby or warm-up replica polls it once per
    turn of its thread's loop, so the member's active tasks keep processing
    while the copy waits (``engine/store_opener.py``).
    """

    def __init__(
        self,
        output: Path,
        pending: PendingRestore,
        *,
        application: str,
        directory: Path,
        changelog_epoch: str | None,
        bounds: Callable[[], tuple[int, int]],
        epoch_end_offset: Callable[[str], int | None] | None = None,
    ) -> None:
        self.output = output
        self.pending = pending
        self._application = application
        self._directory = directory
        self._epoch = changelog_epoch
        self._bounds = bounds
        self._epoch_end_offset = epoch_end_offset
        self._started = time.monotonic()
        self._refusals: list[str] = []
        self._judged: tuple[Path, ...] | None = None

    def poll(self) -> WaitResult | None:
        """The store ingested, a failed Job, or the deadline; None while still waiting."""
        pending = self.pending
        partition = pending.changelog.partition
        found = tuple(manifests_for(self.output, self._application, pending.store, partition))
        result: IngestResult | None = None
        if found != self._judged:
            # Only when a manifest appeared: a refused one is judged (and logged) once.
            self._judged = found
            log_start, log_end = self._bounds()
            attempt = ingest_latest_manifest(
                self.output,
                application=self._application,
                store=pending.store,
                changelog=pending.changelog,
                directory=self._directory,
                log_start=log_start,
                log_end=log_end,
                changelog_epoch=self._epoch,
                epoch_end_offset=self._epoch_end_offset,
            )
            result = attempt.result
            for refusal in attempt.refusals:
                if refusal not in self._refusals:
                    self._refusals.append(refusal)
        seconds = self.seconds
        refusals = tuple(self._refusals)
        if result is not None:
            return WaitResult(
                WaitOutcome.INGESTED,
                result,
                refusals,
                seconds,
                f"ingested {result.manifest} after waiting {seconds:.1f} s",
            )
        failed = next(
            (
                r
                for r in job_results(self.output, self._application, pending.store)
                if r.state is JobState.FAILED
                and partition in r.partitions
                and r.finished_at >= pending.since
            ),
            None,
        )
        if failed is not None:
            return WaitResult(
                WaitOutcome.JOB_FAILED,
                None,
                refusals,
                seconds,
                f"the restore Job failed ({failed.message or 'no reason given'})",
            )
        if time.time() >= pending.deadline:
            return WaitResult(
                WaitOutcome.DEADLINE,
                None,
                refusals,
                seconds,
                f"no fitting build after {seconds:.0f} s (restore.wait.ms)",
            )
        return None

    @property
    def seconds(self) -> float:
        """How long this store has waited so far."""
        return time.monotonic() - self._started

    def stopped(self) -> WaitResult:
        return WaitResult(
            WaitOutcome.STOPPED, None, tuple(self._refusals), self.seconds, "stopping"
        )


def wait_for_build(
    output: Path,
    pending: PendingRestore,
    *,
    application: str,
    directory: Path,
    changelog_epoch: str | None,
    stopped: threading.Event,
    bounds: Callable[[], tuple[int, int]],
    epoch_end_offset: Callable[[str], int | None] | None = None,
    poll_seconds: float = POLL_SECONDS,
) -> WaitResult:
    """Wait until a fitting manifest is ingested into ``directory``, a Job fails, or the deadline.

    ``bounds`` gives the changelog's current ``(start, end)``: a manifest is
    judged against the changelog as it is when it appears, not as it was when
    the wait began; ``epoch_end_offset`` (``Log.epoch_end_offset`` of the partition)
    lets a build of an earlier epoch fit (``sst_restore.check_manifest``).
    """
    watch = BuildWatch(
        output,
        pending,
        application=application,
        directory=directory,
        changelog_epoch=changelog_epoch,
        bounds=bounds,
        epoch_end_offset=epoch_end_offset,
    )
    while True:
        done = watch.poll()
        if done is not None:
            return done
        if stopped.wait(poll_seconds):
            return watch.stopped()
