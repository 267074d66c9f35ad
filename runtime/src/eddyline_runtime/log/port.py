"""The log port: one interface for partitioned, replayable logs.

eddyline reads input, writes output and keeps changelogs in a partitioned log.
Kafka is the production log; the embedded SQLite log (``sqlite:///path``) is
the default for local runs and tests. Both implement :class:`Log`, and one
contract test suite holds for both.

Offsets follow Kafka: a partition's records have consecutive offsets from its
log start; the *end offset* is the offset the next record will get; a
committed *input* offset is the next offset to read.

Transactions (exactly-once): a :class:`TransactionalProducer` for a
transactional id buffers its sends and input offsets and applies them all or
nothing at :meth:`TransactionalProducer.commit`, which returns the offset each
record got. Opening a producer for an id bumps the id's epoch, so an older
producer with the same id (a zombie) is fenced: its commit fails with
:class:`~eddyline_runtime.log.errors.ProducerFencedError` and writes nothing.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import NamedTuple, overload

from eddyline_runtime.log.record_size import RecordSizeLimit
from eddyline_runtime.partitions import TopicPartition

Headers = tuple[tuple[str, bytes], ...]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic's shape: its partition count and whether it is compacted."""

    name: str
    partitions: int
    compacted: bool = False


class Record(NamedTuple):
    """One record as produced (``offset`` is -1) or as fetched from a partition.

    A NamedTuple, not a frozen dataclass: fetches build one per row, and
    tuple construction is several times cheaper (restoration speed).
    """

    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Headers = ()
    offset: int = -1


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Records fetched from one partition, and its end offset as seen by that fetch."""

    records: Sequence[Record]
    end_offset: int


@dataclass(frozen=True, slots=True)
class FetchedColumns:
    """Records fetched from one partition as columns, and its end offset.

    What the processing loop reads: it needs no per-record objects, and an
    adapter can hand over its rows' columns without building them. ``headers``
    holds each record's headers, or is None when no record has any.
    """

    offsets: Sequence[int]
    keys: Sequence[bytes | None]
    values: Sequence[bytes | None]
    timestamps: Sequence[int]
    end_offset: int
    headers: Sequence[Headers] | None = None

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True, slots=True)
class ChangeBatch:
    """Keyed changes read from a changelog, and the offset of the last record read
    (-1 when none was). ``entries`` pairs a key with its value, None for a delete."""

    entries: Sequence[tuple[bytes, bytes | None]]
    last_offset: int


@dataclass(frozen=True, slots=True)
class OffsetChanges:
    """Keyed changes read from a bounded offset range, as columns, with their offsets.

    What a parallel reader of a changelog (a Spark restore task) needs: each
    entry's own offset, so the latest version of a key can be picked across
    ranges read by different tasks. Columns, not rows, because they go
    straight into Arrow arrays. ``values[i]`` is None for a delete (tombstone);
    records without a key are skipped. ``last_offset`` is the offset of the
    last record read, keyless ones included (-1 when none was): the next read
    of the range starts after it.
    """

    offsets: Sequence[int]
    keys: Sequence[bytes]
    values: Sequence[bytes | None]
    last_offset: int


class OffsetsInSendOrder(Sequence[tuple[TopicPartition, int]]):
    """(partition, offset) of each record a transaction sent, in send order, worked out on
    first use: stream threads read only the last offset per partition, so the per-record
    pairs usually never need to exist.

    ``order`` is the partition of each record as sent; ``offsets`` gives each partition's
    offsets in order (a list of delivered offsets, or a counter from the first one).
    """

    def __init__(
        self, order: list[TopicPartition], offsets: Mapping[TopicPartition, Iterable[int]]
    ) -> None:
        self._order = order
        self._offsets = offsets
        self._pairs: list[tuple[TopicPartition, int]] | None = None

    def _resolved(self) -> list[tuple[TopicPartition, int]]:
        if self._pairs is None:
            iterators = {tp: iter(offsets) for tp, offsets in self._offsets.items()}
            self._pairs = [(tp, next(iterators[tp])) for tp in self._order]
        return self._pairs

    def __len__(self) -> int:
        return len(self._order)

    @overload
    def __getitem__(self, index: int) -> tuple[TopicPartition, int]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[TopicPartition, int]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[TopicPartition, int] | list[tuple[TopicPartition, int]]:
        return self._resolved()[index]


@dataclass(frozen=True, slots=True)
class CommittedTransaction:
    """What a committed transaction wrote: the offset of each sent record, in send order,
    and the last offset per partition (what a store commits as its changelog offset)."""

    offsets: Sequence[tuple[TopicPartition, int]]
    last_offsets: Mapping[TopicPartition, int] = field(default_factory=dict)


def check_columns(
    keys: Sequence[bytes | None], values: Sequence[bytes | None], timestamps: Sequence[int]
) -> None:
    """Columns of one batch hold one entry per record each."""
    if not len(keys) == len(values) == len(timestamps):
        raise ValueError(
            f"columns of one batch must have one entry per record: {len(keys)} keys, "
            f"{len(values)} values, {len(timestamps)} timestamps"
        )


class RecordColumns:
    """Records for one partition (or topic) being gathered, as columns: what a sink
    collects, a commit sends and an adapter appends. ``headers`` stays None while
    no record has any; once one has, it holds an entry per record."""

    __slots__ = ("headers", "keys", "timestamps", "values")

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []
        self.headers: list[Headers] | None = None

    @classmethod
    def of(cls, records: Sequence[Record]) -> RecordColumns:
        columns = cls()
        columns.extend_records(records)
        return columns

    def __len__(self) -> int:
        return len(self.keys)

    def append(
        self, key: bytes | None, value: bytes | None, timestamp: int, headers: Headers = ()
    ) -> None:
        if headers and self.headers is None:
            self.headers = [()] * len(self.keys)
        if self.headers is not None:
            self.headers.append(headers)
        self.keys.append(key)
        self.values.append(value)
        self.timestamps.append(timestamp)

    def extend(
        self,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[Headers] | None = None,
    ) -> None:
        """Add records given as columns (``headers`` None: none has any)."""
        check_columns(keys, values, timestamps)
        if headers is not None and len(headers) != len(keys):
            raise ValueError(
                f"columns of one batch must have one entry per record: {len(keys)} keys, "
                f"{len(headers)} headers"
            )
        if headers is not None and any(headers):
            self.pad_headers()
            self.headers.extend(headers)  # type: ignore[union-attr]
        elif self.headers is not None:
            self.headers.extend(repeat((), len(keys)))
        self.keys.extend(keys)
        self.values.extend(values)
        self.timestamps.extend(timestamps)

    def extend_records(self, records: Sequence[Record]) -> None:
        if self.headers is None and any(r.headers for r in records):
            self.pad_headers()
        if self.headers is not None:
            self.headers.extend(r.headers for r in records)
        self.keys.extend(r.key for r in records)
        self.values.extend(r.value for r in records)
        self.timestamps.extend(r.timestamp for r in records)

    def pad_headers(self) -> None:
        """Give every record so far an (empty) headers entry, if none had one."""
        if self.headers is None:
            self.headers = [()] * len(self.keys)


def records_of_columns(
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    timestamps: Sequence[int],
    headers: Sequence[Headers] | None = None,
) -> list[Record]:
    """The records that columns describe; for adapters without a batch path."""
    check_columns(keys, values, timestamps)
    if headers is None:
        return [Record(k, v, t) for k, v, t in zip(keys, values, timestamps, strict=True)]
    return [
        Record(k, v, t, h) for k, v, t, h in zip(keys, values, timestamps, headers, strict=True)
    ]


class TransactionalProducer(abc.ABC):
    """A writer whose sends and input-offset commits land all together or not at all."""

    transactional_id: str
    epoch: int

    @abc.abstractmethod
    def begin(self) -> None:
        """Start a transaction; one at a time."""

    @abc.abstractmethod
    def send(self, tp: TopicPartition, record: Record) -> None:
        """Add a record to the open transaction."""

    def send_batch(self, tp: TopicPartition, records: Sequence[Record]) -> None:
        """Add records for one partition, in order (adapters may do it in one step)."""
        for record in records:
            self.send(tp, record)

    def send_columns(
        self,
        tp: TopicPartition,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[Headers] | None = None,
    ) -> None:
        """Add records for one partition, given as columns of equal length, in order
        (``headers`` None: no record has any). Adapters may take the columns as they are."""
        self.send_batch(tp, records_of_columns(keys, values, timestamps, headers))

    @abc.abstractmethod
    def send_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit these input offsets (next offset to read) for ``group`` with the transaction."""

    @abc.abstractmethod
    def commit(self) -> CommittedTransaction:
        """Apply everything atomically; raises ProducerFencedError if a newer producer exists."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop the open transaction: none of it becomes visible."""

    @abc.abstractmethod
    def close(self) -> None: ...


