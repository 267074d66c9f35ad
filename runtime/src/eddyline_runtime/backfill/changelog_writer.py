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
- Before writing, the committed records of the partition are read back and what
  they hold (their *view*: each key's last value, a tombstone removing it) is
  compared with the contents. Empty: write. Exactly this store's contents (an
  earlier attempt committed, then the job died or Spark retried the task): nothing
  to write, the offsets are those already there. Another state: refused, naming the
  changelog, unless the caller may **supersede** it (below).

Every record the writer writes carries the header ``BUILD_HEADER`` (the build's id).
That is what lets the view be read as it streams, without holding it: each write is
tombstones for every key of the state before it, then the contents in key order, so
when the last tombstone and every record after it carry the header, the view is the
records after that tombstone. A changelog without tombstones has its records as its
view when they equal the contents (in key order, no key twice). Any other changelog (a
revision processed into it since) cannot be shown to hold the contents: another state.

**Superseding** (``supersede=True``): an earlier backfill attempt of the store under
other end offsets (the old revision processed more input since), or a revision
rolled back after it wrote, left another state. The new state replaces it in one
transaction: a tombstone for every key of the old state (the records after the last
tombstone when the view can be read so, else every key written), then the contents.
A ``read_committed`` reader replaying the changelog from its start ends with exactly
the contents; a crash before the commit leaves the old state whole. Only a caller that
knows no running revision has the store may ask for it (the operator's Job: it refuses
backfills of running stores); by hand it is ``eddyline backfill build --supersede``.

The offset returned is the offset of the last record (the store convention a
manifest follows), with the epoch that wrote it, so the pod that ingests the
SSTs resumes the changelog right after it and replays nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, repeat, zip_longest
from typing import Final

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log import Log
from eddyline_runtime.log.port import Headers, TransactionalProducer
from eddyline_runtime.partitions import TopicPartition

# Records per send: bounds what one call hands the producer.
SEND_RECORDS: Final = 10_000
# The header every record the writer writes carries, with the build's id as its value.
BUILD_HEADER: Final = "eddyline.backfill.build"


class ChangelogWriteError(EddylineError):
    """A backfilled store's changelog cannot take its contents (missing, or holding
    another state)."""


@dataclass(frozen=True, slots=True)
class ChangelogWrite:
    """Where a store partition's contents are in its changelog."""

    changelog: TopicPartition
    # Offset of the last record of the changelog once it holds the contents; -1: the
    # store is empty and so was the changelog, nothing written.
    last_offset: int
    log_start: int
    log_end: int
    epoch: str | None
    # Records this call wrote (tombstones of a superseded state included): 0 when an
    # earlier attempt had written the contents already.
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
    build_id: str,
    supersede: bool = False,
) -> ChangelogWrite:
    """Leave ``changelog`` holding exactly ``contents()`` (key order), in one transaction,
    unless it holds them already; another state there is refused, or with ``supersede``
    replaced. ``contents`` is called once per pass (the check, then the write), so it must
    give the same items each time (a store scan does)."""
    if changelog.topic not in log.topics():
        raise ChangelogWriteError(
            f'changelog topic "{changelog.topic}" does not exist; the backfill driver '
            "creates it (run_backfill), or create it compacted with one partition per task"
        )
    # Fence an earlier attempt first: its open transaction is aborted, so what is read
    # next is everything committed, and nothing more will be.
    producer = log.transactional_producer(transactional_id)
    try:
        survey = _survey(log, changelog)
        replaced: Iterable[bytes] = ()
        if survey.records:
            if _holds(log, changelog, survey, contents):
                return ChangelogWrite(
                    changelog,
                    survey.last_offset,
                    log.beginning_offset(changelog),
                    survey.last_offset + 1,
                    log.epoch_at(changelog, survey.last_offset),
                    0,
                )
            if not supersede:
                raise ChangelogWriteError(
                    f"changelog {changelog} holds another state than this backfill's store "
                    "contents (an earlier attempt's under other end offsets, or a revision's "
                    "that processed into it): a backfilled store's changelog must be empty "
                    "or hold an earlier attempt's. If no running revision has the store, run "
                    f'again with --supersede to replace that state, or delete the topic "'
                    f'{changelog.topic}" and run it again'
                )
            replaced = _old_keys(log, changelog, survey)
        epoch_started = log.start_epoch(changelog)
        producer.begin()
        written = _send(producer, changelog, replaced, contents(), build_id)
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


