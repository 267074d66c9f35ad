"""The process ``bench_runtime.py`` kills and restarts: a count app that runs until killed.

Usage: ``bench_runtime_worker.py LOG STATE_DIR APPLICATION_ID``. It runs
``stream(KEYS_TOPIC).peek(stamp).group_by_key().count(STORE)`` under
``exactly_once_v2`` (stores ``READ_COMMITTED``) on the log at LOG and prints
one JSON object per line on stdout:

* ``{"event": "first", ...}`` once, when the first record reaches the
  topology (the ``peek`` stamps it), with ``time.monotonic()`` instants: when
  this script started running (after the interpreter's own start-up, before
  eddyline's imports), when ``instance.start()`` was called and when the first
  record was processed, plus what restoration did. ``CLOCK_MONOTONIC`` is one
  clock for every process on a Linux machine, so the parent can subtract its
  own instants from these.
* ``{"event": "commit", ...}`` after every commit (from the commit listener).

It never closes on its own before ``MAX_SECONDS``: the parent SIGKILLs it.
"""

from __future__ import annotations

import time

SCRIPT_STARTED = time.monotonic()  # before the imports below, which are part of a restart

import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Final  # noqa: E402

from eddyline_runtime.config import StreamsConfig  # noqa: E402
from eddyline_runtime.engine.instance import StreamsInstance  # noqa: E402
from eddyline_runtime.engine.stream_thread import CommitReport  # noqa: E402
from eddyline_runtime.engine.task_manager import RestoreReport  # noqa: E402
from eddyline_runtime.log import SqliteLog  # noqa: E402
from eddyline_runtime.processing import StreamsBuilder  # noqa: E402

KEYS_TOPIC: Final = "keys"
STORE: Final = "counts"
# A safety net: a worker nobody kills closes cleanly after this long.
MAX_SECONDS: Final = 120.0

_print_lock = threading.Lock()


def emit(event: dict[str, Any]) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


def config(state_dir: Path, application_id: str) -> StreamsConfig:
    return StreamsConfig.from_properties(
        {
            "application.id": application_id,
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            "default.state.isolation.level": "READ_COMMITTED",
        }
    )


def main() -> None:
    log_path, state_dir, application_id = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    first_record: list[float] = []
    first = threading.Event()

    def stamp(_key: object, _value: object) -> None:
        if not first_record:
            first_record.append(time.monotonic())
            first.set()

    builder = StreamsBuilder()
    builder.stream(KEYS_TOPIC).peek(stamp).group_by_key().count(STORE)
    restores: list[RestoreReport] = []

    def committed(report: CommitReport) -> None:
        emit(
            {
                "event": "commit",
                "records": report.records,
                "changelog_records": sum(report.changelog_records.values()),
                "seconds": report.seconds,
            }
        )

    log = SqliteLog(log_path)
    instance = StreamsInstance(
        builder.build(),
        config(state_dir, application_id),
        log,
        on_commit=[committed],
        on_restore=[restores.append],
    )
    instance_started = time.monotonic()
    instance.start()
    deadline = instance_started + MAX_SECONDS
    while not first.wait(0.01):
        instance.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no record processed in {MAX_SECONDS} s")
    emit(
        {
            "event": "first",
            "script_started": SCRIPT_STARTED,
            "instance_started": instance_started,
            "first_record": first_record[0],
            "restores": [
                {
                    "task": str(report.task),
                    "records": report.result.records,
                    "seconds": report.result.seconds,
                    "first_offset": report.result.first_offset,
                    "end_offset": report.result.end_offset,
                }
                for report in restores
            ],
        }
    )
    while time.monotonic() < deadline:
        instance.check()
        time.sleep(0.05)
    instance.close()
    log.close()


if __name__ == "__main__":
    main()
