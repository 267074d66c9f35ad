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
import datetime
import sys
import time
from pathlib import Path
from typing import TextIO

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.progress import ProgressLine, progress_wanted
from eddyline_runtime.restore.spark_requirements import java_missing, spark_missing
from eddyline_runtime.spec import BackfillState, BackfillVerdict, load_manifest

SPARK_MISSING = spark_missing("backfill build")
# The progress line's label while the task partitions' histories run.
RUNNING_HISTORY = "running the history"
# How often the operator's backfill Job logs how far the history has got, at most.
JOB_PROGRESS_SECONDS = 5.0
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


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
    _add_from_timestamp(build)
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
        "--supersede",
        action="store_true",
        help="replace another state a store's changelog holds (an earlier attempt's under "
        "other end offsets, or a rolled-back revision's) instead of refusing it; only for "
        "stores no running revision has",
    )
    build.add_argument(
        "--no-progress",
        action="store_true",
        help="no live progress line (automatic when stdout is not a terminal)",
    )
    _add_job_command(actions)


def _add_job_command(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    job = actions.add_parser(
        "job",
        help="what the operator's backfill Job runs during a topology upgrade: build the "
        "stores of the new revision from history up to the app's committed positions, and "
        "write a verdict (JSON) to --result-file",
    )
    job.add_argument("--manifest", type=Path, required=True, help="the StreamApp YAML file")
    job.add_argument(
        "--topology",
        required=True,
        help="the new revision's topology, module:function (the manifest's is the one that "
        "runs until the upgrade publishes the new one)",
    )
    job.add_argument("--store", action="append", required=True, help="a store (repeatable)")
    job.add_argument("--output", type=Path, required=True, help="the restore claim's mount")
    job.add_argument("--log-url", help="open this log instead of spec.log.url")
    job.add_argument("--master", default="local[*]", help="Spark master (default: %(default)s)")
    job.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    job.add_argument("--build-id", required=True, help="names the build (the operator's)")
    _add_from_timestamp(job)
    job.add_argument("--result-file", type=Path, help="where the verdict goes as well")


def _add_from_timestamp(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from-timestamp",
        type=parse_timestamp,
        metavar="TIME",
        help="start each input partition's history at its first record at or after TIME "
        "(RFC 3339 with a zone, e.g. 2026-11-01T00:00:00Z; default: the first retained "
        "offset)",
    )


def parse_timestamp(text: str) -> int:
    """An RFC 3339 time with its zone, as epoch milliseconds (record timestamps' unit)."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        # argparse reports an ArgumentTypeError's text with the option's name.
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an RFC 3339 time with a zone; write e.g. 2026-11-01T00:00:00Z"
        )
    # By integer arithmetic: a float's timestamp() * 1000 can land a millisecond short.
    return (moment - _EPOCH) // datetime.timedelta(milliseconds=1)


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
    if args.backfill_action == "job":
        return run_backfill_job(args, out)
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
        from_timestamp_ms=args.from_timestamp,
        supersede=args.supersede,
    )
    spark = spark_session(args.master, app_name=spark_job.APP_NAME)
    line = ProgressLine(
        out,
        label=RUNNING_HISTORY,
        unit="records",
        enabled=progress_wanted(out, no_progress=args.no_progress),
    )

    def show(progress: spark_job.BackfillProgress) -> None:
        done = progress.tasks_done == progress.tasks
        line.update(progress.read, total=progress.total, force=done)

    try:
        result = spark_job.run_backfill(spark, plan, on_progress=show if line.enabled else None)
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


# A termination message holds at most 4096 bytes (the kubelet cuts the rest): a verdict
# longer than this leaves its end offsets out (the result file beside the build has them),
# and an error's text is cut to _ERROR_LIMIT characters, so the verdict stays JSON.
_MESSAGE_LIMIT = 4000
_ERROR_LIMIT = 2000


def run_backfill_job(args: argparse.Namespace, out: TextIO) -> int:
    """Build, and say how it went in a verdict (stdout and ``--result-file``); 0 only on
    success. Any error becomes a Failed verdict naming it: the operator rolls back on it."""
    try:
        verdict = _backfill_job(args)
    except Exception as error:  # every failure must reach the operator as a verdict
        verdict = BackfillVerdict(
            state=BackfillState.FAILED,
            message=f"{type(error).__name__}: {error}"[:_ERROR_LIMIT],
            buildId=args.build_id,
        )
    text = verdict.to_text()
    if len(text) > _MESSAGE_LIMIT:
        text = verdict.model_copy(
            update={
                "end_offsets": {},
                "message": f"{verdict.message} ({len(verdict.end_offsets)} end offsets: see "
                "the result file beside the build)",
            }
        ).to_text()
    if args.result_file is not None:
        args.result_file.write_text(text, encoding="utf-8")
    print(text, file=out)
    return 0 if verdict.state is BackfillState.SUCCEEDED else 1


def _backfill_job(args: argparse.Namespace) -> BackfillVerdict:
    app = load_manifest(args.manifest)
    if java_missing():
        raise BackfillCommandError(SPARK_MISSING)
    from eddyline_runtime.backfill import backfill_layout, spark_job
    from eddyline_runtime.log import open_log
    from eddyline_runtime.log.positions import read_positions
    from eddyline_runtime.processing.loader import load_topology
    from eddyline_runtime.restore.spark.spark_build import spark_session

    config = app.streams_config()
    application = config.application_id
    log_url = args.log_url or app.spec.log.url
    topology = load_topology(args.topology)
    log = open_log(log_url, read_only=True)
    try:
        layout = backfill_layout(
            topology, application, {name: spec.partitions for name, spec in log.topics().items()}
        )
        inputs = [tp for task in layout.tasks() for tp in layout.input_partitions(task)]
        # Where the new revision's tasks resume (the positions rule, log/positions.py): no
        # pod processes during the upgrade's Backfilling step, so they hold still, and the
        # history ends exactly there.
        ends = read_positions(log, application, inputs)
    finally:
        log.close()
    plan = spark_job.fix_plan(
        topology,
        application=application,
        reference=args.topology,
        stores=args.store,
        log_url=log_url,
        output=args.output,
        build_id=args.build_id,
        end_offsets=ends,
        properties=dict(app.spec.config),
        from_timestamp_ms=args.from_timestamp,
        # The operator runs this Job only for stores the running revision lacks (it refuses
        # the others, reconcile/upgrade.py): an earlier attempt's state is replaced.
        supersede=True,
    )
    conf = dict(_setting(item, "--conf") for item in args.conf)
    spark = spark_session(args.master, conf, app_name=spark_job.APP_NAME)
    logged_at = [float("-inf")]

    def log_progress(progress: spark_job.BackfillProgress) -> None:
        # The Job's pod log (kubectl logs job/<name>): a line every few seconds, and the last.
        now = time.monotonic()
        if now - logged_at[0] >= JOB_PROGRESS_SECONDS or progress.tasks_done == progress.tasks:
            logged_at[0] = now
            print(f"{RUNNING_HISTORY}: {progress.describe()}", file=sys.stderr, flush=True)

    try:
        result = spark_job.run_backfill(spark, plan, on_progress=log_progress)
    finally:
        spark.stop()
    return BackfillVerdict(
        state=BackfillState.SUCCEEDED,
        message=f"built {', '.join(plan.stores)} from {result.records:,} records in "
        f"{len(result.tasks)} task partitions"
        # The time, not each partition's start: the verdict must fit a termination message.
        + (
            ""
            if args.from_timestamp is None
            else " at or after "
            + (_EPOCH + datetime.timedelta(milliseconds=args.from_timestamp)).isoformat()
        ),
        buildId=plan.build_id,
        records=result.records,
        endOffsets=dict(plan.end_offsets),
    )
