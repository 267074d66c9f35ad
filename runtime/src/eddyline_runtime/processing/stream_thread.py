"""A stream thread: owns a set of tasks, fetches for them, processes, commits.

The commit protocol, and why a crash at any instant loses nothing
-----------------------------------------------------------------

A commit (every ``commit.interval.ms``, when the thread's uncommitted bytes
reach its share of ``statestore.uncommitted.max.bytes``, when a processor asks
for one with ``context.commit()``, when the thread runs out of input, and at
a clean shutdown) runs these steps in this order:

1. flush the record cache: dirty entries go to the stores' open transactions,
   to the changelog records of this commit, and downstream to the sinks;
2. write outputs, changelog records and the next input offsets to the log:
   under ``exactly_once_v2`` as **one** log transaction; under
   ``at_least_once`` as plain appends, input offsets last (at-least-once
   also appends outputs as they are produced, as Kafka's producer does);
3. commit each store with the offset of the last changelog record the log
   gave its partition (data and offset in one RocksDB batch).

Invariant under exactly-once: *a store's committed data is exactly its
changelog up to its committed offset, and the log's committed input offsets,
outputs and changelogs belong to the same set of processed records.*

* Killed before step 2 commits: the log holds nothing of this commit and the
  stores never committed it either (a store commits only its own buffer, and
  a killed process's buffer is gone). Restart reads from the previous input
  offsets: nothing lost, nothing doubled.
* Killed between 2 and 3: the log has the commit, the stores do not. Restart
  restores each store's changelog *tail* after its committed offset, which
  is exactly this commit's records; then reads after the new input offsets.
* Killed during 3: each store's batch is atomic, so each store is either
  before or after; the ones before restore their tail as above.

Each active task writes with its own transactional id, ``<application.id>-<task>``
(Kafka's original exactly-once design). Taking over a task opens a producer
for that id *before* restoring or reading offsets, which fences the previous
owner: a zombie's next commit fails and writes nothing, and it drops the task
(``TaskMigratedError``) without touching the log. So a task moving between
members never runs twice, however late the old owner learns it lost it.

Stores are never wiped (KIP-892 with ``READ_COMMITTED`` on disk); restart
replays at most one commit's changelog records per store. Under
at-least-once, step 2's appends may land without step 3 or the input
offsets: restart restores the changelog tail and reprocesses from the last
committed input offsets, so records are never lost but may count twice.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import compress, count, repeat
from operator import eq, itemgetter
from pathlib import Path

from eddyline_runtime.config import ProcessingGuarantee, StreamsConfig
from eddyline_runtime.log import LagTracker, Log, ProducerFencedError
from eddyline_runtime.log.port import RecordColumns
from eddyline_runtime.metrics import MetricName, MetricsRegistry, Sensor
from eddyline_runtime.partitions import TaskId, TopicPartition, partition_for_key
from eddyline_runtime.processing.partition_group import Chunk, PartitionGroup
from eddyline_runtime.processing.queryable import LagInfo, LocalStorePartition, StoreRole
from eddyline_runtime.processing.record_cache import ThreadCache
from eddyline_runtime.processing.standby_task import StandbyTask
from eddyline_runtime.processing.task import StreamTask
from eddyline_runtime.processing.task_store import TaskStore
from eddyline_runtime.processing.task_topology import TaskTopology
from eddyline_runtime.processing.topics import TopicLayout
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.restore import (
    ChangelogMismatchError,
    ReplayStart,
    RestoreResult,
    next_offset_after,
    open_trusted,
    restore,
)
from eddyline_runtime.restore.build_job import (
    PendingRestore,
    WaitOutcome,
    WaitResult,
    should_wait,
    wait_for_build,
)
from eddyline_runtime.restore.sst_restore import IngestResult, ingest_latest_manifest
from eddyline_runtime.state import (
    InMemoryStore,
    RocksDBStore,
    RocksDBStoreOptions,
    StateStore,
    UncommittedBytesBudget,
    store_directory,
)
from eddyline_runtime.state.sst_files import store_exists

logger = logging.getLogger(__name__)

# Fetch a partition when fewer than this many of its records are buffered...
_FETCH_LOW_WATER = 2_500
# ...and fetch this many at a time.
_FETCH_RECORDS = 5_000
# Records a task processes before the thread looks at fetching, committing,
# replaying standbys and shutting down: sized to take about _PROCESS_SECONDS
# (see _next_process_batch). Each batch has a fixed cost: up to 5,000 instead
# of a fixed 1,000 took 7-10% off the CPU per word of the word count; a slow
# topology (1 ms per record) gets small batches, and a turn stays short so a
# thread's standbys (replayed after all its tasks' turns) stay fresh.
_PROCESS_BATCH_FIRST = 1_000
_PROCESS_BATCH_LIMITS = (10, 5_000)
_PROCESS_SECONDS = 0.01
# How long a member waits before it opens again a task fenced away while still assigned to
# it: longer than a membership update takes to arrive, so an old assignment is replaced first.
_RECLAIM_FENCED_SECONDS = 1.0
# Keys per output topic whose partition the thread remembers.
_PARTITION_CACHE_KEYS = 100_000
# How long an idle thread sleeps before polling the log again.
_IDLE_SLEEP_SECONDS = 0.005


class RestoreWaitInterruptedError(Exception):
    """The thread was asked to stop while a store waited for a Spark build."""


# Records for one partition as growing columns: keys, values, timestamps, and
# headers (empty while no record has any, else one entry per record).


class ThreadState(enum.StrEnum):
    CREATED = "CREATED"
    RESTORING = "RESTORING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"


@dataclass(frozen=True, slots=True)
class CommitReport:
    """What one commit wrote; handed to commit listeners after the stores committed."""

    thread: str
    reason: str
    records: int  # input records processed since the previous commit
    input_offsets: Mapping[TopicPartition, int]  # next offset to read, per partition
    changelog_records: Mapping[TopicPartition, int]
    changelog_last_offsets: Mapping[TopicPartition, int]
    output_records: int
    seconds: float


@dataclass(frozen=True, slots=True)
class RestoreReport:
    task: TaskId
    result: RestoreResult


CommitListener = Callable[[CommitReport], None]
RestoreListener = Callable[[RestoreReport], None]


@dataclass(frozen=True)
class ThreadSetup:
    """What every stream thread of an instance shares."""

    topology: Topology
    layout: TopicLayout
    config: StreamsConfig
    log: Log
    metrics: MetricsRegistry
    instance_id: str
    on_commit: Sequence[CommitListener] = ()
    on_restore: Sequence[RestoreListener] = ()


class StreamThread:
    """Runs its tasks on a thread of its own; see the module docstring for the commit."""

    def __init__(
        self,
        index: int,
        tasks: Collection[TaskId],
        setup: ThreadSetup,
        standby_tasks: Collection[TaskId] = (),
    ) -> None:
        self.name = f"{setup.config.application_id}-{setup.instance_id}-StreamThread-{index + 1}"
        self.setup = setup
        # (active, standby) the thread should run; applied between iterations.
        self._pending: tuple[frozenset[TaskId], frozenset[TaskId]] | None = (
            frozenset(tasks),
            frozenset(standby_tasks),
        )
        self._pending_lock = threading.Lock()
        # The assignment last applied, and when to apply it again because a task of it was
        # fenced away by a member acting on an older membership (see _reclaim_fenced).
        self._assigned: tuple[frozenset[TaskId], frozenset[TaskId]] = self._pending
        self._reclaim_at: float | None = None
        config = setup.config
        self._exactly_once = config.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE_V2
        self._commit_interval_seconds = config.effective_commit_interval_ms / 1000
        self._process_batch: dict[TaskId, int] = {}  # each task's record limit
        self._budget = UncommittedBytesBudget(
            config.statestore_uncommitted_max_bytes, config.num_stream_threads
        )
        self._cache = ThreadCache(config.cache_bytes_per_thread)
        self._lag = LagTracker()
        self._store_options = RocksDBStoreOptions.from_config(config)
        # Read by other threads (queries, progress): replaced, never mutated in place.
        self.active: dict[TaskId, StreamTask] = {}
        self.standbys: dict[TaskId, StandbyTask] = {}
        self._fetch_positions: dict[TopicPartition, int] = {}
        self.migrated = 0  # tasks dropped because another member took them over
        self._round_robin = count()
        # Output topic -> key -> partition: keys repeat, and murmur2 in Python is not free.
        self._partition_cache: dict[str, dict[bytes | None, int]] = {}
        self._stop = threading.Event()
        # Stores waiting for a Spark build, by (store, partition); read by other threads.
        self.restore_pending: dict[tuple[str, int], PendingRestore] = {}
        self._ingested: dict[tuple[TaskId, str], IngestResult] = {}
        self._build_waits: dict[tuple[TaskId, str], WaitResult] = {}
        self.state = ThreadState.CREATED
        self.error: BaseException | None = None
        self.final_metrics: dict[MetricName, float] = {}
        self.processed_since_commit = 0
        # A punctuation ran since the last commit: its writes and outputs need one
        # even when no record was processed.
        self._punctuated = False
        self.processed_total = 0  # by every task this thread ran, closed ones included
        self._outputs_sent = 0  # at-least-once outputs already appended since the last commit
        # Set by the thread after an iteration that found nothing to fetch or
        # process with everything committed; read by other threads.
        self.idle = False
        self._last_commit = time.monotonic()
        self._process_sensor = Sensor()
        self._commit_sensor = Sensor()
        self._register_metrics()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the thread to commit what it processed, close its tasks and end."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def tasks(self) -> list[StreamTask]:
        return list(self.active.values())

    def assign(self, active: Collection[TaskId], standby: Collection[TaskId]) -> None:
        """Run these tasks from the next iteration on (a rebalance)."""
        with self._pending_lock:
            self._pending = (frozenset(active), frozenset(standby))

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._apply_pending_assignment()
                self.run_once()
            self.commit("shutdown")
            self.state = ThreadState.STOPPED
        except RestoreWaitInterruptedError:
            # Asked to stop while a store waited for a build: nothing of it is open yet.
            self.commit("shutdown")
            self.state = ThreadState.STOPPED
        except BaseException as exc:  # reported by the instance, never swallowed
            self.error = exc
            self.state = ThreadState.FAILED
            logger.error("stream thread %s failed: %s", self.name, exc)
            for task in self.active.values():
                task.abort_transaction()
        finally:
            self._close_tasks()

    def _apply_pending_assignment(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, None
            if pending is None and self._reclaim_at is not None:
                if time.monotonic() < self._reclaim_at:
                    return
                pending = self._assigned  # take back what is still ours
            if pending is None:
                return
            self._assigned, self._reclaim_at = pending, None
        active, standby = pending
        leaving = [t for t in self.active if t not in active]
        if leaving:
            # Hand over cleanly: everything processed so far is committed first.
            self.commit("tasks reassigned")
            for task_id in leaving:
                if task_id in self.active:  # the commit may have dropped it as migrated
                    self._close_active(task_id)
        for task_id in [t for t in self.standbys if t not in standby or t in active]:
            self._close_standby(task_id)
        self.state = ThreadState.RESTORING
        new_tasks = sorted(t for t in active if t not in self.active)
        # Every missing store that will wait for a build is reported at once, so one Spark
        # build covers them all, though the tasks are then created one after another.
        self._announce_pending_builds(new_tasks)
        try:
            for task_id in new_tasks:
                self._create_task(task_id)
        finally:
            self.restore_pending = {}
        for task_id in sorted(standby - active):
            if task_id not in self.standbys:
                self._create_standby(task_id)
        self.state = ThreadState.RUNNING

    def _reclaim_fenced(self, task_id: TaskId) -> None:
        """A fenced task this member is still assigned: open it again shortly.

        The fencing member may act on an older membership (a pod that started before the
        newest generation reached it): dropping the task for good would leave it with no
        active member while the assignment lasts. Opening it again fences that member in
        turn; if it is this member's assignment that is old, the newer one arrives within
        the delay and moves the task away, so the two never keep fencing each other."""
        with self._pending_lock:
            if task_id in self._assigned[0]:
                self._reclaim_at = time.monotonic() + _RECLAIM_FENCED_SECONDS

    def _close_active(self, task_id: TaskId) -> None:
        """Close a task whose work is committed (or abandoned, when it was migrated)."""
        active = dict(self.active)
        task = active.pop(task_id)
        self.active = active
        self._process_batch.pop(task_id, None)
        for tp in task.consumed:
            self._fetch_positions.pop(tp, None)
        for name in task.stores:
            self._cache.drop(f"{task_id}/{name}")
        self.setup.metrics.unregister_tagged({"thread-id": self.name, "task-id": str(task_id)})
        task.close()

    def _close_standby(self, task_id: TaskId) -> None:
        standbys = dict(self.standbys)
        standby = standbys.pop(task_id)
        self.standbys = standbys
        self.setup.metrics.unregister_tagged({"thread-id": self.name, "task-id": str(task_id)})
        standby.close()

    def _close_tasks(self) -> None:
        # Closed stores drop their metrics: keep the last values for reports.
        mine = ("thread-id", self.name)
        self.final_metrics = {
            name: value
            for name, value in self.setup.metrics.snapshot().items()
            if mine in name.tags
        }
        tasks: list[StreamTask | StandbyTask] = [*self.active.values(), *self.standbys.values()]
        for task in tasks:
            try:
                task.close()
            except Exception as exc:  # close the others regardless
                logger.warning("closing task %s failed: %s", task.id, exc)
        self.active, self.standbys = {}, {}
        self.setup.metrics.unregister_tagged({"thread-id": self.name})

    # -- tasks and restoration ------------------------------------------------------

    def _create_task(self, task_id: TaskId) -> StreamTask:
        """Fence the previous owner, open and restore the stores, then read the input offsets."""
        setup = self.setup
        layout, log, config = setup.layout, setup.log, setup.config
        subtopology = layout.subtopology(task_id)
        # First: from here on the previous owner of the task can commit nothing.
        producer = (
            log.transactional_producer(f"{config.application_id}-{task_id}")
            if self._exactly_once
            else None
        )
        stores: dict[str, TaskStore] = {}
        verdicts: dict[str, tuple[TopicPartition, ReplayStart]] = {}
        try:
            for name in subtopology.stores:
                changelog = layout.changelog_partition(name, task_id)
                if changelog is None:
                    store = self._open_store(name, task_id)
                else:
                    # A store whose offsets do not fit its changelog is rebuilt, never trusted.
                    store, verdict = open_trusted(
                        partial(self._open_store, name, task_id, active=True),
                        log,
                        changelog,
                        copy=f"task {task_id}",
                    )
                    verdicts[name] = (changelog, verdict)
                stores[name] = TaskStore(
                    store, changelog=changelog, cache=self._cache, cache_name=f"{task_id}/{name}"
                )
        except BaseException:
            for opened in stores.values():
                opened.close()
            if producer is not None:
                producer.close()
            raise
        inputs = layout.input_partitions(task_id)
        partitions = PartitionGroup(
            inputs,
            max_task_idle_ms=config.max_task_idle_ms,
            current_lag=self._lag.current_lag,
            clock_ms=lambda: int(time.monotonic() * 1000),
        )
        task = StreamTask(
            task_id,
            topology=TaskTopology(setup.topology, subtopology, task_id.partition, stores),
            stores=stores,
            partitions=partitions,
            logical_topics={physical: logical for logical, physical in layout.physical.items()},
            producer=producer,
        )
        # Visible (as restoring) to queries and lag reports from now on.
        self.active = {**self.active, task_id: task}
        for name, (changelog, verdict) in verdicts.items():
            task.restoring[name] = LagInfo(verdict.first_offset, verdict.log_end)
            self._restored(task_id, restore(stores[name].store, log, changelog, start=verdict))
            del task.restoring[name]
        committed_inputs = log.committed_offsets(config.application_id, inputs)
        start = {tp: committed_inputs.get(tp, log.beginning_offset(tp)) for tp in inputs}
        task.start(start)
        self._fetch_positions.update(start)
        tags = {"thread-id": self.name, "task-id": str(task_id)}
        setup.metrics.register(
            MetricName.of("stream-task-metrics", "enforced-processing-total", tags),
            lambda: float(partitions.enforced_processing),
        )
        setup.metrics.register(
            MetricName.of("stream-task-metrics", "enforced-processing-rate", tags),
            partitions.enforced_processing_sensor.total_rate,  # records/s: one value per batch
        )
        setup.metrics.register(
            MetricName.of("stream-task-metrics", "process-total", tags),
            lambda: float(task.processed),
        )
        for tp in inputs:
            # Kafka's consumer records-lag: the locally known lag (-1: not fetched yet).
            setup.metrics.register(
                MetricName.of(
                    "consumer-fetch-manager-metrics",
                    "records-lag",
                    {**tags, "topic": tp.topic, "partition": str(tp.partition)},
                ),
                partial(self._records_lag, tp),
            )
        return task

    def _replay(self, standby: StandbyTask) -> int:
        """Replay a standby; one whose changelog was truncated or recreated is rebuilt."""
        try:
            return standby.replay(self.setup.log)
        except ChangelogMismatchError as mismatch:
            logger.warning("%s. Rebuilding the standby from the changelog", mismatch.problem)
            self._close_standby(standby.id)
            self._create_standby(standby.id)
            return 0

    def _create_standby(self, task_id: TaskId) -> None:
        layout = self.setup.layout
        changelogs: dict[str, TopicPartition] = {}
        stores: dict[str, StateStore] = {}
        try:
            for name in layout.subtopology(task_id).stores:
                changelog = layout.changelog_partition(name, task_id)
                if changelog is None:
                    continue  # without a changelog there is nothing to replicate
                stores[name], _ = open_trusted(
                    partial(self._open_store, name, task_id),
                    self.setup.log,
                    changelog,
                    copy=f"standby of task {task_id}",
                )
                changelogs[name] = changelog
        except BaseException:
            for store in stores.values():
                store.close()
            raise
        standby = StandbyTask(task_id, stores, changelogs)
        try:
            standby.start(self.setup.log)
        except BaseException:
            standby.close()
            raise
        self.standbys = {**self.standbys, task_id: standby}
        for name in changelogs:
            self.setup.metrics.register(
                MetricName.of(
                    "stream-state-metrics",
                    "standby-offset-lag",
                    {"thread-id": self.name, "task-id": str(task_id), "store": name},
                ),
                partial(_standby_lag, standby, name),
            )

    def _records_lag(self, tp: TopicPartition) -> float:
        lag = self._lag.current_lag(tp)
        return -1.0 if lag is None else float(lag)

    def _open_store(self, name: str, task_id: TaskId, *, active: bool = False) -> StateStore:
        spec = self.setup.topology.stores[name]
        if not spec.persistent:
            return InMemoryStore(name)
        directory = store_directory(self.setup.config.state_dir, task_id, name)
        builds = self.setup.config.restore_build_dir
        changelog = self.setup.layout.changelog_partition(name, task_id)
        if builds is not None and changelog is not None and not store_exists(directory):
            # A missing store comes back from a Spark build when one fits (the
            # restore after opening then replays only the tail); else it replays.
            log = self.setup.log
            attempt = ingest_latest_manifest(
                builds,
                application=self.setup.config.application_id,
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
            self._store_options,
            metrics=self.setup.metrics,
            metric_tags={"thread-id": self.name, "task-id": str(task_id)},
        )

    def _announce_pending_builds(self, tasks: Sequence[TaskId]) -> None:
        """Report restorePending for every store of ``tasks`` that is missing and will wait."""
        config, setup = self.setup.config, self.setup
        if config.restore_build_dir is None or config.restore_wait_lag_above < 0:
            return
        announced = dict(self.restore_pending)
        now = time.time()
        for task_id in tasks:
            for name in setup.layout.subtopology(task_id).stores:
                changelog = setup.layout.changelog_partition(name, task_id)
                if changelog is None or not setup.topology.stores[name].persistent:
                    continue
                if store_exists(store_directory(config.state_dir, task_id, name)):
                    continue
                start, end = setup.log.beginning_offset(changelog), setup.log.end_offset(changelog)
                if should_wait(config.restore_wait_lag_above, start, end):
                    announced[(name, task_id.partition)] = PendingRestore(
                        name, changelog, start, end, now, now + config.restore_wait_ms / 1000
                    )
        self.restore_pending = announced

    def _wait_for_build(
        self, task_id: TaskId, name: str, changelog: TopicPartition, directory: Path, builds: Path
    ) -> None:
        """restorePending: wait for a Spark build when the changelog is too long to replay.

        The operator sees the pending store in this instance's layout and
        launches the build; the wait ends with the store ingested (only the
        tail is replayed then), or with a failed Job or the deadline (the
        whole changelog is replayed). The thread's other tasks wait too.
        """
        config, log = self.setup.config, self.setup.log
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
                stopped=self._stop,
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

    def _restored(self, task_id: TaskId, result: RestoreResult) -> None:
        tags = {"thread-id": self.name, "task-id": str(task_id), "store": result.store}
        metrics = self.setup.metrics
        ingested = self._ingested.pop((task_id, result.store), None)
        waited = self._build_waits.pop((task_id, result.store), None)
        # What came from a Spark build: keys ingested and the offset they cover (-1: none,
        # the whole changelog was replayed), and how long the task waited for the build.
        metrics.register(
            MetricName.of("stream-state-metrics", "restore-ingested-keys", tags),
            lambda: float(ingested.keys if ingested is not None else 0),
        )
        metrics.register(
            MetricName.of("stream-state-metrics", "restore-ingested-offset", tags),
            lambda: float(ingested.offset if ingested is not None else -1),
        )
        metrics.register(
            MetricName.of("stream-state-metrics", "restore-build-wait-seconds", tags),
            lambda: waited.seconds if waited is not None else 0.0,
        )
        metrics.register(
            MetricName.of("stream-state-metrics", "restore-total", tags),
            lambda: float(result.records),
        )
        metrics.register(
            MetricName.of("stream-state-metrics", "restore-rate", tags),
            lambda: result.records_per_second if result.records else 0.0,
        )
        logger.info(
            "task %s restored store %s: %d records from %s offsets %d..%d in %.3f s",
            task_id,
            result.store,
            result.records,
            result.changelog,
            result.first_offset,
            result.end_offset,
            result.seconds,
        )
        report = RestoreReport(task_id, result)
        for listener in self.setup.on_restore:
            listener(report)

    # -- the loop -------------------------------------------------------------------

    def run_once(self) -> int:
        """One iteration: fetch what is low, process, replay standbys, commit if due.

        Returns the records processed.
        """
        fetched = self._fetch()
        processed = 0
        share = self._budget.share
        # Bytes the thread may still buffer before its share is reached: each task
        # stops within one record of it (KIP-892's limit, not 1,000 records' worth).
        room = None if share is None else share - self._uncommitted_bytes()
        for task in self.active.values():
            if room is None:
                processed += self._process(task, None)
                continue
            before = task.uncommitted_bytes()
            processed += self._process(task, before + max(room, 0))
            room -= task.uncommitted_bytes() - before
        now_ms = time.time_ns() // 1_000_000
        for task in self.active.values():
            if task.punctuate_wall_clock(now_ms):
                self._punctuated = True
        if processed:
            self.processed_total += processed
            self.processed_since_commit += processed
            self._process_sensor.record(processed)
            if not self._exactly_once:
                # At-least-once may publish before committing, as Kafka's producer
                # does: downstream sub-topologies need not wait for the interval.
                self._outputs_sent += self._send_outputs()
        replayed = sum(self._replay(standby) for standby in list(self.standbys.values()))
        reason = self._budget.after_iteration(self._uncommitted_bytes())
        committed = None
        if reason is not None:
            committed = self.commit(reason.value)
        elif any(task.topology.commit_requested for task in self.active.values()):
            committed = self.commit("requested by a processor (context.commit())")
        elif time.monotonic() - self._last_commit >= self._commit_interval_seconds:
            committed = self.commit("commit.interval.ms elapsed")
        elif not processed and not fetched and (self.processed_since_commit or self._punctuated):
            # Out of input: waiting out the interval would only delay results.
            committed = self.commit("caught up with the input")
        # A commit may have written input for this thread (a repartition topic),
        # so only an iteration without one can find the thread idle.
        self.idle = (
            committed is None and not processed and not fetched and self.processed_since_commit == 0
        )
        if not processed and not fetched and not replayed:
            self._stop.wait(_IDLE_SLEEP_SECONDS)
        return processed

    def _process(self, task: StreamTask, max_uncommitted_bytes: int | None) -> int:
        limit = self._process_batch.get(task.id, _PROCESS_BATCH_FIRST)
        started = time.perf_counter()
        done = task.process(limit, max_uncommitted_bytes)
        self._process_batch[task.id] = _next_process_batch(limit, time.perf_counter() - started)
        return done

    def _uncommitted_bytes(self) -> int:
        return sum(task.uncommitted_bytes() for task in self.active.values())

    def _send_outputs(self) -> int:
        """At-least-once only: append the outputs produced so far to the log."""
        batches: dict[TopicPartition, RecordColumns] = {}
        sent = 0
        for task in self.active.values():
            sent += self._collect_outputs(task, batches)
        for tp, columns in batches.items():
            self.setup.log.produce_columns(
                tp, columns.keys, columns.values, columns.timestamps, columns.headers
            )
        return sent

    def _collect_outputs(
        self, task: StreamTask, batches: dict[TopicPartition, RecordColumns]
    ) -> int:
        """Move the task's outputs into per-partition columns, partitioned as Kafka's
        default partitioner does (murmur2 of the key; keyless records round-robin)."""
        sent = 0
        for topic, columns in task.drain_output_columns().items():
            sent += len(columns)
            physical = self.setup.layout.physical[topic]
            partitions = self._output_partitions(topic, columns.keys)
            targets: dict[int, RecordColumns] = {}
            for partition in sorted(set(partitions)):
                tp = TopicPartition(physical, partition)
                batch = batches.get(tp)
                if batch is None:
                    batch = batches[tp] = RecordColumns()
                targets[partition] = batch
            _split_columns(columns, partitions, targets)
        return sent

    def _output_partitions(self, topic: str, keys: Sequence[bytes | None]) -> list[int]:
        """The partition of each key; murmur2 in Python is not free, and keys repeat."""
        cache = self._partition_cache.get(topic)
        if cache is None:
            cache = self._partition_cache[topic] = {}
        try:
            return list(map(cache.__getitem__, keys))
        except KeyError:  # a key not seen yet, or keyless records
            found: list[int | None] = list(map(cache.get, keys))
        count = self.setup.layout.topic_partitions[self.setup.layout.physical[topic]]
        for index, partition in enumerate(found):
            if partition is None:
                key = keys[index]
                if key is None:
                    found[index] = next(self._round_robin) % count
                    continue
                known = cache.get(key)  # the batch may repeat a key it did not know
                if known is None:
                    if len(cache) >= _PARTITION_CACHE_KEYS:
                        cache.clear()
                    known = cache[key] = partition_for_key(key, count)
                found[index] = known
        return found  # type: ignore[return-value]

    def _fetch(self) -> int:
        log, lag, positions = self.setup.log, self._lag, self._fetch_positions
        fetched = 0
        for task in self.active.values():
            group = task.partitions
            for tp in task.consumed:
                if group.buffered(tp) >= _FETCH_LOW_WATER:
                    continue
                result = log.fetch_columns(tp, positions[tp], _FETCH_RECORDS)
                lag.fetched(tp, result)
                if result.offsets:
                    group.add_chunk(
                        tp,
                        Chunk(
                            result.offsets,
                            result.keys,
                            result.values,
                            result.timestamps,
                            result.headers,
                        ),
                    )
                    positions[tp] = result.offsets[-1] + 1
                    fetched += len(result.offsets)
                lag.advanced(tp, positions[tp])
        return fetched

    # -- the commit (see the module docstring) ----------------------------------------

    def commit(self, reason: str) -> CommitReport | None:
        if self.processed_since_commit == 0 and not self._punctuated:
            for task in self.active.values():
                task.topology.commit_requested = False  # nothing to commit: granted
            self._last_commit = time.monotonic()
            return None
        started = time.perf_counter()
        self._cache.flush()  # step 1
        changelog_records: dict[TopicPartition, int] = {}
        changelog_last_offsets: dict[TopicPartition, int] = {}
        input_offsets: dict[TopicPartition, int] = {}
        output_records = self._outputs_sent
        self._outputs_sent = 0
        migrated: list[TaskId] = []
        for task in list(self.active.values()):
            batches: dict[TopicPartition, RecordColumns] = {}
            output_records += self._collect_outputs(task, batches)
            timestamp = task.topology.timestamp
            changelogs = task.drain_changelogs()
            for tp, entries in changelogs.items():
                changes = batches[tp] = RecordColumns()
                changes.extend(
                    list(map(itemgetter(0), entries)),
                    list(map(itemgetter(1), entries)),
                    [timestamp] * len(entries),
                )
            offsets = task.offsets_to_commit()
            if not batches and not offsets:
                continue
            try:
                last_offsets = self._write_to_log(task, batches, offsets)  # step 2
            except ProducerFencedError as fenced:
                logger.warning(
                    "task %s was taken over by another member (%s); dropping it uncommitted",
                    task.id,
                    fenced,
                )
                migrated.append(task.id)
                continue
            task.commit_stores(last_offsets)  # step 3
            input_offsets.update(offsets)
            for tp, entries in changelogs.items():
                changelog_records[tp] = len(entries)
                changelog_last_offsets[tp] = last_offsets[tp]
        if not self._exactly_once and input_offsets:
            self.setup.log.commit_offsets(self.setup.config.application_id, input_offsets)
        for task_id in migrated:
            self.migrated += 1
            self._close_active(task_id)
            self._reclaim_fenced(task_id)
        self._budget.committed()
        seconds = time.perf_counter() - started
        self._commit_sensor.record(seconds * 1000)
        report = CommitReport(
            thread=self.name,
            reason=reason,
            records=self.processed_since_commit,
            input_offsets=input_offsets,
            changelog_records=changelog_records,
            changelog_last_offsets=changelog_last_offsets,
            output_records=output_records,
            seconds=seconds,
        )
        self.processed_since_commit = 0
        self._punctuated = False
        for task in self.active.values():
            task.topology.commit_requested = False
        self._last_commit = time.monotonic()
        for listener in self.setup.on_commit:
            listener(report)
        return report

    def _write_to_log(
        self,
        task: StreamTask,
        batches: Mapping[TopicPartition, RecordColumns],
        input_offsets: Mapping[TopicPartition, int],
    ) -> dict[TopicPartition, int]:
        """Step 2 for one task; returns the offset of the last record written per partition."""
        log, group = self.setup.log, self.setup.config.application_id
        if task.producer is not None:
            return task.commit_transaction(batches, group, input_offsets)
        last: dict[TopicPartition, int] = {}
        for tp, columns in batches.items():
            last[tp] = log.produce_columns(
                tp, columns.keys, columns.values, columns.timestamps, columns.headers
            )
        return last

    # -- what others may read ---------------------------------------------------------

    def input_lags(self) -> dict[TopicPartition, int | None]:
        """Locally known lag per input partition (None: not fetched yet)."""
        return {tp: self._lag.current_lag(tp) for tp in list(self._fetch_positions)}

    def buffered(self) -> int:
        return sum(task.partitions.buffered() for task in self.tasks)

    def local_store_partitions(self, store: str) -> list[LocalStorePartition]:
        """This thread's copies of ``store``: active (running or restoring) and standby."""
        found: list[LocalStorePartition] = []
        for task_id, task in self.active.items():
            task_store = task.stores.get(store)
            if task_store is None:
                continue
            restoring = task.restoring.get(store)
            changelog = task_store.logging.changelog
            position = 0
            if changelog is not None:
                position = next_offset_after(
                    task_store.store.committed_offset(changelog),
                    self.setup.log.beginning_offset(changelog),
                )
            found.append(
                LocalStorePartition(
                    store=store,
                    partition=task_id.partition,
                    task=task_id,
                    role=StoreRole.ACTIVE,
                    running=restoring is None and task.running,
                    lag=restoring or LagInfo(position, position),
                    open_reader=task_store.reader,
                )
            )
        for task_id, standby in self.standbys.items():
            standby_store = standby.stores.get(store)
            if standby_store is None:
                continue
            found.append(
                LocalStorePartition(
                    store=store,
                    partition=task_id.partition,
                    task=task_id,
                    role=StoreRole.STANDBY,
                    running=False,
                    lag=standby.lag(store),
                    open_reader=standby_store.reader,
                )
            )
        return found

    def _register_metrics(self) -> None:
        tags = {"thread-id": self.name}
        metrics, cache = self.setup.metrics, self._cache

        def register(group: str, name: str, read: Callable[[], float]) -> None:
            metrics.register(MetricName.of(group, name, tags), read)

        register("stream-thread-metrics", "process-rate", self._process_sensor.total_rate)
        register(
            "stream-thread-metrics",
            "process-total",
            lambda: float(self.processed_total),
        )
        register("stream-thread-metrics", "commit-rate", self._commit_sensor.rate)
        register("stream-thread-metrics", "commit-total", lambda: self._commit_sensor.total_count)
        register("stream-thread-metrics", "commit-latency-avg", self._commit_sensor.avg)
        register("stream-thread-metrics", "commit-latency-max", self._commit_sensor.max)
        register("stream-record-cache-metrics", "hits-total", lambda: float(cache.hits))
        register("stream-record-cache-metrics", "misses-total", lambda: float(cache.misses))
        register(
            "stream-record-cache-metrics", "forwards-saved-total", lambda: cache.forwards_saved
        )
        register(
            "stream-record-cache-metrics",
            "hit-ratio",
            lambda: cache.hits / (cache.hits + cache.misses) if cache.hits + cache.misses else 0.0,
        )
        register("stream-record-cache-metrics", "size-bytes", lambda: float(cache.num_bytes))
        register("stream-record-cache-metrics", "overwrites-total", lambda: float(cache.overwrites))
        register("stream-record-cache-metrics", "evictions-total", lambda: float(cache.evictions))


