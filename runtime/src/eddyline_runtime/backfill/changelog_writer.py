"""A backfilled store partition's final contents, written once to its changelog.

A later restore, standby or relocation finds a store in its changelog, so the
backfill must leave the changelog holding exactly what the built SSTs hold
(``docs/backfill.md``, "The changelog"). The job writes the **final contents**
(one record per live key, in key order), not every update of the history: the
size of the state, not of the history, and what the compacted changelog would
hold anyway.

Idempotent and atomic, so a killed or retried job never leaves duplicates or a
half-written changelog that a ``read_committed`` reader sees:

- One transaction per store partition, with a transactional id fixed by the
  application, store and partition. Opening the producer fences any earlier
  attempt's producer and aborts its open transaction (Kafka's
  ``init_transactions``; the embedded log applies a transaction as one write, so
  a killed attempt left nothing at all).
- Before writing, the committed contents of the partition are read back. Empty:
  write. Exactly this store's contents (an earlier attempt committed, then the
  job died or Spark retried the task): nothing to write, the offsets are those
  already there. Anything else: refuse, naming the changelog, since writing more
  would put two states in one changelog.

The offset returned is the offset of the last record (the store convention a
manifest follows), with the epoch that wrote it, so the pod that ingests the
SSTs resumes the changelog right after it and replays nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, zip_longest
from typing import Final

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log import Log
from eddyline_runtime.partitions import TopicPartition

# Records per send: bounds what one call hands the producer.
SEND_RECORDS: Final = 10_000


class ChangelogWriteError(EddylineError):
    """A backfilled store's changelog cannot take its contents (missing, or holding
    another state)."""


@dataclass(frozen=True, slots=True)
class ChangelogWrite:
    """Where a store partition's contents are in its changelog."""

    changelog: TopicPartition
    # Offset of the last record of the contents; -1: the store is empty, nothing written.
    last_offset: int
    log_start: int
    log_end: int
    epoch: str | None
    # Records this call wrote: 0 when an earlier attempt had written them already.
    written: int


def backfill_transactional_id(application: str, store: str, partition: int) -> str:
    """Fixed per store partition, so a re-run's producer fences an earlier attempt's."""
    return f"{application}-backfill-{store}-{partition}"


def write_store_changelog(
    log: Log,
    changelog: TopicPartition,
    contents: Callable[[], Iterable[tuple[bytes, bytes]]],
    *,
    transactional_id: str,
) -> ChangelogWrite:
    """Write ``contents()`` (key order) to ``changelog`` in one transaction, unless the
    changelog already holds exactly them. ``contents`` is called once per pass (the check,
    then the write), so it must give the same items each time (a store scan does)."""
    if changelog.topic not in log.topics():
        raise ChangelogWriteError(
            f'changelog topic "{changelog.topic}" does not exist; the backfill driver '
            "creates it (run_backfill), or create it compacted with one partition per task"
        )
    # Fence an earlier attempt first: its open transaction is aborted, so what is read
    # next is everything committed, and nothing more will be.
    producer = log.transactional_producer(transactional_id)
    try:
        there = _committed(log, changelog)
        first = next(there, None)
        if first is not None:
            return _already_written(log, changelog, first, there, contents)
        epoch_started = log.start_epoch(changelog)
        producer.begin()
        # Wall-clock time, not 0: a changelog with time-based retention keeps them.
        now = int(time.time() * 1000)
        written = 0
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        for key, value in contents():
            keys.append(key)
            values.append(value)
            if len(keys) >= SEND_RECORDS:
                producer.send_columns(changelog, keys, values, [now] * len(keys))
                written += len(keys)
                keys, values = [], []
        if keys:
            producer.send_columns(changelog, keys, values, [now] * len(keys))
            written += len(keys)
        if written == 0:
            producer.abort()
            return ChangelogWrite(
                changelog,
                -1,
                log.beginning_offset(changelog),
                log.end_offset(changelog),
                epoch_started or log.partition_epoch(changelog),
                0,
            )
        committed = producer.commit()
    finally:
        producer.close()
    last = committed.last_offsets[changelog]
    return ChangelogWrite(
        changelog,
        last,
        log.beginning_offset(changelog),
        last + 1,
        log.epoch_at(changelog, last),
        written,
    )


def _already_written(
    log: Log,
    changelog: TopicPartition,
    first: tuple[int, bytes | None, bytes | None],
    rest: Iterator[tuple[int, bytes | None, bytes | None]],
    contents: Callable[[], Iterable[tuple[bytes, bytes]]],
) -> ChangelogWrite:
    """The changelog is not empty: it must hold exactly ``contents()`` (an earlier
    attempt's committed write), else it holds another state and is refused."""
    last = -1
    there = chain([first], rest)
    for index, (have, want) in enumerate(zip_longest(there, contents())):
        if have is None or want is None or (have[1], have[2]) != want:
            raise ChangelogWriteError(
                f"changelog {changelog} already holds records that are not this backfill's "
                f"store contents (they differ at record {index}): a backfilled store's "
                "changelog must be empty when the backfill starts. Delete the topic "
                f'"{changelog.topic}" (the new store has no other state) and run it again'
            )
        last = have[0]
    return ChangelogWrite(
        changelog,
        last,
        log.beginning_offset(changelog),
        last + 1,
        log.epoch_at(changelog, last),
        0,
    )


def _committed(
    log: Log, changelog: TopicPartition
) -> Iterator[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every committed record (read_committed), in offset order."""
    position = log.beginning_offset(changelog)
    while True:
        columns = log.fetch_columns(changelog, position, SEND_RECORDS)
        if not columns.offsets:
            return
        yield from zip(columns.offsets, columns.keys, columns.values, strict=True)
        position = columns.offsets[-1] + 1
