"""The backfill as a PySpark job: one Spark task per task partition.

The driver fixes the plan (the stores, the end offsets per input partition) and
runs ``parallelize(range(tasks), tasks).mapPartitionsWithIndex``: Spark task
``i`` loads the app's topology by its reference, opens the log read-only
(``read_committed`` on Kafka) and runs task ``0_i``'s history through the
engine's task code (:func:`~eddyline_runtime.backfill.task_history.run_task_history`),
writing its stores' SSTs and manifests under the plan's output. Spark gives the
parallelism, the retries of a failed task (a retried attempt writes files of
its own attempt number) and executor pods on Kubernetes; the per-partition order
needs no shuffle, as a task reads its own partitions in offset order.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pyspark import TaskContext
from pyspark.sql import SparkSession

from eddyline_runtime.backfill.task_history import (
    RESULT_NAME,
    BackfillError,
    BackfillPlan,
    backfill_layout,
    ensure_changelogs,
    partition_key,
    progress_directory,
    read_progress,
    run_task_history,
    task_progress_writer,
    write_manifests,
)
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.topics import TopicLayout
from eddyline_runtime.log import Log, open_log
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.loader import load_topology
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.restore.manifest import RestoreManifest
from eddyline_runtime.restore.spark.spark_build import run_watched

APP_NAME: Final = "eddyline-backfill"


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What the job built: one entry per task partition, and where it wrote them."""

    plan: BackfillPlan
    tasks: Sequence[Mapping[str, object]]
    result_path: Path

    @property
    def records(self) -> int:
        return sum(int(str(task["records"])) for task in self.tasks)


@dataclass(frozen=True, slots=True)
class BackfillProgress:
    """Where a running job is: input records read of the whole history (from the tasks'
    reports, ``task_progress_writer``), and task partitions finished (Spark's tracker)."""

    read: int
    total: int
    tasks_done: int
    tasks: int

    def describe(self) -> str:
        share = 100 * self.read // self.total if self.total else 100
        return (
            f"{self.read:,} of {self.total:,} records read ({share}%), "
            f"{self.tasks_done} of {self.tasks} task partitions done"
        )


def config_of(plan: BackfillPlan) -> StreamsConfig:
    return StreamsConfig.from_properties(
        {**plan.properties, "application.id": plan.application}, environ={}
    )


def layout_of(topology: Topology, plan: BackfillPlan, log: Log) -> TopicLayout:
    partitions = {name: spec.partitions for name, spec in log.topics().items()}
    return backfill_layout(topology, plan.application, partitions)


def fix_plan(
    topology: Topology,
    *,
    application: str,
    reference: str,
    stores: Sequence[str],
    log_url: str,
    output: Path,
    build_id: str,
    end_offsets: Mapping[TopicPartition, int] | None = None,
    properties: Mapping[str, object] | None = None,
    from_timestamp_ms: int | None = None,
    supersede: bool = False,
) -> BackfillPlan:
    """The plan the driver fixes: stores checked against the topology, the end offsets
    (given, or the app's committed positions: where its stream continues), and with
    ``from_timestamp_ms`` the start offsets (each input partition's first record at or
    after it, never past its end: a later time leaves that partition no history).
    ``supersede``: the stores' changelogs may hold another state, to be replaced
    (``BackfillPlan.supersede``)."""
    unknown = [store for store in stores if store not in topology.stores]
    if unknown or not stores:
        raise BackfillError(
            f"no store {', '.join(repr(s) for s in unknown) or '(none named)'} in the "
            f"topology {reference} (its stores: {', '.join(sorted(topology.stores)) or 'none'}); "
            "name the stores to build with --store"
        )
    log = open_log(log_url, read_only=True)
    try:
        layout = backfill_layout(
            topology, application, {name: spec.partitions for name, spec in log.topics().items()}
        )
        inputs = [tp for task in layout.tasks() for tp in layout.input_partitions(task)]
        if end_offsets is None:
            committed = log.committed_offsets(application, inputs)
            missing = [str(tp) for tp in inputs if tp not in committed]
            if missing:
                raise BackfillError(
                    f'the group "{application}" has no committed position for '
                    f"{', '.join(missing)}: pass the end offsets (--end-offset TOPIC:P=OFFSET) "
                    "or let the app commit first"
                )
            end_offsets = committed
        absent = [str(tp) for tp in inputs if tp not in end_offsets]
        if absent:
            raise BackfillError(
                f"no end offset for {', '.join(absent)}: give one per input partition"
            )
        starts = (
            {}
            if from_timestamp_ms is None
            else {
                tp: min(log.offset_for_timestamp(tp, from_timestamp_ms), end_offsets[tp])
                for tp in inputs
            }
        )
    finally:
        log.close()
    return BackfillPlan(
        application=application,
        topology=reference,
        stores=tuple(stores),
        log_url=log_url,
        output=str(output),
        build_id=build_id,
        end_offsets={partition_key(tp): end_offsets[tp] for tp in inputs},
        properties=dict(properties or {}),
        start_offsets={partition_key(tp): offset for tp, offset in starts.items()},
        supersede=supersede,
    )


