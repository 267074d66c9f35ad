"""Where the runtime's time goes: cProfile over ``bench_runtime.py``'s word count.

Usage: ``.venv/bin/python -m tests.bench.profile_runtime [--lines N] [--no-cache]
[--guarantee exactly_once_v2|at_least_once] [--top K]``. One run of the word
count (the same topology, generator and log as ``make bench-runtime``); the
stream thread's loop runs under cProfile (a profiler only sees the thread that
enabled it), and the functions with the most own time are printed with their
share of the thread's total. A script for looking, like the benchmarks: it
measures and prints, and never fails on a number.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.demo.wordcount_demo import generate_lines
from eddyline_runtime.engine import stream_thread as stream_thread_module
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing.loader import load_topology
from tests.bench.bench_runtime import INPUT_PARTITIONS, WORDCOUNT, check_word_counts, latest_counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--guarantee", default="exactly_once_v2")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()

    profiler = cProfile.Profile()
    original_run = stream_thread_module.StreamThread._run

    def profiled_run(self: Any) -> None:
        profiler.enable()
        try:
            original_run(self)
        finally:
            profiler.disable()

    stream_thread_module.StreamThread._run = profiled_run  # type: ignore[method-assign]

    texts = generate_lines(args.lines)
    expected = Counter(word for text in texts for word in text.lower().split())
    with tempfile.TemporaryDirectory(prefix="eddyline-profile-") as name:
        directory = Path(name)
        log = SqliteLog(directory / "log.db")
        log.create_topic("text-lines", INPUT_PARTITIONS)
        for partition in range(INPUT_PARTITIONS):
            log.produce(
                TopicPartition("text-lines", partition),
                [
                    Record(None, text.encode(), offset)
                    for offset, text in enumerate(texts[partition::INPUT_PARTITIONS])
                ],
            )
        properties: dict[str, Any] = {
            "application.id": "profile-wordcount",
            "state.dir": str(directory / "state"),
            "processing.guarantee": args.guarantee,
            "commit.interval.ms": 100,
        }
        if args.no_cache:
            properties["statestore.cache.max.bytes"] = 0
        topology = load_topology("wordcount:topology", [WORDCOUNT])
        instance = StreamsInstance(topology, StreamsConfig.from_properties(properties), log)
        started = time.perf_counter()
        instance.start()
        try:
            instance.wait_until_caught_up(600, poll_seconds=0.01)
            seconds = time.perf_counter() - started
        finally:
            instance.close()
        check_word_counts("profile", latest_counts(log, "word-counts"), expected)
        log.close()
    words = sum(expected.values())
    print(
        f"{args.lines:,} lines, {words:,} words, {args.guarantee}, cache "
        f"{'off' if args.no_cache else 'on'}: {seconds:.2f} s under the profiler "
        f"({words / seconds:,.0f} words/s)"
    )
    stats = pstats.Stats(profiler)
    total = sum(entry[2] for entry in stats.stats.values())  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)  # type: ignore[attr-defined]
    print(f"{'own s':>8}{'share':>8}{'calls':>12}  function")
    for (filename, line, function), (_, calls, own, _, _) in rows[: args.top]:
        where = f"{Path(filename).name}:{line}" if line else filename
        print(f"{own:8.3f}{own / total:8.1%}{calls:12,}  {function} ({where})")
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
    print(out.getvalue(), file=sys.stderr)


if __name__ == "__main__":
    main()
