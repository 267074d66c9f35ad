"""``eddyline restore build|job|executor|ingest``: Spark restore builds by hand and in Jobs.

``build`` runs the PySpark job of :mod:`eddyline_runtime.restore.spark.spark_build`
for one store of a StreamApp and prints a summary (with a live progress line on a
terminal: :mod:`eddyline_runtime.restore.build_progress`); it is the only command
that needs PySpark and a Java runtime, and says how to get them in one line
when they are missing. ``ingest`` rebuilds one task's missing store from the
newest build that fits, then replays the changelog's tail, as a task does at
start-up; it needs neither Spark nor Java (the runtime image has none). ``job`` is
what a restore Job's pod runs, ``executor`` what its executor pods run (k8s:// master).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO
from urllib.parse import urlparse

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log.kafka_settings import KAFKA_SCHEME, settings_from_environment
from eddyline_runtime.partitions import TaskId, TopicPartition, changelog_topic
from eddyline_runtime.progress import ProgressLine, progress_wanted
from eddyline_runtime.restore.build_progress import OFFSETS, STARTING
from eddyline_runtime.restore.spark_requirements import java_missing, spark_missing

if TYPE_CHECKING:
    from eddyline_runtime.config import StreamsConfig
    from eddyline_runtime.processing.topology import Topology
    from eddyline_runtime.spec import StreamApp

SPARK_MISSING = spark_missing("restore build")


class RestoreCommandError(EddylineError):
    """A restore command that cannot run as asked; the message says what to change."""


def add_restore_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    restore = commands.add_parser(
        "restore", help="rebuild state stores from changelogs with Spark, and ingest the result"
    )
    actions = restore.add_subparsers(dest="restore_action", required=True)
    build = actions.add_parser(
        "build",
        help="build sorted SST files and manifests for a store from its changelog (PySpark)",
    )
    build.add_argument("--manifest", type=Path, required=True, help="the StreamApp YAML file")
    build.add_argument("--store", required=True, help="the store to build")
    build.add_argument(
        "--partitions", help="comma-separated changelog partitions (default: every one)"
    )
    build.add_argument(
        "--output", required=True, help="a directory (or file:// URI) the pods can read"
    )
    build.add_argument("--log-url", help="open this log instead of spec.log.url")
    build.add_argument(
        "--master",
        default="local[*]",
        help="Spark master: local[N] or k8s://https://HOST (default: %(default)s)",
    )
    build.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, passed through (repeatable)",
    )
    build.add_argument(
        "--spark-kafka-jars",
        type=Path,
        help="Spark's Kafka source jars, for kafka:// logs (default: $EDDYLINE_SPARK_KAFKA_JARS, "
        "else a checkout's .cache from make spark-kafka-jars)",
    )
    build.add_argument(
        "--split-records",
        type=_positive,
        help="changelog offsets per read task (default: 250,000)",
    )
    build.add_argument(
        "--no-progress",
        action="store_true",
        help="no live progress line (automatic when stdout is not a terminal)",
    )
    job = actions.add_parser(
        "job",
        help="what a restore Job runs: the build through spark-submit (client mode), judged by "
        "its manifests; the verdict goes to the output directory and --result-file",
    )
    job.add_argument("--manifest", type=Path, required=True, help="the StreamApp YAML file")
    job.add_argument("--store", required=True)
    job.add_argument("--partitions", required=True, help="comma-separated changelog partitions")
    job.add_argument("--output", required=True, help="the directory the pods read builds from")
    job.add_argument("--log-url", help="open this log instead of spec.log.url")
    job.add_argument("--master", default="local[*]", help="Spark master (default: %(default)s)")
    job.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    job.add_argument(
        "--spark-kafka-jars", type=Path, help="as for build: Spark's Kafka source jars"
    )
    job.add_argument("--job-name", required=True, help="names the verdict file")
    job.add_argument(
        "--result-file", type=Path, help="also write the verdict here (the termination message)"
    )
    actions.add_parser(
        "executor",
        help="what a Spark executor pod of a restore Job runs (k8s:// master): the executor "
        "JVM, from the settings the driver put in the pod's environment",
    )
    ingest = actions.add_parser(
        "ingest",
        help="rebuild one task's missing store from the newest fitting build, then replay "
        "the changelog's tail",
    )
    ingest.add_argument("--manifest", type=Path, required=True, help="the StreamApp YAML file")
    ingest.add_argument("--store", required=True)
    ingest.add_argument("--partition", type=int, required=True, help="the changelog partition")
    ingest.add_argument(
        "--from", dest="output", required=True, help="the build output directory (or file:// URI)"
    )
    ingest.add_argument(
        "--task", help="the task directory, as 1_3 (default: from the topology's sub-topology)"
    )
    ingest.add_argument("--state-dir", type=Path, help="overrides the app's state.dir")


def run_restore_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from eddyline_runtime.spec import load_manifest

    out = out or sys.stdout
    try:
        if args.restore_action == "executor":
            # Before any manifest: an executor pod has none; the driver's settings come
            # through the environment.
            from eddyline_runtime.restore.spark.executor_backend import exec_executor

            exec_executor()
        app = load_manifest(args.manifest)
        # This process's settings, built once (the environment over the manifest) and
        # handed to the command, as the runner does.
        config = app.streams_config()
        if args.restore_action == "build":
            return _build(args, app, config, out)
        if args.restore_action == "job":
            return _job(args, app, config, out)
        return _ingest(args, app, config, out)
    except EddylineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def _build(args: argparse.Namespace, app: StreamApp, config: StreamsConfig, out: TextIO) -> int:
    from eddyline_runtime.log import open_log

    application = config.application_id
    topic = changelog_topic(application, args.store)
    output = _local_path(args.output, "--output")
    log_url = args.log_url or app.spec.log.url
    log = open_log(log_url, read_only=True)
    try:
        known = log.topics().get(topic)
    finally:
        log.close()
    if known is None:
        _refuse_global_store_of(app, args.manifest, args.store)
        raise RestoreCommandError(
            f'store "{args.store}" of application "{application}" has no changelog topic '
            f'"{topic}" in {log_url}; check --store, or run the app once to create it'
        )
    partitions = _partitions(args.partitions, known.partitions)
    conf = dict(_setting(item) for item in args.conf)
    try:
        from eddyline_runtime.restore.spark import spark_build
    except ImportError:
        print(f"error: {SPARK_MISSING}", file=sys.stderr)
        return 2
    if java_missing():
        print(f"error: {SPARK_MISSING}", file=sys.stderr)
        return 2
    settings: dict[str, str] = {}
    if log_url.startswith(KAFKA_SCHEME):
        from eddyline_runtime.restore.spark.kafka_source import with_connector

        # Spark's Kafka reader must be on the JVM's class path from its start.
        conf = with_connector(conf, args.spark_kafka_jars)
        settings = settings_from_environment()
    try:
        # Spark's own console bar stays off: the build draws one line of its own (below),
        # and only on a terminal, where Spark's would write stage bars into logs too.
        spark = spark_build.spark_session(args.master, conf, progress=False)
    except Exception as exc:
        # PySparkRuntimeError [JAVA_GATEWAY_EXITED]: the JVM did not start.
        if "JAVA_GATEWAY_EXITED" in str(exc):
            print(f"error: {SPARK_MISSING} ({exc})", file=sys.stderr)
            return 2
        raise
    source = spark_build.changelog_source(log_url, settings)
    line = ProgressLine(
        out,
        label=STARTING,
        unit=OFFSETS,
        enabled=progress_wanted(out, no_progress=args.no_progress),
    )
    try:
        options = {} if args.split_records is None else {"split_records": args.split_records}
        result = spark_build.build(
            spark,
            application=application,
            store=args.store,
            changelog_topic=topic,
            partitions=partitions,
            output=output,
            source=source,
            on_progress=(lambda p: line.update(p.done, total=p.total, label=p.phase, unit=p.unit))
            if line.enabled
            else None,
            **options,
        )
    finally:
        line.close()
        spark.stop()
    manifests = result.read()
    for partition, manifest in sorted(manifests.items()):
        size = sum(f.bytes for f in manifest.files)
        print(
            f"partition {partition}: {manifest.records_read:,} records read -> "
            f"{manifest.keys:,} keys in {len(manifest.files)} files ({size:,} bytes), "
            f"up to offset {manifest.offset}",
            file=out,
        )
    summary = {
        "build_id": result.build_id,
        "directory": str(result.directory),
        "partitions": len(manifests),
        "records_read": sum(m.records_read for m in manifests.values()),
        "keys": sum(m.keys for m in manifests.values()),
        "seconds": round(result.seconds, 2),
        "source": type(source).__name__,
    }
    print(json.dumps(summary), file=out)
    return 0


def _job(args: argparse.Namespace, app: StreamApp, config: StreamsConfig, out: TextIO) -> int:
    from eddyline_runtime.restore.job_result import JobState
    from eddyline_runtime.restore.spark.job_runner import run_restore_job

    conf = dict(_setting(item) for item in args.conf)
    if (args.log_url or app.spec.log.url).startswith(KAFKA_SCHEME):
        try:
            from eddyline_runtime.restore.spark.kafka_source import with_connector
        except ImportError:
            pass  # no PySpark here: run_restore_job reports spark-submit missing
        else:
            # spark-submit starts the driver's JVM: the jars must be on its command line.
            conf = with_connector(conf, args.spark_kafka_jars)
    result = run_restore_job(
        manifest=args.manifest,
        application=config.application_id,
        store=args.store,
        partitions=_partitions(args.partitions, 1 << 31),
        output=_local_path(args.output, "--output"),
        master=args.master,
        conf=conf,
        log_url=args.log_url,
        job_name=args.job_name,
        result_file=args.result_file,
    )
    print(result.to_text(), file=out)
    return 0 if result.state is JobState.SUCCEEDED else 1


def _ingest(args: argparse.Namespace, app: StreamApp, config: StreamsConfig, out: TextIO) -> int:
    from eddyline_runtime.log import open_log
    from eddyline_runtime.processing.loader import load_topology
    from eddyline_runtime.restore.ingest.sst_restore import rebuild_store
    from eddyline_runtime.state import RocksDBStoreOptions, store_directory

    application = config.application_id
    if args.task is not None:
        task = TaskId.parse(args.task)
    else:
        topology = load_topology(app.spec.topology.ref, [args.manifest.resolve().parent])
        _refuse_global_store(topology, args.store)
        owners = [sub.id for sub in topology.subtopologies() if args.store in sub.stores]
        if not owners:
            raise RestoreCommandError(
                f'the topology of "{application}" has no store "{args.store}"; stores: '
                f"{', '.join(sorted(topology.stores)) or 'none'}"
            )
        task = TaskId(owners[0], args.partition)
    state_dir = args.state_dir or Path(config.state_dir)
    directory = store_directory(state_dir, task, args.store)
    changelog = TopicPartition(changelog_topic(application, args.store), args.partition)
    log = open_log(app.spec.log.url, read_only=True)
    try:
        rebuilt = rebuild_store(
            args.store,
            directory,
            log,
            changelog,
            application=application,
            output=_local_path(args.output, "--from"),
            options=RocksDBStoreOptions.from_config(config),
        )
    finally:
        log.close()
    for refusal in rebuilt.refusals:
        print(f"refused: {refusal}", file=sys.stderr)
    ingested = rebuilt.ingested
    replayed = rebuilt.replayed
    print(
        json.dumps(
            {
                "store": args.store,
                "directory": str(directory),
                "ingested_manifest": None if ingested is None else str(ingested.manifest),
                "ingested_keys": 0 if ingested is None else ingested.keys,
                "ingested_offset": None if ingested is None else ingested.offset,
                "replayed_from": replayed.first_offset,
                "replayed_records": replayed.records,
            }
        ),
        file=out,
    )
    return 0


def _refuse_global_store_of(app: StreamApp, manifest: Path, store: str) -> None:
    """:func:`_refuse_global_store` when the app's topology loads here (else the caller's
    own message stands: only a better message is at stake)."""
    from eddyline_runtime.processing.loader import load_topology

    try:
        topology = load_topology(app.spec.topology.ref, [manifest.resolve().parent])
    except Exception:  # only a better message is at stake: see the docstring
        return
    _refuse_global_store(topology, store)


def _refuse_global_store(topology: Topology, store: str) -> None:
    """Refuse a Spark build or ingest for a store without a changelog of its own (a global
    store, or one with logging disabled), saying why and what happens instead."""
    spec = topology.global_stores.get(store)
    if spec is not None:
        raise RestoreCommandError(
            f'store "{store}" is a global store: it has no changelog of its own and no task, '
            "so no Spark restore build serves it; every instance rebuilds it by reading its "
            f'topic "{spec.topic}" from the offsets it committed (docs/joins.md, "Global tables")'
        )
    local = topology.stores.get(store)
    if local is not None and not local.logged:
        raise RestoreCommandError(
            f'store "{store}" has logging disabled (Materialized.with_logging_disabled or '
            "StoreSpec(logged=False)): it has no changelog, so no Spark restore build can "
            "rebuild it; its state lives on its member's disk only. Enable its logging "
            "(the next run creates the changelog, which then holds the changes made from "
            "there on) to build it from the log"
        )


def _local_path(location: str, option: str) -> Path:
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location)
    raise RestoreCommandError(
        f"{option} {location!r}: only local directories and file:// URIs are supported so far; "
        "mount the shared volume and pass its path"
    )


def _partitions(text: str | None, count: int) -> list[int]:
    if text is None:
        return list(range(count))
    try:
        chosen = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise RestoreCommandError(
            f"--partitions {text!r}: expected comma-separated partition numbers, as 0,2,3"
        ) from None
    outside = [p for p in chosen if not 0 <= p < count]
    if outside or not chosen:
        raise RestoreCommandError(
            f"--partitions {text!r}: the changelog has partitions 0..{count - 1}"
        )
    return chosen


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of offsets")
    return value


def _setting(item: str) -> tuple[str, str]:
    key, separator, value = item.partition("=")
    if not separator or not key:
        raise RestoreCommandError(f"--conf {item!r}: expected KEY=VALUE, as spark.executor.cores=2")
    return key, value