def run_partition(encoded: str, index: int, _rows: Iterable[int]) -> Iterator[str]:
    """Spark task ``index``: task ``0_index``'s history; yields its result as JSON."""
    plan = BackfillPlan.decode(encoded)
    topology = load_topology(plan.topology)
    config = config_of(plan)
    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    log = open_log(plan.log_url, read_only=True)
    # The history is read read-only (never the embedded log's write lock); the
    # changelog write at the end needs a writable open.
    writer = open_log(plan.log_url)
    try:
        layout = layout_of(topology, plan, log)
        with tempfile.TemporaryDirectory(prefix="eddyline-backfill-") as work:
            built = run_task_history(
                topology,
                config,
                layout=layout,
                task_id=TaskId(0, index),
                log=log,
                plan=plan,
                work_dir=Path(work) / "state",
                attempt=attempt,
                changelog_log=writer,
                on_progress=task_progress_writer(plan, index),
            )
    finally:
        writer.close()
        log.close()
    yield json.dumps(
        {
            "task": str(built.task),
            "records": built.records,
            "manifests": {
                store: manifest.model_dump_json() for store, manifest in built.manifests.items()
            },
            "keys": dict(built.keys),
            "end_offsets": dict(built.end_offsets),
        }
    )


def run_backfill(
    spark: SparkSession,
    plan: BackfillPlan,
    on_progress: Callable[[BackfillProgress], None] | None = None,
) -> BackfillResult:
    """Run every task partition's share as one Spark task; write the job's result
    (the offsets the stores stop at, the manifests) beside the builds.

    ``on_progress``, if given, is called from a watcher thread about twice a second with
    the records read of the history and the task partitions finished, and once more when
    the job has run."""
    topology = load_topology(plan.topology)
    log = open_log(plan.log_url)
    try:
        layout = layout_of(topology, plan, log)
        tasks = layout.partitions[0]
        total = sum(
            plan.end_offset(tp) - plan.start_offset(tp, log)
            for task in layout.tasks()
            for tp in layout.input_partitions(task)
        )
        # Created here, once, so the tasks only write their partitions.
        ensure_changelogs(log, layout, plan.stores)
    finally:
        log.close()
    encoded = plan.encode()
    rows: list[str] = []
    # A killed driver's run of the same build left its tasks' reports: they start again.
    shutil.rmtree(progress_directory(plan), ignore_errors=True)

    def run() -> None:
        rows.extend(
            spark.sparkContext.parallelize(range(tasks), tasks)
            .mapPartitionsWithIndex(lambda index, rows: run_partition(encoded, index, rows))
            .collect()
        )

    try:
        if on_progress is None:
            spark.sparkContext.setJobGroup(f"backfill-{plan.build_id}", "eddyline backfill")
            run()
        else:
            run_watched(
                spark,
                run,
                lambda stages: on_progress(
                    BackfillProgress(
                        min(total, sum(report.read for report in read_progress(plan).values())),
                        total,
                        min(tasks, sum(min(s.completed, s.tasks) for s in stages)),
                        tasks,
                    )
                ),
            )
    finally:
        # The tasks' reports are of no use once the job has run (or failed).
        shutil.rmtree(progress_directory(plan), ignore_errors=True)
    results = sorted((json.loads(row) for row in rows), key=lambda r: str(r["task"]))
    # Every task succeeded: now, and only now, the manifests (the restore sink's rule).
    manifests = [
        RestoreManifest.model_validate_json(text)
        for task in results
        for text in task["manifests"].values()
    ]
    paths = write_manifests(plan, manifests)
    for task in results:
        partition = str(task["task"]).split("_")[1]
        task["manifests"] = {store: paths[f"{store}/{partition}"] for store in task["manifests"]}
    output = Path(plan.output) / plan.application
    output.mkdir(parents=True, exist_ok=True)
    path = output / f"{plan.build_id}-{RESULT_NAME}"
    path.write_text(
        json.dumps({"build_id": plan.build_id, "stores": list(plan.stores), "tasks": results}),
        encoding="utf-8",
    )
    return BackfillResult(plan, results, path)
