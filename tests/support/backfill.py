"""A history on a log, replayed through a StreamsInstance (what a backfill must equal),
and the backfill run in process, its changelogs read and its stores restored."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path

from eddyline_runtime.backfill import (
    BackfillPlan,
    TaskBackfill,
    backfill_layout,
    ensure_changelogs,
    run_task_history,
    write_manifests,
)
from eddyline_runtime.backfill.task_history import partition_key
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.log import Log
from eddyline_runtime.log.port import Record
from eddyline_runtime.partitions import TaskId, TopicPartition, changelog_topic
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.restore.ingest.sst_restore import RebuildResult, rebuild_store
from eddyline_runtime.state import RocksDBStore, RocksDBStoreOptions, store_directory

CAUGHT_UP_TIMEOUT_S = 120.0


def write_history(
    log: Log, topic: str, partitions: int, records: int, *, seed: int = 35, create: bool = True
) -> dict[TopicPartition, int]:
    """``records`` records over ``partitions`` partitions (keys hashed to a partition as
    the key decides, out-of-order timestamps within the grace and beyond it); returns
    each partition's end offset. ``create``: the topic does not exist yet."""
    if create:
        log.create_topic(topic, partitions)
    rng = random.Random(seed)
    batches: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    for index in range(records):
        key = f"user-{rng.randrange(200)}"
        # Mostly moving forward, now and then late by up to 2 s (some beyond the grace).
        timestamp = index * 7 - (rng.randrange(2_000) if rng.random() < 0.1 else 0)
        partition = int(key.split("-")[1]) % partitions
        batches[partition].append(
            Record(key.encode(), f"item-{rng.randrange(50)}".encode(), max(timestamp, 0))
        )
    ends: dict[TopicPartition, int] = {}
    for partition, batch in batches.items():
        tp = TopicPartition(topic, partition)
        for start in range(0, len(batch), 1_000):
            log.produce(tp, batch[start : start + 1_000])
        ends[tp] = log.end_offset(tp)
    return ends


def replay(topology: Topology, config: StreamsConfig, log: Log) -> None:
    """The reference: an ordinary StreamsInstance over the whole log, to its end, then
    closed with a final commit (its committed positions are the history's ends)."""
    instance = StreamsInstance(topology, config, log)
    instance.start()
    try:
        instance.wait_until_caught_up(CAUGHT_UP_TIMEOUT_S)
    finally:
        instance.close()


def store_contents(
    config: StreamsConfig, state_dir: Path, task: TaskId, store: str
) -> list[tuple[bytes, bytes]]:
    """A store's committed bytes, in key order, as a pod left them in ``state_dir``."""
    opened = RocksDBStore(
        store, store_directory(state_dir, task, store), RocksDBStoreOptions.from_config(config)
    )
    try:
        return list(opened.scan(KeyRange()))
    finally:
        opened.close()


def reference_replay(
    topology: Topology,
    application: str,
    log: Log,
    state_dir: Path,
    properties: Mapping[str, object] | None = None,
) -> tuple[StreamsConfig, dict[TopicPartition, int]]:
    """The replay a backfill must equal, run as **another** application, so the
    backfilled app's changelogs stay empty (as a new store's are when the backfill
    starts); the replay's committed positions are then committed as the app's (the
    old revision's final commit). Returns the replay's config and those positions."""
    config = StreamsConfig.from_properties(
        {
            **(properties or {}),
            "application.id": f"{application}-replay",
            "state.dir": str(state_dir),
        },
        environ={},
    )
    replay(topology, config, log)
    sources = {topic for sub in topology.subtopologies() for topic in sub.source_topics}
    inputs = [
        TopicPartition(topic, partition)
        for topic, spec in log.topics().items()
        if topic in sources
        for partition in range(spec.partitions)
    ]
    committed = dict(log.committed_offsets(config.application_id, inputs))
    log.commit_offsets(application, committed)
    return config, committed


def backfill_plan(
    application: str,
    store: str,
    log: Log,
    output: Path,
    ends: Mapping[TopicPartition, int],
    *,
    build_id: str = "b1",
) -> BackfillPlan:
    return BackfillPlan(
        application=application,
        topology="unused: the tasks run in this process",
        stores=(store,),
        log_url=log.url,
        output=str(output),
        build_id=build_id,
        end_offsets={partition_key(tp): offset for tp, offset in ends.items()},
    )


def backfill_in_process(
    topology: Topology,
    config: StreamsConfig,
    log: Log,
    plan: BackfillPlan,
    work: Path,
) -> list[TaskBackfill]:
    """What the Spark job does, without Spark: the driver's changelog topics, then every
    task partition's history (SSTs, changelog records) and the manifests, written."""
    partitions = {name: spec.partitions for name, spec in log.topics().items()}
    layout = backfill_layout(topology, plan.application, partitions)
    ensure_changelogs(log, layout, plan.stores)
    built = [
        run_task_history(
            topology, config, layout=layout, task_id=task, log=log, plan=plan, work_dir=work
        )
        for task in layout.tasks()
    ]
    write_manifests(plan, [m for task in built for m in task.manifests.values()])
    return built


def committed_changelog(log: Log, tp: TopicPartition) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) of every record of ``tp`` a read_committed reader sees."""
    seen: list[tuple[int, bytes, bytes]] = []
    position = log.beginning_offset(tp)
    while True:
        columns = log.fetch_columns(tp, position, 10_000)
        if not columns.offsets:
            return seen
        for offset, key, value in zip(columns.offsets, columns.keys, columns.values, strict=True):
            assert key is not None and value is not None
            seen.append((offset, key, value))
        position = columns.offsets[-1] + 1


def rebuilt(
    log: Log, application: str, store: str, partition: int, *, directory: Path, builds: Path
) -> tuple[RebuildResult, list[tuple[bytes, bytes]]]:
    """A pod's restore of a missing store (``rebuild_store``: the newest fitting build
    under ``builds``, then the changelog after it), and the store's bytes."""
    changelog = TopicPartition(changelog_topic(application, store), partition)
    result = rebuild_store(store, directory, log, changelog, application=application, output=builds)
    opened = RocksDBStore(store, directory)
    try:
        return result, list(opened.scan(KeyRange()))
    finally:
        opened.close()
