"""The ``eddyline`` command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from eddyline_runtime.restore_cli import add_restore_commands, run_restore_command

if TYPE_CHECKING:
    from eddyline_runtime.log import Log, Record

DEFAULT_LOG_URL = "sqlite:///.eddyline-state/log.db"


def main(argv: Sequence[str] | None = None, *, stdin: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eddyline", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_run_command(commands)
    _add_query_command(commands)
    _add_demo_commands(commands)
    _add_log_commands(commands)
    add_restore_commands(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", "WARNING"), format="%(levelname)s %(name)s: %(message)s"
    )
    if args.command == "run":
        return _run_manifest(args)
    if args.command == "query":
        return _run_query(args)
    if args.command == "restore":
        return run_restore_command(args)
    if args.command == "demo":
        if args.demo == "wordcount":
            from eddyline_runtime.demo.wordcount_demo import run_demo as run_wordcount

            return _report_errors(
                lambda: run_wordcount(
                    args.manifest,
                    args.state_dir,
                    args.lines,
                    replicas=args.replicas,
                    base_port=args.base_port,
                )
            )
        from eddyline_runtime.demo.store_demo import run_demo

        return run_demo(args.state_dir)
    return _run_log_command(args, stdin or sys.stdin)


def _add_run_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = commands.add_parser(
        "run", help="run a StreamApp manifest locally until SIGINT/SIGTERM (then commit and close)"
    )
    run.add_argument("manifest", type=Path, help="a StreamApp YAML file")
    run.add_argument("--instance-id", default="0", help="this instance's id (default: 0)")
    run.add_argument(
        "--config",
        type=Path,
        help="a .properties or YAML file of Kafka Streams settings; overrides spec.config "
        "(EDDYLINE_<NAME> environment variables override both)",
    )
    run.add_argument(
        "--until-caught-up",
        action="store_true",
        help="stop once every input record is processed and committed",
    )
    run.add_argument(
        "--member-file",
        type=Path,
        help="run as one replica of a local group, following this membership file "
        "(eddyline run starts replicas this way when spec.replicas > 1)",
    )
    run.add_argument(
        "--membership-configmap",
        metavar="NAME",
        help="run as a pod of a cluster, following the membership the operator publishes in "
        "this ConfigMap of the pod's namespace (watched through the Kubernetes API)",
    )
    run.add_argument("--log-url", help="open this log instead of spec.log.url")
    run.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _add_query_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    query = commands.add_parser(
        "query",
        help="look a key up in a running app: its active host, else the freshest standby",
    )
    query.add_argument("store")
    query.add_argument("key")
    query.add_argument(
        "--bootstrap",
        default="127.0.0.1:7070",
        help="comma-separated host:port of some replicas (default: %(default)s)",
    )
    query.add_argument(
        "--max-lag",
        type=int,
        help="accept a standby at most this many changelog records behind (default: any)",
    )
    query.add_argument("--isolation", choices=["READ_COMMITTED", "READ_UNCOMMITTED"])


def _run_query(args: argparse.Namespace) -> int:
    from eddyline_runtime.query.client import QueryRouter

    def run() -> int:
        router = QueryRouter(args.bootstrap.split(","), acceptable_lag=args.max_lag)
        result = router.get(args.store, args.key, isolation=args.isolation)
        print(
            json.dumps(
                {
                    "key": args.key,
                    "found": result.found,
                    "value": result.value,
                    "host": result.host,
                    "role": result.role,
                    "stale": result.stale,
                    "lag": result.lag,
                    "partition": result.partition,
                }
            )
        )
        return 0

    return _report_errors(run)


def _run_manifest(args: argparse.Namespace) -> int:
    from eddyline_runtime.runner import run_manifest

    def run() -> int:
        run_manifest(
            args.manifest,
            instance_id=args.instance_id,
            config_file=args.config,
            member_file=args.member_file,
            membership_configmap=args.membership_configmap,
            log_url=args.log_url,
            until_caught_up=args.until_caught_up,
        )
        return 0

    return _report_errors(run)


def _report_errors(action: Callable[[], int]) -> int:
    """Our errors already say what to do: print them without a traceback."""
    from eddyline_runtime.errors import EddylineError

    try:
        return action()
    except EddylineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def _add_demo_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser("demo", help="run a demonstration")
    demos = demo.add_subparsers(dest="demo", required=True)
    store = demos.add_parser(
        "store", help="the transactional store: write, crash, reopen, query at both isolations"
    )
    store.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".eddyline-state/demo"),
        help="where the demo's store lives (default: %(default)s)",
    )
    wordcount = demos.add_parser(
        "wordcount", help="word count on the embedded log: generate, process, verify, report"
    )
    wordcount.add_argument(
        "--manifest", type=Path, default=Path("examples/wordcount/streamapp.yaml")
    )
    wordcount.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".eddyline-state/wordcount-demo"),
        help="the demo's log and stores; wiped at start (default: %(default)s)",
    )
    wordcount.add_argument("--lines", type=int, default=50_000, help="lines of text to generate")
    wordcount.add_argument(
        "--replicas", type=int, default=3, help="local replicas (default: %(default)s)"
    )
    wordcount.add_argument(
        "--base-port",
        type=int,
        default=7070,
        help="replica i answers queries on this port + i (default: %(default)s)",
    )


def _add_log_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    log = commands.add_parser("log", help="inspect and feed the log")
    log.add_argument(
        "--log", default=DEFAULT_LOG_URL, help="log URL (default: %(default)s)", dest="url"
    )
    actions = log.add_subparsers(dest="action", required=True)
    actions.add_parser("topics", help="list topics")
    create = actions.add_parser("create-topic", help="create a topic")
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--compacted", action="store_true")
    produce = actions.add_parser("produce", help="append stdin lines as records")
    produce.add_argument("topic")
    produce.add_argument(
        "--partition",
        type=int,
        help="the partition (default: by key as Kafka's default partitioner, "
        "keyless lines round-robin)",
    )
    produce.add_argument(
        "--key-separator", help="split each line into key and value at the first SEP"
    )
    consume = actions.add_parser("consume", help="print records as offset, key, value")
    consume.add_argument("topic")
    consume.add_argument("--partition", type=int, default=0)
    consume.add_argument("--offset", type=int, help="first offset (default: the beginning)")
    consume.add_argument("--max", type=int, default=100, help="at most this many records")
    consume.add_argument(
        "--key-serde", help="print keys through this serde (string, long, int, json, ...)"
    )
    consume.add_argument(
        "--value-serde", help="print values through this serde (a count store's: long)"
    )


def _run_log_command(args: argparse.Namespace, stdin: TextIO) -> int:
    from eddyline_runtime.errors import ConfigError
    from eddyline_runtime.log import LogError, Record, open_log
    from eddyline_runtime.partitions import TopicPartition

    log = open_log(args.url)
    try:
        if args.action == "topics":
            for spec in sorted(log.topics().values(), key=lambda s: s.name):
                kind = " compacted" if spec.compacted else ""
                print(f"{spec.name}\t{spec.partitions} partitions{kind}")
        elif args.action == "create-topic":
            log.create_topic(args.topic, args.partitions, compacted=args.compacted)
        elif args.action == "produce":
            now = int(time.time() * 1000)
            records = []
            for line in stdin.read().splitlines():
                key, value = None, line
                if args.key_separator and args.key_separator in line:
                    key, value = line.split(args.key_separator, 1)
                records.append(Record(key.encode() if key else None, value.encode(), now))
            produced = _produce(log, args.topic, args.partition, records)
            print(f"produced {produced} records", file=sys.stderr)
        else:
            tp = TopicPartition(args.topic, args.partition)
            start = log.beginning_offset(tp) if args.offset is None else args.offset
            keys = _printer(args.key_serde, "--key-serde")
            values = _printer(args.value_serde, "--value-serde")
            for record in log.fetch(tp, start, args.max).records:
                print(f"{record.offset}\t{keys(record.key)}\t{values(record.value)}")
    except (LogError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        log.close()
    return 0


def _produce(log: Log, topic: str, partition: int | None, records: list[Record]) -> int:
    """Append to one partition, or spread as a Kafka producer would."""
    from eddyline_runtime.log import UnknownTopicError
    from eddyline_runtime.partitions import TopicPartition, partition_for_key

    spec = log.topics().get(topic)
    if spec is None:
        raise UnknownTopicError(f'topic "{topic}"', log.topics())
    by_partition: dict[int, list[Record]] = {}
    for index, record in enumerate(records):
        if partition is not None:
            chosen = partition
        elif record.key is not None:
            chosen = partition_for_key(record.key, spec.partitions)
        else:
            chosen = index % spec.partitions
        by_partition.setdefault(chosen, []).append(record)
    for number, batch in sorted(by_partition.items()):
        log.produce(TopicPartition(topic, number), batch)
    return len(records)


def _printer(serde_name: str | None, option: str) -> Callable[[bytes | None], str]:
    """Render a key or value: decoded text by default, or through the named serde."""
    if serde_name is None:
        return lambda data: "" if data is None else data.decode(errors="replace")
    from eddyline_runtime.serde import serde_for

    serde = serde_for(serde_name, key=option)
    return lambda data: "" if data is None else str(serde.deserialize(data))


if __name__ == "__main__":
    sys.exit(main())
