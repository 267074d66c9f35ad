"""eddyline's side of ``make bench-joins``: the foreign-key join on a Kafka broker, until stopped.

Usage: ``python -m tests.bench.bench_joins_eddyline CONFIG_JSON ORDERS CUSTOMERS OUTPUT``.
CONFIG_JSON holds ``{"bootstrap": "host:port", "config": {...StreamsConfig properties}}``,
written and printed by ``bench_joins.py``. The topology is Kafka Streams' program
``kstreams/FkJoin.java``: the orders table joined with the customers table by the customer id
each order names (an order is ``CUSTOMER_ID|AMOUNT``, a customer ``NAME|TIER``, a joined row
``ORDER|CUSTOMER``). It prints ``RUNNING`` once started and runs until SIGTERM (closes cleanly).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.processing import StreamsBuilder, Topology


def customer_id(order: str) -> str:
    return order[: order.index("|")]


def joined(order: str, customer: str) -> str:
    return f"{order}|{customer}"


def fk_join(orders_topic: str, customers_topic: str, output_topic: str) -> Topology:
    builder = StreamsBuilder()
    orders = builder.table(orders_topic, "orders", key_serde="string", value_serde="string")
    customers = builder.table(
        customers_topic, "customers", key_serde="string", value_serde="string"
    )
    (
        orders.join(customers, customer_id, joined, value_serde="string")
        .to_stream()
        .to(output_topic, key_serde="string", value_serde="string")
    )
    return builder.build()


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    orders_topic, customers_topic, output_topic = sys.argv[2:5]
    stop = threading.Event()

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    log = KafkaLog.open(f"kafka://{spec['bootstrap']}")
    instance = StreamsInstance(
        fk_join(orders_topic, customers_topic, output_topic),
        StreamsConfig.from_properties(spec["config"]),
        log,
    )
    instance.start()
    print("RUNNING", flush=True)
    try:
        while not stop.wait(0.05):
            instance.check()  # raises what a stream thread died of
    finally:
        instance.close()
        log.close()


if __name__ == "__main__":
    main()
