"""One task partition's history through the engine's own task code, ending in SSTs.

What runs is what a pod runs for the task (and what :mod:`eddyline_runtime.testing`
runs): a :class:`~eddyline_runtime.engine.task.StreamTask` with its
:class:`~eddyline_runtime.engine.partition_group.PartitionGroup` (KIP-695 timestamp
order), :class:`~eddyline_runtime.engine.task_topology.TaskTopology` and
:class:`~eddyline_runtime.engine.task_store.TaskStore` over RocksDB. Only the log
and the stream thread stand aside: the history is read up to fixed end offsets
and fed in chunks, and the commits write nothing to the log (the outputs of the
history are not re-emitted; see ``docs/backfill.md``).

The order (the backfill's reference order): per input partition by offset; across
co-partitioned inputs, the PartitionGroup's timestamp order with every partition
buffered, so it never waits and never proceeds without a partition that still has
history (its lag is the history left to feed). A live run may differ where its
fetches left an input empty and ``max.task.idle.ms`` let it proceed.
"""

from __future__ import annotations

import datetime
import json
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Final

from eddyline_runtime import __version__
from eddyline_runtime.backfill.changelog_writer import (
    backfill_transactional_id,
    write_store_changelog,
)
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.partition_group import PartitionGroup
from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.record_failures import RecordFailures
from eddyline_runtime.engine.task import StreamTask
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.engine.topics import (
    TopicLayout,
    changelog_topics,
    physical_topics,
)
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.log import FetchedColumns, Log
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.restore.manifest import (
    MANIFEST_FORMAT_VERSION,
    ChangelogRef,
    ManifestFile,
    RestoreManifest,
    build_directory,
    sst_name,
    write_manifest,
)
from eddyline_runtime.state import RocksDBStore, RocksDBStoreOptions, StateStore, store_directory
from eddyline_runtime.state.sst_files import SortedFileWriter

# Records fetched per input partition at a time: bounds a task's buffered history.
FETCH_RECORDS: Final = 10_000
# Records processed between two commits of the task's stores (a commit flushes the
# record cache into RocksDB; nothing is written to the log).
COMMIT_RECORDS: Final = 50_000
RESULT_NAME: Final = "backfill-result.json"
# How often a task says how far its history has got (HistoryProgress), at most.
PROGRESS_SECONDS: Final = 1.0


class BackfillError(EddylineError):
    """A backfill cannot run as asked (bad input offsets, unknown stores, ...)."""


class NotBackfillableError(BackfillError):
    """The topology has a shape this backfill does not build yet."""


@dataclass(frozen=True, slots=True)
class BackfillPlan:
    """What the driver fixes before the job; passed to every task (JSON-encodable)."""

    application: str
    topology: str  # module:function, loaded on every executor
    stores: tuple[str, ...]
    log_url: str
    output: str
    build_id: str
    # Input partition ("topic:partition") -> the offset the history ends at (exclusive).
    end_offsets: Mapping[str, int]
    properties: Mapping[str, object] = field(default_factory=dict)
    # Input partition -> the offset the history starts at, fixed by the driver for a
    # backfill from a timestamp; empty: each partition's first retained offset.
    start_offsets: Mapping[str, int] = field(default_factory=dict)
    # A changelog holding another state (an earlier attempt's, or a rolled-back
    # revision's) is replaced rather than refused (changelog_writer.py, "Superseding"):
    # only when no running revision has the stores.
    supersede: bool = False

    def encode(self) -> str:
        return json.dumps(
            {
                "application": self.application,
                "topology": self.topology,
                "stores": list(self.stores),
                "log_url": self.log_url,
                "output": self.output,
                "build_id": self.build_id,
                "end_offsets": dict(self.end_offsets),
                "properties": dict(self.properties),
                "start_offsets": dict(self.start_offsets),
                "supersede": self.supersede,
            }
        )

    @classmethod
    def decode(cls, text: str) -> BackfillPlan:
        raw = json.loads(text)
        return cls(
            application=raw["application"],
            topology=raw["topology"],
            stores=tuple(raw["stores"]),
            log_url=raw["log_url"],
            output=raw["output"],
            build_id=raw["build_id"],
            end_offsets=dict(raw["end_offsets"]),
            properties=dict(raw["properties"]),
            start_offsets=dict(raw.get("start_offsets", {})),
            supersede=bool(raw.get("supersede", False)),
        )

    def end_offset(self, tp: TopicPartition) -> int:
        return self.end_offsets[partition_key(tp)]

    def start_offset(self, tp: TopicPartition, log: Log) -> int:
        """Where ``tp``'s history starts: the fixed start, or the first retained offset.
        A fixed start that retention deleted since is refused: those records are gone."""
        first = log.beginning_offset(tp)
        start = self.start_offsets.get(partition_key(tp))
        if start is None:
            return first
        if start < first:
            raise BackfillError(
                f"the history of {tp} starts at {start}, but retention deleted the records "
                f"before {first} since the backfill began: backfill from a later timestamp, "
                "or from a longer-retained log"
            )
        return start


