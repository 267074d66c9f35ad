"""``examples/wordcount`` as a local replica group on a SQLite log, and what to watch it by.

The failover test (``tests/integration/test_failover.py``), the failover
benchmark (``tests/bench/bench_failover.py``) and the replica-group e2e tests
(``tests/e2e/test_replica_group.py``) all start the example the same way:
three replicas (one process each, ``exactly_once_v2``, one standby per
stateful task, ``commit.interval.ms`` 100), the log and the state under one
directory, lines round-robin over the four input partitions. The group is
watched from outside: committed offsets on the log, ``/readyz`` and
``/v1/lags`` on the replicas, the restore lines in the replicas' logs.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from eddyline_runtime.local_group import LocalGroup
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.runner import load_app, start_group
from eddyline_runtime.serde import serde_for
from tests.support.ports import free_port_range

REPO: Final = Path(__file__).resolve().parents[2]
WORDCOUNT: Final = REPO / "examples" / "wordcount" / "wordcount.py"
APPLICATION_ID: Final = "wordcount"
INPUT: Final = "text-lines"
OUTPUT: Final = "word-counts"
STORE: Final = "word-counts"
CHANGELOG: Final = f"{APPLICATION_ID}-{STORE}-changelog"
PARTITIONS: Final = 4
REPLICAS: Final = 3
COUNTING_SUBTOPOLOGY: Final = 1  # sub-topology 0 splits lines and repartitions by word
LONGS: Final = serde_for("long")
STRINGS: Final = serde_for("string")
# What a replica logs once it restored a store (seconds: how long the restore took).
RESTORE_LINE: Final = re.compile(
    r"task (?P<task>\S+) restored store (?P<store>\S+): (?P<records>\d+) records from "
    r"(?P<changelog>\S+) offsets (?P<first>-?\d+)\.\.(?P<end>-?\d+)(?: in (?P<seconds>[\d.]+) s)?"
)
_POLL_SECONDS: Final = 0.05
_BATCH: Final = 50_000


# -- starting the group ---------------------------------------------------------------------


def write_manifest(
    directory: Path,
    *,
    base_port: int | None = None,
    replicas: int = REPLICAS,
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """The word-count example as three replicas, its log and state under ``directory``.

    With ``base_port``, ``application.server`` names it: replica i then answers
    queries on ``base_port + i`` when the group is started without a port.
    """
    directory = directory.resolve()
    shutil.copy(WORDCOUNT, directory / "wordcount.py")
    config: dict[str, Any] = {
        "processing.guarantee": "exactly_once_v2",
        "num.standby.replicas": 1,
        "commit.interval.ms": 100,
        "state.dir": str(directory / "state"),
    }
    if base_port is not None:
        config["application.server"] = f"127.0.0.1:{base_port}"
    config.update(extra_config or {})
    document = {
        "apiVersion": "eddyline.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": {"name": APPLICATION_ID},
        "spec": {
            "topology": "wordcount:topology",
            "replicas": replicas,
            "log": {"url": f"sqlite:///{directory / 'log.db'}"},
            "config": config,
        },
    }
    manifest = directory / "streamapp.yaml"
    manifest.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return manifest


def produce_lines(
    log: SqliteLog, lines: Sequence[str], partitions: Sequence[int] = range(PARTITIONS)
) -> None:
    """Keyless lines round-robin over ``partitions`` of the input (created if missing)."""
    if INPUT not in log.topics():
        log.create_topic(INPUT, PARTITIONS)
    now = int(time.time() * 1000)
    for index, partition in enumerate(partitions):
        batch = [Record(None, line.encode(), now) for line in lines[index :: len(partitions)]]
        for start in range(0, len(batch), _BATCH):
            log.produce(TopicPartition(INPUT, partition), batch[start : start + _BATCH])


def start_replica_group(
    directory: Path,
    lines: Sequence[str],
    *,
    replicas: int = REPLICAS,
    spare_ports: int = 0,
    extra_config: dict[str, Any] | None = None,
) -> tuple[SqliteLog, LocalGroup]:
    """Write the manifest, produce ``lines``, start the (three) replicas on free ports.

    Their output goes to ``directory/logs/replica-<id>.log``. The caller stops
    the group and closes the log (or uses :func:`running_replica_group`).
    ``spare_ports`` keeps that many more ports free after theirs, for replicas
    a scale-out adds.
    """
    manifest = write_manifest(directory, replicas=replicas, extra_config=extra_config)
    log = SqliteLog(directory / "log.db")
    try:
        produce_lines(log, lines)
        group = start_group(
            manifest,
            load_app(manifest),
            logs_dir=directory / "logs",
            base_port=free_port_range(replicas + spare_ports),
            out=io.StringIO(),
        )
    except BaseException:
        log.close()
        raise
    return log, group


@contextlib.contextmanager
def running_replica_group(
    directory: Path, lines: Sequence[str]
) -> Iterator[tuple[SqliteLog, LocalGroup]]:
    """:func:`start_replica_group`, stopped and closed again at the end of the block."""
    log, group = start_replica_group(directory, lines)
    try:
        yield log, group
    finally:
        group.stop()
        log.close()


# -- watching it ----------------------------------------------------------------------------


def processed_inputs(log: SqliteLog) -> list[TopicPartition]:
    """Every input and repartition partition the group reads."""
    return [
        TopicPartition(name, p)
        for name, spec in log.topics().items()
        if name == INPUT or name.endswith("-repartition")
        for p in range(spec.partitions)
    ]


def behind(log: SqliteLog) -> dict[str, tuple[int, int]]:
    """(committed, end) of every input and repartition partition the group has not finished."""
    inputs = processed_inputs(log)
    committed = log.committed_offsets(APPLICATION_ID, inputs)
    ends = {tp: log.end_offset(tp) for tp in inputs}
    return {
        str(tp): (committed.get(tp, 0), end)
        for tp, end in ends.items()
        if committed.get(tp, 0) != end
    }


def wait_caught_up(
    log: SqliteLog, group: LocalGroup, timeout: float, what: str = "the group"
) -> float:
    """Until the group committed every input and repartition record (polling the group,
    which restarts replicas that died); returns the seconds it took."""
    started = time.monotonic()
    while True:
        group.poll()
        left = behind(log)
        if not left:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(
                f"{what}: not caught up in {timeout} s: (committed, end) {left}\n"
                f"{replica_logs(group)}"
            )
        time.sleep(_POLL_SECONDS)


def get_json(address: str, path: str, timeout: float = 2.0) -> tuple[int, Any]:
    """(status, body) of a GET; status 0 (and the error) when nothing answered."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")
    except OSError as error:
        return 0, {"error": str(error)}


