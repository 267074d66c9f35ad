"""The Spark restore build: changelog -> latest value per key -> sorted SST files + manifests.

A changelog of N updates over K live keys becomes K sorted keys, written once
at RocksDB's bottom level with no compaction debt; a task whose store is
missing ingests them (:mod:`eddyline_runtime.restore.ingest.sst_restore`) and
replays only the changelog after the offset they cover.

The plan, per store (``build``):

1. the driver fixes each changelog partition's bounds ``[start, end)`` and cuts
   them into offset ranges (:mod:`offset_ranges`), one Spark task each;
2. the source (:class:`ChangelogSource`) reads the ranges as rows
   ``(partition, offset, key, value)``;
3. ``groupBy(partition, key)`` keeps ``max(struct(offset, value))``, the latest
   version (fastest of the ways tried here), and counts versions; a key whose
   latest version is a tombstone keeps a null value and is dropped by the
   writer, never filtered before the aggregation (that would resurrect the
   version before the delete);
4. ``repartitionByRange(n, partition, key)`` + ``sortWithinPartitions``: Spark
   sorts binary unsigned bytewise, RocksDB's order; ranges do not overlap, so
   the files of a store partition ingest side by side at the bottom level
   (hash partitioning would pile store partitions into few tasks);
5. the ``eddyline_sst`` sink writes the files in the executors and the
   manifests on the driver, last (:mod:`sst_sink`).

``pyspark`` is imported only in ``restore/``; this is the module the CLI
imports for ``eddyline restore build``.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.restore.build_progress import BuildProgress, StageCounts, build_progress
from eddyline_runtime.restore.manifest import (
    RestoreManifest,
    build_directory,
    manifest_name,
    new_build_id,
    read_manifest,
)
from eddyline_runtime.restore.spark.changelog_source import ChangelogSource, LogPortSource
from eddyline_runtime.restore.spark.offset_ranges import split_offset_ranges
from eddyline_runtime.restore.spark.sst_sink import SST_FORMAT, BuildPlan, SstDataSource

# Offsets per read task. Large enough that a task's fixed cost (a Python worker
# round trip, a log open) is small next to its reading; small enough that a
# partition of a few million records spreads over every core.
DEFAULT_SPLIT_RECORDS: Final = 250_000
# A session setting that marks eddyline's data sources as registered.
_REGISTERED_CONF: Final = "spark.eddyline.sourcesRegistered"
# How often a build's watcher asks Spark's status tracker how far its stages are: as
# often as a progress line redraws (eddyline_runtime.progress.MIN_REDRAW_SECONDS).
_WATCH_SECONDS: Final = 0.5


def spark_session(
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    *,
    app_name: str = "eddyline-restore",
    progress: bool = False,
) -> SparkSession:
    """A session that can run restore builds.

    Python workers must be this interpreter (PySpark's default is ``python3``
    from PATH, which lacks pyarrow and eddyline), and on machines whose
    hostname resolves to loopback Spark should bind it rather than guess.
    Shuffles get twice the default parallelism instead of 200 partitions:
    a build's shuffle is one stage of a few large partitions.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "true" if progress else "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if "spark.sql.shuffle.partitions" not in (conf or {}):
        parallelism = spark.sparkContext.defaultParallelism
        spark.conf.set("spark.sql.shuffle.partitions", str(max(2 * parallelism, 2)))
    return spark


class RestoreBuildError(EddylineError):
    """A build that ended without every manifest it should have written."""


@dataclass(frozen=True, slots=True)
class BuildResult:
    build_id: str
    directory: Path
    manifests: Mapping[int, Path]
    seconds: float

    def read(self) -> dict[int, RestoreManifest]:
        return {p: read_manifest(path) for p, path in self.manifests.items()}

    @property
    def records_read(self) -> int:
        return sum(m.records_read for m in self.read().values())

    @property
    def keys(self) -> int:
        return sum(m.keys for m in self.read().values())


