"""Both halves of a crash test on the embedded log: a worker process, SIGKILLed and restarted.

The parent (:func:`kill_and_restart`) starts a worker module on a SQLite log, waits for
its first commit, kills it a random moment later, and does so ``kills`` times (deleting
the state directory before one run, as a pod that lost its disk), then lets a last run
finish. The worker (:func:`run_worker`) runs a topology under exactly-once until it has
processed and committed everything, then closes cleanly. Between them, the events file:
one JSON line per commit (``{"event": "commit", ...}``, one ``write()`` on an
``O_APPEND`` file, so lines survive a SIGKILL) and ``{"event": "closed"}`` after a clean
close. What the output must hold is each test's own.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.stream_thread import CommitReport
from eddyline_runtime.log import Log, Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Topology
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
# The worker's own bound: a run that cannot catch up fails instead of hanging its test.
WORKER_MAX_SECONDS = 120.0


def commits(events: Path) -> int:
    """The commits a worker reported in ``events`` so far."""
    if not events.exists():
        return 0
    return sum(json.loads(line)["event"] == "commit" for line in events.read_text().splitlines())


def kill_and_restart(
    worker_module: str,
    log_path: Path,
    tmp_path: Path,
    *,
    kills: int,
    seed: int,
    final_timeout: float,
    wipe_state_before_run: int = 2,
) -> None:
    """Run ``python -m worker_module LOG STATE_DIR EVENTS`` ``kills`` times, each SIGKILLed
    within half a second after its first commit, then once to its clean end."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("EDDYLINE_")}
    rng = random.Random(seed)
    state, stderr_path = tmp_path / "state", tmp_path / "worker.stderr"
    killed = 0
    for run in range(kills + 1):
        events = tmp_path / f"events-{run}.jsonl"
        if run == wipe_state_before_run:
            # A pod that lost its disk: every store comes back from its changelog.
            shutil.rmtree(state)
        with stderr_path.open("ab") as stderr:
            worker = subprocess.Popen(
                [sys.executable, "-m", worker_module, str(log_path), str(state), str(events)],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
            )
        try:
            if run < kills:
                wait_for(functools.partial(_committed_or_ended, events, worker), "a commit", 60)
                time.sleep(rng.uniform(0.0, 0.5))
                if worker.poll() is None:
                    worker.send_signal(signal.SIGKILL)
                    assert worker.wait(timeout=30) == -signal.SIGKILL
                    killed += 1
            else:
                assert worker.wait(timeout=final_timeout) == 0, stderr_path.read_text()[-3000:]
                assert '"closed"' in events.read_text()
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    assert killed == kills, "a run ended before its kill: the input is too small to crash in"


def _committed_or_ended(events: Path, worker: subprocess.Popen[bytes]) -> bool:
    return commits(events) >= 1 or worker.poll() is not None


def committed_records(log: Log, topic: str, partitions: int) -> Iterator[Record]:
    """Every record of ``topic``, partition by partition, in offset order."""
    for partition in range(partitions):
        tp = TopicPartition(topic, partition)
        offset, end = log.beginning_offset(tp), log.end_offset(tp)
        while offset < end:
            records = log.fetch(tp, offset, 10_000).records
            if not records:
                break
            yield from records
            offset = records[-1].offset + 1


def run_worker(topology: Topology, application_id: str) -> None:
    """The worker's side, from ``sys.argv``: LOG STATE_DIR EVENTS."""
    where, state_dir, events_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    fd = os.open(events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(event: dict[str, Any]) -> None:
        os.write(fd, (json.dumps(event) + "\n").encode())

    def committed(report: CommitReport) -> None:
        emit({"event": "commit", "records": report.records})

    config = StreamsConfig.from_properties(
        {
            "application.id": application_id,
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": 0,  # a commit after each batch (<= 1,000 records per task)
        }
    )
    log = SqliteLog(Path(where))
    instance = StreamsInstance(topology, config, log, on_commit=[committed])
    started = time.monotonic()
    instance.start()
    try:
        while not instance.caught_up():
            if time.monotonic() - started > WORKER_MAX_SECONDS:
                raise TimeoutError(
                    f"not caught up after {WORKER_MAX_SECONDS} s: {instance.input_lags()}"
                )
            time.sleep(0.01)
    finally:
        instance.close()
        log.close()
    emit({"event": "closed"})
    os.close(fd)
