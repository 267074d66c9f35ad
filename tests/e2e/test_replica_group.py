"""`eddyline run` with several replicas, as a user and a kubelet would see it.

Real processes throughout: a supervisor SIGKILLed takes its replicas with it
(they watch a pipe only it holds), a SIGSTOPped replica is noticed by its
liveness probe and republished without, ``--until-caught-up`` ends a group
once the log holds every input as committed, and a single instance fenced
out of its tasks fails instead of claiming it caught up.
"""

from __future__ import annotations

import contextlib
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
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from eddyline_runtime.local_group import LIVENESS_FAILURE_SECONDS, LocalGroup
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.membership import Membership
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.runner import load_app, start_group, uncommitted_inputs
from tests.support.http_client import http_get
from tests.support.ports import free_port_range
from tests.support.replica_group import (
    REPLICAS,
    latest_counts,
    produce_lines,
    replica_logs,
    write_manifest,
)
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
CUSTOM = ROOT / "examples" / "custom_processor"
ENVIRONMENT = {name: value for name, value in os.environ.items() if not name.startswith("EDDYLINE")}
LINES = [f"alpha beta w{i % 50} w{i % 7}" for i in range(400)]
EXPECTED = Counter(word for line in LINES for word in line.split())


def children_of(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(c) for c in (task / "children").read_text().split())
    return found


