"""A foreign-key join (KIP-213) on a real Apache Kafka broker (tests/support/kafka/),
under exactly-once, with tables of different partition counts.

As Kafka's ``KTableKTableForeignKeyJoinDistributedTest`` runs the join across
partitions: orders (3 partitions) name customers (2 partitions) by id, so every
subscription crosses to the customer's partition through the registration topic
and its answer comes back through the response topic to the order's. The inputs
go through every case at once (orders before and after their customer, foreign-key
changes, customer updates fanning out, deletes on both sides), and the output
table must converge to the inner join of the final inputs: responses that lost a
race with a newer order value are dropped by their hash.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.partitions import TopicPartition, partition_for_key
from tests.integration.processing.test_foreign_key_join_runtime import LEFT, RIGHT, fk_join

TIMEOUT = 120
ORDERS, CUSTOMERS = 60, 8
PARTITIONS = {LEFT: 3, RIGHT: 2, "output": 3}


@pytest.fixture
def log(kafka_bootstrap: str) -> Iterator[KafkaLog]:
    opened = KafkaLog.open(
        f"kafka://{kafka_bootstrap}", {}, topic_prefix=f"fk-{uuid.uuid4().hex[:8]}."
    )
    for topic, partitions in PARTITIONS.items():
        opened.create_topic(topic, partitions)
    yield opened
    opened.close()


def produce(log: KafkaLog, topic: str, rows: list[tuple[str, str | None]], at: int) -> None:
    """Each row to its key's partition, as Kafka's default partitioner puts it."""
    for index, (key, value) in enumerate(rows):
        data = key.encode()
        partition = partition_for_key(data, PARTITIONS[topic])
        encoded = None if value is None else value.encode()
        log.produce(TopicPartition(topic, partition), [Record(data, encoded, at + index)])


def output_table(log: KafkaLog) -> dict[str, str]:
    """The output topic read as a table: each key's last value, tombstones removing it."""
    table: dict[str, str] = {}
    for partition in range(PARTITIONS["output"]):
        tp = TopicPartition("output", partition)
        offset, end = log.beginning_offset(tp), log.end_offset(tp)
        while offset < end:
            records = log.fetch(tp, offset).records
            if not records:
                break
            for record in records:
                assert record.key is not None
                key = record.key.decode()
                if record.value is None:
                    table.pop(key, None)
                else:
                    table[key] = record.value.decode()
            offset = records[-1].offset + 1
    return table


def test_foreign_key_join_converges_across_partitions_on_a_real_broker(
    tmp_path: Path, log: KafkaLog
) -> None:
    config = StreamsConfig.from_properties(
        {
            "application.id": f"fk-join-{uuid.uuid4().hex[:6]}",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": 50,
        }
    )
    orders: dict[str, str | None] = {}
    customers: dict[str, str | None] = {}

    def order_rows(rows: Sequence[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
        orders.update(rows)
        return list(rows)

    def customer_rows(rows: Sequence[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
        customers.update(rows)
        return list(rows)

    instance = StreamsInstance(fk_join(left_join=False), config, log)
    instance.start()
    try:
        # Half the customers first, then every order, then the other half.
        produce(log, RIGHT, customer_rows([(f"c{i}", f"name{i}") for i in range(0, 8, 2)]), 0)
        order_list = [(f"o{i}", f"order{i}|c{i % CUSTOMERS}") for i in range(ORDERS)]
        produce(log, LEFT, order_rows(order_list), 100)
        produce(log, RIGHT, customer_rows([(f"c{i}", f"name{i}") for i in range(1, 8, 2)]), 200)
        # Moves to another customer, in a burst racing the answers to the first values.
        moves = [(f"o{i}", f"order{i}b|c{(i + 3) % CUSTOMERS}") for i in range(0, ORDERS, 2)]
        produce(log, LEFT, order_rows(moves), 300)
        produce(log, RIGHT, customer_rows([("c1", "name1-renamed"), ("c2", None)]), 400)
        produce(log, LEFT, order_rows([(f"o{i}", None) for i in range(0, ORDERS, 5)]), 500)
        produce(log, RIGHT, customer_rows([("c2", "name2-back"), ("c5", None)]), 600)

        expected = {}
        for key, value in orders.items():
            if value is None:
                continue
            customer = customers.get(value.split("|")[1])
            if customer is not None:
                expected[key] = f"({value},{customer})"
        deadline = time.monotonic() + TIMEOUT
        found = output_table(log)
        while found != expected and time.monotonic() < deadline:
            time.sleep(0.2)
            found = output_table(log)
        assert found == expected
        assert instance.layout is not None
        internal = {
            topic: instance.layout.topic_partitions[instance.layout.physical[topic]]
            for topic in instance.topology.internal_topics
        }
        # Co-partitioned with their readers: subscriptions with customers, answers with orders.
        assert sorted(internal.values()) == [2, 3]
    finally:
        instance.close(TIMEOUT)
