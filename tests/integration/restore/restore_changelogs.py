"""Generated changelogs for restore tests: many versions per key, deletes, awkward keys."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from eddyline_runtime.log import Log, Record
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.replay import restore
from eddyline_runtime.state import KeyRange, RocksDBStore

# Keys that trip up orderings: empty, single bytes around the signed/unsigned edge,
# and prefixes of each other.
AWKWARD_KEYS = [b"", b"\x00", b"\x7f", b"\x80", b"\xff", b"a", b"ab", b"abc", b"\xff\xff"]


def changelog_records(seed: int, count: int, distinct_keys: int) -> list[Record]:
    """``count`` records over about ``distinct_keys`` keys: ~25% tombstones, a few keyless."""
    rng = random.Random(seed)
    keys = AWKWARD_KEYS + [
        rng.randbytes(rng.randrange(1, 12)) for _ in range(distinct_keys - len(AWKWARD_KEYS))
    ]
    records = []
    for i in range(count):
        if rng.random() < 0.01:
            records.append(Record(None, b"keyless", i))
            continue
        key = rng.choice(keys)
        value = None if rng.random() < 0.25 else f"{seed}:{i}".encode()
        records.append(Record(key, value, i))
    return records


def produce_changelog(log: Log, topic: str, partitions: int, per_partition: int, keys: int) -> None:
    log.create_topic(topic, partitions, compacted=True)
    for partition in range(partitions):
        records = changelog_records(partition, per_partition, keys)
        log.produce(TopicPartition(topic, partition), records)


def replay_store(name: str, directory: Path, log: Log, changelog: TopicPartition) -> int:
    """Rebuild a store by replaying the changelog; returns the records applied."""
    with RocksDBStore(name, directory) as store:
        return restore(store, log, changelog).records


def store_contents(
    name: str, directory: Path, changelog: TopicPartition
) -> tuple[list[tuple[bytes, bytes]], int | None]:
    """Every key and value, in order, and the committed offset."""
    with RocksDBStore(name, directory) as store:
        return list(store.scan(KeyRange.closed(None, None))), store.committed_offset(changelog)


def live_keys(records: Sequence[Record]) -> dict[bytes, bytes]:
    latest: dict[bytes, bytes | None] = {}
    for record in records:
        if record.key is not None:
            latest[record.key] = record.value
    return {k: v for k, v in latest.items() if v is not None}