def running(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status and "\nState:\tX" not in status


class Output:
    """A process's stderr, read on a thread so it never blocks."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._thread = threading.Thread(
            target=lambda: [self.lines.put(line) for line in process.stderr or ()], daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._thread.join(10)

    def text(self) -> str:
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return "".join(self.seen)


@contextlib.contextmanager
def supervisor(manifest: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], Output]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "eddyline_runtime.cli", "run", str(manifest), *args],
        cwd=manifest.parent,
        env=ENVIRONMENT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    output = Output(process)
    try:
        yield process, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        output.close()
        assert process.stderr is not None
        process.stderr.close()


@pytest.mark.slow
def test_a_sigkilled_supervisors_replicas_exit_and_a_new_one_runs_until_caught_up(
    tmp_path: Path,
) -> None:
    base_port = free_port_range(REPLICAS)
    manifest = write_manifest(tmp_path, base_port=base_port)
    log = SqliteLog(tmp_path / "log.db")
    produce_lines(log, LINES)
    addresses = [f"127.0.0.1:{base_port + i}" for i in range(REPLICAS)]
    replicas: set[int] = set()
    try:
        with supervisor(manifest) as (process, output):
            try:
                wait_for(
                    lambda: all(http_get(a, "/readyz", timeout=2).status == 200 for a in addresses),
                    "every replica is ready",
                )
            except AssertionError as error:
                answers = {a: http_get(a, "/readyz", timeout=2) for a in addresses}
                raise AssertionError(
                    f"{error}; /readyz answers: "
                    + ", ".join(f"{a}: {r.status} {r.text[:200]!r}" for a, r in answers.items())
                    + f"\nthe supervisor's output:\n{output.text()[-5000:]}"
                ) from None
            replicas = children_of(process.pid)
            assert len(replicas) == REPLICAS
            # Replica output reaches the supervisor's terminal, prefixed.
            wait_for(
                lambda: all(f"[replica {i}] " in output.text() for i in range(REPLICAS)),
                "every replica's output is forwarded",
                timeout=10,
            )
            process.send_signal(signal.SIGKILL)
            process.wait()
        wait_for(
            lambda: not any(running(pid) for pid in replicas),
            "the orphaned replicas exit",
            timeout=30,
        )
        more = [f"gamma w{i % 11}" for i in range(100)]
        produce_lines(log, more)
        with supervisor(manifest, "--until-caught-up") as (process, output):
            try:
                returncode = process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"--until-caught-up never ended:\n{output.text()[-3000:]}"
                ) from None
            assert returncode == 0, output.text()[-3000:]
            assert "Traceback" not in output.text()
        app = load_app(manifest)
        from eddyline_runtime.engine.topics import resolve_topics
        from eddyline_runtime.processing.loader import load_topology

        topology = load_topology(app.spec.topology.ref, [tmp_path])
        layout = resolve_topics(topology, app.streams_config().application_id, log)
        assert uncommitted_inputs(log, layout) == {}
        assert latest_counts(log) == dict(
            EXPECTED + Counter(word for line in more for word in line.split())
        )
    finally:
        for pid in replicas:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        log.close()


@pytest.mark.slow
def test_a_sigstopped_replica_is_dropped_from_the_membership_then_restarted(
    tmp_path: Path,
) -> None:
    base_port = free_port_range(REPLICAS)
    manifest = write_manifest(tmp_path, base_port=base_port)
    log = SqliteLog(tmp_path / "log.db")
    produce_lines(log, LINES)
    log.close()
    app = load_app(manifest)
    group: LocalGroup = start_group(manifest, app, logs_dir=tmp_path / "logs")
    stopped: int | None = None
    try:
        addresses = [m.address or "" for m in group.members]

        def ready() -> bool:
            group.poll()
            # Probed alive, too: until then only the 60 s startup grace would apply.
            probed = all(group.answered_probe(m.id) for m in group.members)
            return probed and all(
                http_get(a, "/readyz", timeout=2).status == 200 for a in addresses
            )

        wait_for(ready, "every replica is ready", timeout=120)
        stopped = group.pid("1")
        assert stopped is not None
        os.kill(stopped, signal.SIGSTOP)
        frozen_at = time.monotonic()
        events: list[str] = []

        def dropped() -> bool:
            events.extend(group.poll())
            membership = Membership.read(group.membership_file)
            return membership is not None and "1" not in membership.assignment.active

        wait_for(dropped, "the hung replica leaves the membership", timeout=60)
        noticed = time.monotonic() - frozen_at
        # Not at the first failed probe (the last answer came at most a probe period and
        # timeout before the freeze); after the window by a few periods (more under load).
        assert LIVENESS_FAILURE_SECONDS / 2 <= noticed < LIVENESS_FAILURE_SECONDS + 15, events
        assert any(
            re.search(r"replica 1 \(pid \d+\) has not answered /healthz", e) for e in events
        ), events
        assert not running(stopped)  # killed, as a kubelet restarts a failed container
        wait_for(ready, "the replica is restarted and the group ready again", timeout=120)
        membership = Membership.read(group.membership_file)
        assert membership is not None and "1" in membership.assignment.active
    except AssertionError as failure:
        raise AssertionError(f"{failure}\n{replica_logs(group)}") from None
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        group.stop()


SLOW_TOPOLOGY = """
import time

from custom_processor import DeduplicateProcessor, topology as example_topology


class SlowDeduplicateProcessor(DeduplicateProcessor):
    def process(self, key, value):
        time.sleep(0.002)
        super().process(key, value)


def topology():
    built = example_topology()
    built.nodes["deduplicate"].supplier = SlowDeduplicateProcessor
    return built
"""


@pytest.mark.slow
def test_until_caught_up_fails_when_another_instance_fences_this_one_out(
    tmp_path: Path,
) -> None:
    shutil.copy(CUSTOM / "custom_processor.py", tmp_path / "custom_processor.py")
    (tmp_path / "slow_deduplicate.py").write_text(SLOW_TOPOLOGY, encoding="utf-8")
    document = yaml.safe_load((CUSTOM / "streamapp.yaml").read_text(encoding="utf-8"))
    document["spec"]["topology"] = "slow_deduplicate:topology"
    document["spec"]["log"]["url"] = f"sqlite:///{tmp_path / 'log.db'}"
    document["spec"]["config"]["state.dir"] = str(tmp_path / "state")
    manifest = tmp_path / "streamapp.yaml"
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    total = 5_000
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("events", 1)
    events = TopicPartition("events", 0)
    log.produce(events, [Record(f"e{i}".encode(), b"{}", i) for i in range(total)])
    try:
        with supervisor(manifest, "--until-caught-up") as (process, output):
            wait_for(
                lambda: log.committed_offsets("custom-processor", [events]).get(events, 0) > 0,
                "the instance commits some input",
            )
            # Another instance of the application takes task 0_0 over.
            log.transactional_producer("custom-processor-0_0")
            returncode = process.wait(timeout=60)
            text = output.text()
        committed = log.committed_offsets("custom-processor", [events]).get(events, 0)
        assert committed < total
        assert returncode == 1, text[-3000:]
        assert "Traceback" not in text
        error = [line for line in text.splitlines() if line.startswith("error: ")]
        assert len(error) == 1, text[-3000:]
        assert "taken over by another instance" in error[0]
        assert '"custom-processor"' in error[0]
    finally:
        log.close()


def published_generation(membership_file: Path) -> int:
    return Membership.from_json(json.loads(membership_file.read_text())).generation


@pytest.mark.slow
def test_a_second_supervisor_on_the_same_state_directory_exits_naming_the_first(
    tmp_path: Path,
) -> None:
    """Two supervisors used to both rewrite membership.json (22 generations in 25 s)."""
    base_port = free_port_range(REPLICAS)
    manifest = write_manifest(tmp_path, base_port=base_port)
    log = SqliteLog(tmp_path / "log.db")
    produce_lines(log, LINES)
    membership_file = tmp_path / "state" / "membership.json"
    try:
        with supervisor(manifest) as (first, _):
            wait_for(membership_file.exists, "the first supervisor publishes")
            generation = published_generation(membership_file)
            second = subprocess.run(
                [sys.executable, "-m", "eddyline_runtime.cli", "run", str(manifest)],
                cwd=tmp_path,
                env=ENVIRONMENT,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert second.returncode == 1, second.stderr
            assert f"another supervisor (pid {first.pid})" in second.stderr, second.stderr
            assert "Traceback" not in second.stderr
            assert first.poll() is None
            # The second started no replica and published nothing.
            wait_for(
                lambda: latest_counts(log) == dict(EXPECTED),
                "the first group processes its input",
            )
            assert published_generation(membership_file) == generation
    finally:
        log.close()


@pytest.mark.slow
def test_replicas_exit_when_a_supervisor_writing_to_a_file_is_sigkilled(tmp_path: Path) -> None:
    """The replicas' output goes through the supervisor's pipe: once it dies, every write to
    it fails, and the lifeline's own farewell line used to kill the lifeline before it
    signalled (3 of 3 replicas still alive 20 s later). Idle replicas, as a group waiting
    for input is: a busy one died anyway, at its next line of output."""
    base_port = free_port_range(REPLICAS)
    manifest = write_manifest(tmp_path, base_port=base_port)
    log = SqliteLog(tmp_path / "log.db")
    produce_lines(log, [])  # the input topic, and nothing in it
    addresses = [f"127.0.0.1:{base_port + i}" for i in range(REPLICAS)]
    replicas: set[int] = set()
    try:
        with (tmp_path / "supervisor.out").open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "eddyline_runtime.cli", "run", str(manifest)],
                cwd=tmp_path,
                env=ENVIRONMENT,
                stdout=out,
                stderr=out,
            )
        wait_for(
            lambda: all(http_get(a, "/readyz", timeout=2).status == 200 for a in addresses),
            "every replica is ready",
        )
        replicas = children_of(process.pid)
        assert len(replicas) == REPLICAS
        process.send_signal(signal.SIGKILL)
        process.wait()
        wait_for(
            lambda: not any(running(pid) for pid in replicas),
            "the orphaned replicas exit",
            timeout=15,
        )
    finally:
        for pid in replicas:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        log.close()