def partition_key(tp: TopicPartition) -> str:
    return f"{tp.topic}:{tp.partition}"


@dataclass(frozen=True, slots=True)
class HistoryProgress:
    """How far a task partition's history has got: its input offsets read, of the span from
    its start offsets to its end offsets (records, transaction markers among them)."""

    read: int
    total: int


@dataclass(frozen=True, slots=True)
class TaskBackfill:
    """What one task partition's run built: its manifests and where its history ends."""

    task: TaskId
    records: int
    # Store -> its manifest, not written yet: the driver writes every task's once all
    # succeeded (write_manifests), so a failed or retried attempt leaves no manifest.
    manifests: Mapping[str, RestoreManifest]
    keys: Mapping[str, int]
    end_offsets: Mapping[str, int]


def backfill_layout(
    topology: Topology, application_id: str, input_partitions: Mapping[str, int]
) -> TopicLayout:
    """The layout a run over these input topics has: named as ``resolve_topics`` names
    them, one task per partition. Refuses what this backfill does not build yet: more
    than one sub-topology (a repartition or a through-topic) and inputs that are not
    co-partitioned; and what it cannot build right: a global store (docs/backfill.md)."""
    if topology.global_stores:
        names = ", ".join(f'"{name}"' for name in sorted(topology.global_stores))
        # The task is built without global stores: a join against one would read its
        # contents of today for every historical record, not its contents at that time.
        raise NotBackfillableError(
            f"the topology has global stores ({names}): a backfill would join every "
            "historical record against their current contents, not those of its time. "
            "Backfill a revision without the GlobalKTable, or replay the history through "
            "the app"
        )
    subtopologies = tuple(topology.subtopologies())
    if len(subtopologies) != 1:
        stores = sorted(store for sub in subtopologies for store in sub.stores)
        raise NotBackfillableError(
            f"the topology has {len(subtopologies)} sub-topologies (a repartition links "
            f"them; stores: {', '.join(stores) or 'none'}): backfilling behind a "
            "repartition is not supported yet. Backfill a topology with one "
            "sub-topology, or replay the history through the app"
        )
    (sub,) = subtopologies
    physical = physical_topics(topology, application_id, subtopologies)
    counts = set()
    for topic in sub.source_topics:
        name = physical[topic]
        if name not in input_partitions:
            raise BackfillError(
                f'input topic "{name}" is not in the log; create it, or check the topology'
            )
        counts.add(input_partitions[name])
    if len(counts) != 1:
        raise NotBackfillableError(
            f"inputs {', '.join(sorted(physical[t] for t in sub.source_topics))} have "
            f"different partition counts ({sorted(counts)}): they are not co-partitioned"
        )
    changelogs = changelog_topics(topology, application_id, subtopologies)
    (partitions,) = counts
    return TopicLayout(
        application_id=application_id,
        physical=physical,
        partitions={sub.id: partitions},
        changelogs=changelogs,
        topic_partitions={
            **{physical[t]: input_partitions[physical[t]] for t in sub.source_topics},
            **dict.fromkeys(changelogs.values(), partitions),
        },
        subtopologies=subtopologies,
    )