@dataclass(frozen=True, slots=True)
class _Survey:
    """One pass over a changelog's committed records."""

    records: int
    last_offset: int
    # Offset of the last tombstone; -1: none.
    last_tombstone: int
    # The last tombstone and every record after it carry BUILD_HEADER: a backfill's
    # write ends the changelog, and the records after the tombstone are its view.
    tail_marked: bool

    @property
    def view_after(self) -> int | None:
        """The view is the records after this offset (-1: all); None: it cannot be read
        so (a revision wrote since the last backfill's tombstones)."""
        if self.last_tombstone < 0 or self.tail_marked:
            return self.last_tombstone
        return None


def _survey(log: Log, changelog: TopicPartition) -> _Survey:
    records, last_offset, last_tombstone, tail_marked = 0, -1, -1, True
    for offset, _key, value, headers in _committed(log, changelog):
        records += 1
        last_offset = offset
        marked = any(name == BUILD_HEADER for name, _ in headers)
        if value is None:
            last_tombstone, tail_marked = offset, marked
        else:
            tail_marked = tail_marked and marked
    return _Survey(records, last_offset, last_tombstone, tail_marked)


def _holds(
    log: Log,
    changelog: TopicPartition,
    survey: _Survey,
    contents: Callable[[], Iterable[tuple[bytes, bytes]]],
) -> bool:
    """Whether the changelog's view is exactly ``contents()``: the records after its last
    tombstone when a backfill's write ends it, or all of them when it has no tombstone
    (then equal to the contents means in key order, no key twice). Otherwise the view
    cannot be read as it streams: another state."""
    after = survey.view_after
    if after is None:
        return False
    view = ((key, value) for offset, key, value, _ in _committed(log, changelog) if offset > after)
    return all(have == want for have, want in zip_longest(view, contents()))


def _old_keys(log: Log, changelog: TopicPartition, survey: _Survey) -> Iterator[bytes]:
    """The keys a superseding write deletes: the view's when it can be read (the records
    after the last tombstone), else every key ever written."""
    after = survey.view_after
    if after is None:
        after = -1
    for offset, key, value, _ in _committed(log, changelog):
        if offset > after and value is not None and key is not None:
            yield key


def _send(
    producer: TransactionalProducer,
    changelog: TopicPartition,
    deleted: Iterable[bytes],
    contents: Iterable[tuple[bytes, bytes]],
    build_id: str,
) -> int:
    """Tombstones for ``deleted``, then ``contents``, every record marked with the build;
    returns how many were sent."""
    # Wall-clock time, not 0: a changelog with time-based retention keeps them.
    now = int(time.time() * 1000)
    mark: Headers = ((BUILD_HEADER, build_id.encode()),)
    written = 0
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    for key, value in chain(zip(deleted, repeat(None)), contents):
        keys.append(key)
        values.append(value)
        if len(keys) >= SEND_RECORDS:
            producer.send_columns(changelog, keys, values, [now] * len(keys), [mark] * len(keys))
            written += len(keys)
            keys, values = [], []
    if keys:
        producer.send_columns(changelog, keys, values, [now] * len(keys), [mark] * len(keys))
        written += len(keys)
    return written


def _committed(
    log: Log, changelog: TopicPartition
) -> Iterator[tuple[int, bytes | None, bytes | None, Headers]]:
    """(offset, key, value, headers) of every committed record (read_committed), in
    offset order."""
    position = log.beginning_offset(changelog)
    while True:
        columns = log.fetch_columns(changelog, position, SEND_RECORDS)
        if not columns.offsets:
            return
        headers = columns.headers or repeat((), len(columns.offsets))
        yield from zip(columns.offsets, columns.keys, columns.values, headers, strict=True)
        position = columns.offsets[-1] + 1
