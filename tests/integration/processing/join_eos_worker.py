"""The process ``test_join_crash.py`` SIGKILLs and restarts: a windowed stream-stream left join.

Usage (from the repository's root)::

    python -m tests.integration.processing.join_eos_worker LOG STATE_DIR EVENTS

It runs :func:`topology` (application id ``joins``) on the SQLite log at LOG under
exactly-once until every input record is processed and committed, then closes cleanly,
unless the parent kills it first (tests/support/crash_runs.py, which also says what
EVENTS holds). Each record waits half a millisecond so that a run lasts long enough for
kills to land between commits.
"""

from __future__ import annotations

import time
from typing import Any

from eddyline_runtime.processing import JoinWindows, StreamsBuilder, Topology
from tests.support.crash_runs import run_worker

MINUTE = 60_000


def joined(impression: Any, click: Any) -> str:
    return f"{impression}+{click}"


def slowly(_key: Any, _value: Any) -> None:
    time.sleep(0.0005)


def topology() -> Topology:
    builder = StreamsBuilder()
    impressions = builder.stream("impressions", key_serde="string", value_serde="string")
    clicks = builder.stream("clicks", key_serde="string", value_serde="string").peek(slowly)
    impressions = impressions.peek(slowly)
    impressions.left_join(
        clicks,
        joined,
        JoinWindows.of_time_difference_with_grace(10 * MINUTE, MINUTE),
        store_name="impressions-clicks",
        value_serde="string",
        other_value_serde="string",
    ).to("joined", key_serde="string", value_serde="string")
    return builder.build()


if __name__ == "__main__":
    run_worker(topology(), application_id="joins")
