"""Opening a thread's state stores: where they live, and what a missing one comes back from.

A persistent store opens at its directory under ``state.dir``
(:func:`~eddyline_runtime.state.store_directory`). A store that is missing
there, when Spark restore builds are configured, first comes back from the
newest build that fits its changelog (only the tail is replayed after); when
none fits and the changelog is long, an active task's store waits for one
(``restorePending``): the operator sees the pending store in this instance's
layout and launches the build. Standbys never wait: nothing reads them while
they catch up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.topics import TopicLayout
from eddyline_runtime.log import Log
from eddyline_runtime.metrics import MetricsRegistry
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.restore.ingest.build_wait import (
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
        # Stores waiting for a Spark build, by (store, partition); read by other threads,
        # so replaced, never mutated in place.
        self.restore_pending: dict[tuple[str, int], PendingRestore] = {}
        self._ingested: dict[tuple[TaskId, str], IngestResult] = {}
        self._build_waits: dict[tuple[TaskId, str], WaitResult] = {}

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
            )
            if attempt.result is not None:
                self._ingested[(task_id, name)] = attempt.result
            elif active:  # standbys never wait: nothing reads them while they catch up
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
        announced = dict(self.restore_pending)
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
        self.restore_pending = announced

    def clear_pending(self) -> None:
        """The announced tasks are created (or failed): nothing is pending any more."""
        self.restore_pending = {}

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
        pending = self.restore_pending.get(key) or PendingRestore(
            name, changelog, log_start, log_end, now, now + config.restore_wait_ms / 1000
        )
        self.restore_pending = {**self.restore_pending, key: pending}
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
                stopped=self._stopped,
                bounds=lambda: (log.beginning_offset(changelog), log.end_offset(changelog)),
            )
        finally:
            self.restore_pending = {k: v for k, v in self.restore_pending.items() if k != key}
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
