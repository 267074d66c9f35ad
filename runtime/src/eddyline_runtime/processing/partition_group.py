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
processing*, counted in :attr:`PartitionGroup.enforced_processing`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.log import Record
from eddyline_runtime.metrics import Sensor
from eddyline_runtime.partitions import TopicPartition

MAX_TASK_IDLE_DISABLED = -1


def validate_max_task_idle_ms(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < MAX_TASK_IDLE_DISABLED:
        raise ConfigError(
            "max.task.idle.ms",
            value,
            "-1 (never wait), 0 (wait only for data already produced) or a number of ms > 0",
        )
    return value


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
        self._queues: dict[TopicPartition, deque[Record]] = {tp: deque() for tp in partitions}
        # The common case of one input partition, without the search for the oldest.
        self._only = next(iter(self._queues.items())) if len(self._queues) == 1 else None
        self._current_lag = current_lag
        self._clock_ms = clock_ms
        # When each empty, caught-up partition stops being waited for.
        self._idle_deadlines: dict[TopicPartition, int] = {}
        self.enforced_processing = 0
        # For enforced-processing-rate (Kafka reports the rate beside the total).
        self.enforced_processing_sensor = Sensor()

    def add_records(self, tp: TopicPartition, records: Iterable[Record]) -> None:
        self._queues[tp].extend(records)

    def buffered(self, tp: TopicPartition | None = None) -> int:
        if tp is not None:
            return len(self._queues[tp])
        return sum(len(queue) for queue in self._queues.values())

    def ready_to_process(self) -> bool:
        """Whether the next record may be taken now, by the rules in the module docstring."""
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
        if waited_out:
            self.enforced_processing += 1
            self.enforced_processing_sensor.record()
        return True

    def next_record(self) -> tuple[TopicPartition, Record] | None:
        """The buffered record with the smallest timestamp (ties: the earlier partition)."""
        if self._only is not None:
            tp, queue = self._only
            return (tp, queue.popleft()) if queue else None
        chosen: TopicPartition | None = None
        for tp, queue in self._queues.items():
            if queue and (chosen is None or queue[0].timestamp < self._queues[chosen][0].timestamp):
                chosen = tp
        if chosen is None:
            return None
        return chosen, self._queues[chosen].popleft()
