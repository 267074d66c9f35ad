"""The ``eddyline`` command.

Every failure a user can cause ends in one line, ``error: ...``, naming the
input and what to do, and exit code 1 (2 for a malformed command line, from
argparse): our errors say so themselves, and anything else is still one line
(``--traceback`` prints the whole traceback, for a bug report).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from eddyline_runtime.backfill_cli import add_backfill_commands, run_backfill_command
from eddyline_runtime.restore_cli import add_restore_commands, run_restore_command
from eddyline_runtime.state_cli import add_state_commands, run_state_command

if TYPE_CHECKING:
    from eddyline_runtime.log import Log, Record
    from eddyline_runtime.processing.topology import Topology

DEFAULT_LOG_URL = "sqlite:///.eddyline-state/log.db"


# Kafka's rule for topic names: what every Kafka tool accepts.
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def main(argv: Sequence[str] | None = None, *, stdin: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eddyline", description=__doc__)
    parser.add_argument(
        "--traceback", action="store_true", help="on an unexpected error, print its traceback"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _add_run_command(commands)
    _add_query_command(commands)
    _add_describe_command(commands)
    _add_demo_commands(commands)
    _add_log_commands(commands)
    add_restore_commands(commands)
    add_backfill_commands(commands)
    add_state_commands(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", "WARNING"), format="%(levelname)s %(name)s: %(message)s"
    )
    return _report_errors(lambda: _dispatch(args, stdin), show_traceback=args.traceback)


def _dispatch(args: argparse.Namespace, stdin: TextIO | None) -> int:
    if args.command == "run":
        return _run_manifest(args)
    if args.command == "query":
        return _run_query(args)
    if args.command == "describe":
        return _run_describe(args)
    if args.command == "restore":
        return run_restore_command(args)
    if args.command == "backfill":
        return run_backfill_command(args)
    if args.command == "state":
        return run_state_command(args)
    if args.command == "demo":
        if args.demo == "wordcount":
            from eddyline_runtime.demo.wordcount_demo import run_demo as run_wordcount

            return run_wordcount(
                args.manifest,
                args.state_dir,
                args.lines,
                replicas=args.replicas,
                base_port=args.base_port,
                no_progress=args.no_progress,
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
    # A replica's lifeline to its supervisor (local_group.py): internal, not for users.
    run.add_argument("--supervisor-fd", type=int, help=argparse.SUPPRESS)
    run.add_argument(
        "--logs-dir",
        type=Path,
        help="with spec.replicas > 1: write replica N's output to DIR/replica-N.log "
        "(default: the terminal, each line prefixed [replica N])",
    )
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
    query.add_argument(
        "--max-staleness-ms",
        type=int,
        help="accept any copy whose committed data is at most this stale, standby or "
        "restoring (docs/queries.md; default: no bound)",
    )


def _run_query(args: argparse.Namespace) -> int:
    from eddyline_runtime.query.client import QueryRouter
    from eddyline_runtime.query.position import position_to_json

    router = QueryRouter(args.bootstrap.split(","), acceptable_lag=args.max_lag)
    result = router.get(
        args.store, args.key, isolation=args.isolation, max_staleness_ms=args.max_staleness_ms
    )
    reflects = result.reflects
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
                # What the answer reflects (docs/queries.md).
                "member": reflects.member,
                "revision": reflects.revision,
                "position": position_to_json(reflects.position),
                "changelog_offset": reflects.changelog_offset,
                "committed_at_ms": reflects.committed_at_ms,
                "as_of_ms": reflects.as_of_ms,
                "staleness_ms": reflects.staleness_ms,
            }
        )
    )
    return 0


def _add_describe_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    describe = commands.add_parser(
        "describe",
        help="print a StreamApp's topology as Kafka Streams' describe() does, or draw it",
    )
    describe.add_argument("manifest", type=Path, help="a StreamApp YAML file")
    describe.add_argument(
        "--format",
        choices=["text", "dot", "mermaid", "svg"],
        default="text",
        help="text: Kafka's describe(); dot, mermaid: a drawing's source; svg: drawn by "
        "Graphviz (Debian package graphviz) (default: %(default)s)",
    )
    describe.add_argument(
        "--hash",
        action="store_true",
        help="print only the describe hash (the one the pods report and the operator records)",
    )
    describe.add_argument(
        "--upgrade-from",
        type=Path,
        metavar="OLD_MANIFEST",
        help="instead of describing, check an upgrade from OLD_MANIFEST's topology to this "
        "one as the operator does: exit 1, naming each, if a generated store or topic name "
        "moved (GeneratedNamesMoved)",
    )


def _run_describe(args: argparse.Namespace) -> int:
    from eddyline_runtime.processing import description, topology_picture
    from eddyline_runtime.processing.loader import load_topology
    from eddyline_runtime.resource_names import generated_name_notes
    from eddyline_runtime.runner import load_app

    def topology_of(manifest: Path) -> Topology:
        app = load_app(manifest)
        return load_topology(app.spec.topology.ref, [manifest.resolve().parent])

    topology = topology_of(args.manifest)
    if args.upgrade_from is not None:
        return _check_upgrade(topology_of(args.upgrade_from), topology, args.upgrade_from)
    text = topology.describe()
    if args.hash:
        print(description.describe_hash(text))
        return 0
    # Kafka's text stays exactly Kafka's on stdout (diffable, hashed); the generated
    # names are flagged beside it, on stderr.
    for note in generated_name_notes(topology.generated_names()):
        print(note, file=sys.stderr)
    drawings: dict[str, Callable[[Topology], str]] = {
        "text": lambda _: text,
        "dot": topology_picture.to_dot,
        "mermaid": topology_picture.to_mermaid,
        "svg": topology_picture.to_svg,
    }
    sys.stdout.write(drawings[args.format](topology))
    return 0


def _check_upgrade(old: Topology, new: Topology, old_manifest: Path) -> int:
    """The operator's check of an upgrade's generated names, before applying it: the
    same rule (:func:`eddyline_runtime.resource_names.moved_names`) on the two topologies,
    every store and internal topic of the new one counting as still named."""
    from eddyline_runtime.resource_names import moved_names

    kept = {*new.stores, *new.global_stores, *new.internal_topics}
    problems = moved_names(old.generated_names(), new.generated_names(), still_named=kept)
    if not problems:
        print(f"upgrade from {old_manifest}: allowed (no generated name moved)")
        return 0
    print(f"upgrade from {old_manifest}: refused (GeneratedNamesMoved)", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    return 1


def _run_manifest(args: argparse.Namespace) -> int:
    from eddyline_runtime.runner import run_manifest

    run_manifest(
        args.manifest,
        instance_id=args.instance_id,
        config_file=args.config,
        member_file=args.member_file,
        membership_configmap=args.membership_configmap,
        log_url=args.log_url,
        supervisor_fd=args.supervisor_fd,
        until_caught_up=args.until_caught_up,
        logs_dir=args.logs_dir,
    )
    return 0


def _report_errors(action: Callable[[], int], *, show_traceback: bool = False) -> int:
    """Our errors already say what to do: print them without a traceback. Anything else
    is one line too, naming what failed (``--traceback`` for the whole story)."""
    from eddyline_runtime.errors import EddylineError

    try:
        return action()
    except EddylineError as error:
        print(f"error: {error}", file=sys.stderr)
        _write_termination_message(str(error))
        return 1
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:
        if show_traceback:
            traceback.print_exc()
        print(
            f"error: {type(error).__name__}: {error} (unexpected: rerun with "
            "eddyline --traceback ... and report it)",
            file=sys.stderr,
        )
        _write_termination_message(f"{type(error).__name__}: {error}")
        return 1


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number >= 1 (partition counts, record limits)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def _topic_name(text: str) -> str:
    if not _TOPIC_NAME.fullmatch(text) or text in (".", ".."):
        raise argparse.ArgumentTypeError(
            f"invalid topic name {text!r}: use 1 to 249 letters, digits, '.', '_' or '-'"
        )
    return text


# Kubernetes shows this file's content as the container's termination message
# (``terminationMessagePath``); the operator reads it to say why a pod refused to start.
TERMINATION_MESSAGE_ENV = "EDDYLINE_TERMINATION_MESSAGE_PATH"
# The kubelet keeps at most 4096 bytes of it.
_TERMINATION_MESSAGE_MAX = 4000


def _write_termination_message(message: str) -> None:
    path = os.environ.get(TERMINATION_MESSAGE_ENV)
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as file:
            file.write(message.encode()[:_TERMINATION_MESSAGE_MAX].decode(errors="ignore"))
    except OSError as failure:  # never hide the error itself behind this one
        print(
            f"warning: cannot write the termination message to {path}: {failure}", file=sys.stderr
        )


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
    wordcount.add_argument(
        "--no-progress",
        action="store_true",
        help="no live progress line (automatic when stdout is not a terminal)",
    )


def _add_log_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    log = commands.add_parser("log", help="inspect and feed the log")
    log.add_argument(
        "--log", default=DEFAULT_LOG_URL, help="log URL (default: %(default)s)", dest="url"
    )
    actions = log.add_subparsers(dest="action", required=True)
    actions.add_parser("topics", help="list topics")
    create = actions.add_parser("create-topic", help="create a topic")
    create.add_argument("topic", type=_topic_name)
    create.add_argument("--partitions", type=_at_least_one, default=1)
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
    consume.add_argument("--max", type=_at_least_one, default=100, help="at most this many records")
    consume.add_argument(
        "--key-serde", help="print keys through this serde (string, long, int, json, ...)"
    )
    consume.add_argument(
        "--value-serde", help="print values through this serde (a count store's: long)"
    )


def _run_log_command(args: argparse.Namespace, stdin: TextIO) -> int:
    from eddyline_runtime.log import Record, open_log
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
            for line in _text_lines(stdin):
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
                where = f"record {record.offset} of {tp.topic}-{tp.partition}"
                print(f"{record.offset}\t{keys(record.key, where)}\t{values(record.value, where)}")
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


def _printer(serde_name: str | None, option: str) -> Callable[[bytes | None, str], str]:
    """Render a key or value: decoded text by default, or through the named serde."""
    if serde_name is None:
        return lambda data, where: "" if data is None else data.decode(errors="replace")
    from eddyline_runtime.errors import EddylineError
    from eddyline_runtime.serde import SerdeError, serde_for

    serde = serde_for(serde_name, key=option)

    def render(data: bytes | None, where: str) -> str:
        if data is None:
            return ""
        try:
            return str(serde.deserialize(data))
        except (SerdeError, ValueError, TypeError) as error:
            raise EddylineError(
                f'{option} "{serde_name}" cannot read {where} ({error}); use the serde the '
                "topic was written with, or none to print the bytes as text"
            ) from None

    return render


def _text_lines(stdin: TextIO) -> list[str]:
    """stdin's lines as text; a line that is not UTF-8 is named, not a traceback."""
    from eddyline_runtime.errors import EddylineError

    buffer = getattr(stdin, "buffer", None)
    if buffer is None:  # already text (tests pass io.StringIO)
        return stdin.read().splitlines()
    lines = []
    for number, raw in enumerate(buffer.read().splitlines(), start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise EddylineError(
                f"stdin line {number} is not UTF-8 text (byte {raw[error.start]:#04x} at "
                f"position {error.start}); eddyline log produce sends text lines as UTF-8"
            ) from None
    return lines


if __name__ == "__main__":
    sys.exit(main())
