"""A stream thread's tasks: creating, restoring and closing them, active and standby.

Creating an active task runs in this order, each step for a reason:

1. open the task's transactional producer (exactly-once): from here on the
   previous owner of the task can commit nothing (it is fenced). The producers
   of the tasks a thread gets in one assignment are started together, so their
   ``init_transactions`` round trips overlap (docs/kafka.md, "Starting tasks");
2. open each store, rebuilding one whose offsets do not fit its changelog, or
   stopping the task when the changelog lost records the store applied
   (:func:`~eddyline_runtime.restore.replay.open_trusted`), then start a new
   changelog epoch for this writer: a missing store may come back from a Spark
   build first (:mod:`~eddyline_runtime.engine.store_opener`);
3. make the task visible, as restoring, to queries and lag reports, and
   restore each store's changelog tail;
4. read the committed input offsets (the log's start where none is committed):
   only now, so the previous owner's last commit is in them.

A standby (or warm-up replica) opens the same stores and replays their
changelogs after every turn of the thread's loop; one whose changelog was
truncated or recreated is rebuilt. One whose missing store waits for a Spark
build is set aside first and opened once the build settles, without holding
up the thread's active tasks (:meth:`StoreOpener.defer_standby`). The task
dictionaries are read by other threads (queries, progress): they are
replaced, never mutated in place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.partition_group import PartitionGroup
from eddyline_runtime.engine.queryable import LocalStorePartition
from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.record_failures import RecordFailures
from eddyline_runtime.engine.store_opener import StoreOpener
from eddyline_runtime.engine.task import StreamTask
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.engine.thread_metrics import ThreadMetrics
from eddyline_runtime.engine.topics import TopicLayout
from eddyline_runtime.log import LagTracker, Log, ProducerFencedError, TransactionalProducer
from eddyline_runtime.log.positions import read_positions
from eddyline_runtime.log.record_size import RecordSizeLimit
from eddyline_runtime.membership import StoreRole
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.topology import SubTopology, Topology
from eddyline_runtime.restore.replay import (
    ChangelogMismatchError,
    LagInfo,
    ReplayStart,
    RestoreResult,
    StandbyTask,
    next_offset_after,
    open_trusted,
    restore,
)
from eddyline_runtime.state import StateStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RestoreReport:
    task: TaskId
    result: RestoreResult


RestoreListener = Callable[[RestoreReport], None]


class TaskManager:
    """Creates, restores and closes one thread's tasks (see the module docstring)."""

    def __init__(
        self,
        *,
        topology: Topology,
        layout: TopicLayout,
        config: StreamsConfig,
        log: Log,
        exactly_once: bool,
        cache: ThreadCache,
        lag: LagTracker,
        opener: StoreOpener,
        metrics: ThreadMetrics,
        on_restore: Sequence[RestoreListener] = (),
        on_set_aside: Callable[[Path], None] | None = None,
        global_stores: Mapping[str, Any] | None = None,
    ) -> None:
        self._topology = topology
        # The instance fills this mapping once the global stores are open: keep it, not a copy.
        self._global_stores = {} if global_stores is None else global_stores
        self._layout = layout
        self._config = config
        self._log = log
        self._exactly_once = exactly_once
        self._cache = cache
        self._lag = lag
        self._opener = opener
        self._metrics = metrics
        self._on_restore = tuple(on_restore)
        self._on_set_aside = on_set_aside
        # Read by other threads (queries, progress): replaced, never mutated in place.
        self.active: dict[TaskId, StreamTask] = {}
        self.standbys: dict[TaskId, StandbyTask] = {}

    # -- active tasks ---------------------------------------------------------------

    def create_actives(self, task_ids: Sequence[TaskId]) -> list[TaskId]:
        """Create the tasks in order (see _create_active), their producers started together.

        Under exactly-once every task's producer is started first, their
        ``init_transactions`` round trips at once (Log.transactional_producers): each
        task fences its previous owner before it is created, as one alone would. A task
        whose producer failed to start raises that error when its turn comes, as its own
        start would have; the producers of tasks not reached are closed.

        Returns the tasks taken over before their turn came: a newer owner fenced their
        producer between the start and the task's creation (a membership that moved them
        on while this member was still creating the earlier ones). They are not created,
        as a task fenced at a commit is dropped."""
        if not self._exactly_once:
            for task_id in task_ids:
                self._create_active(task_id, None)
            return []
        application_id = self._config.application_id
        started = self._log.transactional_producers([f"{application_id}-{t}" for t in task_ids])
        taken_over: list[TaskId] = []
        try:
            for task_id in task_ids:
                # A producer that failed to start fails the thread with its own error (take
                # raises it); only a fence met once the task has its producer drops the task.
                producer = started.take(f"{application_id}-{task_id}")
                try:
                    self._create_active(task_id, producer)
                except ProducerFencedError as fenced:
                    logger.warning(
                        "task %s was taken over by another member before it started here "
                        "(%s): not created",
                        task_id,
                        fenced,
                    )
                    taken_over.append(task_id)
        finally:
            started.close()
        return taken_over

    def _create_active(self, task_id: TaskId, producer: TransactionalProducer | None) -> StreamTask:
        """Open and restore the stores, then read the input offsets; ``producer`` (under
        exactly-once) has fenced the previous owner already, and is closed if this fails.

        A standby of the task this thread holds becomes the active task on its open stores
        (Kafka Streams recycles them too): they are not closed and opened again, and the
        standby stays visible to queries until the active task is, so a promotion leaves
        no moment in which this member holds no readable copy."""
        layout, log, config = self._layout, self._log, self._config
        subtopology = layout.subtopology(task_id)
        standby = self.standbys.get(task_id)
        recycled: dict[str, StateStore] = {} if standby is None else dict(standby.stores)
        # How current each recycled copy is (LagInfo.caught_up_at_ms): the standby knows,
        # the store only what it recorded at its own open, maybe long ago or nothing.
        recycled_as_of = (
            {}
            if standby is None
            else {name: standby.lag(name).caught_up_at_ms for name in recycled}
        )
        stores: dict[str, TaskStore] = {}
        verdicts: dict[str, tuple[TopicPartition, ReplayStart]] = {}
        try:
            for name in subtopology.stores:
                changelog = layout.changelog_partition(name, task_id)
                if changelog is None:
                    store = self._opener.open(name, task_id)
                else:
                    # A store whose offsets do not fit its changelog is rebuilt, never trusted.
                    store, verdict = open_trusted(
                        partial(self._recycled_or_open, recycled, name, task_id),
                        log,
                        changelog,
                        copy=f"task {task_id}",
                        on_set_aside=self._on_set_aside,
                        rebuild_recreated=config.state_rebuild_after_changelog_recreated,
                        state_dir=config.state_dir,
                        writer=True,
                        # Fenced above, so no earlier owner writes the changelog after the
                        # new epoch begins (without a fence a zombie could, and its copy would
                        # be judged a loss when nothing was lost). And begun only while this
                        # producer is still the newest: a later owner may have fenced it
                        # since (ProducerFencedError: the task moved on).
                        new_epoch=self._exactly_once,
                        fence=producer,
                    )
                    verdicts[name] = (changelog, verdict)
                # A store materialized with caching disabled writes and forwards every update.
                cache = self._cache if self._topology.stores[name].cached else None
                stores[name] = TaskStore(
                    store, changelog=changelog, cache=cache, cache_name=f"{task_id}/{name}"
                )
        except BaseException:
            for opened in stores.values():
                opened.close()
            if standby is not None:
                # Its stores are this task's now (closed above) or closed here: never twice.
                for left in recycled.values():
                    left.close()
                self._drop_standby(task_id)
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
            topology=TaskTopology(
                self._topology,
                subtopology,
                task_id.partition,
                stores,
                global_stores=self._global_stores,
                failures=RecordFailures.from_config(config),
                physical_topics=layout.physical,
                record_limits=self._record_limits(subtopology),
            ),
            stores=stores,
            partitions=partitions,
            logical_topics={physical: logical for logical, physical in layout.physical.items()},
            producer=producer,
        )
        # Visible (as restoring) to queries and lag reports from now on; a recycled standby
        # goes only now (the same open stores: a moment of two entries, never of none).
        self.active = {**self.active, task_id: task}
        if standby is not None:
            for left in recycled.values():  # a store the active task no longer has
                left.close()
            self._drop_standby(task_id)
        if verdicts:
            self._metrics.restore_started()
        try:
            for name, (changelog, verdict) in verdicts.items():
                # Until it catches up, a copy reopened after a clean close is as current
                # as it was then (state/as_of_marker.py), a recycled standby's as its
                # standby last saw it; one rebuilt cannot tell.
                store = stores[name].store
                recorded = store.recorded_as_of_ms
                if standby is not None and standby.stores.get(name) is store:
                    recorded = _latest(recycled_as_of.get(name), recorded)
                task.restoring(name, LagInfo(verdict.first_offset, verdict.log_end, recorded))
                self._restored(task_id, restore(stores[name].store, log, changelog, start=verdict))
                task.restored(name)
        finally:
            if verdicts:
                self._metrics.restore_ended()
        task.start(read_positions(log, config.application_id, inputs))
        self._metrics.task_created(task)
        return task

    def _record_limits(self, subtopology: SubTopology) -> dict[str, RecordSizeLimit]:
        """The largest record the log takes in each topic the task writes to (its sinks',
        and the dead-letter topic): the sink hands a larger one to the production handler
        before it is sent. The Kafka adapter asks the broker once per topic."""
        nodes = self._topology.nodes
        outputs = {
            nodes[name].topics[0] for name in subtopology.nodes if nodes[name].kind == "sink"
        }
        dead_letters = self._config.errors_dead_letter_queue_topic_name
        if dead_letters is not None:
            outputs.add(dead_letters)
        limits: dict[str, RecordSizeLimit] = {}
        for topic in sorted(outputs):
            limit = self._log.record_size_limit(self._layout.physical.get(topic, topic))
            if limit is not None:
                limits[topic] = limit
        return limits

    def close_active(self, task_id: TaskId) -> None:
        """Close a task whose work is committed (or abandoned, when it was migrated)."""
        active = dict(self.active)
        task = active.pop(task_id)
        self.active = active
        for name in task.stores:
            self._cache.drop(f"{task_id}/{name}")
        self._metrics.task_closed(task_id)
        task.close()

    def _restored(self, task_id: TaskId, result: RestoreResult) -> None:
        ingested, waited = self._opener.take_build(task_id, result.store)
        self._metrics.restored(task_id, result, ingested, waited)
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
        for listener in self._on_restore:
            listener(report)

    # -- standbys -------------------------------------------------------------------

    def create_standby(self, task_id: TaskId) -> None:
        """Open a standby (or warm-up) now, or set it aside while a store waits for a build."""
        if task_id in self.standbys or task_id in self._opener.waiting_standbys():
            return
        if self._opener.defer_standby(task_id):
            return  # opened by replay_standbys once its builds settle
        self._open_standby(task_id)

    @property
    def standby_ids(self) -> frozenset[TaskId]:
        """The standbys (and warm-ups) this thread holds, opened or waiting for a build."""
        return frozenset(self.standbys) | self._opener.waiting_standbys()

    def _open_standby(self, task_id: TaskId) -> None:
        layout = self._layout
        changelogs: dict[str, TopicPartition] = {}
        stores: dict[str, StateStore] = {}
        try:
            for name in layout.subtopology(task_id).stores:
                changelog = layout.changelog_partition(name, task_id)
                if changelog is None:
                    continue  # without a changelog there is nothing to replicate
                stores[name], _ = open_trusted(
                    partial(self._opener.open, name, task_id),
                    self._log,
                    changelog,
                    copy=f"standby of task {task_id}",
                    on_set_aside=self._on_set_aside,
                    rebuild_recreated=self._config.state_rebuild_after_changelog_recreated,
                    state_dir=self._config.state_dir,
                )
                changelogs[name] = changelog
        except BaseException:
            for store in stores.values():
                store.close()
            raise
        standby = StandbyTask(task_id, stores, changelogs)
        try:
            standby.start(self._log)
        except BaseException:
            standby.close()
            raise
        self.standbys = {**self.standbys, task_id: standby}
        self._metrics.standby_created(standby)
        for name in changelogs:
            ingested, waited = self._opener.take_build(task_id, name)
            if ingested is not None or waited:
                self._metrics.standby_seeded(task_id, name, ingested, waited)

    def close_standby(self, task_id: TaskId) -> None:
        if task_id not in self.standbys:
            self._opener.forget_standby(task_id)  # still waiting for a build
            return
        standby = self.standbys[task_id]
        self._drop_standby(task_id)
        standby.close()

    def _drop_standby(self, task_id: TaskId) -> None:
        """Forget a standby without closing its stores (closed, or now an active task's)."""
        standbys = dict(self.standbys)
        del standbys[task_id]
        self.standbys = standbys
        self._metrics.task_closed(task_id)

    def _recycled_or_open(
        self, recycled: dict[str, StateStore], name: str, task_id: TaskId
    ) -> StateStore:
        """The standby's open copy of store ``name`` the first time (a copy judged untrusted
        is set aside and opened again: then from disk), else the store opened as for any
        active task."""
        store = recycled.pop(name, None)
        if store is not None:
            return store
        return self._opener.open(name, task_id, active=True)

    def replay_standbys(self) -> int:
        """Replay every standby; one whose changelog was truncated or recreated is rebuilt.

        First open the standbys whose Spark builds settled (ingested: only the
        tail replays; given up on: everything does).
        """
        for task_id in self._opener.poll_standby_builds():
            self._open_standby(task_id)
        replayed = 0
        for standby in list(self.standbys.values()):
            try:
                replayed += standby.replay(self._log)
            except ChangelogMismatchError as mismatch:
                logger.warning("%s. Rebuilding the standby from the changelog", mismatch.problem)
                self.close_standby(standby.id)
                self._open_standby(standby.id)
        return replayed

    # -- all of them ----------------------------------------------------------------

    def close_all(self) -> None:
        """Close every task, active and standby; a failure to close one closes the others."""
        tasks: list[StreamTask | StandbyTask] = [*self.active.values(), *self.standbys.values()]
        for task in tasks:
            try:
                task.close()
            except Exception as exc:  # close the others regardless
                logger.warning("closing task %s failed: %s", task.id, exc)
        for task_id in self._opener.waiting_standbys():
            self._opener.forget_standby(task_id)
        self.active, self.standbys = {}, {}

    def local_store_partitions(self, store: str) -> list[LocalStorePartition]:
        """The copies of ``store`` these tasks hold: active (running or restoring) and standby."""
        found: list[LocalStorePartition] = []
        for task_id, task in self.active.items():
            task_store = task.stores.get(store)
            if task_store is None:
                continue
            restoring = task.restore_lag(store)
            changelog = task_store.logging.changelog
            position = 0
            if changelog is not None:
                position = next_offset_after(
                    task_store.store.committed_offset(changelog),
                    self._log.beginning_offset(changelog),
                )
            found.append(
                LocalStorePartition(
                    store=store,
                    partition=task_id.partition,
                    task=task_id,
                    role=StoreRole.ACTIVE,
                    running=restoring is None and task.running,
                    # A running copy is its task's committed state, as of its last commit.
                    lag=restoring or LagInfo(position, position, task.committed_at_ms),
                    open_reader=task_store.reader,
                    disk_bytes=task_store.store.disk_bytes,
                    committed_at_ms=None if restoring else task.committed_at_ms,
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
                    disk_bytes=standby_store.disk_bytes,
                )
            )
        return found


def _latest(first: int | None, second: int | None) -> int | None:
    """The later of two as-of times (None: unknown)."""
    known = [time for time in (first, second) if time is not None]
    return max(known) if known else None
