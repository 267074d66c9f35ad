"""The process ``test_foreign_key_join_crash.py`` SIGKILLs and restarts: a foreign-key join.

Usage::

    fk_join_eos_worker.py LOG STATE_DIR EVENTS

It runs :func:`topology` (application id ``fk-joins``: orders joined with customers by
the customer id their value names) on the SQLite log at LOG under exactly-once until
every input record, and every subscription and answer on the join's internal topics,
is processed and committed, then closes cleanly, unless the parent kills it first.
Each commit appends one JSON line to EVENTS (one ``write()`` on an ``O_APPEND`` file,
so lines survive a SIGKILL); ``{"event": "closed"}`` follows a clean close. The
foreign-key extractor waits half a millisecond per call so that a run lasts long
enough for kills to land between commits.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.stream_thread import CommitReport
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.processing import StreamsBuilder, Topology

MAX_SECONDS = 120.0


def customer_of(order: str) -> str:
    time.sleep(0.0005)
    return order.split("|")[1]


def joined(order: str, customer: str) -> str:
    return f"{order}+{customer}"


def topology() -> Topology:
    builder = StreamsBuilder()
    orders = builder.table("orders", "orders-store", key_serde="string", value_serde="string")
    customers = builder.table(
        "customers", "customers-store", key_serde="string", value_serde="string"
    )
    orders.join(
        customers, customer_of, joined, name="orders-customers", value_serde="string"
    ).to_stream().to("joined", key_serde="string", value_serde="string")
    return builder.build()


def main() -> None:
    where, state_dir, events_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    fd = os.open(events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(event: dict[str, Any]) -> None:
        os.write(fd, (json.dumps(event) + "\n").encode())

    def committed(report: CommitReport) -> None:
        emit({"event": "commit", "records": report.records})

    config = StreamsConfig.from_properties(
        {
            "application.id": "fk-joins",
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": 0,  # a commit after each batch
        }
    )
    log = SqliteLog(Path(where))
    instance = StreamsInstance(topology(), config, log, on_commit=[committed])
    started = time.monotonic()
    instance.start()
    try:
        while not instance.caught_up():
            if time.monotonic() - started > MAX_SECONDS:
                raise TimeoutError(f"not caught up after {MAX_SECONDS} s: {instance.input_lags()}")
            time.sleep(0.01)
    finally:
        instance.close()
        log.close()
    emit({"event": "closed"})
    os.close(fd)


if __name__ == "__main__":
    main()
