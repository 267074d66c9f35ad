"""One running instance of a stream application (Kafka Streams' ``KafkaStreams`` object).

An instance resolves its topology against the log (topics, task counts),
spreads its tasks over ``num.stream.threads`` stream threads, and runs them
until it is closed. ``close()`` asks every thread to commit what it processed
and close its stores; a crash instead leaves the last commit, which the next
start resumes from (see :mod:`eddyline_runtime.engine.stream_thread`).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from eddyline_runtime.assignor import Assignment, Member, MemberTasks, assign
from eddyline_runtime.config import IsolationLevel, ProcessingGuarantee, StreamsConfig
from eddyline_runtime.engine.global_thread import (
    GlobalStoreError,
    GlobalStores,
    GlobalStreamThread,
)
from eddyline_runtime.engine.queryable import (
    HostInfo,
    KeyQueryMetadata,
    LocalStorePartition,
)
from eddyline_runtime.engine.stream_thread import (
    CommitListener,
    StreamThread,
    ThreadSetup,
    ThreadState,
)
from eddyline_runtime.engine.task_manager import RestoreListener
from eddyline_runtime.engine.task_release import LayoutProbe, TaskRelease, probe_layout
from eddyline_runtime.engine.topics import TopicLayout, resolve_topics, store_homes
from eddyline_runtime.errors import ConfigError, EddylineError
from eddyline_runtime.log import Log
from eddyline_runtime.metrics import MetricName, MetricsRegistry
from eddyline_runtime.partitions import TaskId, TopicPartition, partition_for_key
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.restore.ingest.build_wait import PendingRestore
from eddyline_runtime.restore.replay import LagInfo
from eddyline_runtime.state import StoreReader
from eddyline_runtime.state.relocation import RelocationReport, relocate_state
from eddyline_runtime.state.state_directory import prune_quarantine, task_directory

logger = logging.getLogger(__name__)

# A task's thread: the partitions of one sub-topology go round-robin over the threads, and
# each sub-topology starts at another thread (its id times this stride, modulo the thread
# count), so the partitions 0 of all sub-topologies do not pile onto thread 0. Any stride
# sharing no factor with the thread count does that; a prime above any sensible
# num.stream.threads shares none with all of them.
_SUBTOPOLOGY_STRIDE = 7919


class InstanceState(enum.StrEnum):
    CREATED = "CREATED"
    REBALANCING = "REBALANCING"  # Kafka's name for "tasks are being created and restored"
    RUNNING = "RUNNING"
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    ERROR = "ERROR"


class InstanceNotStartedError(EddylineError):
    """Asked for something only a started instance knows (its topic layout, say)."""


class StreamsFailedError(EddylineError):
    """A stream thread stopped on an error; the instance stopped with it."""


def refuse_unlogged_stores(topology: Topology, config: StreamsConfig) -> None:
    """Refuse a store without a changelog on the state paths that need one.

    Kafka Streams keeps no standby for such a store and wipes it after a crash under
    exactly-once; eddyline has neither behaviour, so it refuses the configuration
    rather than run a standby with nothing to follow or keep a store that a crash
    left ahead of (or behind) the committed input offsets."""
    unlogged = sorted(name for name, spec in topology.stores.items() if not spec.logged)
    if not unlogged:
        return
    stores = ", ".join(f'"{name}"' for name in unlogged)
    what = f"store {stores} has" if len(unlogged) == 1 else f"stores {stores} have"
    disabled = (
        f"{what} logging disabled (Materialized.with_logging_disabled or StoreSpec(logged=False))"
    )
    if config.num_standby_replicas > 0:
        raise ConfigError(
            "num.standby.replicas",
            config.num_standby_replicas,
            f"0 while {disabled}",
            hint="a standby keeps its copy by reading the store's changelog, and such a "
            "store has none: enable its logging or set num.standby.replicas=0",
        )
    if config.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE_V2:
        raise ConfigError(
            "processing.guarantee",
            str(config.processing_guarantee),
            f"at_least_once while {disabled}",
            hint="exactly-once recovery after a crash rebuilds stores from their "
            "changelogs, and such a store has none: enable its logging or use "
            "processing.guarantee=at_least_once",
        )


class StreamsInstance:
    """One member of a stream application's group; see the module docstring."""

    def __init__(
        self,
        topology: Topology,
        config: StreamsConfig,
        log: Log,
        *,
        instance_id: str = "0",
        member: Member | None = None,
        assignment: Assignment | None = None,
        on_commit: Sequence[CommitListener] = (),
        on_restore: Sequence[RestoreListener] = (),
        release_probe: LayoutProbe = probe_layout,
    ) -> None:
        """``member``: this instance in the group (default: ``instance_id`` at
        ``application.server``); ``assignment``: who runs what (default: this
        instance alone, running every task). Change it with :meth:`apply_assignment`.
        ``release_probe``: how a task's previous owner is asked whether it still runs it
        (:mod:`~eddyline_runtime.engine.task_release`; its ``/v1/layout`` by default)."""
        self.topology = topology
        self.config = config
        self.log = log
        self.instance_id = instance_id
        self.member = member or Member(instance_id, address=config.application_server)
        self.metrics = MetricsRegistry()
        # Every metric's value as the threads closed (stores drop theirs on close).
        self.final_metrics: dict[MetricName, float] = {}
        self.state = InstanceState.CREATED
        self.layout: TopicLayout | None = None
        self.threads: list[StreamThread] = []
        self._thread_count = config.num_stream_threads  # lowered to the task count at start
        self.assignment = assignment
        self.relocation: RelocationReport | None = None
        self._on_commit = tuple(on_commit)
        self._on_restore = tuple(on_restore)
        # Stores this instance set aside for a rebuild (open_trusted): where each went.
        self.stores_set_aside: list[Path] = []
        # On its way out (a cluster pod after SIGTERM): reported, so that the membership
        # authority hands its active tasks over and gives it nothing new.
        self.leaving = False
        self._lock = threading.Lock()
        # Tasks moving here wait for their previous owner to commit and close them first.
        self.release = TaskRelease(
            self.member.id,
            caught_up=self._copy_caught_up,
            deliver=self._redeliver,
            fence=self._fence_previous_owners,
            probe=release_probe,
        )
        # Global stores (GlobalKTable): held whole here, loaded by the global thread before
        # any stream thread starts (engine/global_thread.py).
        self.global_stores = GlobalStores(
            topology,
            config,
            log,
            metrics=self.metrics,
            on_set_aside=self.stores_set_aside.append,
        )
        self.global_thread: GlobalStreamThread | None = None
        # Global store -> the read-only view every task gets; filled once they are open.
        self._global_views: dict[str, object] = {}

    def start(self) -> None:
        with self._lock:
            if self.state is not InstanceState.CREATED:
                raise EddylineError(f"an instance starts once; this one is {self.state}")
            refuse_unlogged_stores(self.topology, self.config)
            if self.config.ensure_explicit_internal_resource_naming:
                self.topology.ensure_explicit_naming()
            layout = resolve_topics(
                self.topology,
                self.config.application_id,
                self.log,
                window_changelog_additional_retention_ms=(
                    self.config.windowstore_changelog_additional_retention_ms
                ),
                dead_letter_queue_topic=self.config.errors_dead_letter_queue_topic_name,
            )
            # KIP-816, before any store opens: stores whose sub-topology ordinal
            # changed move to where this topology expects them (or we refuse).
            self.relocation = relocate_state(
                self.config.state_dir,
                store_homes(self.topology, layout),
                automatic=self.config.automatic_state_relocation,
            )
            relocation = self.relocation
            # KIP-816 at this start: how many stores moved, and how long it took (an
            # operator's upgrade reads them to tell relocation from the rest of a start).
            self.metrics.register(
                MetricName.of("stream-metrics", "state-relocation-seconds"),
                lambda: relocation.seconds,
                description="Seconds this start spent relocating state directories (KIP-816)",
            )
            self.metrics.register(
                MetricName.of("stream-metrics", "state-relocated-stores"),
                lambda: float(len(relocation.moves)),
                description="Stores whose directories this start relocated (KIP-816)",
            )
            # The bound a standby's lag is judged by (KIP-441), beside standby-offset-lag,
            # so the chart's EddylineStandbyLagging alert compares the two per pod.
            self.metrics.register(
                MetricName.of("stream-metrics", "acceptable-recovery-lag"),
                lambda: float(self.config.acceptable_recovery_lag),
                description=(
                    "acceptable.recovery.lag: the records a copy may trail its changelog by "
                    "and still take its task over without warming up (KIP-441)"
                ),
            )
            # Stores set aside by earlier rebuilds are kept for an operator to republish,
            # within the configured count and age.
            for gone in prune_quarantine(
                self.config.state_dir,
                max_stores=self.config.state_quarantine_max_stores,
                retention_seconds=self.config.state_quarantine_retention_ms / 1000,
            ):
                logger.info("deleted %s: older than the quarantine keeps", gone)
            # A rebuild that set a store aside is an incident: an operator must see the count.
            self.metrics.register(
                MetricName.of("stream-metrics", "state-set-aside-stores-total"),
                lambda: float(len(self.stores_set_aside)),
                description="Stores a rebuild set aside in the quarantine since the start",
            )
            # Tasks moved here: how many their previous owner released (promoted with
            # nothing to restore), how many waited the whole bound, and the last wait.
            release = self.release
            outcomes = release.outcomes
            self.metrics.register(
                MetricName.of("stream-metrics", "task-released-total"),
                lambda: float(release.counts["released"]),
                description="Tasks moved here that their previous owner released in time",
            )
            self.metrics.register(
                MetricName.of("stream-metrics", "task-release-bound-reached-total"),
                lambda: float(release.counts["bound"]),
                description="Tasks moved here that waited the whole bound for their release",
            )
            self.metrics.register(
                # In seconds, Prometheus' base unit (promtool refuses "_ms" in a name).
                MetricName.of("stream-metrics", "task-release-last-wait-seconds"),
                lambda: outcomes[-1].waited_seconds if outcomes else 0.0,
                description="How long, in seconds, the last task moved here waited for its release",
            )
            self.state = InstanceState.REBALANCING
            self.layout = layout
            if self.assignment is None:
                self.assignment = assign(
                    layout.tasks(),
                    [self.member],
                    self.config.num_standby_replicas,
                    stateful=layout.stateful_tasks(),
                )
            setup = ThreadSetup(
                topology=self.topology,
                layout=layout,
                config=self.config,
                log=self.log,
                metrics=self.metrics,
                instance_id=self.instance_id,
                on_commit=self._on_commit,
                on_restore=self._on_restore,
                on_set_aside=self.stores_set_aside.append,
                global_stores=self._global_views,
            )
            # A thread without a task would only cost memory: start no more than
            # the topology has tasks (assignments change, the task count does not).
            self._thread_count = min(self.config.num_stream_threads, max(1, len(layout.tasks())))
            if self._thread_count < self.config.num_stream_threads:
                logger.info(
                    "starting %d stream threads, not num.stream.threads=%d: the topology has "
                    "%d tasks",
                    self._thread_count,
                    self.config.num_stream_threads,
                    len(layout.tasks()),
                )
            shares = self._thread_shares(self.assignment)
            self.threads = [
                StreamThread(index, active, setup, standby)
                for index, (active, standby) in enumerate(shares)
            ]
            if not self.topology.global_stores:
                for thread in self.threads:
                    thread.start()
                return
            # Kafka's order: global stores bootstrapped first, then the stream threads, so
            # no record is joined against a global table still loading.
            self.global_thread = GlobalStreamThread(
                self.global_stores, on_bootstrapped=self._start_stream_threads
            )
            self.global_thread.start()

    def _start_stream_threads(self) -> None:
        """The global stores are bootstrapped (called on the global thread): the stream
        threads start, each task reading the global stores' views."""
        with self._lock:
            if self.state is not InstanceState.REBALANCING:
                return  # closed while the global stores loaded
            for name in self.global_stores.names:
                self._global_views[name] = self.global_stores.view(name)
            for thread in self.threads:
                thread.start()

    def apply_assignment(self, assignment: Assignment) -> None:
        """A rebalance: run this member's share of ``assignment`` from now on.

        Threads commit and close the active tasks they lose before anything
        else, promote standbys they become active for (restoring only the
        tail), and open new standbys.
        """
        with self._lock:
            previous, self.assignment = self.assignment, assignment
            if not self.threads:
                return
            # A task moving here from a member still in the group stays a standby until
            # that member committed and closed it (engine/task_release.py).
            held = self.release.hold(previous, assignment)
            for thread, (active, standby) in zip(
                self.threads, self._thread_shares(assignment, held), strict=True
            ):
                thread.assign(active, standby)

    def _redeliver(self) -> None:
        """The release watcher let some held task go: hand the threads the assignment in
        force again, now with it active (a thread promotes its standby copy in place)."""
        with self._lock:
            assignment = self.assignment
            if (
                assignment is None
                or not self.threads
                or self.state
                in (
                    InstanceState.PENDING_SHUTDOWN,
                    InstanceState.NOT_RUNNING,
                )
            ):
                return
            held = self.release.held()
            for thread, (active, standby) in zip(
                self.threads, self._thread_shares(assignment, held), strict=True
            ):
                thread.assign(active, standby)

    def _fence_previous_owners(self, tasks: Sequence[TaskId]) -> dict[TaskId, Exception]:
        """Under exactly-once, open (and close) a producer for each task's transactional
        id, all at once (``Log.transactional_producers``: one round trip for them all on
        Kafka): when that returns, every transaction an earlier owner made with an id is
        decided (its markers are in the changelogs, an open one aborted) and its producer
        can commit nothing more, so a changelog end read afterwards is final until this
        member writes (engine/task_release.py). The stream thread's own producer, opened at
        the promotion, fences this one in turn. Under at-least-once an owner appends
        without transactions: there is nothing to fence. Returns the tasks whose id could
        not be fenced, each with its error."""
        if self.config.processing_guarantee is not ProcessingGuarantee.EXACTLY_ONCE_V2:
            return {}
        ids = {task: f"{self.config.application_id}-{task}" for task in tasks}
        started = self.log.transactional_producers(list(ids.values()))
        failed: dict[TaskId, Exception] = {}
        for task, transactional_id in ids.items():
            try:
                started.take(transactional_id).close()
            except Exception as error:  # that id's start failed; the others are fenced
                failed[task] = error
        return failed

    def _copy_caught_up(self, task: TaskId) -> bool:
        """This member's standby copy of ``task`` read everything its previous owner's final
        commit wrote to the task's changelogs (a copy not open, waiting for a Spark build,
        has nothing to wait for; one its thread has yet to open is not caught up: promoted
        then, its store restored the tail on the critical path, 7 records in the soak of
        issue 38, where the task had moved away and back within a second).

        Called once that owner let the task go *and* was fenced
        (:meth:`_fence_previous_owners`): no earlier owner can commit to the changelogs any
        more and every transaction it made is decided, so the end read here is final (the
        invariant, engine/task_release.py). The old owner's word that it released the task
        was not enough: a copy compared with an end read before a commit's markers landed
        (36 records at an eviction whose release and catch-up both took 2 ms), or before a
        commit the owner still made, was promoted with records still to read and replayed
        them on the critical path (12 records, caught up in the release's own round; issue
        38). ``Log.undecided`` is still asked: under at-least-once nothing is fenced, and a
        decided changelog is the cheap half of the same rule."""
        for thread in self.threads:
            standby = thread.standbys.get(task)
            if standby is None:
                if thread.standby_to_open(task):
                    return False
                continue
            return all(
                not self.log.undecided(changelog)
                and standby.lag(store).current_offset_position >= self.log.end_offset(changelog)
                for store, changelog in standby.changelogs.items()
            )
        return True

    def handed_over(self) -> bool:
        """Whether a leaving member may exit: the assignment in force gives it no active
        task and its threads committed and closed every one they ran (or dropped it, fenced
        by its new owner), or nobody is left to take them (:meth:`Assignment.handed_over`).

        Committed, not only reassigned: until a thread takes the new assignment, commits
        the tasks it loses and closes them, their new owners wait for this member's
        ``/v1/layout`` to stop naming them (engine/task_release.py). Exiting before that
        left the last commit to ``close()`` while the layout could no longer be asked, and
        a new owner promoted its copy before that commit was readable (a tail replayed on
        the critical path)."""
        with self._lock:
            assignment = self.assignment
        if assignment is None:
            return True
        if assignment.active.get(self.member.id):
            # Still given tasks: done only when every member is leaving (nobody takes over;
            # close() makes the final commits).
            return assignment.handed_over(self.member.id)
        # A thread drops a task from its map only after its final commit (or its fencing).
        return not any(thread.active for thread in self.threads)

    @property
    def closing(self) -> bool:
        """close() was called: the stores are being (or were) committed and closed, so they
        answer no more queries; the layout still says which tasks are not closed yet."""
        return self.state in (InstanceState.PENDING_SHUTDOWN, InstanceState.NOT_RUNNING)

    def _thread_shares(
        self, assignment: Assignment, held: frozenset[TaskId] = frozenset()
    ) -> list[tuple[frozenset[TaskId], frozenset[TaskId]]]:
        """Split this member's tasks over the threads; a task always lands on the same one.
        ``held`` active tasks run as standbys for now (waiting for their release)."""
        mine = (
            assignment.tasks_of(self.member.id)
            if self._has_share(assignment)
            # Given nothing (a pod before its first assignment, and every pod while an
            # upgrade's membership is the reset one): the copies on its disk run as
            # standbys, which only read their changelogs, so the pod still answers
            # queries from them (docs/queries.md, "Through a topology upgrade").
            else MemberTasks(frozenset(), self._copies_on_disk())
        )
        if held:
            mine = MemberTasks(mine.active - held, mine.standby | held, mine.warmup)
        count = self._thread_count

        def thread_of(task: TaskId) -> int:
            return (task.subtopology * _SUBTOPOLOGY_STRIDE + task.partition) % count

        return [
            (
                frozenset(t for t in mine.active if thread_of(t) == index),
                # A warm-up (assignor point 10) replays its changelog as a standby does,
                # and reports its lag the same way; only the assignor tells them apart.
                frozenset(t for t in mine.standby | mine.warmup if thread_of(t) == index),
            )
            for index in range(count)
        ]

    def _has_share(self, assignment: Assignment) -> bool:
        """This member has a share of ``assignment``, maybe empty: it is listed, and the
        assignment hands out tasks when the topology has any. An upgrade's reset membership
        hands out none (old task ids name other tasks in the new revision) and lists the
        members only for their query addresses: nobody has a share of it. A topology of
        global stores only has no task to hand out: a listed member's share is empty."""
        if self.member.id not in assignment.active:
            return False
        return bool(assignment.tasks) or self.layout is None or not self.layout.tasks()

    def _copies_on_disk(self) -> frozenset[TaskId]:
        """The stateful tasks of this topology with a persistent store's directory in
        state.dir (after relocation, so under this topology's ordinals)."""
        if self.layout is None:
            return frozenset()
        persistent = [name for name, spec in self.topology.stores.items() if spec.persistent]
        return frozenset(
            task
            for task in self.layout.stateful_tasks()
            if any(
                (task_directory(self.config.state_dir, task) / store).is_dir()
                for store in persistent
            )
        )

    def _layout(self) -> TopicLayout:
        if self.layout is None:
            raise InstanceNotStartedError(
                "the instance has not started: call start() first (queries: retry shortly)"
            )
        return self.layout

    def close(self, timeout: float | None = None) -> None:
        """Commit, close every store and stop; raises what made a thread fail, if any."""
        with self._lock:
            if self.state in (InstanceState.CREATED, InstanceState.NOT_RUNNING):
                self.state = InstanceState.NOT_RUNNING
                return
            self.state = InstanceState.PENDING_SHUTDOWN
        self.release.close()
        for thread in self.threads:
            thread.request_stop()
        for thread in self.threads:
            thread.join(timeout)
        # After the stream threads: no processor reads a global store once it closed.
        self._stop_global_thread(timeout)
        for thread in self.threads:
            self.final_metrics.update(thread.final_metrics)
        failed = self._failure()
        self.state = InstanceState.ERROR if failed else InstanceState.NOT_RUNNING
        if failed is not None:
            raise failed

    def check(self) -> InstanceState:
        """Update and return the state; raises StreamsFailedError once a thread failed."""
        failed = self._failure()
        if failed is not None:
            for thread in self.threads:
                thread.request_stop()
            for thread in self.threads:
                thread.join()
            self._stop_global_thread(None)
            self.state = InstanceState.ERROR
            raise failed
        self._refresh_state()
        return self.state

    def _refresh_state(self) -> None:
        """REBALANCING becomes RUNNING once every thread has created its tasks."""
        if self.state is InstanceState.REBALANCING and all(
            thread.state is ThreadState.RUNNING for thread in self.threads
        ):
            self.state = InstanceState.RUNNING

    # -- interactive queries (KIP-535) -----------------------------------------------

    def local_store_partitions(self, store: str) -> list[LocalStorePartition]:
        """This instance's copies of ``store``, active and standby, by partition."""
        found: list[LocalStorePartition] = []
        for thread in self.threads:
            found.extend(thread.local_store_partitions(store))
        return sorted(found, key=lambda local: (local.partition, local.role.value))

    def global_store(self, store: str, isolation: IsolationLevel | None = None) -> StoreReader:
        """A read view of the global store ``store``, this instance's whole copy (in-process
        queries; any member answers any key). Raises :class:`GlobalStoreError` when the
        topology has no such global store or its bootstrap is not over yet."""
        if store not in self.topology.global_stores:
            known = ", ".join(sorted(self.topology.global_stores)) or "none"
            raise GlobalStoreError(f'no global store named "{store}" (global stores: {known})')
        if not self.global_stores.bootstrapped.is_set():
            raise GlobalStoreError(
                f'global store "{store}" is still loading its topic (bootstrap before '
                "processing starts); retry shortly"
            )
        return self.global_stores.reader(store, isolation)

    def restore_pending(self) -> list[PendingRestore]:
        """Stores that wait for a Spark restore build (restorePending): of active tasks,
        standbys and warm-ups."""
        return sorted(
            (p for thread in self.threads for p in thread.restore_pending.values()),
            key=lambda p: (p.store, p.changelog.partition),
        )

    def all_local_store_partition_lags(self) -> dict[str, dict[int, LagInfo]]:
        """Store -> partition -> LagInfo for every store partition held here that has a
        changelog (an unlogged store has nothing to lag behind, as in Kafka Streams); a
        global store's partitions are its topic's."""
        lags: dict[str, dict[int, LagInfo]] = {
            name: self.global_stores.lags(name) for name in self.global_stores.names
        }
        for store, spec in self.topology.stores.items():
            if not spec.logged:
                continue
            for local in self.local_store_partitions(store):
                lags.setdefault(store, {})[local.partition] = local.lag
        return lags

    def key_query_metadata(self, store: str, key: bytes) -> KeyQueryMetadata | None:
        """Which hosts hold ``key`` of ``store`` (its serialized form), and its partition.

        None when the topology has no store of that name (as Kafka Streams'
        ``queryMetadataForKey`` answers null, and the HTTP API 404). Before
        this instance knows an assignment that covers the key's task: no host, but
        the key's partition (a property of the key and the topology, not of the
        assignment), so that a router still finds the copies members hold while no
        assignment names them (an upgrade's reset membership; docs/queries.md).
        """
        layout = self._layout()
        subtopology = next((sub for sub in layout.subtopologies if store in sub.stores), None)
        if subtopology is None:
            return None
        partition = partition_for_key(key, layout.partitions[subtopology.id])
        task = TaskId(subtopology.id, partition)
        assignment = self.assignment
        if assignment is None or task not in assignment.tasks:
            return KeyQueryMetadata(None, (), partition)

        def host(member_id: str) -> HostInfo | None:
            address = assignment.member(member_id).address
            return None if address is None else HostInfo.parse(address)

        standbys = tuple(
            h for h in (host(m) for m in assignment.standby_owners(task)) if h is not None
        )
        return KeyQueryMetadata(host(assignment.active_owner(task)), standbys, partition)

    def ready(self) -> bool:
        """Every global store bootstrapped and every active task assigned here running
        (restored): Kubernetes' readiness."""
        if not self.global_stores.bootstrapped.is_set():
            return False
        self._refresh_state()
        if self.state is not InstanceState.RUNNING or self.assignment is None:
            return False
        if not self._has_share(self.assignment):
            return False  # no share yet: on a cluster, the operator has not assigned it
        wanted = self.assignment.tasks_of(self.member.id).active
        running = {
            task_id
            for thread in self.threads
            for task_id, task in thread.active.items()
            if task.running
        }
        return wanted <= running

    def serving(self) -> bool:
        """This instance can answer interactive queries: started and not closing, no thread
        failed, every global store bootstrapped, and at least one copy of a store open here
        (active, standby or restoring; a topology with only global stores needs none).

        The query side's readiness (``/readyz/serving``), split from :meth:`ready` (the
        processing one): a pod restoring, or waiting for an assignment that moves tasks to it,
        still answers from the copies it holds, within a caller's ``allow_stale`` or
        ``max_staleness_ms``; docs/queries.md says which consumer uses which signal."""
        if not self.healthy() or not self.global_stores.bootstrapped.is_set():
            return False
        if self.state not in (InstanceState.REBALANCING, InstanceState.RUNNING):
            return False  # not started yet, or closing: store reads answer 503
        partitioned = list(self.topology.stores)
        if not partitioned:
            return True
        return any(self.local_store_partitions(store) for store in partitioned)

    def healthy(self) -> bool:
        """No stream thread failed (liveness)."""
        return self._failure() is None and self.state is not InstanceState.ERROR

    def _stop_global_thread(self, timeout: float | None) -> None:
        if self.global_thread is not None:
            self.global_thread.request_stop()
            self.global_thread.join(timeout)

    def _failure(self) -> StreamsFailedError | None:
        glob = self.global_thread
        if glob is not None and glob.error is not None:
            error = StreamsFailedError(f"{glob.name} failed: {glob.error}")
            error.__cause__ = glob.error
            return error
        for thread in self.threads:
            if thread.error is not None:
                error = StreamsFailedError(f"{thread.name} failed: {thread.error}")
                error.__cause__ = thread.error
                return error
        return None

    # -- progress ---------------------------------------------------------------------

    @property
    def processed(self) -> int:
        return sum(thread.processed_total for thread in self.threads)

    def input_lags(self) -> dict[TopicPartition, int | None]:
        lags: dict[TopicPartition, int | None] = {}
        for thread in self.threads:
            lags.update(thread.input_lags())
        return lags

    def caught_up(self) -> bool:
        """Running, every input fetched to its end, and everything processed committed.

        What the answer covers must be committed when it is given, so a caller may read
        the outputs (``read_committed`` under exactly-once) and the committed offsets at
        once. A thread's ``idle`` flag alone cannot say that: it is set at the end of an
        iteration and stays set while the next one processes and commits, so a record
        produced meanwhile was processed (its position at the log's end) but not yet
        committed. Per task, every input position must be committed (nothing left for
        the next commit) and at the log's end; then each thread's count of records
        processed since its last commit must be 0, read after the positions: it is
        cleared only at the end of a commit, once its input offsets are written too
        (at-least-once writes them after the tasks' stores).
        """
        if self.check() is not InstanceState.RUNNING:
            return False
        # A task fenced away and due to be taken back is assigned but not running: its
        # inputs are not at their end for this member yet. Read before ``idle``, which a
        # thread clears before it takes such an assignment and sets again only after an
        # iteration with the tasks it creates.
        if any(thread.assignment_waiting for thread in self.threads):
            return False
        if not all(thread.idle and thread.buffered() == 0 for thread in self.threads):
            return False
        # Global topics are inputs too: every record on them applied to the global stores.
        if any(self.global_stores.behind(name) for name in self.global_stores.names):
            return False
        for thread in self.threads:
            for task in thread.tasks:
                if task.offsets_to_commit():
                    return False  # processed, not committed yet
                # Ask the log, not the lag last fetched: a record produced since counts.
                for tp, position in list(task.consumed.items()):
                    if position < self.log.end_offset(tp):
                        return False
        # A commit that returned may still have its markers on the way (Kafka): until they
        # land, the end above is below what it wrote, such as a repartition topic's records
        # another task of this instance has yet to read. Asked last: it is a round trip.
        for thread in self.threads:
            for task in thread.tasks:
                if any(self.log.undecided(tp) for tp in list(task.consumed)):
                    return False
        return all(thread.processed_since_commit == 0 for thread in self.threads)

    def wait_until_caught_up(self, timeout: float, *, poll_seconds: float = 0.05) -> None:
        """Block until :meth:`caught_up` (inputs that keep growing never catch up)."""
        deadline = time.monotonic() + timeout
        while not self.caught_up():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"not caught up after {timeout} s: lags {self.input_lags()}, state {self.state}"
                )
            time.sleep(poll_seconds)