def build(
    spark: SparkSession,
    *,
    application: str,
    store: str,
    changelog_topic: str,
    partitions: Sequence[int],
    output: Path | str,
    source: ChangelogSource | None = None,
    log_url: str | None = None,
    split_records: int = DEFAULT_SPLIT_RECORDS,
    files_per_build: int | None = None,
    on_progress: Callable[[BuildProgress], None] | None = None,
) -> BuildResult:
    """Build SST files and one manifest per partition of ``store``'s changelog.

    ``source`` defaults to the log port at ``log_url``. ``files_per_build``: how
    many range partitions the sorted output is cut into (default: the
    session's parallelism); each holds ascending keys, so a store partition
    gets about that many files at most. ``on_progress``, if given, is called from a
    watcher thread about twice a second while Spark runs (:mod:`..build_progress`).
    """
    started = time.perf_counter()
    if source is None:
        if log_url is None:
            raise ValueError("build() needs a source or a log_url")
        source = LogPortSource(log_url)
    if not partitions:
        raise ValueError(f'store "{store}": no changelog partitions to build')
    output = Path(output).resolve()
    build_id = new_build_id()
    directory = build_directory(output, application, store, build_id)
    directory.mkdir(parents=True)
    bounds = source.bounds(changelog_topic, partitions)
    ranges = [
        piece
        for partition in partitions
        for piece in split_offset_ranges(
            partition, bounds[partition].start, bounds[partition].end, split_records
        )
    ]
    plan = BuildPlan(
        application=application,
        store=store,
        topic=changelog_topic,
        build_id=build_id,
        build_dir=str(directory),
        created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        bounds={p: (bounds[p].start, bounds[p].end) for p in partitions},
        epochs={p: bounds[p].epoch for p in partitions},
    )
    _register_once(spark)
    layout_partitions = files_per_build or spark.sparkContext.defaultParallelism
    if ranges:
        changes = source.load(spark, changelog_topic, ranges)
        latest = changes.groupBy("partition", "key").agg(
            F.max(F.struct("offset", "value")).alias("latest"),
            F.count(F.lit(1)).alias("versions"),
        )
        rows = latest.select("partition", "key", F.col("latest.value").alias("value"), "versions")
        laid_out = rows.repartitionByRange(layout_partitions, "partition", "key")
        laid_out = laid_out.sortWithinPartitions("partition", "key")
    else:
        laid_out = spark.createDataFrame(
            [], "partition int, key binary, value binary, versions long"
        )
    writer = laid_out.write.format(SST_FORMAT).mode("append").option("plan", plan.encode())
    if on_progress is None:
        writer.save()
    else:
        offsets = sum(r.end - r.start for r in ranges)
        run_watched(spark, writer.save, lambda stages: on_progress(build_progress(stages, offsets)))
    manifests = {p: directory / manifest_name(p) for p in partitions}
    missing = [p for p, path in manifests.items() if not path.is_file()]
    if missing:
        raise RestoreBuildError(
            f'restore build {build_id} of store "{store}" finished without manifests for '
            f"partitions {missing} in {directory}; the build is incomplete: run it again"
        )
    return BuildResult(build_id, directory, manifests, time.perf_counter() - started)


def changelog_source(log_url: str, settings: Mapping[str, object] | None = None) -> ChangelogSource:
    """The source a build of the log at ``log_url`` reads its changelogs with.

    ``kafka://``: Spark's own Kafka reader (:class:`KafkaChangelogSource`), whose
    executors fetch from the brokers in parallel; the session must have been started
    with :func:`~eddyline_runtime.restore.spark.kafka_source.connector_conf`'s
    ``spark.jars``. ``settings`` are the Kafka client settings (librdkafka names).
    Anything else is the embedded SQLite log, a file Spark's Kafka reader cannot read:
    the log port's own source (:class:`LogPortSource`) reads it, read-only.
    """
    if log_url.startswith("kafka://"):
        # Imported here: it loads confluent-kafka, which SQLite builds never need.
        from eddyline_runtime.restore.spark.kafka_source import KafkaChangelogSource

        return KafkaChangelogSource(log_url, settings)
    return LogPortSource(log_url)


def run_watched(
    spark: SparkSession,
    run: Callable[[], None],
    report: Callable[[list[StageCounts]], None],
) -> None:
    """``run()`` under a job group of its own, with ``report`` given the group's stages
    from a watcher thread while it runs, and once more when it has returned (so the
    last report is the finished build, however short it was). A restore build's and a
    backfill's progress lines both come from here."""
    context = spark.sparkContext
    tracker = context.statusTracker()
    group = f"eddyline-restore-{uuid.uuid4().hex[:12]}"
    done = threading.Event()

    def stages() -> list[StageCounts]:
        return [
            StageCounts(info.stageId, info.numTasks, info.numCompletedTasks)
            for job in tracker.getJobIdsForGroup(group)
            if (job_info := tracker.getJobInfo(job)) is not None
            for stage in job_info.stageIds
            if (info := tracker.getStageInfo(stage)) is not None
        ]

    def report_now(found: Callable[[], list[StageCounts]]) -> bool:
        try:
            report(found())
        except Exception:  # progress is a courtesy: it never fails a build
            return False
        return True

    def watch() -> None:
        if not report_now(list):
            return
        while not done.wait(_WATCH_SECONDS) and report_now(stages):
            pass

    # The group is the calling thread's (PySpark pins Python threads to JVM threads), so
    # the watcher sees exactly this build's jobs, even beside other work in the session.
    context.setJobGroup(group, "eddyline build")
    watcher = threading.Thread(target=watch, name="restore-build-progress", daemon=True)
    watcher.start()
    try:
        run()
    finally:
        done.set()
        watcher.join()
        # Unset (null) rather than "": a later job of the session belongs to no group.
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    report_now(stages)


def _register_once(spark: SparkSession) -> None:
    """Register the SST sink, once per session (again would only log a warning)."""
    if spark.conf.get(_REGISTERED_CONF, "false") != "true":
        spark.dataSource.register(SstDataSource)
        spark.conf.set(_REGISTERED_CONF, "true")
