"""eddyline's side of ``make bench-kafka``: the word count on a Kafka broker, until stopped.

Usage: ``python -m tests.bench.bench_kafka_eddyline CONFIG_JSON INPUT_TOPIC OUTPUT_TOPIC``.
CONFIG_JSON holds ``{"bootstrap": "host:port", "config": {...StreamsConfig properties}}``,
written and printed by ``bench_kafka.py``. The topology is ``examples/wordcount``'s with the
benchmark's topics (the Kafka Streams program, ``kstreams/WordCount.java``, is the same).
It prints ``RUNNING`` once started and runs until SIGTERM (closes cleanly) or SIGKILL; a clean
close prints ``COMMITS {json}``: every commit's duration and task transactions per thread, for
the benchmark's commit latency and transactions per second.
With ``EDDYLINE_BENCH_PROFILE=FILE`` the stream thread's loop runs under cProfile (a profiler
sees only the thread that enabled it) and its stats are written to FILE when it closes;
``EDDYLINE_BENCH_PROFILE_CLOCK=cpu`` times it by the thread's CPU time instead of the wall
clock (``wall``, the default), so the two profiles separate computing from waiting.
With ``EDDYLINE_BENCH_SERIAL_STARTS=1`` a thread's new tasks start their transactional
producers one after another, each ``init_transactions`` waiting for the previous one (the
port's default ``Log.transactional_producers``, as eddyline started them before issue 32), so
``--start-mode concurrent,serial`` shows the concurrent start's saving in one run.
"""

from __future__ import annotations

import cProfile
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine import stream_thread as stream_thread_module
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.stream_thread import CommitReport
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.log.port import Log
from eddyline_runtime.processing import StreamsBuilder, Topology

SERIAL_STARTS_ENV = "EDDYLINE_BENCH_SERIAL_STARTS"
PROFILE_CLOCK_ENV = "EDDYLINE_BENCH_PROFILE_CLOCK"
PROFILE_CLOCKS = ("wall", "cpu")


def word_count(input_topic: str, output_topic: str) -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream(input_topic, value_serde="string")
        .flat_map_values(lambda line: line.lower().split())
        .group_by(lambda _, word: word, value_serde="string")
        .count("counts")
        .to_stream()
        .to(output_topic, key_serde="string", value_serde="long")
    )
    return builder.build()


def profile_stream_threads(path: str, clock: str) -> None:
    """Runs every stream thread's loop under one cProfile, dumped to ``path`` when it ends.

    ``clock`` ``wall`` times calls by the wall clock (a call waiting on the broker counts
    its wait), ``cpu`` by the thread's CPU time (``time.thread_time``: a wait counts
    nothing, and other processes on a busy machine do not inflate it). Wall minus CPU per
    function is what it waited."""
    if clock not in PROFILE_CLOCKS:
        raise SystemExit(f"{PROFILE_CLOCK_ENV}={clock!r}: give one of {', '.join(PROFILE_CLOCKS)}")
    profiler = cProfile.Profile(time.thread_time) if clock == "cpu" else cProfile.Profile()
    original_run = stream_thread_module.StreamThread._run

    def profiled_run(self: stream_thread_module.StreamThread) -> None:
        profiler.enable()
        try:
            original_run(self)
        finally:
            profiler.disable()
            profiler.dump_stats(path)

    stream_thread_module.StreamThread._run = profiled_run  # type: ignore[method-assign]


def main() -> None:
    if os.environ.get("EDDYLINE_BENCH_PROFILE"):
        profile_stream_threads(
            os.environ["EDDYLINE_BENCH_PROFILE"], os.environ.get(PROFILE_CLOCK_ENV, "wall")
        )
    if os.environ.get(SERIAL_STARTS_ENV) == "1":
        KafkaLog.transactional_producers = Log.transactional_producers  # type: ignore[method-assign]
    spec = json.loads(Path(sys.argv[1]).read_text())
    input_topic, output_topic = sys.argv[2], sys.argv[3]
    stop = threading.Event()

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    log = KafkaLog.open(f"kafka://{spec['bootstrap']}")
    # Per thread: (monotonic instant at the end, seconds, task transactions) of each commit.
    commits: dict[str, list[tuple[float, float, int]]] = {}

    def committed(report: CommitReport) -> None:  # on the committing thread: its own list
        commits.setdefault(report.thread, []).append(
            (time.monotonic(), report.seconds, report.transactions)
        )

    instance = StreamsInstance(
        word_count(input_topic, output_topic),
        StreamsConfig.from_properties(spec["config"]),
        log,
        on_commit=[committed],
    )
    instance.start()
    print("RUNNING", flush=True)
    try:
        while not stop.wait(0.05):
            instance.check()  # raises what a stream thread died of
    finally:
        instance.close()
        log.close()
    print("COMMITS " + json.dumps(commits), flush=True)


if __name__ == "__main__":
    main()
