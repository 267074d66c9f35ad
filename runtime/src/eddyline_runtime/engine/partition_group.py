"""Timestamp synchronization of a task's inputs (KIP-695's ``max.task.idle.ms``).

A task with several input partitions processes records in timestamp order
across them: it always takes the buffered record with the smallest timestamp.
When some partition's buffer is empty, it cannot know that partition's next
timestamp, so :meth:`PartitionGroup.ready_to_process` decides whether to wait:

* ``-1``: never wait; process whatever is buffered;
* ``0`` (default): wait while an empty partition has lag > 0 (data exists but
  is not fetched yet) or unknown lag (no fetch has told us yet); once its lag
  is 0, proceed at once;
* ``N > 0``: as ``0``, and also wait up to N ms after an empty partition's
  lag reached 0, for new data to be produced.

The lag is the locally known one (``LagTracker.current_lag``): never a remote
call per record. Proceeding while a partition is still empty is *enforced
processing*, counted (per record) in :attr:`PartitionGroup.enforced_processing`.

Each record released counts its *lateness*, how far its timestamp is behind the
stream time of the records released before it (0 for one that moves stream
time on), in :attr:`PartitionGroup.record_lateness_sensor`: Kafka's task
metrics ``record-lateness-avg`` and ``-max``, counted where Kafka's
``PartitionGroup.nextRecord`` records them and recorded once per turn of the task
(:meth:`PartitionGroup.flush_lateness`).

Records are buffered as the columns a fetch returned (:class:`Chunk`) and
released in batches (:meth:`PartitionGroup.next_batch`): the longest run of
one partition's records that taking them one by one, smallest timestamp
first, would also have released in a row. With one input partition that is
simply the next records; with several, a run stops where another partition's
buffered head is older (ties go to the partition listed first, as before).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.log import Record
from eddyline_runtime.metrics import Sensor
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing.topology import Headers

MAX_TASK_IDLE_DISABLED = -1


def validate_max_task_idle_ms(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < MAX_TASK_IDLE_DISABLED:
        raise ConfigError(
            "max.task.idle.ms",
            value,
            "-1 (never wait), 0 (wait only for data already produced) or a number of ms > 0",
        )
    return value


@dataclass(slots=True)
class Chunk:
    """Consecutive records of one partition, as columns, and how many were taken."""

    offsets: Sequence[int]
    keys: Sequence[bytes | None]
    values: Sequence[bytes | None]
    timestamps: Sequence[int]
    # Each record's headers; None when no record of the chunk has any.
    headers: Sequence[Headers] | None = None
    taken: int = 0

    @classmethod
    def of(cls, records: Sequence[Record]) -> Chunk:
        return cls(
            [r.offset for r in records],
            [r.key for r in records],
            [r.value for r in records],
            [r.timestamp for r in records],
            [r.headers for r in records] if any(r.headers for r in records) else None,
        )


@dataclass(frozen=True, slots=True)
class Batch:
    """Records of one partition to process in a row, as columns."""

    tp: TopicPartition
    offsets: Sequence[int]
    keys: Sequence[bytes | None]
    values: Sequence[bytes | None]
    timestamps: Sequence[int]
    # Each record's headers; None when none of them has any.
    headers: Sequence[Headers] | None = None

    def __len__(self) -> int:
        return len(self.offsets)


class PartitionGroup:
    """The buffered records of one task's input partitions, released in timestamp order."""

    def __init__(
        self,
        partitions: Sequence[TopicPartition],
        *,
        max_task_idle_ms: int,
        current_lag: Callable[[TopicPartition], int | None],
        clock_ms: Callable[[], int],
    ) -> None:
        self.max_task_idle_ms = validate_max_task_idle_ms(max_task_idle_ms)
        # Per partition: its chunks (never an empty one), and how many records they hold.
        self._queues: dict[TopicPartition, deque[Chunk]] = {tp: deque() for tp in partitions}
        self._buffered: dict[TopicPartition, int] = dict.fromkeys(partitions, 0)
        # The common case of one input partition, without the search for the oldest.
        self._only = next(iter(self._queues.items())) if len(self._queues) == 1 else None
        self._current_lag = current_lag
        self._clock_ms = clock_ms
        # When each empty, caught-up partition stops being waited for.
        self._idle_deadlines: dict[TopicPartition, int] = {}
        self.enforced_processing = 0
        # For enforced-processing-rate (Kafka reports the rate beside the total).
        self.enforced_processing_sensor = Sensor()
        # Whether the last ready_to_process() allowed processing only by enforcing it.
        self._enforcing = False
        # The largest timestamp released so far (Kafka's PartitionGroup.streamTime; -1: none).
        self.stream_time = -1
        # Each released record's lateness behind it (record-lateness-avg/-max), counted
        # here and recorded by flush_lateness.
        self.record_lateness_sensor = Sensor()
        self._lateness_count = self._lateness_total = self._lateness_max = 0

    def add_records(self, tp: TopicPartition, records: Sequence[Record]) -> None:
        if records:
            self.add_chunk(tp, Chunk.of(records))

    def add_chunk(self, tp: TopicPartition, chunk: Chunk) -> None:
        """Buffer fetched records given as columns (offsets, keys, values, timestamps)."""
        size = len(chunk.offsets) - chunk.taken
        if size > 0:
            self._queues[tp].append(chunk)
            self._buffered[tp] += size

    def buffered(self, tp: TopicPartition | None = None) -> int:
        if tp is not None:
            return self._buffered[tp]
        return sum(self._buffered.values())

    def ready_to_process(self) -> bool:
        """Whether the next record may be taken now, by the rules in the module docstring."""
        self._enforcing = False
        if all(self._queues.values()):
            # Every input has a record buffered: timestamp order is known, no waiting.
            if self._idle_deadlines:
                self._idle_deadlines.clear()
            return True
        any_buffered = any(self._queues.values())
        if self.max_task_idle_ms == MAX_TASK_IDLE_DISABLED:
            return any_buffered
        now = self._clock_ms()
        waited_out = False
        for tp, queue in self._queues.items():
            if queue:
                self._idle_deadlines.pop(tp, None)
                continue
            lag = self._current_lag(tp)
            if lag is None or lag > 0:
                # Unknown lag: wait for a fetch to tell. Lag > 0: wait to fetch the data.
                self._idle_deadlines.pop(tp, None)
                return False
            deadline = self._idle_deadlines.setdefault(tp, now + self.max_task_idle_ms)
            if now < deadline:
                return False  # caught up: wait for new data to be produced
            waited_out = True
        if not any_buffered:
            return False
        self._enforcing = waited_out
        return True

    def next_record(self) -> tuple[TopicPartition, Record] | None:
        """The buffered record with the smallest timestamp (ties: the earlier partition)."""
        batch = self.next_batch(1)
        if batch is None:
            return None
        headers = () if batch.headers is None else batch.headers[0]
        return batch.tp, Record(
            batch.keys[0], batch.values[0], batch.timestamps[0], headers, batch.offsets[0]
        )

    def next_batch(self, max_records: int) -> Batch | None:
        """Up to ``max_records`` records of one partition that timestamp order releases in
        a row (see the module docstring); call after :meth:`ready_to_process` said yes."""
        if self._only is not None:
            tp, queue = self._only
            if not queue:
                return None
            chunk = queue[0]
            end = min(chunk.taken + max_records, len(chunk.offsets))
        else:
            chosen: TopicPartition | None = None
            oldest = 0
            for tp, queue in self._queues.items():
                if queue:
                    head = queue[0]
                    timestamp = head.timestamps[head.taken]
                    if chosen is None or timestamp < oldest:
                        chosen, oldest = tp, timestamp
            if chosen is None:
                return None
            tp, queue = chosen, self._queues[chosen]
            chunk = queue[0]
            end = min(chunk.taken + max_records, len(chunk.offsets))
            end = self._run_end(chosen, chunk, end)
        start = chunk.taken
        headers = None if chunk.headers is None else chunk.headers[start:end]
        batch = Batch(
            tp,
            chunk.offsets[start:end],
            chunk.keys[start:end],
            chunk.values[start:end],
            chunk.timestamps[start:end],
            headers if headers and any(headers) else None,  # None: the batch path may run
        )
        chunk.taken = end
        if end == len(chunk.offsets):
            queue.popleft()
        taken = end - start
        self._buffered[tp] -= taken
        if self._enforcing:
            self.enforced_processing += taken
            self.enforced_processing_sensor.record(taken)
        self._count_lateness(batch.timestamps)
        return batch

    def _count_lateness(self, timestamps: Sequence[int]) -> None:
        """Count each record's lateness behind the stream time before it; the sensor gets
        them at :meth:`flush_lateness`. A batch in order (most are) costs one sort check
        in C; an out-of-order one a loop."""
        newest = self.stream_time
        self._lateness_count += len(timestamps)
        if timestamps[0] >= newest and (len(timestamps) == 1 or sorted(timestamps) == timestamps):
            self.stream_time = timestamps[-1]
            return
        total = worst = 0
        for timestamp in timestamps:
            if timestamp > newest:
                newest = timestamp
            else:
                late = newest - timestamp
                total += late
                if late > worst:  # noqa: PLR1730 (a call to max per record costs 4x this)
                    worst = late
        self.stream_time = newest
        self._lateness_total += total
        self._lateness_max = max(self._lateness_max, worst)

    def flush_lateness(self) -> None:
        """Record the lateness counted since the last flush (once per turn of the task: a
        sensor per record would cost about as much as processing the record)."""
        if self._lateness_count:
            self.record_lateness_sensor.record_many(
                self._lateness_count, self._lateness_total, self._lateness_max
            )
            self._lateness_count = self._lateness_total = self._lateness_max = 0

    def _run_end(self, chosen: TopicPartition, chunk: Chunk, end: int) -> int:
        """Where the chosen partition's run stops: before the first record that another
        partition's head precedes (strictly older, or as old and listed earlier)."""
        bound_before = None  # heads of partitions listed before the chosen one: must be <
        bound_after = None  # listed after it: ties go to the chosen one, so <=
        before = True
        for tp, queue in self._queues.items():
            if tp == chosen:
                before = False
                continue
            if not queue:
                continue
            head = queue[0]
            timestamp = head.timestamps[head.taken]
            if before:
                bound_before = timestamp if bound_before is None else min(bound_before, timestamp)
            else:
                bound_after = timestamp if bound_after is None else min(bound_after, timestamp)
        timestamps = chunk.timestamps
        position = chunk.taken + 1  # the first record was chosen: it is always taken
        while position < end:
            timestamp = timestamps[position]
            if (bound_before is not None and timestamp >= bound_before) or (
                bound_after is not None and timestamp > bound_after
            ):
                break
            position += 1
        return position