def all_ready(group: LocalGroup) -> bool:
    """Every replica is up with all its active tasks restored and running (``/readyz``)."""
    return all(get_json(m.address or "", "/readyz")[0] == 200 for m in group.members)


def wait_ready(group: LocalGroup, timeout: float) -> None:
    """Until :func:`all_ready` (polling the group)."""
    started = time.monotonic()
    while not all_ready(group):
        group.poll()
        if time.monotonic() - started > timeout:
            raise AssertionError(
                f"the replicas were not ready after {timeout} s\n{replica_logs(group)}"
            )
        time.sleep(_POLL_SECONDS)


def wait_standby_current(
    log: SqliteLog, group: LocalGroup, address: str, partition: int, timeout: float
) -> dict[str, int]:
    """Until the standby at ``address`` replayed the partition's changelog to its end;
    returns its ``/v1/lags`` entry then."""
    changelog = TopicPartition(CHANGELOG, partition)
    started = time.monotonic()
    while True:
        group.poll()
        status, body = get_json(address, "/v1/lags")
        lag = body.get(STORE, {}).get(str(partition)) if status == 200 else None
        if (
            lag is not None
            and lag["offset_lag"] == 0
            and lag["current_offset_position"] == log.end_offset(changelog)
        ):
            return dict(lag)
        if time.monotonic() - started > timeout:
            raise AssertionError(f"the standby at {address} did not catch up: {status} {body}")
        time.sleep(_POLL_SECONDS)


def distinct_keys(log: SqliteLog, changelog: TopicPartition) -> int:
    """How many keys the changelog partition holds: the size of its store."""
    keys: set[bytes] = set()
    position, end = log.beginning_offset(changelog), log.end_offset(changelog)
    while position < end:
        batch = log.fetch_changes(changelog, position, _BATCH)
        if batch.last_offset < 0:
            break
        keys.update(key for key, _ in batch.entries)
        position = batch.last_offset + 1
    return len(keys)


def output_history(log: SqliteLog) -> dict[str, list[int]]:
    """Every count published per word, in log order."""
    history: dict[str, list[int]] = {}
    for partition in range(log.topics()[OUTPUT].partitions):
        tp = TopicPartition(OUTPUT, partition)
        position = log.beginning_offset(tp)
        while True:
            fetched = log.fetch(tp, position, _BATCH)
            for record in fetched.records:
                assert record.key is not None and record.value is not None
                history.setdefault(record.key.decode(), []).append(LONGS.deserialize(record.value))
            if not fetched.records:
                break
            position = fetched.records[-1].offset + 1
    return history


def latest_counts(log: SqliteLog) -> dict[str, int]:
    """The last count published per word."""
    return {word: counts[-1] for word, counts in output_history(log).items()}


def log_sizes(group: LocalGroup) -> dict[str, int]:
    """Per member, how long its replica log is now (for :func:`restore_lines` ``since``)."""
    assert group.logs_dir is not None
    sizes = {}
    for member in group.members:
        path = group.logs_dir / f"replica-{member.id}.log"
        sizes[member.id] = path.stat().st_size if path.exists() else 0
    return sizes


def restore_lines(group: LocalGroup, since: dict[str, int], task: str) -> list[dict[str, Any]]:
    """The "task X restored store word-counts" lines the replicas logged after ``since``,
    in member order: member, records, changelog, first and end offset, seconds (-1 unknown)."""
    assert group.logs_dir is not None
    found: list[dict[str, Any]] = []
    for member in group.members:
        with (group.logs_dir / f"replica-{member.id}.log").open("rb") as handle:
            handle.seek(since.get(member.id, 0))
            text = handle.read().decode(errors="replace")
        for match in RESTORE_LINE.finditer(text):
            if match["task"] == task and match["store"] == STORE:
                found.append(
                    {
                        "member": member.id,
                        "records": int(match["records"]),
                        "changelog": match["changelog"],
                        "first": int(match["first"]),
                        "end": int(match["end"]),
                        "seconds": float(match["seconds"] or -1),
                    }
                )
    return found


def replica_logs(group: LocalGroup) -> str:
    """The end of every replica's log, for a failure message."""
    assert group.logs_dir is not None
    return "\n".join(
        f"--- {path.name} (end)\n{path.read_text(errors='replace')[-3_000:]}"
        for path in sorted(group.logs_dir.glob("replica-*.log"))
    )
