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

Under ``commit.mode=concurrent`` (the default) step 2 of every task is made at
once (``Log.commit_transactions``: on Kafka each task's flush,
``send_offsets_to_transaction`` and ``commit_transaction`` in a worker thread), and
step 3 of a task follows only its own transaction's commit; a crash between tasks
leaves each task in one of the states above (docs/kafka.md, "Committing a thread's
tasks together"). ``serial`` commits one task after another. Under ``pipelined`` each
task's outputs also go into its transaction after every iteration, begun
by the first of them, as Kafka Streams' producer sends records as they are produced:
only step 2's changelog records, input offsets and commit wait for the commit, and the
cases above hold unchanged, since nothing of an open transaction is visible or kept
before its commit (docs/kafka.md, "Sending outputs before the commit").

Stores are never wiped (KIP-892 with ``READ_COMMITTED`` on disk); restart
replays at most one commit's changelog records per store. Under
at-least-once, step 2's appends may land without step 3 or the input
offsets: restart restores the changelog tail and reprocesses from the last
committed input offsets, so records are never lost but may count twice.

This module keeps the loop, the assignment hand-over and the order of those
steps; each task says what it commits (``StreamTask.prepare_commit`` and
``complete_commit``). Creating, restoring and closing tasks is
:mod:`~eddyline_runtime.engine.task_manager`, opening stores
:mod:`~eddyline_runtime.engine.store_opener`, partitioning and sending outputs
:mod:`~eddyline_runtime.engine.record_collector`, the metrics
:mod:`~eddyline_runtime.engine.thread_metrics`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eddyline_runtime.config import CommitMode, ProcessingGuarantee, StreamsConfig
from eddyline_runtime.engine.assignment_inbox import AssignmentInbox
from eddyline_runtime.engine.log_retention import LogRetention
from eddyline_runtime.engine.queryable import LocalStorePartition
from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.record_collector import RecordCollector
from eddyline_runtime.engine.store_opener import RestoreWaitInterruptedError, StoreOpener
from eddyline_runtime.engine.task import PreparedCommit, StreamTask
from eddyline_runtime.engine.task_manager import RestoreListener, TaskManager
from eddyline_runtime.engine.thread_metrics import ThreadMetrics
from eddyline_runtime.engine.topics import TopicLayout
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log import LagTracker, Log, ProducerFencedError, TransactionalProducer
from eddyline_runtime.log.port import RecordColumns
from eddyline_runtime.metrics import MetricName, MetricsRegistry
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.restore.ingest.build_wait import PendingRestore
from eddyline_runtime.restore.replay import StandbyTask
from eddyline_runtime.state import UncommittedBytesBudget

logger = logging.getLogger(__name__)

# Fetch a partition when fewer than this many of its records are buffered...
_FETCH_LOW_WATER = 2_500
# ...and fetch this many at a time.
_FETCH_RECORDS = 5_000
# How long an idle thread sleeps before polling the log again.
_IDLE_SLEEP_SECONDS = 0.005


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
    transactions: int = 0  # task transactions committed (exactly-once)
    migrated: tuple[TaskId, ...] = ()  # tasks dropped uncommitted: another member fenced them


CommitListener = Callable[[CommitReport], None]


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
    # Called with where a store went when it was set aside for a rebuild (see open_trusted).
    on_set_aside: Callable[[Path], None] | None = None
    # Global store -> its read-only view (engine.global_thread), handed to every task.
    global_stores: Mapping[str, Any] = field(default_factory=dict)


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
        self._inbox = AssignmentInbox(tasks, standby_tasks)
        config = setup.config
        self._exactly_once = config.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE_V2
        self._concurrent_commits = config.commit_mode is not CommitMode.SERIAL
        # Outputs go into the tasks' open transactions after each iteration, not at the
        # commit (see _send_outputs).
        self._pipelined = self._exactly_once and config.commit_mode is CommitMode.PIPELINED
        self._sent_before_commit = 0  # outputs _send_outputs sent since the last commit
        self._commit_interval_seconds = config.effective_commit_interval_ms / 1000
        self._budget = UncommittedBytesBudget(config)
        self._cache = ThreadCache(config.cache_bytes_per_thread)
        self._lag = LagTracker()
        self._stop = threading.Event()
        self._metrics = ThreadMetrics(setup.metrics, self.name, self._cache, self._lag)
        self._stores = StoreOpener(
            topology=setup.topology,
            layout=setup.layout,
            config=config,
            log=setup.log,
            metrics=setup.metrics,
            thread_name=self.name,
            stopped=self._stop,
        )
        self._tasks = TaskManager(
            topology=setup.topology,
            layout=setup.layout,
            config=config,
            log=setup.log,
            exactly_once=self._exactly_once,
            cache=self._cache,
            lag=self._lag,
            opener=self._stores,
            metrics=self._metrics,
            on_restore=setup.on_restore,
            on_set_aside=setup.on_set_aside,
            global_stores=setup.global_stores,
        )
        self._collector = RecordCollector(setup.log, setup.layout)
        self.state = ThreadState.CREATED
        self.error: BaseException | None = None
        self.final_metrics: dict[MetricName, float] = {}
        self.processed_since_commit = 0
        # A punctuation ran since the last commit: its writes and outputs need one
        # even when no record was processed.
        self._punctuated = False
        # Set by the thread after an iteration that found nothing to fetch or
        # process with everything committed; read by other threads.
        self.idle = False
        self._last_commit = time.monotonic()
        self._retention = LogRetention(setup.log, setup.config.log_retention_check_interval_ms)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the thread to commit what it processed, close its tasks and end."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread.ident is None:
            return True  # never started (the instance closed while global stores loaded)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def assign(self, active: Collection[TaskId], standby: Collection[TaskId]) -> None:
        """Run these tasks from the next iteration on (a rebalance)."""
        self._inbox.post(active, standby)

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
            # An error eddyline raises on purpose says what happened and the way out; any
            # other is a bug, whose traceback is what finds it.
            trace = None if isinstance(exc, EddylineError) else exc
            logger.error("stream thread %s failed: %s", self.name, exc, exc_info=trace)
            for task in self.active.values():
                task.abort_transaction()
        finally:
            # Closed stores drop their metrics: keep the last values for reports.
            self.final_metrics = self._metrics.last_values()
            self._tasks.close_all()
            self._metrics.close()

    def _apply_pending_assignment(self) -> None:
        if self._inbox.waiting:
            # Cleared before the take: a reader that sees nothing waiting (caught_up) then
            # sees no idle thread either until an iteration ran with the new tasks.
            self.idle = False
        pending = self._inbox.take()
        if pending is None:
            return
        active, standby = pending
        tasks = self._tasks
        leaving = [t for t in tasks.active if t not in active]
        if leaving:
            # Hand over cleanly: everything processed so far is committed first.
            self.commit("tasks reassigned")
            for task_id in leaving:
                if task_id in tasks.active:  # the commit may have dropped it as migrated
                    tasks.close_active(task_id)
        # standby_ids: a standby still waiting for a Spark build is dropped the same way. An
        # open standby that becomes active is not closed: create_actives takes its stores.
        dropped = [t for t in tasks.standby_ids if t not in standby or t in active]
        for task_id in dropped:
            if task_id not in active or task_id not in tasks.standbys:
                tasks.close_standby(task_id)
        # A task that moved away but stays here as a standby opens as one at once, before
        # the new active tasks restore (which can take long): this member keeps serving a
        # copy of it meanwhile, which may be the only one up (its new owner restoring).
        for task_id in sorted(t for t in leaving if t in standby and t not in active):
            if task_id not in tasks.standbys:
                tasks.create_standby(task_id)
        self.state = ThreadState.RESTORING
        new_tasks = sorted(t for t in active if t not in tasks.active)
        # Every missing store that will wait for a build is reported at once, so one Spark
        # build covers them all, though the tasks are then created one after another (their
        # producers' init_transactions round trips are made together, before the first).
        self._stores.announce_pending_builds(new_tasks)
        try:
            taken_over = tasks.create_actives(new_tasks)
        finally:
            self._stores.clear_pending()
        for task_id in taken_over:
            self._metrics.commit_fenced()
            self._inbox.reclaim(task_id)  # if still assigned here: an old membership fenced it
        for task_id in sorted(standby - active):
            if task_id not in tasks.standbys:
                tasks.create_standby(task_id)
        self.state = ThreadState.RUNNING

    # -- the loop -------------------------------------------------------------------

    def run_once(self) -> int:
        """One iteration: fetch what is low, process, replay standbys, commit if due.

        Returns the records processed.
        """
        fetched = self._fetch()
        processed = 0
        # Busy time for process-ratio: the tasks' turns and punctuations (not fetching,
        # replaying standbys, committing or idling).
        busy_since = time.perf_counter()
        share = self._budget.share
        # Bytes the thread may still buffer before its share is reached: each task
        # stops within one record of it (KIP-892's limit, not 1,000 records' worth).
        room = None if share is None else share - self._uncommitted_bytes()
        for task in self.active.values():
            if room is None:
                processed += task.take_turn(None)
                continue
            before = task.uncommitted_bytes()
            processed += task.take_turn(before + max(room, 0))
            room -= task.uncommitted_bytes() - before
        now_ms = time.time_ns() // 1_000_000
        punctuated = False
        for task in self.active.values():
            if task.punctuate_wall_clock(now_ms):
                punctuated = self._punctuated = True
        if self._pipelined and (processed or punctuated):
            self._send_outputs()
        # A turn that processed nothing and punctuated nothing did no work: its few
        # microseconds of bookkeeping are not busy time (on a loaded node they grow with
        # every preemption, and an idle thread read 0.057, not ~0).
        self._metrics.iterated(time.perf_counter() - busy_since if processed or punctuated else 0.0)
        if processed:
            self.processed_since_commit += processed
            self._metrics.processed(processed)
            if not self._exactly_once:
                # At-least-once may publish before committing, as Kafka's producer
                # does: downstream sub-topologies need not wait for the interval.
                self._collector.send(self.active.values())
        replayed = self._tasks.replay_standbys()
        reason = self._budget.after_iteration(self._uncommitted_bytes())
        committed = None
        if reason is not None:
            committed = self.commit(reason.value)
        elif any(task.commit_requested for task in self.active.values()):
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

    def _send_outputs(self) -> None:
        """``commit.mode=pipelined``: each task's outputs so far into its open transaction
        (begun by the first), so the producer delivers them while the thread goes on
        processing and the commit's flush finds most of them delivered. Input offsets and
        changelog records are still sent only by the commit; a crash before it aborts the
        transaction, and a fenced producer found here drops its task as a commit would."""
        taken_over: list[TaskId] = []
        for task in self.active.values():
            if not task.transactional:
                continue
            held_bytes = task.topology.output_bytes  # the collect drains them
            outputs: dict[TopicPartition, RecordColumns] = {}
            sent = self._collector.collect(task, outputs)
            if not sent:
                continue
            try:
                task.send_outputs(outputs, held_bytes)
            except ProducerFencedError as fenced:
                logger.warning(
                    "task %s was taken over by another member (%s); dropping it uncommitted",
                    task.id,
                    fenced,
                )
                taken_over.append(task.id)
                continue
            self._sent_before_commit += sent
        for task_id in taken_over:
            self._drop_taken_over(task_id)

    def _drop_taken_over(self, task_id: TaskId) -> None:
        """Close a task another member fenced, uncommitted: its transaction is aborted."""
        self._metrics.commit_fenced()
        self._tasks.close_active(task_id)
        self._inbox.reclaim(task_id)  # if still assigned here: an old membership fenced it

    def _uncommitted_bytes(self) -> int:
        return sum(task.uncommitted_bytes() for task in self.active.values())

    def _fetch(self) -> int:
        log, lag = self.setup.log, self._lag
        fetched = 0
        for task in self.active.values():
            group = task.partitions
            for tp in task.inputs:
                if group.buffered(tp) >= _FETCH_LOW_WATER:
                    continue
                result = log.fetch_columns(tp, task.fetch_position(tp), _FETCH_RECORDS)
                lag.fetched(tp, result)
                fetched += task.add_input(tp, result)
                lag.advanced(tp, task.fetch_position(tp))
        return fetched

    # -- the commit (see the module docstring) ----------------------------------------

    def commit(self, reason: str) -> CommitReport | None:
        if self.processed_since_commit == 0 and not self._punctuated:
            for task in self.active.values():
                task.grant_commit_request()  # nothing to commit: granted
            self._last_commit = time.monotonic()
            return None
        started = time.perf_counter()
        self._cache.flush()  # step 1
        changelog_records: dict[TopicPartition, int] = {}
        changelog_last_offsets: dict[TopicPartition, int] = {}
        input_offsets: dict[TopicPartition, int] = {}
        output_records = self._collector.take_sent() + self._sent_before_commit
        self._sent_before_commit = 0
        migrated: list[TaskId] = []
        prepared_tasks: list[tuple[StreamTask, PreparedCommit]] = []
        for task in list(self.active.values()):
            outputs: dict[TopicPartition, RecordColumns] = {}
            output_records += self._collector.collect(task, outputs)
            prepared = task.prepare_commit(outputs)
            if prepared is not None:
                prepared_tasks.append((task, prepared))
        written = self._write(prepared_tasks)  # step 2
        failure: Exception | None = None
        transactions = 0
        for (task, prepared), outcome in zip(prepared_tasks, written, strict=True):
            if isinstance(outcome, ProducerFencedError):
                logger.warning(
                    "task %s was taken over by another member (%s); dropping it uncommitted",
                    task.id,
                    outcome,
                )
                migrated.append(task.id)
                continue
            if isinstance(outcome, Exception):
                # Concurrent commits: the other tasks' transactions are decided, so their
                # stores still commit; then the thread fails with this task's error.
                failure = failure or outcome
                continue
            task.complete_commit(outcome)  # step 3
            if task.transactional:
                transactions += 1
            self._metrics.task_committed(task.id)
            input_offsets.update(prepared.input_offsets)
            for tp, records in prepared.changelog_records.items():
                changelog_records[tp] = records
                changelog_last_offsets[tp] = outcome[tp]
        if failure is not None:
            raise failure
        if not self._exactly_once and input_offsets:
            self.setup.log.commit_offsets(self.setup.config.application_id, input_offsets)
        for task_id in migrated:
            self._drop_taken_over(task_id)
        self._budget.committed()
        self._retention.after_commit()  # window changelogs' retention.ms, on the embedded log
        seconds = time.perf_counter() - started
        self._metrics.committed(seconds)
        report = CommitReport(
            thread=self.name,
            reason=reason,
            records=self.processed_since_commit,
            input_offsets=input_offsets,
            changelog_records=changelog_records,
            changelog_last_offsets=changelog_last_offsets,
            output_records=output_records,
            seconds=seconds,
            transactions=transactions,
            migrated=tuple(migrated),
        )
        self.processed_since_commit = 0
        self._punctuated = False
        for task in self.active.values():
            task.grant_commit_request()
        self._last_commit = time.monotonic()
        for listener in self.setup.on_commit:
            listener(report)
        return report

    def _write(
        self, prepared_tasks: Sequence[tuple[StreamTask, PreparedCommit]]
    ) -> list[dict[TopicPartition, int] | Exception]:
        """Step 2 for each task, in order: the last offset the log gave each of its
        partitions, or the ProducerFencedError that dropped it. Under
        ``commit.mode=concurrent`` every task's transaction is opened and filled first
        (CPU work), then the log commits them all at once (Log.commit_transactions), and
        any other error is returned too, for the caller to raise once the tasks that
        committed finished; serial commits raise it at once, as they always did."""
        group = self.setup.config.application_id
        if not self._exactly_once or not self._concurrent_commits:
            written: list[dict[TopicPartition, int] | Exception] = []
            for task, prepared in prepared_tasks:
                try:
                    if task.transactional:
                        written.append(
                            task.commit_transaction(prepared.records, group, prepared.input_offsets)
                        )
                    else:
                        written.append(self._collector.append(prepared.records))
                except ProducerFencedError as fenced:
                    written.append(fenced)
            return written
        opened: dict[int, TransactionalProducer] = {}
        outcomes: dict[int, dict[TopicPartition, int] | Exception] = {}
        for i, (task, prepared) in enumerate(prepared_tasks):
            try:
                opened[i] = task.open_transaction(prepared.records, group, prepared.input_offsets)
            except ProducerFencedError as fenced:  # found while sending: this task alone
                outcomes[i] = fenced
        committed = self.setup.log.commit_transactions(list(opened.values()))
        for i, outcome in zip(opened, committed, strict=True):
            try:
                outcomes[i] = prepared_tasks[i][0].transaction_committed(outcome)
            except Exception as exc:  # that task's alone; the caller decides
                outcomes[i] = exc
        return [outcomes[i] for i in range(len(prepared_tasks))]

    # -- what others may read ---------------------------------------------------------

    @property
    def migrated(self) -> int:
        """Tasks dropped because another member took them over (fenced their commit)."""
        return self._metrics.fenced_total

    @property
    def active(self) -> dict[TaskId, StreamTask]:
        return self._tasks.active

    @property
    def standbys(self) -> dict[TaskId, StandbyTask]:
        return self._tasks.standbys

    @property
    def tasks(self) -> list[StreamTask]:
        return list(self.active.values())

    def standby_to_open(self, task_id: TaskId) -> bool:
        """``task_id`` is a standby of this thread's assignment that is not open yet, and not
        waiting for a Spark build either: the thread has yet to apply the assignment, or is
        applying it (its standbys open after its new active tasks)."""
        return self._inbox.standby_assigned(task_id) and task_id not in self._tasks.standby_ids

    @property
    def assignment_waiting(self) -> bool:
        """Tasks of the thread's assignment are not running yet (posted, or fenced away and
        due to be taken back)."""
        return self._inbox.waiting

    @property
    def processed_total(self) -> int:
        """Records processed by every task this thread ran, closed ones included."""
        return self._metrics.processed_total

    @property
    def restore_pending(self) -> dict[tuple[str, int], PendingRestore]:
        """Stores waiting for a Spark build, by (store, partition)."""
        return self._stores.restore_pending

    def input_lags(self) -> dict[TopicPartition, int | None]:
        """Locally known lag per input partition (None: not fetched yet)."""
        return {tp: self._lag.current_lag(tp) for task in self.tasks for tp in task.inputs}

    def buffered(self) -> int:
        return sum(task.partitions.buffered() for task in self.tasks)

    def local_store_partitions(self, store: str) -> list[LocalStorePartition]:
        """This thread's copies of ``store``: active (running or restoring) and standby."""
        return self._tasks.local_store_partitions(store)
