"""The yardstick of ``bench_runtime.py``: the same word count on bytewax 0.21.1.

Run by ``bench_runtime.py`` as a subprocess of ``.venv-bytewax`` (bytewax's
pins stay out of the project's environment), never imported by it:
``bench_bytewax_wordcount.py LINES_FILE {recovery,none} WORK_DIR``.

The dataflow does what ``examples/wordcount`` does: read the lines, split
each lowercased line into words, key by word, count with a ``stateful_map``
that emits every new count (as eddyline publishes each new count), and write
the counts to a sink. ``recovery`` runs it with bytewax's SQLite recovery
store (one partition, initialised in WORK_DIR) and an epoch (snapshot)
interval of 100 ms, eddyline's ``commit.interval.ms`` under exactly-once.
One worker in this process (``run_main``), as eddyline runs one stream
thread.

Prints one JSON line: wall seconds and CPU seconds (this process, every
thread) from the dataflow's start to its end, and the last count per word,
which the parent checks against the generated text.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
from bytewax.connectors.files import FileSource
from bytewax.dataflow import Dataflow
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import run_main

# eddyline's commit.interval.ms under exactly-once (Kafka's default there).
EPOCH_INTERVAL = timedelta(milliseconds=100)


class _LatestCounts(StatelessSinkPartition[tuple[str, int]]):
    def __init__(self, latest: dict[str, int]) -> None:
        self._latest = latest

    def write_batch(self, items: list[tuple[str, int]]) -> None:
        self._latest.update(items)


class LatestCountsSink(DynamicSink[tuple[str, int]]):
    """Keeps the last count written per word (every count is written, as eddyline's are)."""

    def __init__(self) -> None:
        self.latest: dict[str, int] = {}

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _LatestCounts:
        return _LatestCounts(self.latest)


def count(previous: int | None, _word: str) -> tuple[int, int]:
    updated = (previous or 0) + 1
    return updated, updated


def main() -> None:
    lines_file, mode, work_dir = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    sink = LatestCountsSink()
    flow = Dataflow("wordcount")
    lines = op.input("lines", flow, FileSource(lines_file))
    words = op.flat_map("split", lines, lambda line: line.lower().split())
    keyed = op.key_on("word", words, lambda word: word)
    counts = op.stateful_map("count", keyed, count)
    op.output("out", counts, sink)
    options: dict[str, Any] = {"epoch_interval": EPOCH_INTERVAL}
    if mode == "recovery":
        db_dir = work_dir / "recovery"
        db_dir.mkdir(parents=True)
        init_db_dir(db_dir, 1)
        options["recovery_config"] = RecoveryConfig(db_dir)
    cpu_started, started = time.process_time(), time.perf_counter()
    run_main(flow, **options)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "counts": sink.latest}))


if __name__ == "__main__":
    main()