class StartedProducers:
    """Transactional producers started together (:meth:`Log.transactional_producers`):
    each id's producer, or the error its start raised, each handed out once.

    Every producer here has fenced its id's older producers already; a start that
    failed keeps its error for :meth:`take`, so it is raised for that id alone."""

    def __init__(self, started: Mapping[str, TransactionalProducer | Exception]) -> None:
        self._started = dict(started)

    def take(self, transactional_id: str) -> TransactionalProducer:
        """The id's producer, or the error its start raised (as ``transactional_producer``
        would have raised it)."""
        started = self._started.pop(transactional_id)
        if isinstance(started, Exception):
            raise started
        return started

    def close(self) -> None:
        """Close the producers never taken (their tasks were not created after all)."""
        left, self._started = self._started, {}
        for started in left.values():
            if not isinstance(started, Exception):
                started.close()


class Log(abc.ABC):
    """A partitioned log; see the module docstring for the offset conventions."""

    @property
    def url(self) -> str:
        """Where this log is, for messages (``sqlite:///path`` for the embedded one)."""
        return type(self).__name__

    @abc.abstractmethod
    def create_topic(self, name: str, partitions: int, *, compacted: bool = False) -> TopicSpec:
        """Create a topic; creating an identical one again is a no-op, a different one an error."""

    @abc.abstractmethod
    def topics(self) -> Mapping[str, TopicSpec]: ...

    # -- topic retention (cleanup.policy=delete, or compact,delete) ----------------

    def set_topic_retention(self, topic: str, retention_ms: int | None) -> None:
        """Delete ``topic``'s records once they are older than ``retention_ms`` (None: never).

        Kafka's ``retention.ms`` topic config; on a compacted topic it makes the
        cleanup policy ``compact,delete``, as Kafka Streams sets for window and
        session store changelogs. Age is measured against record timestamps,
        and only a prefix of the partition is ever deleted (the log start moves
        forward, as when a broker drops whole old segments). Setting it again
        replaces it.

        This default keeps every record and says so once: an adapter that
        cannot apply retention stays correct (window stores drop expired
        entries themselves, during restoration too) but its changelogs grow.
        Adapters override it: Kafka sets ``retention.ms`` and
        ``cleanup.policy=compact,delete`` on the topic (AlterConfigs), the
        embedded log stores it and deletes in :meth:`enforce_retention`.
        """
        if retention_ms is not None:
            logger.warning(
                "log %s does not apply topic retention: topic %s keeps its records beyond "
                "retention.ms=%d. Results stay correct; give the topic retention.ms and "
                "cleanup.policy=compact,delete on the log's side to bound its size",
                self.url,
                topic,
                retention_ms,
            )

    def topic_retention(self, topic: str) -> int | None:
        """``topic``'s ``retention.ms``; None when its records are kept forever."""
        return None

    def record_size_limit(self, topic: str) -> RecordSizeLimit | None:
        """The largest record ``topic`` takes (see :mod:`~eddyline_runtime.log.record_size`),
        or None when the log has no limit of its own. The runtime asks once per output
        topic when it creates a task; an adapter that must ask a server keeps the answer.

        Kafka: the topic's ``max.message.bytes`` (DescribeConfigs), or the producer's
        ``message.max.bytes`` when that is smaller; the embedded log: SQLite's
        ``SQLITE_LIMIT_LENGTH``, the largest value a column holds."""
        return None

    def enforce_retention(self, now_ms: int) -> int:
        """Delete records older than their topic's retention as of ``now_ms``; returns
        how many went.

        A broker does this on its own schedule, so this default does nothing;
        the embedded log deletes only when asked, so that what is deleted is a
        function of ``now_ms`` and nothing else (the runtime calls it after
        commits, at most once per ``log.retention.check.interval.ms``).
        """
        return 0

    @abc.abstractmethod
    def produce(self, tp: TopicPartition, records: Sequence[Record]) -> list[int]:
        """Append records outside any transaction; returns their offsets."""

    def produce_columns(
        self,
        tp: TopicPartition,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[Headers] | None = None,
    ) -> int:
        """Append records given as columns of equal length (at least one record;
        ``headers`` None: no record has any), outside any transaction; returns the
        offset of the last one."""
        return self.produce(tp, records_of_columns(keys, values, timestamps, headers))[-1]

    @abc.abstractmethod
    def fetch(self, tp: TopicPartition, offset: int, max_records: int = 10_000) -> FetchResult:
        """Committed records from ``offset`` on (read_committed), and the end offset."""

    def fetch_columns(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> FetchedColumns:
        """Like :meth:`fetch`, as columns: the processing loop's fetch. Adapters may
        build the columns without per-record objects."""
        result = self.fetch(tp, offset, max_records)
        records = result.records
        return FetchedColumns(
            [r.offset for r in records],
            [r.key for r in records],
            [r.value for r in records],
            [r.timestamp for r in records],
            result.end_offset,
            [r.headers for r in records] if any(r.headers for r in records) else None,
        )

    @abc.abstractmethod
    def fetch_changes(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> ChangeBatch:
        """Like :meth:`fetch`, for replaying a changelog into a store: only keys and
        values (records without a key are skipped), and the offset of the last
        record read. Restoration's hot path, so it builds no Record objects."""

    def fetch_changes_between(
        self, tp: TopicPartition, start: int, end: int, max_records: int = 10_000
    ) -> OffsetChanges:
        """Keyed changes with offsets in ``[start, end)``, at most ``max_records`` read.

        ``end`` bounds the read even while the log grows, so a reader that
        fixed its ranges up front reads exactly them. This default goes
        through :meth:`fetch`; adapters may read the range directly.
        """
        if end <= start:
            return OffsetChanges((), (), (), -1)
        records = self.fetch(tp, start, max_records).records
        offsets: list[int] = []
        keys: list[bytes] = []
        values: list[bytes | None] = []
        last = -1
        for record in records:
            if record.offset >= end:
                break
            last = record.offset
            if record.key is not None:
                offsets.append(record.offset)
                keys.append(record.key)
                values.append(record.value)
        return OffsetChanges(offsets, keys, values, last)

    @abc.abstractmethod
    def beginning_offset(self, tp: TopicPartition) -> int: ...

    @abc.abstractmethod
    def end_offset(self, tp: TopicPartition) -> int: ...

    def offset_for_timestamp(self, tp: TopicPartition, timestamp_ms: int) -> int:
        """The offset of ``tp``'s first committed record, in offset order from the
        beginning, whose timestamp is at or after ``timestamp_ms``; the end offset when
        none is (Kafka's ``offsetsForTimes``: records after it with earlier timestamps
        are not skipped). This default reads the partition from its beginning; an
        adapter with a time index asks it."""
        offset, end = self.beginning_offset(tp), self.end_offset(tp)
        while offset < end:
            fetched = self.fetch_columns(tp, offset)
            if not fetched.offsets:
                break  # only transaction markers (or aborted records) are left
            for at, timestamp in zip(fetched.offsets, fetched.timestamps, strict=True):
                if timestamp >= timestamp_ms:
                    return at
            offset = fetched.offsets[-1] + 1
        return end

    def undecided(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` holds records whose transaction is not decided yet: written, and
        maybe committed by their producer, but not yet readable as committed or aborted.

        On Kafka a producer's commit returns once the transaction coordinator logged the
        decision; the commit markers reach the partitions after that, and until then the
        last stable offset (``end_offset``) stays below the committed records (it is the
        high watermark only with no transaction open). So "my copy is at ``end_offset``"
        does not mean "my copy read what a commit that returned wrote" while this is true.
        A log whose commit makes the records readable at once (the embedded one applies a
        transaction as one write) never has undecided records: False."""
        return False

    def partition_epoch(self, tp: TopicPartition) -> str | None:
        """Which incarnation of the partition this is; None when the log cannot tell.

        It changes whenever offsets that were handed out before may now stand
        for other records: the topic deleted and created again (Kafka's topic
        id, KIP-516), or the partition truncated (as a leader epoch marks
        diverged logs, KIP-320). Stores keep it beside their committed
        changelog offset, and a store whose epoch is not the changelog's is
        rebuilt instead of trusted. Appends, compaction and deleting records
        from the start never change it. Its form is ``<topic incarnation>:<partition
        epoch>``: the part before the first ``:`` changes only when the topic was
        deleted and created again (which the runtime refuses to rebuild from
        unless told to, see ``state.rebuild.after.changelog.recreated``).
        """
        return None

    def epoch_end_offset(self, tp: TopicPartition, epoch: str) -> int | None:
        """Where ``epoch`` of the partition ended: the first offset written after it.

        Kafka's OffsetsForLeaderEpoch (KIP-101): a copy that committed offset
        O in ``epoch`` still holds what the log holds when O is below this.
        None when the log cannot tell (then a copy of another epoch is rebuilt).
        """
        return None

    def epoch_at(self, tp: TopicPartition, offset: int) -> str | None:
        """The epoch whose writer wrote the record now at ``offset``, as the log's history
        records it; None when the partition does not hold that offset (at or past its end).

        What a copy that ends at ``offset`` is stamped with when it was not written by a
        task (a Spark restore build: docs/state.md, "Epochs"), so that it is judged as a
        store is, by :meth:`epoch_end_offset`. A log that keeps no epoch history answers
        its epoch now (:meth:`partition_epoch`): then a copy of an earlier epoch is judged
        another epoch's, never wrongly trusted.
        """
        return self.partition_epoch(tp)

    def start_epoch(
        self, tp: TopicPartition, *, fence: TransactionalProducer | None = None
    ) -> str | None:
        """A new writer of ``tp`` begins: start a new epoch at its end; returns its name.

        An active task calls it for each changelog it will write, once it has
        fenced the previous owner and judged its stores, and stamps the new epoch
        on its stores (docs/state.md, "Epochs"): offsets a copy commits are then
        named by the epoch their writer opened, so the same offsets written again
        on a log put back from a backup are told apart. A log whose own epochs
        already mark a new writer (Kafka's leader epochs) does nothing (None).

        ``fence``: the writer's transactional producer. If a newer producer of its
        transactional id has started since (the task moved on before this member got to
        it), :class:`ProducerFencedError` is raised and no epoch begins: an epoch begun
        by such a zombie would name the real owner's later records as its own, and the
        owner's copy would be judged to hold records the changelog lost.
        """
        del fence
        return None

    def hold_changelog(self, tp: TopicPartition, reason: str) -> None:
        """A copy found that changelog ``tp`` lost records it applied: no writer may rebuild
        a store from ``tp`` until the user decides (docs/state.md, "Changelog loss waits
        for your decision"); ``reason`` says where the copy waits. A log that cannot keep
        such a mark (Kafka) does nothing: then only instances holding a copy stop."""
        return None

    def changelog_hold(self, tp: TopicPartition) -> str | None:
        """Why ``tp`` is held (see :meth:`hold_changelog`); None when it is not."""
        return None

    def release_changelog(self, tp: TopicPartition) -> None:
        """The user decided (republished the copy, or accepted the loss): writers may go on."""
        return None

    def record_divergence(self, tp: TopicPartition) -> None:
        """A copy saw offsets of ``tp`` that the log no longer holds (its committed offset is
        past the end): records written from now on must not be taken for the lost ones.

        A log whose own epochs already mark such divergence (Kafka's leader
        epochs) does nothing.
        """
        return None

    @abc.abstractmethod
    def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """The next offset to read per partition for ``group``; absent when never committed."""

    @abc.abstractmethod
    def commit_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit input offsets outside a transaction (at-least-once)."""

    @abc.abstractmethod
    def transactional_producer(self, transactional_id: str) -> TransactionalProducer:
        """A producer for ``transactional_id``; fences every earlier one for that id."""

    def transactional_producers(self, transactional_ids: Sequence[str]) -> StartedProducers:
        """Producers for several ids, as :meth:`transactional_producer` makes each; an
        adapter whose start is a round trip (Kafka's ``init_transactions``) starts them
        concurrently. Here: one after another."""
        started: dict[str, TransactionalProducer | Exception] = {}
        for transactional_id in transactional_ids:
            try:
                started[transactional_id] = self.transactional_producer(transactional_id)
            except Exception as exc:  # raised by take(), for this id alone
                started[transactional_id] = exc
        return StartedProducers(started)

    def commit_transactions(
        self, producers: Sequence[TransactionalProducer]
    ) -> list[CommittedTransaction | Exception]:
        """Commit each producer's open transaction: each outcome in order, the committed
        transaction or the error its ``commit()`` raised (that producer's alone, the
        others still commit). An adapter whose commit is round trips (Kafka's flush,
        ``send_offsets_to_transaction``, ``commit_transaction``) makes them concurrently,
        each producer's calls in their usual order. Here: one after another."""
        outcomes: list[CommittedTransaction | Exception] = []
        for producer in producers:
            try:
                outcomes.append(producer.commit())
            except Exception as exc:  # that producer's outcome; the caller decides
                outcomes.append(exc)
        return outcomes

    @abc.abstractmethod
    def close(self) -> None: ...


class LagTracker:
    """KIP-695's ``currentLag``: a partition's lag as known from fetches already made.

    Never a remote call per record: each fetch reports the end offset it saw,
    and the consumer's position advances as records are processed. Before the
    first fetch of a partition the lag is unknown (``None``), which is not 0.
    """

    def __init__(self) -> None:
        self._end_offsets: dict[TopicPartition, int] = {}
        self._positions: dict[TopicPartition, int] = {}

    def fetched(self, tp: TopicPartition, result: FetchResult | FetchedColumns) -> None:
        self._end_offsets[tp] = result.end_offset

    def advanced(self, tp: TopicPartition, position: int) -> None:
        """The consumer's next offset to read in ``tp`` is now ``position``."""
        self._positions[tp] = position

    def current_lag(self, tp: TopicPartition) -> int | None:
        end = self._end_offsets.get(tp)
        position = self._positions.get(tp)
        if end is None or position is None:
            return None
        return max(end - position, 0)


def read_partition(log: Log, tp: TopicPartition, offset: int | None = None) -> Iterator[Record]:
    """Every committed record of ``tp`` from ``offset`` (default: the beginning) to its end."""
    position = log.beginning_offset(tp) if offset is None else offset
    while True:
        records = log.fetch(tp, position).records
        if not records:
            return
        yield from records
        position = records[-1].offset + 1
