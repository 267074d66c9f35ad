"""The process ``test_foreign_key_join_crash.py`` SIGKILLs and restarts: a foreign-key join.

Usage (from the repository's root)::

    python -m tests.integration.processing.fk_join_eos_worker LOG STATE_DIR EVENTS

It runs :func:`topology` (application id ``fk-joins``: orders joined with customers by
the customer id their value names) on the SQLite log at LOG under exactly-once until
every input record, and every subscription and answer on the join's internal topics,
is processed and committed, then closes cleanly, unless the parent kills it first
(tests/support/crash_runs.py, which also says what EVENTS holds). The foreign-key
extractor waits half a millisecond per call so that a run lasts long enough for kills
to land between commits.
"""

from __future__ import annotations

import time

from eddyline_runtime.processing import StreamsBuilder, Topology
from tests.support.crash_runs import run_worker


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


if __name__ == "__main__":
    run_worker(topology(), application_id="fk-joins")