def _task(  # noqa: PLR0917 - the task's parts, as TaskManager.create_active takes them
    topology: Topology,
    config: StreamsConfig,
    layout: TopicLayout,
    task_id: TaskId,
    state_dir: Path,
    history_left: Callable[[TopicPartition], int],
    start_offsets: Mapping[TopicPartition, int],
) -> tuple[StreamTask, ThreadCache]:
    """The task as ``TaskManager.create_active`` assembles it, without a producer; and
    the record cache its stores share (a commit flushes it)."""
    subtopology = layout.subtopology(task_id)
    cache = ThreadCache(config.cache_bytes_per_thread)
    stores: dict[str, TaskStore] = {}
    try:
        for name in subtopology.stores:
            stores[name] = TaskStore(
                RocksDBStore(
                    name,
                    store_directory(state_dir, task_id, name),
                    RocksDBStoreOptions.from_config(config),
                ),
                changelog=layout.changelog_partition(name, task_id),
                cache=cache if topology.stores[name].cached else None,
                cache_name=f"{task_id}/{name}",
            )
        task_topology = TaskTopology(
            topology,
            subtopology,
            task_id.partition,
            stores,
            # A wall-clock punctuation has no history to replay: the clock stands still.
            wall_clock_ms=lambda: 0,
            failures=RecordFailures.from_config(config),
            physical_topics=layout.physical,
        )
    except BaseException:
        for store in stores.values():
            store.close()
        raise
    inputs = layout.input_partitions(task_id)
    partitions = PartitionGroup(
        inputs,
        # Never idle: an input with history left is waited for (its lag), an input
        # at its end offset has nothing more to come.
        max_task_idle_ms=0,
        current_lag=history_left,
        clock_ms=lambda: 0,
    )
    task = StreamTask(
        task_id,
        topology=task_topology,
        stores=stores,
        partitions=partitions,
        logical_topics={physical: logical for logical, physical in layout.physical.items()},
    )
    task.start({tp: start_offsets[tp] for tp in inputs})
    return task, cache


def _commit(task: StreamTask, cache: ThreadCache) -> None:
    """A stream thread's commit with nothing written to the log: the outputs of the
    history are dropped, the stores committed (no changelog offset: see the docs)."""
    cache.flush()
    task.drain_output_columns()
    task.drain_changelogs()
    task.commit_stores({})
    task.grant_commit_request()


def run_task_history(
    topology: Topology,
    config: StreamsConfig,
    *,
    layout: TopicLayout,
    task_id: TaskId,
    log: Log,
    plan: BackfillPlan,
    work_dir: Path,
    attempt: int = 0,
    changelog_log: Log | None = None,
    on_progress: Callable[[HistoryProgress], None] | None = None,
) -> TaskBackfill:
    """Process task ``task_id``'s history (each input partition from its start offset to
    its end offset in ``plan``), then write each of ``plan.stores`` the task has as one sorted
    SST and a restore manifest under ``plan.output`` (the layout ``eddyline restore
    ingest`` and a pod's restore read). ``work_dir`` holds the task's RocksDB stores and
    is removed at the end. ``on_progress`` hears how far the history has got about once
    every PROGRESS_SECONDS, and once it is all read (``read == total``)."""
    inputs = layout.input_partitions(task_id)
    positions = {tp: plan.start_offset(tp, log) for tp in inputs}
    ends = {tp: plan.end_offset(tp) for tp in inputs}
    for tp in inputs:
        if ends[tp] < positions[tp]:
            raise BackfillError(
                f"the history of {tp} ends at {ends[tp]}, before its start offset "
                f"{positions[tp]} (its first retained offset, or the timestamp's): pass an "
                "end offset >= it, or backfill from a longer-retained log"
            )
    start_offsets = dict(positions)
    fetched = dict(positions)

    def history_left(tp: TopicPartition) -> int:
        return ends[tp] - fetched[tp]

    total = sum(ends[tp] - start_offsets[tp] for tp in inputs)

    def report(now: float) -> float:
        """Tell ``on_progress`` where the history is; when to tell it next."""
        if on_progress is not None:
            on_progress(
                HistoryProgress(sum(fetched[tp] - start_offsets[tp] for tp in inputs), total)
            )
        return now + PROGRESS_SECONDS

    shutil.rmtree(work_dir, ignore_errors=True)
    task, cache = _task(topology, config, layout, task_id, work_dir, history_left, start_offsets)
    processed = since_commit = 0
    next_report = report(time.monotonic())
    try:
        while True:
            fed = False
            for tp in inputs:
                if task.partitions.buffered(tp) == 0 and fetched[tp] < ends[tp]:
                    _feed(task, log, tp, fetched, ends[tp])
                    fed = True
            done = task.process(FETCH_RECORDS)
            processed += done
            since_commit += done
            if since_commit >= COMMIT_RECORDS:
                _commit(task, cache)
                since_commit = 0
            if on_progress is not None and (now := time.monotonic()) >= next_report:
                next_report = report(now)
            if done == 0 and not fed:
                if task.partitions.buffered() or any(fetched[tp] < ends[tp] for tp in inputs):
                    # Timestamp order held back records with every input fed: a bug.
                    raise BackfillError(
                        f"task {task_id} stopped with history left "
                        f"({task.partitions.buffered()} records buffered); report this"
                    )
                break
        report(time.monotonic())
        _commit(task, cache)
        manifests, keys = _write_stores(
            task, layout, plan, task_id, processed, attempt, changelog_log or log
        )
    finally:
        task.close()
        shutil.rmtree(work_dir, ignore_errors=True)
    return TaskBackfill(
        task_id,
        processed,
        manifests,
        keys,
        {partition_key(tp): ends[tp] for tp in inputs},
    )


