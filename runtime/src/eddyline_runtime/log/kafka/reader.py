"""Reading: one ``read_committed`` consumer per thread, per-partition buffers over it.

Manual assignment (the assignor decides who reads what, never a consumer
group's rebalance). A partition is assigned the first time it is read (its
topic's metadata asked first, so fetching starts at once) and stays
assigned, so librdkafka keeps prefetching it; a fetch at the offset the
previous one ended at serves what arrived, a fetch anywhere else seeks. When
nothing is buffered the fetch asks the leader for the last stable offset (one
``ListOffsets`` round trip), then waits for the records below it or for the
consumer's position to pass it (transaction markers and aborted records take
offsets but are never delivered). The end offset a fetch reports is the last
stable offset, or the requested offset when only markers and aborted records
lie before it: KIP-695's lag (:class:`~eddyline_runtime.log.port.LagTracker`)
then reads 0, as Kafka's consumer position would make it, instead of waiting
on a marker forever.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaPartition

from eddyline_runtime.log.errors import LogError, OffsetOutOfRangeError
from eddyline_runtime.log.kafka.connection import KafkaConnection
from eddyline_runtime.log.kafka.errors import kafka_error, leader_moving
from eddyline_runtime.partitions import TopicPartition

logger = logging.getLogger(__name__)

# One watermark query's timeout; bounds() repeats it within the request timeout.
_WATERMARK_ATTEMPT_S = 3.0
# How long a fetch waits for records the last stable offset says are there.
_FETCH_WAIT_S = 30.0
# One consume() while waiting: short, so a fetch returns as soon as data lands.
_POLL_S = 0.005
# Messages taken from librdkafka's queue per consume() call.
_CONSUME_BATCH = 10_000
# Records buffered for one partition before it is paused: the memory bound for
# partitions read rarely (a changelog after its restore) or slower than they fill.
_BUFFER_PAUSE = 20_000
# A partition not read for this long is unassigned, so librdkafka stops
# fetching it (a restored changelog, a task handed over).
_IDLE_UNASSIGN_S = 60.0
# How long a last stable offset a query returned stands in for the end offset of
# fetches that stay below it: a reader catching up learns nothing new from asking
# before each fetch (a round trip per 5,000 records), only its lag is as old as this.
_KNOWN_END_S = 1.0


def message_offset(message: Message) -> int:
    """A delivered or fetched message's offset (never None for those)."""
    return cast(int, message.offset())


def message_headers(headers: Any) -> tuple[tuple[str, bytes], ...]:
    """librdkafka gives a header without a value as None; the port has b""."""
    return tuple((name, value or b"") for name, value in headers)


class DataEnds:
    """Per partition, a last stable offset and where committed data ended below it, when
    a reader found only transaction markers in between: a ``read_committed`` reader at
    that data end is at the end (``KafkaLog.end_offset``). Shared by every thread's
    reader: the thread asking for an end offset need not be the one that fetched."""

    def __init__(self) -> None:
        self._ends: dict[tuple[str, int], tuple[int, int]] = {}

    def markers_only(self, real: str, partition: int, stable: int, data_end: int) -> None:
        """A reader found only transaction markers between ``data_end`` and ``stable``."""
        self._ends[(real, partition)] = (stable, data_end)

    def end(self, real: str, partition: int, stable: int) -> int:
        """Where committed data ends, given the partition's last stable offset."""
        seen = self._ends.get((real, partition))
        return seen[1] if seen is not None and seen[0] == stable else stable


