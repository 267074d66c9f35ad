"""The yardstick of ``bench_windows.py``: the same windowed counts on bytewax 0.21.1.

Run by ``bench_windows.py`` as a subprocess of ``.venv-bytewax`` (never imported
by it): ``bench_bytewax_windows.py EVENTS_FILE {tumbling,session} WORK_DIR
WAIT_MS``. EVENTS_FILE holds ``key,timestamp_ms`` lines. The dataflow keys
each event, windows it on an event clock waiting WAIT_MS (the grace) with a
1-minute ``TumblingWindower`` aligned to the epoch, or a ``SessionWindower``
with a 30-minute gap, and folds each window into (first timestamp, last
timestamp, count).

The clock is purely event-time, as eddyline's stream time is: bytewax's
``EventClock`` advances its watermark by the system time elapsed since a key's
newest event (``now_getter``), and wakes each key at the system time of its
next window close (``to_system_utc``). On a replay of 2023's clicks both are
wrong: the elapsed time made the watermark overtake events (with a wait of the
grace alone, about half of them came out ``late``), and every close time lies
in the past, so every key with an open window was woken on every activation.
Here ``now_getter`` returns one fixed instant (the watermark of a key is then
its newest event minus WAIT_MS) and ``to_system_utc`` returns None (windows
close on items and at the end of the input, never on a timer), both documented
parameters of bytewax 0.21's ``EventClock``.

It runs with bytewax's SQLite recovery (an epoch of 100 ms, as
``make bench-runtime``), one worker in this process.

Prints one JSON line: wall and CPU seconds of the dataflow, peak RSS, the events
its clock found late (the parent fails on any), and the
windows as ``{"<key>@<start>": [end, count]}`` (tumbling: end = start + 1 min;
session: the last event's time), which the parent compares with eddyline's.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import bytewax.operators.windowing as win
from bytewax.connectors.files import FileSource
from bytewax.dataflow import Dataflow
from bytewax.operators.windowing import EventClock, SessionWindower, TumblingWindower
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import run_main

EPOCH_INTERVAL = timedelta(milliseconds=100)
MINUTE_MS = 60_000
GAP = timedelta(minutes=30)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Acc = tuple[int, int, int]  # first timestamp, last timestamp, count


class _Windows(StatelessSinkPartition[Any]):
    def __init__(self, found: dict[str, list[int]], tumbling: bool) -> None:
        self._found, self._tumbling = found, tumbling

    def write_batch(self, items: list[Any]) -> None:
        for key, (_window_id, (first, last, count)) in items:
            if self._tumbling:
                start = first - first % MINUTE_MS
                self._found[f"{key}@{start}"] = [start + MINUTE_MS, count]
            else:
                self._found[f"{key}@{first}"] = [last, count]


class WindowsSink(DynamicSink[Any]):
    def __init__(self, tumbling: bool) -> None:
        self.found: dict[str, list[int]] = {}
        self._tumbling = tumbling

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Windows:
        return _Windows(self.found, self._tumbling)


class _Late(StatelessSinkPartition[Any]):
    def __init__(self, late: list[int]) -> None:
        self._late = late

    def write_batch(self, items: list[Any]) -> None:
        self._late[0] += len(items)


class LateSink(DynamicSink[Any]):
    """Counts the events bytewax's clock found late (its ``late`` stream): none expected."""

    def __init__(self) -> None:
        self.late = [0]

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Late:
        return _Late(self.late)


def parse(line: str) -> tuple[str, int]:
    key, timestamp = line.split(",")
    return key, int(timestamp)


def event_time(event: tuple[str, int]) -> datetime:
    return EPOCH + timedelta(milliseconds=event[1])


def fold(acc: Acc, event: tuple[str, int]) -> Acc:
    first, last, count = acc
    timestamp = event[1]
    return min(first, timestamp), max(last, timestamp), count + 1


def fixed_now() -> datetime:
    """The clock's "system time": one instant, so only events move the watermark."""
    return EPOCH


def no_wake_up(_close: datetime) -> datetime | None:
    """No timer wakes a key to close its windows: items and the input's end do."""
    return None


def merge(a: Acc, b: Acc) -> Acc:
    return min(a[0], b[0]), max(a[1], b[1]), a[2] + b[2]


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    events_file, kind, work_dir = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    wait = timedelta(milliseconds=int(sys.argv[4]))
    tumbling = kind == "tumbling"
    sink = WindowsSink(tumbling)
    flow = Dataflow(f"windows-{kind}")
    lines = op.input("lines", flow, FileSource(events_file))
    keyed = op.key_on("key", op.map("parse", lines, parse), lambda event: event[0])
    clock = EventClock(
        event_time, wait_for_system_duration=wait, now_getter=fixed_now, to_system_utc=no_wake_up
    )
    windower: Any = (
        TumblingWindower(length=timedelta(minutes=1), align_to=EPOCH)
        if tumbling
        else SessionWindower(gap=GAP)
    )
    windows = win.fold_window("fold", keyed, clock, windower, lambda: (2**62, -1, 0), fold, merge)
    op.output("out", windows.down, sink)
    late = LateSink()
    op.output("late", windows.late, late)
    db_dir = work_dir / "recovery"
    db_dir.mkdir(parents=True)
    init_db_dir(db_dir, 1)
    cpu_started, started = time.process_time(), time.perf_counter()
    run_main(flow, epoch_interval=EPOCH_INTERVAL, recovery_config=RecoveryConfig(db_dir))
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "peak_rss_bytes": peak_rss_bytes(),
                "late_events": late.late[0],
                "windows": sink.found,
            }
        )
    )


if __name__ == "__main__":
    main()
