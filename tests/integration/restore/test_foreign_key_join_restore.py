"""A foreign-key join's subscription store (KIP-213) rebuilt by a Spark restore build.

An instance runs the join on the embedded log (orders in 3 partitions, customers in 2,
so the subscription store has 2 partitions) through inserts, foreign-key changes and
deletes, which leave the store's changelog with overwritten keys and tombstones. A
Spark build of that changelog, ingested, must equal both a replay of it and the active
copy byte for byte, and keep the store's key layout (``len(fk) | fk | left key``, with
customer ids that are prefixes of each other: ``c1``, ``c10``, ``c100``), so the
right side's prefix scan still finds every subscriber: an instance started on the
ingested files restores nothing of the store, and a change of every customer reaches
every order that names it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.task_manager import RestoreReport
from eddyline_runtime.engine.topics import resolve_topics
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TaskId, TopicPartition, partition_for_key
from eddyline_runtime.processing.operators.foreign_key_joins import decode_subscription
from eddyline_runtime.restore.ingest.sst_restore import ingest_latest_manifest
from eddyline_runtime.restore.spark.spark_build import build, spark_session
from eddyline_runtime.state import store_directory
from eddyline_runtime.value_and_timestamp import split_timestamped
from tests.integration.processing.test_foreign_key_join_runtime import LEFT, RIGHT, fk_join
from tests.integration.restore.restore_changelogs import replay_store, store_contents

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

APP, NAME = "fk-restore", "fk"
SUBSCRIPTIONS = f"{NAME}-subscription-store"
PARTITIONS = {LEFT: 3, RIGHT: 2}
CUSTOMERS = ["c1", "c10", "c100", "c2", "c20", "c3"]
ORDERS = 40
TIMEOUT = 60
_LENGTH = struct.Struct(">I")


def config(state_dir: Path) -> StreamsConfig:
    return StreamsConfig.from_properties(
        {
            "application.id": APP,
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            "statestore.cache.max.bytes": 0,
        },
        environ={},
    )


def produce(log: SqliteLog, topic: str, rows: list[tuple[str, str | None]], at: int) -> None:
    for index, (key, value) in enumerate(rows):
        data = key.encode()
        partition = partition_for_key(data, PARTITIONS[topic])
        encoded = None if value is None else value.encode()
        log.produce(TopicPartition(topic, partition), [Record(data, encoded, at + index)])


# Rows of a topic produced at a timestamp (the first row's; one more each row after).
Batch = tuple[str, list[tuple[str, str | None]], int]


def run(log: SqliteLog, state_dir: Path, restored: list[RestoreReport], *batches: Batch) -> None:
    """One instance on ``state_dir``: each batch (topic, rows, timestamp) produced and
    processed to the end before the next."""
    instance = StreamsInstance(
        fk_join(left_join=False, name=NAME), config(state_dir), log, on_restore=[restored.append]
    )
    instance.start()
    try:
        for topic, rows, at in batches:
            produce(log, topic, rows, at)
            instance.wait_until_caught_up(TIMEOUT)
    finally:
        instance.close(TIMEOUT)


def output_table(log: SqliteLog) -> dict[str, str]:
    """The output topic read as a table: each key's last value, tombstones removing it."""
    table: dict[str, str] = {}
    for partition in range(log.topics()["output"].partitions):
        tp = TopicPartition("output", partition)
        for record in log.fetch(tp, log.beginning_offset(tp), 1_000_000).records:
            assert record.key is not None
            if record.value is None:
                table.pop(record.key.decode(), None)
            else:
                table[record.key.decode()] = record.value.decode()
    return table


def split_key(key: bytes) -> tuple[str, str]:
    """A subscription store key's foreign key and left key (``len(fk) | fk | left key``)."""
    (length,) = _LENGTH.unpack_from(key)
    start = _LENGTH.size
    return key[start : start + length].decode(), key[start + length :].decode()


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    opened = SqliteLog(tmp_path / "log.db")
    for topic, partitions in PARTITIONS.items():
        opened.create_topic(topic, partitions)
    yield opened
    opened.close()


