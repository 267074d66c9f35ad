"""``eddyline backfill build``: build stores from their input's history with PySpark.

Runs :mod:`eddyline_runtime.backfill.spark_job` by hand (``docs/backfill.md``):
the app's topology (a ``module:function`` reference, importable here and on the
executors), the stores to build, the log (``sqlite:///...`` or ``kafka://...``)
and the offsets the history ends at (default: the app's committed positions).
It writes, per task partition, the stores' SSTs and manifests in the layout
``eddyline restore ingest`` reads, and a result file naming the end offsets.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.progress import ProgressLine, progress_wanted
from eddyline_runtime.restore.spark_requirements import java_missing, spark_missing

SPARK_MISSING = spark_missing("backfill build")
# The progress line's label while the task partitions' histories run.
RUNNING_HISTORY = "running the history"


class BackfillCommandError(EddylineError):
    """A backfill command's arguments do not fit."""


def add_backfill_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    backfill = commands.add_parser(
        "backfill", help="build state stores from their input's history with Spark"
    )
    actions = backfill.add_subparsers(dest="backfill_action", required=True)
    build = actions.add_parser(
        "build",
        help="run each task partition's history through the app's topology code (PySpark) "
        "and write the stores as SSTs and restore manifests",
    )
    build.add_argument(
        "--topology", required=True, help="the app's topology, module:function (spec.topology)"
    )
    build.add_argument(
        "--application", required=True, help="the application.id (names topics and the group)"
    )
    build.add_argument(
        "--store", action="append", required=True, help="a store to build (repeatable)"
    )
    build.add_argument("--log-url", required=True, help="sqlite:///PATH or kafka://HOST:PORT")
    build.add_argument("--output", type=Path, required=True, help="where the builds go")
    build.add_argument(
        "--end-offset",
        action="append",
        default=[],
        metavar="TOPIC:PARTITION=OFFSET",
        help="where an input partition's history ends (exclusive; repeatable; default: "
        "the application's committed positions)",
    )
    build.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Streams setting of the app, as Kafka Streams names it (repeatable)",
    )
    build.add_argument("--master", default="local[*]", help="Spark master (default: %(default)s)")
    build.add_argument("--build-id", help="names the build (default: a new one)")
    build.add_argument(
        "--no-progress",
        action="store_true",
        help="no live progress line (automatic when stdout is not a terminal)",
    )


def _setting(text: str, option: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise BackfillCommandError(f"{option} {text!r} is not KEY=VALUE; write it as KEY=VALUE")
    return key, value


def parse_end_offset(text: str) -> tuple[TopicPartition, int]:
    where, sep, offset = text.rpartition("=")
    topic, colon, partition = where.rpartition(":")
    if not sep or not colon or not topic or not partition.isdigit() or not offset.isdigit():
        raise BackfillCommandError(
            f"--end-offset {text!r} is not TOPIC:PARTITION=OFFSET (e.g. events:0=1500)"
        )
    return TopicPartition(topic, int(partition)), int(offset)


def run_backfill_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    ends = dict(parse_end_offset(item) for item in args.end_offset) or None
    properties = dict(_setting(item, "--property") for item in args.property)
    try:
        from eddyline_runtime.backfill import spark_job
        from eddyline_runtime.restore.spark.spark_build import spark_session
    except ImportError:
        print(f"error: {SPARK_MISSING}", file=sys.stderr)
        return 2
    if java_missing():
        print(f"error: {SPARK_MISSING}", file=sys.stderr)
        return 2
    from eddyline_runtime.processing.loader import load_topology
    from eddyline_runtime.restore.manifest import new_build_id

    topology = load_topology(args.topology)
    plan = spark_job.fix_plan(
        topology,
        application=args.application,
        reference=args.topology,
        stores=args.store,
        log_url=args.log_url,
        output=args.output,
        build_id=args.build_id or new_build_id(),
        end_offsets=ends,
        properties=properties,
    )
    spark = spark_session(args.master, app_name=spark_job.APP_NAME)
    line = ProgressLine(
        out,
        label=RUNNING_HISTORY,
        unit="task partitions",
        enabled=progress_wanted(out, no_progress=args.no_progress),
    )
    try:
        result = spark_job.run_backfill(
            spark,
            plan,
            on_progress=(lambda done, total: line.update(done, total=total, force=done == total))
            if line.enabled
            else None,
        )
    finally:
        line.close()
        spark.stop()
    print(
        f"backfill {plan.build_id}: {result.records:,} records through "
        f"{len(result.tasks)} tasks; stores {', '.join(plan.stores)} under "
        f"{Path(plan.output) / plan.application}; result {result.result_path}",
        file=out,
    )
    return 0
