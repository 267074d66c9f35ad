"""The Quix Streams yardstick of ``bench_windows.py``: the 1-minute tumbling count.

Run by ``bench_windows.py`` as a subprocess of ``.venv-bench`` (quixstreams 3.28.1 in an
environment of its own, never imported by the project): ``bench_quix_windows.py BOOTSTRAP
INPUT_TOPIC OUTPUT_TOPIC STATE_DIR EVENTS GRACE_MS COMMIT_INTERVAL_MS``. Quix runs windows
only on a Kafka broker, so it reads the generated click stream from INPUT_TOPIC (key = the
click's key, value ignored, the Kafka timestamp as event time: Quix's default extractor)
with ``processing_guarantee="exactly-once"``, a fresh consumer group from the earliest
offset, and ``tumbling_window(1 min, grace).count().final(closing_strategy="partition")``
(a window closes when the partition's stream time passes its end + grace, as in eddyline;
Quix's default closes a key's windows on that key's next record only). Each final window goes to
OUTPUT_TOPIC (transactionally, as every Quix output under exactly-once) as the value
``"<key>@<start>=<end>:<count>"``; ``bench_windows.py`` reads it ``read_committed`` and
compares it with eddyline's.

Quix has no "caught up" signal, so the dataframe counts the input records it has processed
and stops the application after the EVENTS-th: ``Application.stop()`` ends the loop after
that record has gone through the window, and the loop's exit commits the last checkpoint
(``commit_checkpoint(force=True)``), so every final the input closes is committed when
``run()`` returns. Prints one JSON line: wall and CPU seconds of ``run()`` (group join and
topic setup included, as eddyline's figure includes its start), and peak RSS.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

MINUTE_MS = 60_000


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    bootstrap, input_name, output_name, state_dir = sys.argv[1:5]
    events, grace_ms, commit_interval_ms = (int(arg) for arg in sys.argv[5:8])
    # quixstreams' import chain warns about its own dependencies; the JSON line must stay last.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from quixstreams import Application

    app = Application(
        broker_address=bootstrap,
        consumer_group=f"bench-quix-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=commit_interval_ms / 1000,
        state_dir=state_dir,
        loglevel="WARNING",
    )
    clicks = app.topic(input_name, key_deserializer="str", value_deserializer="bytes")
    finals = app.topic(output_name, key_serializer="str", value_serializer="str")
    sdf = app.dataframe(clicks)
    seen = 0

    def count_input(_value: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == events:
            app.stop()

    sdf = sdf.update(count_input)
    window = sdf.tumbling_window(duration_ms=MINUTE_MS, grace_ms=grace_ms).count()
    # Stream time per partition, as Kafka Streams and eddyline close windows: Quix's default
    # ("key") closes a key's windows only on that key's next record, so with 10,000 keys
    # most of the windows the stream has passed would never come out.
    sdf = window.final(closing_strategy="partition")
    sdf = sdf.apply(
        lambda window, key, _timestamp, _headers: (
            f"{key}@{window['start']}={window['end']}:{window['value']}"
        ),
        metadata=True,
    )
    sdf.to_topic(finals)
    cpu_started, started = time.process_time(), time.perf_counter()
    app.run()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    if seen != events:
        raise SystemExit(f"quix stopped after {seen} of {events} input records")
    print(
        json.dumps(
            {"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_bytes": peak_rss_bytes()}
        )
    )


if __name__ == "__main__":
    main()