def _feed(
    task: StreamTask, log: Log, tp: TopicPartition, fetched: dict[TopicPartition, int], end: int
) -> None:
    """Buffer the next records of ``tp`` below ``end``; skips offsets the log no longer
    has (transaction markers, aborted records) by moving on to what it returns."""
    columns = log.fetch_columns(tp, fetched[tp], FETCH_RECORDS)
    if not columns.offsets:
        if columns.end_offset < end:
            raise BackfillError(
                f"{tp} ends at offset {columns.end_offset}, before the backfill's end "
                f"offset {end}; pass end offsets the log has"
            )
        # Nothing committed between here and the end: the rest is markers or aborted.
        fetched[tp] = end
        return
    keep = sum(1 for offset in columns.offsets if offset < end)
    chunk = FetchedColumns(
        columns.offsets[:keep],
        columns.keys[:keep],
        columns.values[:keep],
        columns.timestamps[:keep],
        columns.end_offset,
        None if columns.headers is None else columns.headers[:keep],
    )
    task.add_input(tp, chunk)
    # A record at or past the end was fetched: the history of ``tp`` is all buffered.
    fetched[tp] = end if keep < len(columns.offsets) else columns.offsets[-1] + 1


def _write_stores(  # noqa: PLR0917 - the run's facts, passed on
    task: StreamTask,
    layout: TopicLayout,
    plan: BackfillPlan,
    task_id: TaskId,
    processed: int,
    attempt: int,
    log: Log,
) -> tuple[dict[str, RestoreManifest], dict[str, int]]:
    """Each wanted store's committed contents, in key order, as one SST, its changelog's
    records and a manifest naming the changelog offset the SST corresponds to."""
    manifests: dict[str, RestoreManifest] = {}
    keys: dict[str, int] = {}
    created = datetime.datetime.now(datetime.UTC).isoformat()
    for name in plan.stores:
        store = task.stores.get(name)
        if store is None:
            continue
        directory = manifest_directory(plan, name)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / sst_name(task_id.partition, task_id.partition, attempt, 0)
        writer = SortedFileWriter(path, store=name)
        count = 0
        batch_keys: list[bytes] = []
        batch_values: list[bytes] = []
        for key, value in _committed_items(store.store):
            batch_keys.append(key)
            batch_values.append(value)
            if len(batch_keys) >= FETCH_RECORDS:
                writer.add(batch_keys, batch_values)
                count += len(batch_keys)
                batch_keys, batch_values = [], []
        if batch_keys:
            writer.add(batch_keys, batch_values)
            count += len(batch_keys)
        sst = writer.finish()
        changelog = layout.changelog_partition(name, task_id)
        if changelog is None:
            raise BackfillError(
                f'store "{name}" has no changelog; only logged stores are backfilled'
            )
        files: tuple[ManifestFile, ...] = ()
        if sst is not None:
            files = (ManifestFile(name=path.name, sha256=sst.sha256, bytes=sst.size, keys=count),)
        written = write_store_changelog(
            log,
            changelog,
            partial(_committed_items, store.store),
            transactional_id=backfill_transactional_id(plan.application, name, task_id.partition),
            build_id=plan.build_id,
            supersede=plan.supersede,
        )
        manifest = RestoreManifest(
            format_version=MANIFEST_FORMAT_VERSION,
            eddyline_version=__version__,
            build_id=plan.build_id,
            created_at=created,
            application=plan.application,
            store=name,
            changelog=ChangelogRef(topic=changelog.topic, partition=changelog.partition),
            # The SST is the changelog up to and including this offset: the pod that
            # ingests it resumes the changelog right after it and replays nothing.
            offset=written.last_offset,
            log_start=written.log_start,
            log_end=written.log_end,
            changelog_epoch=written.epoch,
            records_read=processed,
            keys=count,
            files=files,
        )
        manifests[name] = manifest
        keys[name] = count
    return manifests, keys


