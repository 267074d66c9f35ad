"""Windows benchmark: a 1-minute tumbling count and a 30-minute session count, beside bytewax.

Run it with ``make bench-windows`` (the project's ``.venv`` and bytewax's own
``.venv-bytewax``, as ``make bench-runtime``). One generated click stream
(``EVENTS`` events, default 1,000,000; 10,000 keys; one event per ms; 1% of
events up to 5 s out of order, inside the 10 s grace) goes through:

* eddyline, exactly-once (``commit.interval.ms`` 100), on the embedded log,
  one partition, one stream thread, in a process of its own:
  ``windowed_by(TimeWindows.of_size_with_grace(1 min, 10 s)).emit_final().count()``
  and ``windowed_by(SessionWindows.of_inactivity_gap_with_grace(30 min, 10 s)).count()``;
* bytewax 0.21.1 with recovery (epoch 100 ms), ``bench_bytewax_windows.py``:
  ``fold_window`` on an event clock, tumbling and session windowers. The clock
  waits 1 hour, not the 10 s grace: bytewax's watermark also advances with the
  system time elapsed since a key's newest event, and waiting only the grace
  it dropped about half of this replay's events as late (``late`` stream), so
  its results could not match anyone's. It emits every window at the end of
  its input.

Throughput is events over the wall time from the process's start of
processing to its end (eddyline: start to caught up and closed, restoring
nothing); CPU per event and peak RSS (VmHWM) of each process. Results are
checked equal: every tumbling window eddyline closed (end + grace <= its final
stream time) came out once with bytewax's count, and no other; the sessions
eddyline holds at the end (latest update per session, merged ones removed)
are bytewax's sessions. The Quix Streams comparison and eddyline on Kafka
(the issue's ``quix_*`` and ``eddyline_kafka_*`` keys) are not measured here
yet. ``BYTEWAX=0`` skips bytewax (it runs about 300 events/s with recovery
here, so 1M events take about an hour). The last line of output is one JSON
object.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
BYTEWAX_PYTHON: Final = ROOT / ".venv-bytewax" / "bin" / "python"
BYTEWAX_SCRIPT: Final = Path(__file__).with_name("bench_bytewax_windows.py")
KEYS: Final = 10_000
MINUTE_MS: Final = 60_000
GAP_MS: Final = 30 * MINUTE_MS
GRACE_MS: Final = 10_000
LATE_MS: Final = 5_000
# bytewax's event clock waits this long (>= the grace, as the issue allows): its watermark
# also advances with the system time elapsed since a key's newest event, and with a wait
# of the grace alone it dropped about half the events of this fast replay as late.
BYTEWAX_WAIT_MS: Final = 3_600_000
BASE_MS: Final = 1_700_000_000_000
TOPICS: Final = {"tumbling": "tumbling-finals", "session": "session-results"}


def generate(events: int, seed: int = 24) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    stream = []
    for i in range(events):
        timestamp = BASE_MS + i
        if rng.random() < 0.01:
            timestamp -= rng.randrange(1, LATE_MS)
        stream.append((f"k{rng.randrange(KEYS)}", timestamp))
    return stream


# -- eddyline, in a process of its own ------------------------------------------------------


def eddyline_topology(kind: str) -> Any:
    from eddyline_runtime.processing import SessionWindows, StreamsBuilder, TimeWindows

    builder = StreamsBuilder()
    grouped = builder.stream("clicks", key_serde="string", value_serde="string").group_by_key()
    if kind == "tumbling":
        (
            grouped.windowed_by(TimeWindows.of_size_with_grace(MINUTE_MS, GRACE_MS))
            .emit_final()
            .count("tumbling")
            .to_stream()
            .map(lambda w, count: (f"{w.key}@{w.window.start}", f"{w.window.end}:{count}"))
            .to(TOPICS[kind], key_serde="string", value_serde="string")
        )
    else:
        (
            grouped.windowed_by(SessionWindows.of_inactivity_gap_with_grace(GAP_MS, GRACE_MS))
            .count("sessions")
            .to_stream()
            .map(
                lambda w, count: (
                    f"{w.key}@{w.window.start}",
                    None if count is None else f"{w.window.end}:{count}",
                )
            )
            .to(TOPICS[kind], key_serde="string", value_serde="string")
        )
    return builder.build()


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def eddyline_worker(log_path: str, state_dir: str, kind: str) -> None:
    from eddyline_runtime.config import StreamsConfig
    from eddyline_runtime.engine.instance import StreamsInstance
    from eddyline_runtime.log import SqliteLog

    config = StreamsConfig.from_properties(
        {
            "application.id": f"bench-{kind}",
            "state.dir": state_dir,
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": 100,
        }
    )
    log = SqliteLog(Path(log_path))
    instance = StreamsInstance(eddyline_topology(kind), config, log)
    cpu_started, started = time.process_time(), time.perf_counter()
    instance.start()
    try:
        instance.wait_until_caught_up(3_600)
    finally:
        instance.close()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    log.close()
    print(
        json.dumps(
            {"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_bytes": peak_rss_bytes()}
        )
    )


def run_json(command: list[str]) -> dict[str, Any]:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[1]} failed:\n{done.stderr[-3_000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def eddyline_results(log: Any, kind: str) -> dict[str, list[int]]:
    from eddyline_runtime.partitions import TopicPartition

    tp = TopicPartition(TOPICS[kind], 0)
    found: dict[str, list[int]] = {}
    seen: Counter[str] = Counter()
    position = log.beginning_offset(tp)
    while True:
        records = log.fetch(tp, position, 100_000).records
        if not records:
            break
        for record in records:
            key = record.key.decode()
            if record.value is None:
                found.pop(key, None)
                continue
            end, count = record.value.decode().split(":")
            found[key] = [int(end), int(count)]
            seen[key] += 1
        position = records[-1].offset + 1
    if kind == "tumbling":
        repeated = [key for key, n in seen.items() if n > 1]
        if repeated:
            raise AssertionError(f"final results repeated for {len(repeated)} windows")
    return found


def check_equal(
    kind: str, eddyline: dict[str, list[int]], bytewax: dict[str, list[int]], stream_time: int
) -> None:
    """Tumbling: the windows eddyline closed (bytewax closes every window at the end of
    its input); sessions: all of them."""
    if kind == "tumbling":
        bytewax = {k: v for k, v in bytewax.items() if v[0] + GRACE_MS <= stream_time}
    if eddyline != bytewax:
        differing = sorted(
            k for k in eddyline.keys() | bytewax.keys() if eddyline.get(k) != bytewax.get(k)
        )
        raise AssertionError(
            f"{kind}: eddyline and bytewax differ on {len(differing)} windows, e.g. "
            + ", ".join(f"{k}: {eddyline.get(k)} vs {bytewax.get(k)}" for k in differing[:5])
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--eddyline-worker":
        eddyline_worker(*sys.argv[2:5])
        return
    from eddyline_runtime.log import Record, SqliteLog
    from eddyline_runtime.partitions import TopicPartition

    events = int(os.environ.get("EVENTS", "1000000"))
    stream = generate(events)
    stream_time = max(t for _, t in stream)
    result: dict[str, Any] = {"events": events, "keys": KEYS}
    with tempfile.TemporaryDirectory(prefix="bench-windows-") as tmp:
        work = Path(tmp)
        events_file = work / "events.csv"
        events_file.write_text("".join(f"{key},{t}\n" for key, t in stream))
        log_path = work / "log.db"
        log = SqliteLog(log_path)
        log.create_topic("clicks", 1)
        tp = TopicPartition("clicks", 0)
        for i in range(0, events, 50_000):
            log.produce(tp, [Record(k.encode(), b"c", t) for k, t in stream[i : i + 50_000]])
        log.close()
        for kind in ("tumbling", "session"):
            run = run_json(
                [sys.executable, "-m", "tests.bench.bench_windows", "--eddyline-worker",
                 str(log_path), str(work / f"state-{kind}"), kind]
            )  # fmt: skip
            log = SqliteLog(log_path)
            eddyline = eddyline_results(log, kind)
            log.close()
            result[f"eddyline_{kind}_events_per_s"] = round(events / run["seconds"])
            result[f"eddyline_{kind}_cpu_us_per_event"] = round(
                1e6 * run["cpu_seconds"] / events, 1
            )
            result[f"eddyline_{kind}_peak_rss_mb"] = round(run["peak_rss_bytes"] / 2**20)
            result[f"eddyline_{kind}_windows"] = len(eddyline)
            print(
                f"eddyline {kind}: {result[f'eddyline_{kind}_events_per_s']:,} events/s", flush=True
            )
            if kind == "tumbling" and not eddyline:
                raise AssertionError("no tumbling window closed: generate more EVENTS (>= 50,000)")
            if os.environ.get("BYTEWAX", "1") == "0":
                continue
            if not BYTEWAX_PYTHON.exists():
                print(f"(no {BYTEWAX_PYTHON}: bytewax skipped; `make bench-windows` creates it)")
                continue
            work_dir = work / f"bytewax-{kind}"
            work_dir.mkdir()
            yardstick = run_json(
                [str(BYTEWAX_PYTHON), str(BYTEWAX_SCRIPT), str(events_file), kind, str(work_dir),
                 str(BYTEWAX_WAIT_MS)]
            )  # fmt: skip
            result[f"bytewax_{kind}_events_per_s"] = round(events / yardstick["seconds"])
            result[f"bytewax_{kind}_cpu_us_per_event"] = round(
                1e6 * yardstick["cpu_seconds"] / events, 1
            )
            result[f"bytewax_{kind}_peak_rss_mb"] = round(yardstick["peak_rss_bytes"] / 2**20)
            check_equal(kind, eddyline, yardstick["windows"], stream_time)
            result[f"{kind}_results_equal"] = True
            result[f"eddyline_vs_bytewax_{kind}"] = round(
                result[f"eddyline_{kind}_events_per_s"] / result[f"bytewax_{kind}_events_per_s"], 2
            )
            print(
                f"bytewax {kind}: {result[f'bytewax_{kind}_events_per_s']:,} events/s", flush=True
            )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
