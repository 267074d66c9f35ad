"""Opening a thread's state stores: where they live, and what a missing one comes back from.

A persistent store opens at its directory under ``state.dir``
(:func:`~eddyline_runtime.state.store_directory`). A store that is missing
there, when Spark restore builds are configured, first comes back from the
newest build that fits its changelog (only the tail is replayed after); when
none fits and the changelog is long, the store waits for one
(``restorePending``): the operator sees the pending store in this instance's
layout and launches the build. An active task's store waits in
:meth:`StoreOpener.open` (the task cannot run without it). A standby's or
warm-up replica's store (KIP-441: a warm-up is a standby to the thread) waits
without blocking: :meth:`StoreOpener.defer_standby` sets it aside, and the
thread polls it once per turn of its loop (:meth:`StoreOpener.poll_standby_builds`)
while the member's active tasks keep processing; once the build is ingested
(or its Job failed, or ``restore.wait.ms`` passed: then it replays everything)
the standby opens and replays from there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.topics import TopicLayout
from eddyline_runtime.log import Log
from eddyline_runtime.metrics import MetricsRegistry
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.restore.ingest.build_wait import (
    POLL_SECONDS,
    BuildWatch,
    PendingRestore,
    WaitOutcome,
    WaitResult,
    should_wait,
    wait_for_build,
)
from eddyline_runtime.restore.ingest.sst_restore import IngestResult, ingest_latest_manifest
from eddyline_runtime.state import (
    InMemoryStore,
    RocksDBStore,
    RocksDBStoreOptions,
    StateStore,
    store_directory,
)
from eddyline_runtime.state.sst_files import store_exists

logger = logging.getLogger(__name__)


class RestoreWaitInterruptedError(Exception):
    """The thread was asked to stop while a store waited for a Spark build."""


class StoreOpener:
    """Opens the stores of one stream thread's tasks (see the module docstring)."""

    def __init__(
        self,
        *,
        topology: Topology,
        layout: TopicLayout,
        config: StreamsConfig,
        log: Log,
        metrics: MetricsRegistry,
        thread_name: str,
        stopped: threading.Event,
    ) -> None:
        self._topology = topology
        self._layout = layout
        self._config = config
        self._log = log
        self._metrics = metrics
        self._thread_name = thread_name
        self._stopped = stopped  # ends a wait for a build
        self._options = RocksDBStoreOptions.from_config(config)
        # Stores waiting for a Spark build, by (store, partition): those of active tasks
        # (announced, then waited for in open()) and those of standbys and warm-ups (polled
        # by the thread's loop). Read by other threads, so replaced, never mutated in place.
        self._active_pending: dict[tuple[str, int], PendingRestore] = {}
        self._standby_pending: dict[tuple[str, int], PendingRestore] = {}
        # Standby (and warm-up) tasks set aside until their builds settle: task -> store ->
        # the watch of a store still waiting.
        self._standby_watches: dict[TaskId, dict[str, BuildWatch]] = {}
        self._next_standby_poll = 0.0
        self._ingested: dict[tuple[TaskId, str], IngestResult] = {}
        self._build_waits: dict[tuple[TaskId, str], WaitResult] = {}

    @property
    def restore_pending(self) -> dict[tuple[str, int], PendingRestore]:
        """Every store of this thread waiting for a Spark build, by (store, partition)."""
        return {**self._standby_pending, **self._active_pending}

    def open(self, name: str, task_id: TaskId, *, active: bool = False) -> StateStore:
        """Open store ``name`` of ``task_id``; an active task's missing store may wait."""
        spec = self._topology.stores[name]
        if not spec.persistent:
            return InMemoryStore(name)
        config = self._config
        directory = store_directory(config.state_dir, task_id, name)
        builds = config.restore_build_dir
        changelog = self._layout.changelog_partition(name, task_id)
        if builds is not None and changelog is not None and not store_exists(directory):
            # A missing store comes back from a Spark build when one fits (the
            # restore after opening then replays only the tail); else it replays.
            log = self._log
            attempt = ingest_latest_manifest(
                builds,
                application=config.application_id,
                store=name,
                changelog=changelog,
                directory=directory,
                log_start=log.beginning_offset(changelog),
                log_end=log.end_offset(changelog),
                changelog_epoch=log.partition_epoch(changelog),
                epoch_end_offset=partial(log.epoch_end_offset, changelog),
            )
            if attempt.result is not None:
                self._ingested[(task_id, name)] = attempt.result
            elif active:  # a standby waited before it was opened (defer_standby)
                self._wait_for_build(task_id, name, changelog, directory, builds)
        return RocksDBStore(
            name,
            directory,
            self._options,
            metrics=self._metrics,
            metric_tags={"thread-id": self._thread_name, "task-id": str(task_id)},
        )

    def take_build(self, task_id: TaskId, store: str) -> tuple[IngestResult | None, float]:
        """What a Spark build gave ``store`` when it was opened (None: nothing, the whole
        changelog replays), and the seconds its task waited for the build; asked once."""
        ingested = self._ingested.pop((task_id, store), None)
        waited = self._build_waits.pop((task_id, store), None)
        return ingested, waited.seconds if waited is not None else 0.0

    def announce_pending_builds(self, tasks: Sequence[TaskId]) -> None:
        """Report restorePending for every store of ``tasks`` that is missing and will wait.

        All at once, before the tasks are created one after another, so one
        Spark build covers them all.
        """
        config, layout, log = self._config, self._layout, self._log
        if config.restore_build_dir is None or config.restore_wait_lag_above < 0:
            return
        announced = dict(self._active_pending)
        now = time.time()
        for task_id in tasks:
            for name in layout.subtopology(task_id).stores:
                changelog = layout.changelog_partition(name, task_id)
                if changelog is None or not self._topology.stores[name].persistent:
                    continue
                if store_exists(store_directory(config.state_dir, task_id, name)):
                    continue
                start, end = log.beginning_offset(changelog), log.end_offset(changelog)
                if should_wait(config.restore_wait_lag_above, start, end):
                    announced[(name, task_id.partition)] = PendingRestore(
                        name, changelog, start, end, now, now + config.restore_wait_ms / 1000
                    )
        self._active_pending = announced

    def clear_pending(self) -> None:
        """The announced tasks are created (or failed): none of them is pending any more."""
        self._active_pending = {}

    # -- standbys and warm-ups: waiting without blocking the thread -------------------

    def defer_standby(self, task_id: TaskId) -> bool:
        """Whether standby ``task_id`` must wait for a Spark build before it opens.

        With the thresholds an active task waits by (``restore.wait.lag.above``,
        ``restore.wait.ms``), a missing store whose changelog is long and which
        no build fits yet is reported restorePending and watched; the thread
        then opens the standby once :meth:`poll_standby_builds` names it. A
        store a build fits now is ingested here (it opens on it, replaying
        only the tail).
        """
        config, layout, log = self._config, self._layout, self._log
        builds = config.restore_build_dir
        if builds is None or config.restore_wait_lag_above < 0:
            return False
        watches: dict[str, BuildWatch] = {}
        now = time.time()
        for name in layout.subtopology(task_id).stores:
            changelog = layout.changelog_partition(name, task_id)
            if changelog is None or not self._topology.stores[name].persistent:
                continue
            directory = store_directory(config.state_dir, task_id, name)
            if store_exists(directory):
                continue
            start, end = log.beginning_offset(changelog), log.end_offset(changelog)
            if not should_wait(config.restore_wait_lag_above, start, end):
                continue
            pending = PendingRestore(
                name, changelog, start, end, now, now + config.restore_wait_ms / 1000
            )
            watch = BuildWatch(
                builds,
                pending,
                application=config.application_id,
                directory=directory,
                changelog_epoch=log.partition_epoch(changelog),
                bounds=partial(_bounds, log, changelog),
                epoch_end_offset=partial(log.epoch_end_offset, changelog),
            )
            done = watch.poll()  # a build that fits now: no wait at all
            if done is not None:
                self._settled(task_id, name, done)
                continue
            watches[name] = watch
            logger.info(
                "standby of task %s: store %s is missing and %s holds %d records: it waits up "
                "to %.0f s for a Spark restore build (restorePending) while the thread runs on",
                task_id,
                name,
                changelog,
                pending.records,
                config.restore_wait_ms / 1000,
            )
        if not watches:
            return False
        self._standby_watches = {**self._standby_watches, task_id: watches}
        self._publish_standby_pending()
        return True

    def poll_standby_builds(self) -> list[TaskId]:
        """Look once (at most every poll interval) for the builds standbys wait for; returns
        the standbys whose stores all settled: ingested, or given up on (a failed Job, the
        deadline: they replay the whole changelog), to be opened now."""
        if not self._standby_watches:
            return []
        now = time.monotonic()
        if now < self._next_standby_poll:
            return []
        self._next_standby_poll = now + POLL_SECONDS
        ready: list[TaskId] = []
        remaining: dict[TaskId, dict[str, BuildWatch]] = {}
        settled = False
        for task_id, watches in self._standby_watches.items():
            waiting = {}
            for name, watch in watches.items():
                done = watch.poll()
                if done is None:
                    waiting[name] = watch
                else:
                    self._settled(task_id, name, done)
                    settled = True  # never polled again (a task may have other stores)
            if waiting:
                remaining[task_id] = waiting
            else:
                ready.append(task_id)
        if settled:
            self._standby_watches = remaining
            self._publish_standby_pending()
        return sorted(ready)

    def waiting_standbys(self) -> frozenset[TaskId]:
        """Standbys set aside until a build settles."""
        return frozenset(self._standby_watches)

    def forget_standby(self, task_id: TaskId) -> None:
        """A waiting standby is no longer assigned here (or becomes active): stop watching."""
        if task_id in self._standby_watches:
            self._standby_watches = {t: w for t, w in self._standby_watches.items() if t != task_id}
            self._publish_standby_pending()
        for key in [k for k in self._build_waits if k[0] == task_id]:
            self._build_waits.pop(key, None)
        for key in [k for k in self._ingested if k[0] == task_id]:
            self._ingested.pop(key, None)

    def _settled(self, task_id: TaskId, store: str, done: WaitResult) -> None:
        """A standby's store stopped waiting: note what it got, for take_build."""
        self._build_waits[(task_id, store)] = done
        pending = done.ingested
        if pending is not None:
            self._ingested[(task_id, store)] = pending
            logger.info(
                "standby of task %s store %s: %s; replaying the changelog after offset %d",
                task_id,
                store,
                done.message,
                pending.offset,
            )
        else:
            logger.warning(
                "standby of task %s store %s: %s; replaying the whole changelog instead",
                task_id,
                store,
                done.message,
            )

    def _publish_standby_pending(self) -> None:
        self._standby_pending = {
            (name, task_id.partition): watch.pending
            for task_id, watches in self._standby_watches.items()
            for name, watch in watches.items()
        }

    def _wait_for_build(
        self, task_id: TaskId, name: str, changelog: TopicPartition, directory: Path, builds: Path
    ) -> None:
        """restorePending: wait for a Spark build when the changelog is too long to replay.

        The wait ends with the store ingested (only the tail is replayed
        then), or with a failed Job or the deadline (the whole changelog is
        replayed). The thread's other tasks wait too.
        """
        config, log = self._config, self._log
        log_start, log_end = log.beginning_offset(changelog), log.end_offset(changelog)
        if not should_wait(config.restore_wait_lag_above, log_start, log_end):
            return
        key = (name, task_id.partition)
        now = time.time()
        pending = self._active_pending.get(key) or PendingRestore(
            name, changelog, log_start, log_end, now, now + config.restore_wait_ms / 1000
        )
        self._active_pending = {**self._active_pending, key: pending}
        logger.info(
            "task %s: store %s is missing and %s holds %d records: waiting up to %.0f s for a "
            "Spark restore build (restorePending)",
            task_id,
            name,
            changelog,
            pending.records,
            config.restore_wait_ms / 1000,
        )
        try:
            waited = wait_for_build(
                builds,
                pending,
                application=config.application_id,
                directory=directory,
                changelog_epoch=log.partition_epoch(changelog),
                epoch_end_offset=partial(log.epoch_end_offset, changelog),
                stopped=self._stopped,
                bounds=lambda: (log.beginning_offset(changelog), log.end_offset(changelog)),
            )
        finally:
            self._active_pending = {k: v for k, v in self._active_pending.items() if k != key}
        self._build_waits[(task_id, name)] = waited
        if waited.outcome is WaitOutcome.STOPPED:
            raise RestoreWaitInterruptedError(f"task {task_id}: stopped while waiting for a build")
        if waited.ingested is not None:
            self._ingested[(task_id, name)] = waited.ingested
            logger.info("task %s store %s: %s", task_id, name, waited.message)
        else:
            logger.warning(
                "task %s store %s: %s; replaying %d records of %s instead",
                task_id,
                name,
                waited.message,
                pending.records,
                changelog,
            )


def _bounds(log: Log, changelog: TopicPartition) -> tuple[int, int]:
    return log.beginning_offset(changelog), log.end_offset(changelog)