def manifest_directory(plan: BackfillPlan, store: str) -> Path:
    return build_directory(Path(plan.output), plan.application, store, plan.build_id)


def progress_directory(plan: BackfillPlan) -> Path:
    """Where the job's tasks say how far their histories have got, a file each: beside
    the builds, which every executor writes to (a Spark task can tell its driver nothing
    before it ends; the driver reads these while the job runs)."""
    return Path(plan.output) / plan.application / f"{plan.build_id}-progress"


def task_progress_writer(plan: BackfillPlan, partition: int) -> Callable[[HistoryProgress], None]:
    """What task ``partition`` reports its progress to: its file, replaced atomically (a
    reader sees the last report whole; a retried attempt starts it again from 0)."""
    directory = progress_directory(plan)
    path = directory / f"{partition}.json"
    staging = directory / f".{partition}.json.tmp"

    def write(progress: HistoryProgress) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        staging.write_text(
            json.dumps({"read": progress.read, "total": progress.total}), encoding="utf-8"
        )
        staging.replace(path)

    return write


def read_progress(plan: BackfillPlan) -> dict[int, HistoryProgress]:
    """Task partition -> its last report; a task that has reported nothing yet is absent."""
    found: dict[int, HistoryProgress] = {}
    for path in progress_directory(plan).glob("*.json"):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            found[int(path.stem)] = HistoryProgress(int(raw["read"]), int(raw["total"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # removed meanwhile, or not one of ours: progress is a courtesy
    return found


def write_manifests(plan: BackfillPlan, manifests: Iterable[RestoreManifest]) -> dict[str, str]:
    """After every task succeeded: write the manifests (each atomically), then delete any
    SST file of the build that no manifest names (a failed or superseded attempt's).
    Returns "<store>/<partition>" -> the manifest's path."""
    written: dict[str, str] = {}
    listed: dict[str, set[str]] = {store: set() for store in plan.stores}
    for manifest in manifests:
        directory = manifest_directory(plan, manifest.store)
        path = write_manifest(directory, manifest)
        written[f"{manifest.store}/{manifest.changelog.partition}"] = str(path)
        listed[manifest.store].update(file.name for file in manifest.files)
    for store, names in listed.items():
        directory = manifest_directory(plan, store)
        if directory.is_dir():
            for entry in directory.glob("*.sst"):
                if entry.name not in names:
                    entry.unlink()
    return written


def _committed_items(store: StateStore) -> Iterator[tuple[bytes, bytes]]:
    """Every committed entry, in key order (RocksDB's byte order: the SST's)."""
    yield from store.scan(KeyRange())


def ensure_changelogs(log: Log, layout: TopicLayout, stores: Iterable[str]) -> None:
    """The driver's step before the job: each backfilled store's changelog exists,
    compacted, one partition per task (as a run creates it), so the tasks only write."""
    (partitions,) = set(layout.partitions.values())
    existing = log.topics()
    for store in stores:
        topic = layout.changelogs[store]
        spec = existing.get(topic)
        if spec is None:
            log.create_topic(topic, partitions, compacted=True)
        elif spec.partitions != partitions:
            raise BackfillError(
                f'changelog topic "{topic}" has {spec.partitions} partitions and the '
                f"backfill has {partitions} tasks; delete the topic (a new store has no "
                "other state) and run the backfill again"
            )
