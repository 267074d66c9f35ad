"""`eddyline run MANIFEST` as a user runs it: a real process, its exit code and its output."""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_runtime.cli import main
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_processor"
EVENTS = [(f"e{i % 7}", {"n": i}) for i in range(10)]  # ids e0..e6, then e0..e2 again


# EDDYLINE_<NAME> variables override manifests: the runs here see none.
ENVIRONMENT = {name: value for name, value in os.environ.items() if not name.startswith("EDDYLINE")}


def eddyline(*args: str) -> list[str]:
    return [sys.executable, "-m", "eddyline_runtime.cli", *args]


def run_eddyline(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        eddyline(*args),
        cwd=cwd,
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write_manifest(directory: Path, topology: str | None = None, **config: Any) -> Path:
    """The custom_processor example's manifest and module, copied; log and state in directory."""
    shutil.copy(EXAMPLE / "custom_processor.py", directory / "custom_processor.py")
    document = yaml.safe_load((EXAMPLE / "streamapp.yaml").read_text(encoding="utf-8"))
    if topology is not None:
        document["spec"]["topology"] = topology
    document["spec"]["log"]["url"] = f"sqlite:///{directory / 'log.db'}"
    document["spec"]["config"]["state.dir"] = str(directory / "state")
    document["spec"]["config"].update(config)
    manifest = directory / "streamapp.yaml"
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    return manifest


def unique_events(log: SqliteLog) -> list[str]:
    keys = []
    for partition in range(log.topics()["unique-events"].partitions):
        records = log.fetch(TopicPartition("unique-events", partition), 0).records
        keys.extend(r.key.decode() for r in records if r.key is not None)
    return sorted(keys)


def committed_inputs(log: SqliteLog, group: str = "custom-processor") -> int:
    partitions = [TopicPartition("events", p) for p in range(log.topics()["events"].partitions)]
    return sum(log.committed_offsets(group, partitions).values())


PROGRESS = re.compile(r"processed ([\d,]+) records")


def processed_in(line: str) -> int:
    found = PROGRESS.search(line)
    return -1 if found is None else int(found.group(1).replace(",", ""))


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    log = SqliteLog(tmp_path / "log.db")
    yield log
    log.close()


def test_run_until_caught_up_runs_the_example_manifest_as_shipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's steps, from a fresh directory: the manifest's relative paths land there."""
    url = "sqlite:///" + str(tmp_path / ".eddyline-state" / "custom-processor" / "log.db")
    assert main(["log", "--log", url, "create-topic", "events", "--partitions", "2"]) == 0
    lines = "".join(f"{key}:{json.dumps(value)}\n" for key, value in EVENTS)
    produce = ["log", "--log", url, "produce", "events", "--key-separator", ":"]
    assert main(produce, stdin=io.StringIO(lines)) == 0

    result = run_eddyline("run", str(EXAMPLE / "streamapp.yaml"), "--until-caught-up", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "processed 10 records" in result.stderr
    assert "input lag 0" in result.stderr
    assert (tmp_path / ".eddyline-state" / "custom-processor" / "state").is_dir()
    for partition in ("0", "1"):  # the runtime partitions outputs by key
        consume = ["log", "--log", url, "consume", "unique-events", "--partition", partition]
        assert main(consume) == 0
    consumed = capsys.readouterr().out.splitlines()
    # The first ten events hold the ids e0..e6, then e0..e2 again: each id once.
    assert sorted(line.split("\t")[1] for line in consumed) == [f"e{i}" for i in range(7)]


def test_a_bad_config_value_fails_naming_the_key_and_the_accepted_values(
    tmp_path: Path,
) -> None:
    manifest = write_manifest(tmp_path, **{"processing.guarantee": "exactly_once"})

    result = run_eddyline("run", str(manifest), "--until-caught-up", cwd=tmp_path)

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    error = result.stderr.strip()
    assert error.startswith(f"error: {manifest}: ")
    assert '"processing.guarantee"' in error
    assert "'exactly_once'" in error
    assert "'at_least_once', 'exactly_once_v2'" in error


def test_more_standbys_than_other_replicas_runs_with_a_warning_naming_the_cap(
    tmp_path: Path, log: SqliteLog
) -> None:
    manifest = write_manifest(tmp_path, **{"num.standby.replicas": 2})
    log.create_topic("events", 2)

    result = run_eddyline("run", str(manifest), "--until-caught-up", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, result.stderr
    assert (
        "num.standby.replicas is 2 but spec.replicas is 1: each stateful task gets 0 "
        "standby replica(s)"
    ) in warnings[0]


def test_a_missing_input_topic_fails_naming_it(tmp_path: Path, log: SqliteLog) -> None:
    manifest = write_manifest(tmp_path)
    log.create_topic("something-else", 1)

    result = run_eddyline("run", str(manifest), "--until-caught-up", cwd=tmp_path)

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    url = f"sqlite:///{tmp_path / 'log.db'}"
    assert f"input topic(s) events do not exist in the log {url}" in result.stderr
    assert f"eddyline log --log {url} create-topic NAME" in result.stderr


def test_until_caught_up_stops_when_an_input_was_truncated_before_anything_was_committed(
    tmp_path: Path, log: SqliteLog
) -> None:
    """Reading starts at a partition's beginning, not 0: a partition whose records were all
    deleted holds nothing to read, so it is caught up without ever being committed."""
    manifest = write_manifest(tmp_path)
    log.create_topic("events", 2)
    truncated, kept = TopicPartition("events", 0), TopicPartition("events", 1)
    log.produce(truncated, [Record(f"gone{i}".encode(), b"{}", i) for i in range(5)])
    log.produce(kept, [Record(f"e{i}".encode(), b"{}", i) for i in range(5)])
    assert log.delete_records(truncated, 5) == 5  # retention took the whole partition

    result = run_eddyline("run", str(manifest), "--until-caught-up", cwd=tmp_path, timeout=45)

    assert result.returncode == 0, result.stderr
    assert unique_events(log) == [f"e{i}" for i in range(5)]
    assert log.committed_offsets("custom-processor", [truncated, kept]) == {kept: 5}


@pytest.mark.parametrize("membership", ["--membership-configmap", "--member-file"])
def test_every_member_refuses_a_state_dir_that_is_a_file(
    tmp_path: Path, log: SqliteLog, membership: str
) -> None:
    """A pod (the ConfigMap) and a local replica (the file) start as a single process does:
    state.dir is checked before anything runs, and the error says what to fix (a pod that
    skipped the check failed later, as an "unexpected" error). Nothing answers at the API
    address: the check must not need a membership."""
    state_file = tmp_path / "state-file"
    state_file.write_text("not a directory", encoding="utf-8")
    manifest = write_manifest(tmp_path, **{"state.dir": str(state_file)})
    log.create_topic("events", 2)
    source = "app-membership" if membership == "--membership-configmap" else str(tmp_path / "m")
    env = {**ENVIRONMENT, "EDDYLINE_KUBERNETES_API": "http://127.0.0.1:9", "POD_NAMESPACE": "a"}

    result = subprocess.run(
        eddyline("run", str(manifest), membership, source, "--instance-id", "app-0"),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "state.dir" in result.stderr
    assert "it is a file: remove it or choose another state.dir" in result.stderr


SLOW_TOPOLOGY = """
import time

from custom_processor import DeduplicateProcessor, topology as example_topology


class SlowDeduplicateProcessor(DeduplicateProcessor):
    def process(self, key, value):
        time.sleep(0.001)  # the run must still be busy when SIGTERM arrives
        super().process(key, value)


def topology():
    built = example_topology()
    built.nodes["deduplicate"].supplier = SlowDeduplicateProcessor
    return built
"""


def test_sigterm_commits_what_was_processed_then_exits_cleanly(
    tmp_path: Path, log: SqliteLog
) -> None:
    # No commit falls due on its own while input remains (1 ms per record, 5,000
    # records): whatever is committed, the shutdown committed.
    (tmp_path / "slow_deduplicate.py").write_text(SLOW_TOPOLOGY, encoding="utf-8")
    manifest = write_manifest(
        tmp_path, "slow_deduplicate:topology", **{"commit.interval.ms": 600_000}
    )
    total = 5_000
    log.create_topic("events", 1)
    log.produce(
        TopicPartition("events", 0), [Record(f"e{i}".encode(), b"{}", i) for i in range(total)]
    )
    process = subprocess.Popen(
        eddyline("run", str(manifest)),
        cwd=tmp_path,
        env=ENVIRONMENT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    stderr = process.stderr
    assert stderr is not None

    def read_stderr() -> None:
        for line in stderr:
            lines.put(line)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while not (seen and PROGRESS.search(seen[-1]) and processed_in(seen[-1]) > 0):
            assert process.poll() is None, "".join(seen)
            assert time.monotonic() < deadline, "".join(seen)
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=0.5))
        # Processing, nothing committed yet: neither input offsets nor outputs.
        assert committed_inputs(log) == 0
        assert "unique-events" not in log.topics() or unique_events(log) == []

        process.send_signal(signal.SIGTERM)
        returncode = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(timeout=10)
        stderr.close()
    while not lines.empty():
        seen.append(lines.get())

    assert returncode == 0, "".join(seen)
    assert "Traceback" not in "".join(seen)
    final = seen[-1]
    processed = processed_in(final)
    assert 0 < processed < total, final  # stopped while busy, not after the input ran out
    assert final.rstrip().endswith("commits 1"), final  # the shutdown's, and only it
    # The final commit holds exactly what was processed: offsets and outputs alike.
    assert committed_inputs(log) == processed
    assert unique_events(log) == sorted(f"e{i}" for i in range(processed))
