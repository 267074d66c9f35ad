"""The process ``test_final_results_crash.py`` SIGKILLs and restarts: final per-second counts.

Usage::

    final_results_worker.py LOG STATE_DIR UNTIL

Runs :func:`topology` (application id ``finals``) on the SQLite log at LOG under
exactly-once, committing every 20 ms. With UNTIL ``caught-up`` it runs until
every input record is processed and committed, then closes cleanly; with UNTIL
``killed`` it never ends on its own and the parent SIGKILLs it, so a run meant
to be killed cannot finish its input first, however fast the machine.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.processing import StreamsBuilder, TimeWindows, Topology

SIZE_MS = 1_000
GRACE_MS = 200
# A safety net: a worker that never catches up (or is never killed) fails instead of
# hanging the suite.
MAX_SECONDS = 120.0
UNTIL = ("caught-up", "killed")


def topology() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("clicks", key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(TimeWindows.of_size_with_grace(SIZE_MS, GRACE_MS))
        .emit_final()
        .count("clicks-per-second")
        .to_stream()
        .map(lambda window, count: (str(window), str(count)))
        .to("finals", key_serde="string", value_serde="string")
    )
    return builder.build()


def finished(instance: StreamsInstance, until: str) -> bool:
    """Whether the run is over: never in the ``killed`` mode. Either way a failed
    stream thread raises here (``check``), and the state moves on to RUNNING."""
    if until == "killed":
        instance.check()
        return False
    return instance.caught_up()


def main() -> None:
    where, state_dir, until = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    if until not in UNTIL:
        raise SystemExit(f"UNTIL must be one of {', '.join(UNTIL)}, not {until!r}")
    config = StreamsConfig.from_properties(
        {
            "application.id": "finals",
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": 20,
        }
    )
    log = SqliteLog(where)
    instance = StreamsInstance(topology(), config, log)
    started = time.monotonic()
    instance.start()
    try:
        while not finished(instance, until):
            if time.monotonic() - started > MAX_SECONDS:
                raise TimeoutError(
                    f"not {'killed' if until == 'killed' else 'caught up'} after "
                    f"{MAX_SECONDS} s: {instance.input_lags()}"
                )
            time.sleep(0.01)
    finally:
        instance.close()
        log.close()


if __name__ == "__main__":
    main()
