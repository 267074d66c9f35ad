"""A history on a log, replayed through a StreamsInstance: what a backfill must equal."""

from __future__ import annotations

import random
from pathlib import Path

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.log import Log
from eddyline_runtime.log.port import Record
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.state import RocksDBStore, RocksDBStoreOptions, store_directory

CAUGHT_UP_TIMEOUT_S = 120.0


def write_history(
    log: Log, topic: str, partitions: int, records: int, *, seed: int = 35, create: bool = True
) -> dict[TopicPartition, int]:
    """``records`` records over ``partitions`` partitions (keys hashed to a partition as
    the key decides, out-of-order timestamps within the grace and beyond it); returns
    each partition's end offset. ``create``: the topic does not exist yet."""
    if create:
        log.create_topic(topic, partitions)
    rng = random.Random(seed)
    batches: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    for index in range(records):
        key = f"user-{rng.randrange(200)}"
        # Mostly moving forward, now and then late by up to 2 s (some beyond the grace).
        timestamp = index * 7 - (rng.randrange(2_000) if rng.random() < 0.1 else 0)
        partition = int(key.split("-")[1]) % partitions
        batches[partition].append(
            Record(key.encode(), f"item-{rng.randrange(50)}".encode(), max(timestamp, 0))
        )
    ends: dict[TopicPartition, int] = {}
    for partition, batch in batches.items():
        tp = TopicPartition(topic, partition)
        for start in range(0, len(batch), 1_000):
            log.produce(tp, batch[start : start + 1_000])
        ends[tp] = log.end_offset(tp)
    return ends


def replay(topology: Topology, config: StreamsConfig, log: Log) -> None:
    """The reference: an ordinary StreamsInstance over the whole log, to its end, then
    closed with a final commit (its committed positions are the history's ends)."""
    instance = StreamsInstance(topology, config, log)
    instance.start()
    try:
        instance.wait_until_caught_up(CAUGHT_UP_TIMEOUT_S)
    finally:
        instance.close()


def store_contents(
    config: StreamsConfig, state_dir: Path, task: TaskId, store: str
) -> list[tuple[bytes, bytes]]:
    """A store's committed bytes, in key order, as a pod left them in ``state_dir``."""
    opened = RocksDBStore(
        store, store_directory(state_dir, task, store), RocksDBStoreOptions.from_config(config)
    )
    try:
        return list(opened.scan(KeyRange()))
    finally:
        opened.close()