class PartitionReader:
    """One thread's read_committed consumer: per-partition buffers over librdkafka's queue."""

    def __init__(self, connection: KafkaConnection, ends: DataEnds) -> None:
        self._connection = connection
        self._ends = ends
        self._consumer = connection.reader_consumer()
        self._offsets = connection.offsets_consumer()
        # For the high watermark (undecided transactions), made on first use.
        self._uncommitted_offsets: Consumer | None = None
        self._assigned: set[tuple[str, int]] = set()
        # Where the caller's next fetch is expected to start, per partition.
        self._next: dict[tuple[str, int], int] = {}
        self._buffers: dict[tuple[str, int], deque[Message]] = {}
        self._paused: set[tuple[str, int]] = set()
        self._read_at: dict[tuple[str, int], float] = {}
        self._swept_at = time.monotonic()
        # Per partition, the last stable offset the latest query returned, and when.
        self._known_ends: dict[tuple[str, int], tuple[int, float]] = {}
        # An error met while draining belongs to its partition's next fetch.
        self._errors: dict[tuple[str, int], LogError] = {}
        # Topics the reader consumer asked metadata for while any of their partitions
        # stays assigned (``_assign``).
        self._topics_known: set[str] = set()

    def bounds(self, tp: TopicPartition, real: str) -> tuple[int, int]:
        """(log start, last stable offset): one ListOffsets round trip, repeated while
        the partition's leadership moves (a broker restart, a leader election) for at
        most the request timeout."""
        low, high = self._watermarks(self._offsets, tp, real)
        self._known_ends[(real, tp.partition)] = (high, time.monotonic())
        return low, high

    def offset_for_timestamp(self, tp: TopicPartition, real: str, timestamp_ms: int) -> int | None:
        """The first offset whose record's timestamp is at or after ``timestamp_ms``
        (ListOffsets by timestamp, bounded by the last stable offset under
        read_committed); None when no record is."""
        action = f"looking up the offset of {tp} at timestamp {timestamp_ms}"
        try:
            (found,) = self._offsets.offsets_for_times(
                # A time before 1970 asks for every record (their timestamps are >= 0);
                # sent as is, -1 and -2 would mean the latest and the earliest offset.
                [KafkaPartition(real, tp.partition, max(0, timestamp_ms))],
                timeout=self._connection.request_timeout_s,
            )
        except KafkaException as exc:
            raise self._connection.error(exc, action=action) from None
        if found.error is not None:
            raise self._connection.error(found.error, action=action)
        return None if found.offset < 0 else int(found.offset)

    def high_watermark(self, tp: TopicPartition, real: str) -> int:
        """The offset after the last record written, decided or not (read_uncommitted)."""
        if self._uncommitted_offsets is None:
            self._uncommitted_offsets = self._connection.offsets_consumer(committed=False)
        return self._watermarks(self._uncommitted_offsets, tp, real)[1]

    def _watermarks(self, offsets: Consumer, tp: TopicPartition, real: str) -> tuple[int, int]:
        deadline = time.monotonic() + self._connection.request_timeout_s
        # Each attempt is short: a query sent to a leader that was just killed waits for
        # it until its timeout (a whole request timeout once, seen on the 3-broker
        # cluster), while a metadata refresh finds the new leader in milliseconds.
        attempt_s = min(_WATERMARK_ATTEMPT_S, self._connection.request_timeout_s)
        while True:
            try:
                low, high = offsets.get_watermark_offsets(
                    KafkaPartition(real, tp.partition), timeout=attempt_s, cached=False
                )
            except KafkaException as exc:
                error = kafka_error(exc)
                retry = leader_moving(error) or (
                    error is not None and error.code() == KafkaError._TIMED_OUT
                )
                if not retry or time.monotonic() > deadline:
                    action = f"reading the offsets of {tp}"
                    raise self._connection.error(exc, action=action) from None
                self._refresh_metadata(real)
                time.sleep(0.05)
                continue
            return low, high

    def _refresh_metadata(self, real: str, consumer: Consumer | None = None) -> None:
        """Ask for ``real``'s metadata now, into ``consumer``'s cache (the watermark
        consumer's unless said; the reader's: :meth:`_assign`). The watermark consumer
        is assigned nothing, so no fetcher notices a leader that died: librdkafka kept
        the dead leader (or none) in its cache until its periodic refresh
        (topic.metadata.refresh.interval.ms, 5 min), and every watermark query failed
        with _UNKNOWN_PARTITION meanwhile (seen on the three-broker cluster with a
        broker killed). A metadata response updates the client's cache, so the next
        query goes to the new leader."""
        asking = self._offsets if consumer is None else consumer
        try:
            asking.list_topics(real, timeout=min(5.0, self._connection.request_timeout_s))
        except KafkaException as exc:  # the next query (or librdkafka's scan) finds it
            logger.debug("metadata refresh of %s failed: %s", real, exc)

    def fetch(
        self, tp: TopicPartition, real: str, offset: int, max_records: int
    ) -> tuple[list[Message], int]:
        key = (real, tp.partition)
        now = time.monotonic()
        self._read_at[key] = now
        if now - self._swept_at > _IDLE_UNASSIGN_S / 4:
            self._unassign_idle(now)
        self._raise_pending(key)
        known_end: int | None = None
        if self._next.get(key) != offset:
            beginning, known_end = self.bounds(tp, real)
            if not beginning <= offset <= known_end:
                raise OffsetOutOfRangeError(tp, offset, beginning, known_end)
            self._seek(key, offset)
        self._drain(0)
        self._raise_pending(key)
        taken = self._take(key, max_records)
        if taken:
            return taken, self._end_after(tp, real, message_offset(taken[-1]))
        end = known_end if known_end is not None else self.bounds(tp, real)[1]
        if offset >= end:
            return [], end
        # Committed records lie ahead: wait for them, or for the position to pass
        # the last stable offset (only markers and aborted records were left).
        deadline = time.monotonic() + _FETCH_WAIT_S
        kafka_tp = KafkaPartition(real, tp.partition)
        while time.monotonic() < deadline:
            # Checked first: a partition whose tail is a commit marker comes here on
            # every fetch, and should not pay a poll's wait for it.
            (position,) = self._consumer.position([kafka_tp])
            if position.offset >= end:  # a seek resets it to -1001 (invalid)
                self._ends.markers_only(real, tp.partition, end, offset)
                return [], offset
            self._drain(_POLL_S)
            self._raise_pending(key)
            taken = self._take(key, max_records)
            if taken:
                return taken, self._end_after(tp, real, message_offset(taken[-1]))
        raise self._connection.unreachable(
            f"{tp} has committed records up to offset {end} but none arrived from offset {offset}",
            _FETCH_WAIT_S,
        )

    def _end_after(self, tp: TopicPartition, real: str, last: int) -> int:
        """The end offset after delivering ``last``: the cached high watermark when it
        says nothing follows (then it is the last stable offset too); a last stable
        offset queried less than ``_KNOWN_END_S`` ago when the reader is still below it
        (the end is at least that: the reader is not caught up, and its lag is that
        query's); else a round trip."""
        _, high = self._consumer.get_watermark_offsets(
            KafkaPartition(real, tp.partition), cached=True
        )
        if high == last + 1:
            return high
        known = self._known_ends.get((real, tp.partition))
        if known is not None and known[0] > last + 1 and time.monotonic() - known[1] < _KNOWN_END_S:
            return known[0]
        return max(self.bounds(tp, real)[1], last + 1)

    def _raise_pending(self, key: tuple[str, int]) -> None:
        error = self._errors.pop(key, None)
        if error is not None:
            self._next.pop(key, None)  # the next fetch seeks and checks the range again
            raise error

    def _unassign_idle(self, now: float) -> None:
        self._swept_at = now
        idle = [key for key, at in self._read_at.items() if now - at > _IDLE_UNASSIGN_S]
        if idle:
            self._consumer.incremental_unassign([KafkaPartition(*key) for key in idle])
            for key in idle:
                for state in (
                    self._read_at,
                    self._next,
                    self._buffers,
                    self._errors,
                    self._known_ends,
                ):
                    state.pop(key, None)
                self._assigned.discard(key)
                self._paused.discard(key)
            # A topic read again after a long pause asks for its metadata again: librdkafka
            # may have let it age out meanwhile (metadata.max.age.ms), and one round trip
            # per return is cheap.
            self._topics_known -= {topic for topic, _ in idle} - {t for t, _ in self._assigned}

    def _resume(self, key: tuple[str, int]) -> None:
        if key in self._paused:
            self._paused.discard(key)
            self._consumer.resume([KafkaPartition(*key)])

    def _seek(self, key: tuple[str, int], offset: int) -> None:
        kafka_tp = KafkaPartition(key[0], key[1], offset)
        self._buffers.pop(key, None)
        self._resume(key)
        if key in self._assigned:
            try:
                self._consumer.seek(kafka_tp)
            except KafkaException:
                # A partition whose assignment is not active yet cannot seek: reassign.
                self._consumer.incremental_unassign([KafkaPartition(key[0], key[1])])
                self._consumer.incremental_assign([kafka_tp])
        else:
            self._assign(kafka_tp)
            self._assigned.add(key)
        self._next[key] = offset

    def _assign(self, kafka_tp: KafkaPartition) -> None:
        """Start fetching a partition, at once. librdkafka fetches a partition only once
        it has its topic's metadata, and for a topic the consumer has not read yet it
        asks for that on its once-a-second scan of topics without metadata, not on
        assignment: the first fetch of a standby's changelog waited 0.5 to 1.1 s for
        it on an idle broker (longer on a loaded machine), its thread blocked and its
        copy reporting the whole changelog as lag meanwhile (a standby that a query
        fell over to right after the active's first commit held none of it). Asking
        for the topic's metadata first (one round trip) lets the fetch start now."""
        topic = kafka_tp.topic
        if topic not in self._topics_known:
            self._refresh_metadata(topic, self._consumer)
            self._topics_known.add(topic)
        self._consumer.incremental_assign([kafka_tp])

    def _drain(self, timeout: float) -> None:
        messages = self._consumer.consume(_CONSUME_BATCH, timeout)
        if not messages:
            return
        buffers, expected = self._buffers, self._next
        touched: dict[tuple[str, int], deque[Message]] = {}
        # A consume() returns runs of one partition's messages: look the buffer
        # up once per run, not once per message (the fetch hot path).
        run_key: tuple[str | None, int | None] = (None, None)
        buffer: deque[Message] | None = None
        for message in messages:
            if message.error() is not None:
                self._failed(message, cast(KafkaError, message.error()))
                continue
            key = (message.topic(), message.partition())
            if key != run_key:
                run_key = key
                real_key = cast(tuple[str, int], key)
                if real_key not in expected:
                    buffer = None  # unassigned meanwhile
                    continue
                buffer = buffers.get(real_key)
                if buffer is None:
                    buffer = buffers[real_key] = deque()
                touched[real_key] = buffer
            if buffer is not None:
                buffer.append(message)
        for key, filled in touched.items():
            if len(filled) >= _BUFFER_PAUSE and key not in self._paused:
                self._consumer.pause([KafkaPartition(*key)])
                self._paused.add(key)

    def _failed(self, message: Message, error: KafkaError) -> None:
        topic, partition = message.topic(), message.partition()
        if topic is None or partition is None or partition < 0:
            # Client-wide events (a broker connection dropped): librdkafka retries.
            logger.warning("Kafka consumer: %s", error.str())
            return
        key = (topic, partition)
        tp = TopicPartition(self._connection.port_topic(topic), partition)
        if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            beginning, end = self.bounds(tp, topic)
            found: LogError = OffsetOutOfRangeError(tp, self._next.get(key, -1), beginning, end)
        else:
            found = self._connection.error(
                error, action=f"fetching {tp}", acl=f'READ on topic "{topic}"'
            )
        self._errors[key] = found

    def _take(self, key: tuple[str, int], max_records: int) -> list[Message]:
        buffer = self._buffers.get(key)
        if not buffer:
            return []
        if len(buffer) <= max_records:
            taken = list(buffer)
            buffer.clear()
        else:
            taken = [buffer.popleft() for _ in range(max_records)]
        if len(buffer) < _BUFFER_PAUSE // 2:
            self._resume(key)
        self._next[key] = message_offset(taken[-1]) + 1
        return taken

    def close(self) -> None:
        self._consumer.close()
        self._offsets.close()
        if self._uncommitted_offsets is not None:
            self._uncommitted_offsets.close()