def _standby_lag(standby: StandbyTask, store: str) -> float:
    return float(standby.lag(store).offset_lag)


def _split_columns(
    columns: RecordColumns, partitions: list[int], targets: dict[int, RecordColumns]
) -> None:
    """Append each output to its partition's columns, in order."""
    if len(targets) == 1:
        next(iter(targets.values())).extend(
            columns.keys, columns.values, columns.timestamps, columns.headers
        )
        return
    if columns.headers is not None:
        for target in targets.values():
            target.pad_headers()
    # One pass in Python, ~80 ns per output: a compress per partition and column
    # (C, but each a pass over every output) cost 215 ns at four partitions.
    for partition, key, value, timestamp in zip(
        partitions, columns.keys, columns.values, columns.timestamps, strict=True
    ):
        target = targets[partition]
        target.keys.append(key)
        target.values.append(value)
        target.timestamps.append(timestamp)
    for partition, target in targets.items():
        if columns.headers is not None:
            mine = compress(columns.headers, map(eq, partitions, repeat(partition)))
            target.headers.extend(mine)  # type: ignore[union-attr]
        elif target.headers is not None:
            target.headers.extend(repeat((), len(target.keys) - len(target.headers)))


def _next_process_batch(current: int, seconds: float) -> int:
    """The next task's record limit: doubled while a task's turn takes under half of
    _PROCESS_SECONDS (a task short of input is not a slow one), halved when one
    takes over twice as long."""
    low, high = _PROCESS_BATCH_LIMITS
    if seconds < _PROCESS_SECONDS / 2:
        return min(current * 2, high)
    if seconds > _PROCESS_SECONDS * 2:
        return max(current // 2, low)
    return current