def test_a_spark_built_subscription_store_equals_the_replayed_and_active_ones(
    log: SqliteLog, tmp_path: Path
) -> None:
    orders: dict[str, str | None] = {f"o{i}": f"v{i}|{CUSTOMERS[i % 6]}" for i in range(ORDERS)}
    first = dict(orders)
    # Every third order moves to another customer (its old subscription deleted), every
    # seventh is deleted: the changelog holds overwrites and tombstones to compact.
    moves = {f"o{i}": f"v{i}b|{CUSTOMERS[(i + 1) % 6]}" for i in range(0, ORDERS, 3)}
    deletes: dict[str, str | None] = {f"o{i}": None for i in range(0, ORDERS, 7)}
    orders.update(moves)
    orders.update(deletes)
    customers = {c: f"name-{c}" for c in CUSTOMERS}
    restored: list[RestoreReport] = []
    run(
        log,
        tmp_path / "state",
        restored,
        (RIGHT, list(customers.items()), 0),
        (LEFT, list(first.items()), 100),
        (LEFT, list(moves.items()), 200),
        (LEFT, list(deletes.items()), 300),
    )
    layout = resolve_topics(fk_join(left_join=False, name=NAME), APP, log)
    topic = layout.changelogs[SUBSCRIPTIONS]
    subtopologies = fk_join(left_join=False, name=NAME).subtopologies()
    (owner,) = [s.id for s in subtopologies if SUBSCRIPTIONS in s.stores]

    spark: SparkSession = spark_session("local[2]")
    try:
        build(
            spark,
            application=APP,
            store=SUBSCRIPTIONS,
            changelog_topic=topic,
            partitions=list(range(PARTITIONS[RIGHT])),
            output=tmp_path / "out",
            log_url=log.url,
        )
    finally:
        spark.stop()

    subscribed = {(v.split("|")[1], k) for k, v in orders.items() if v is not None}
    found: set[tuple[str, str]] = set()
    for partition in range(PARTITIONS[RIGHT]):
        changelog = TopicPartition(topic, partition)
        written = log.fetch(changelog, log.beginning_offset(changelog), 1_000_000).records
        assert any(r.value is None for r in written)  # deleted subscriptions: tombstones
        task = TaskId(owner, partition)
        built = store_directory(tmp_path / "built", task, SUBSCRIPTIONS)
        attempt = ingest_latest_manifest(
            tmp_path / "out",
            application=APP,
            store=SUBSCRIPTIONS,
            changelog=changelog,
            directory=built,
            log_start=log.beginning_offset(changelog),
            log_end=log.end_offset(changelog),
        )
        assert attempt.refusals == () and attempt.result is not None
        replayed = tmp_path / "replay" / str(partition) / SUBSCRIPTIONS
        replay_store(SUBSCRIPTIONS, replayed, log, changelog)
        from_files = store_contents(SUBSCRIPTIONS, built, changelog)
        assert from_files[1] == log.end_offset(changelog) - 1  # the last record read
        assert from_files == store_contents(SUBSCRIPTIONS, replayed, changelog)
        active = store_directory(tmp_path / "state", task, SUBSCRIPTIONS)
        assert from_files[0] == store_contents(SUBSCRIPTIONS, active, changelog)[0]
        for key, value in from_files[0]:
            foreign_key, left_key = split_key(key)
            assert partition_for_key(foreign_key.encode(), PARTITIONS[RIGHT]) == partition
            assert decode_subscription(split_timestamped(value)[1]).left_key == left_key.encode()
            found.add((foreign_key, left_key))
    assert found == subscribed  # every live subscription, none of a moved or deleted order

    # A new instance on the ingested store (the tables restored from their changelogs):
    # nothing of the subscription store to restore, and a change of every customer
    # answers every order subscribed to it, found by the prefix scan of the built store.
    restored.clear()
    renamed = {c: f"renamed-{c}" for c in CUSTOMERS}
    run(log, tmp_path / "built", restored, (RIGHT, list(renamed.items()), 400))
    assert {str(r.task): r.result.records for r in restored if r.result.store == SUBSCRIPTIONS} == {
        f"{owner}_{p}": 0 for p in range(PARTITIONS[RIGHT])
    }
    expected = {
        key: f"({value},{renamed[value.split('|')[1]]})"
        for key, value in orders.items()
        if value is not None
    }
    assert output_table(log) == expected
