"""One sub-topology instantiated for one task: records in, forwards, sink output out.

A task runs its sub-topology for one input partition. :class:`TaskTopology`
creates the processors (one instance per task, as Kafka Streams does), pushes
each input record from its source through ``forward`` calls depth-first, and
collects what sinks emit, serialized, for the task to send in its log
transaction. It does no I/O itself, which is also what makes it the unit that
tests drive directly.

It also keeps what Kafka Streams keeps per task for its processors: the
*record context* of the record being processed (timestamp, headers, topic,
partition, offset), which sinks copy onto what they emit; the task's *stream
time*, the largest timestamp processed so far, and each record's lateness
behind it; the punctuations processors scheduled, by stream time (checked
after every record) or wall-clock time (checked by the stream thread on every
loop); and whether a processor asked for a commit.

Stream time starts over when a task is created (Kafka restores it from the
committed offsets' metadata; eddyline does not yet).

Batch-at-a-time: :meth:`TaskTopology.process_batch` takes the records a
fetch gave one input partition. When everything below the source is one
chain of the DSL's batch processors ending in a sink (or nothing), the batch
goes down the chain list by list: serdes convert whole lists, each step calls
the user's function once per record and nothing else, and the sink appends
columns. The outputs are the ones depth-first processing gives, in the same
order: a chain has one path, so only the interleaving of calls on different
nodes differs, and no node of such a chain can observe it (stateless steps,
and aggregations whose store no other node touches). Any other shape (a
branch, a Processor API processor, a shared store) runs record by record,
and so does every batch while a stream-time punctuation is scheduled (it may
be due after any record) or when a record of the batch has headers (the
batch path carries none). A batch keeps the record context, stream time and
lateness as record-by-record processing leaves them, and an aggregation's
store writes each carry the context of the record they stand for.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, repeat
from typing import Any, Final, NamedTuple

from eddyline_runtime.config import ExceptionHandlerKind
from eddyline_runtime.engine.record_failures import RecordFailures, is_fatal
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_windows import TaskSessionStore, TaskWindowStore
from eddyline_runtime.log.port import RecordColumns
from eddyline_runtime.log.record_size import (
    MOST_OVERHEAD_WITHOUT_HEADERS,
    RecordSizeLimit,
    RecordTooLargeError,
    headers_size_bound,
    record_size_upper_bound,
)
from eddyline_runtime.metrics import Sensor
from eddyline_runtime.processing.exception_handlers import DeadLetterRecord, ErrorHandlerContext
from eddyline_runtime.processing.topology import (
    BatchProcessor,
    Headers,
    Items,
    Node,
    Processor,
    PunctuationType,
    Punctuator,
    RecordContext,
    RecordFailedError,
    SubTopology,
    Topology,
    TopologyError,
)
from eddyline_runtime.serde import deserialize_all, serde_for, serialize_all
from eddyline_runtime.state import Retention, StateStore, VersionedKeyValueStore

# Stream time before the task has processed a record (Kafka's RecordQueue.UNKNOWN).
UNKNOWN_STREAM_TIME: Final = -1
# "No punctuation due": larger than any timestamp.
_NEVER: Final = 2**63 - 1
_new_context: Final = tuple.__new__


@dataclass(frozen=True, slots=True)
class Output:
    """A record a sink emitted: serialized, for the task's producer."""

    topic: str
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Headers = ()


@dataclass(eq=False, slots=True)
class _Schedule:
    """One ``schedule`` call: when it is next due, and how to reschedule it."""

    topology: TaskTopology
    node: str
    interval_ms: int
    punctuation_type: PunctuationType
    punctuator: Punctuator
    due: int
    cancelled: bool = field(default=False)

    def cancel(self) -> None:
        self.cancelled = True
        self.topology._recompute_next_punctuation()

    def advance(self, now: int) -> None:
        """Kafka's ``PunctuationSchedule.next``: the first multiple of the interval past
        ``now``, so a gap of several intervals punctuates once, not once per interval."""
        missed = (now - self.due) // self.interval_ms
        self.due += (missed + 1) * self.interval_ms


class _Batch(NamedTuple):
    """The input batch being processed: where it was read, and its bytes as read."""

    topic: str | None
    partition: int
    offsets: Sequence[int]
    keys: Sequence[bytes | None]
    values: Sequence[bytes | None]


# A compiled batch path: takes a batch's items and its input timestamps.
_BatchHandler = Callable[[Items, Sequence[int]], None]


class _Context:
    """The ProcessorContext of one node in one task."""

    def __init__(self, task: TaskTopology, node: Node) -> None:
        self._task = task
        self._node = node

    def forward(
        self,
        key: Any,
        value: Any,
        *,
        to: str | None = None,
        timestamp: int | None = None,
        headers: Headers | None = None,
    ) -> None:
        children = self._node.children if to is None else [to]
        task = self._task
        saved = task.record_context
        if timestamp is not None or headers is not None:
            task.record_context = saved._replace(
                timestamp=saved.timestamp if timestamp is None else timestamp,
                headers=saved.headers if headers is None else tuple(headers),
            )
        try:
            for child in children:
                if child not in self._node.children:
                    raise TopologyError(f'"{self._node.name}" has no child "{child}"')
                task._deliver(child, key, value)
        finally:
            task.record_context = saved

    def get_state_store(self, name: str) -> Any:
        if name not in self._node.stores:
            attached = ", ".join(self._node.stores) or "none"
            raise TopologyError(
                f'processor "{self._node.name}" is not connected to store "{name}" '
                f"(connected: {attached}); attach it with add_state_store"
            )
        task = self._task
        if name in task.global_stores:
            return task.global_stores[name]
        if name in task.window_stores:
            return task.window_stores[name]
        if name in task.session_stores:
            return task.session_stores[name]
        if name in task.versioned_stores:
            return task.versioned_stores[name]
        return task.stores[name]

    def schedule(
        self, interval_ms: int, punctuation_type: PunctuationType, punctuator: Punctuator
    ) -> _Schedule:
        return self._task.schedule(self._node.name, interval_ms, punctuation_type, punctuator)

    def commit(self) -> None:
        self._task.commit_requested = True

    def record_dropped(self) -> None:
        self._task.record_dropped()

    def node_sensor(self, name: str) -> Sensor:
        return self._task.node_sensor(self._node.name, name)

    @property
    def timestamp(self) -> int:
        return self._task.record_context.timestamp

    @property
    def headers(self) -> Headers:
        return self._task.record_context.headers

    @property
    def topic(self) -> str | None:
        return self._task.record_context.topic

    @property
    def partition(self) -> int:
        return self._task.record_context.partition

    @property
    def offset(self) -> int:
        return self._task.record_context.offset

    @property
    def stream_time(self) -> int:
        return self._task.stream_time

    @property
    def record_lateness(self) -> int:
        return self._task.record_lateness

    @property
    def task_id(self) -> str:
        return self._task.task_id


class TaskTopology:
    # Slots, not an instance dict: the per-record path reads these attributes for every
    # record, and past 30 attributes CPython 3.11 stops sharing an instance dict's keys
    # (measured: the per-record path ~10% slower). A new attribute must be named here.
    __slots__ = (
        "_all_batchable",
        "_batch",
        "_batch_offsets",
        "_batch_partition",
        "_batch_paths",
        "_batch_topic",
        "_next_stream_punctuation",
        "_nodes",
        "_processors",
        "_record_limits",
        "_serdes",
        "_sources",
        "_stream_schedules",
        "_wall_clock_ms",
        "_wall_schedules",
        "commit_requested",
        "dropped_records",
        "dropped_records_sensor",
        "failures",
        "global_stores",
        "next_wall_clock_punctuation",
        "node_sensors",
        "output_bytes",
        "outputs",
        "record_context",
        "record_lateness",
        "session_stores",
        "stores",
        "stream_time",
        "task_id",
        "versioned_stores",
        "window_stores",
    )

    def __init__(
        self,
        topology: Topology,
        subtopology: SubTopology,
        partition: int,
        stores: Mapping[str, StateStore | TaskStore],
        *,
        global_stores: Mapping[str, Any] | None = None,
        wall_clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        failures: RecordFailures | None = None,
        physical_topics: Mapping[str, str] | None = None,
        record_limits: Mapping[str, RecordSizeLimit] | None = None,
    ) -> None:
        """``failures``: the handlers for records that cannot be processed (default:
        Kafka's, log-and-fail); ``physical_topics``: logical -> log topic names, which
        failed records are reported by (default: the same); ``record_limits``: output
        topic (logical, and the dead-letter topic) -> the largest record the log takes
        there (``Log.record_size_limit``; default: none, the test driver's case)."""
        missing = [name for name in subtopology.stores if name not in stores]
        if missing:
            raise TopologyError(f"task {subtopology.task_id(partition)} lacks stores {missing}")
        self.task_id = subtopology.task_id(partition)
        # A bare store (tests, tools) runs without record cache or changelog.
        self.stores = {
            name: store
            if isinstance(store, TaskStore)
            else TaskStore(store, changelog=None, cache=None, cache_name=name)
            for name, store in stores.items()
        }
        # Global stores (read-only views; engine.global_thread): every task reads the same.
        self.global_stores: Mapping[str, Any] = {} if global_stores is None else global_stores
        missing_global = [
            name
            for node_name in subtopology.nodes
            for name in topology.nodes[node_name].stores
            if name in topology.global_stores and name not in self.global_stores
        ]
        if missing_global:
            raise TopologyError(
                f"task {subtopology.task_id(partition)} reads global stores {missing_global}, "
                "which this runner does not hold"
            )
        # Window and session stores are views over their task store (engine.task_windows).
        self.window_stores = {
            name: TaskWindowStore(self.stores[name], Retention.of(spec.window_retention_ms))
            for name, spec in topology.stores.items()
            if name in self.stores and spec.window_retention_ms is not None
        }
        self.session_stores = {
            name: TaskSessionStore(self.stores[name], Retention.of(spec.session_retention_ms))
            for name, spec in topology.stores.items()
            if name in self.stores and spec.session_retention_ms is not None
        }
        # Versioned stores (KIP-889) are views over their task store too; no record cache
        # (Materialized.as_versioned refuses one, as Kafka).
        self.versioned_stores = {
            name: VersionedKeyValueStore(self.stores[name], spec.versioned_history_ms)
            for name, spec in topology.stores.items()
            if name in self.stores and spec.versioned_history_ms is not None
        }
        # Records a processor dropped (Kafka's task metrics dropped-records-total/-rate).
        self.dropped_records, self.dropped_records_sensor = 0, Sensor()
        self.failures = RecordFailures() if failures is None else failures
        self._record_limits: Mapping[str, RecordSizeLimit] = dict(record_limits or {})
        if physical_topics is not None:
            self.failures.topic_names = dict(physical_topics)
        # (node, sensor name) -> the sensor a processor asked for (node-level metrics).
        self.node_sensors: dict[tuple[str, str], Sensor] = {}
        self.record_context = RecordContext(0)
        self.stream_time = UNKNOWN_STREAM_TIME
        self.record_lateness = 0
        self.commit_requested = False
        # Sink topic -> what was emitted to it since the last drain.
        self.outputs: dict[str, RecordColumns] = {}
        self.output_bytes = 0  # key + value bytes of ``outputs``
        self._wall_clock_ms = wall_clock_ms
        self._stream_schedules: list[_Schedule] = []
        self._wall_schedules: list[_Schedule] = []
        self._next_stream_punctuation = _NEVER
        self.next_wall_clock_punctuation = _NEVER
        self._nodes = {name: topology.nodes[name] for name in subtopology.nodes}
        self._sources = {
            topic: node
            for node in self._nodes.values()
            if node.kind == "source"
            for topic in node.topics
        }
        # Resolved once per task, not per record: (key serde, value serde) per source/sink.
        self._serdes = {
            node.name: (serde_for(node.key_serde), serde_for(node.value_serde))
            for node in self._nodes.values()
            if node.kind != "processor"
        }
        for store in self.stores.values():
            store.bind(self)  # cached writes keep the context of the record that made them
        self._processors: dict[str, Processor] = {}
        for node in self._nodes.values():
            if node.kind != "processor" or node.supplier is None:
                continue
            processor = node.supplier()
            processor.init(_Context(self, node))
            self._processors[node.name] = processor
        # Source topic -> its batch path, for the sources whose whole subtree is one chain
        # of batch processors (see the module docstring); the others go record by record.
        self._batch_paths: dict[str, tuple[Any, Any, _BatchHandler]] = {}
        for topic, source in self._sources.items():
            handler = self._compile_batch_path(source)
            if handler is not None:
                key_serde, value_serde = self._serdes[source.name]
                self._batch_paths[topic] = (key_serde, value_serde, handler)
        self._all_batchable = len(self._batch_paths) == len(self._sources)
        # The batch being processed: its topic, partition and offsets (for record contexts).
        self._batch = _Batch(None, -1, (), (), ())
        # ... and its parts _enter reads per store write, as attributes of their own.
        self._batch_topic: str | None = None
        self._batch_partition = -1
        self._batch_offsets: Sequence[int] = ()

    def record_dropped(self) -> None:
        """A processor dropped the record being processed (late, or without a key)."""
        self.dropped_records += 1
        self.dropped_records_sensor.record()
        self.failures.dropped_by_processor()

    def node_sensor(self, node: str, name: str) -> Sensor:
        """Node ``node``'s sensor ``name``, made at the first ask (see
        ``ProcessorContext.node_sensor``; the thread's metrics publish it)."""
        sensor = self.node_sensors.get((node, name))
        if sensor is None:
            sensor = self.node_sensors[(node, name)] = Sensor()
        return sensor

    def grant_commit_request(self) -> None:
        """A commit ran (or there was nothing to commit): ``context.commit()`` is answered."""
        self.commit_requested = False

    def swap_record_context(self, context: RecordContext) -> RecordContext:
        """Describe the record being processed as ``context`` (a store forwarding a flushed
        entry does, for the entry's record); returns the previous context."""
        saved, self.record_context = self.record_context, context
        return saved

    @property
    def batching(self) -> bool:
        """Whether whole batches may go through now: every source has a batch path and
        no stream-time punctuation is scheduled (it may be due after any record). Else
        the task hands over one record at a time (a Processor API processor may ask
        for a commit after any record)."""
        return self._all_batchable and not self._stream_schedules

    @property
    def timestamp(self) -> int:
        """The timestamp of the record being processed (or last processed)."""
        return self.record_context.timestamp

    def process(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers = (),
        *,
        partition: int = -1,
        offset: int = -1,
    ) -> None:
        """Push one input record through the sub-topology, then run the stream-time
        punctuations it made due."""
        source = self._sources.get(topic)
        if source is None:
            raise TopologyError(f'task {self.task_id} does not read topic "{topic}"')
        # tuple.__new__ skips the NamedTuple's Python-level __new__: this runs per record.
        self.record_context = _new_context(
            RecordContext, (timestamp, headers, topic, partition, offset)
        )
        key_serde, value_serde = self._serdes[source.name]
        try:
            key_object, value_object = key_serde.deserialize(key), value_serde.deserialize(value)
        except Exception as exc:
            # A record that does not deserialize moves no stream time (Kafka's RecordQueue).
            self._record_failed(
                ExceptionHandlerKind.DESERIALIZATION, None, None, None, exc, raw=(key, value)
            )
            return
        if timestamp > self.stream_time:
            self.stream_time = timestamp
            self.record_lateness = 0
        else:
            self.record_lateness = self.stream_time - timestamp
        for child in source.children:
            self._deliver(child, key_object, value_object)
        if self.stream_time >= self._next_stream_punctuation:
            self._punctuate(self._stream_schedules, self.stream_time)

    def process_batch(
        self,
        topic: str,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[Headers] | None = None,
        *,
        partition: int = -1,
        offsets: Sequence[int] | None = None,
    ) -> None:
        """Push a batch of input records (one partition's, in order) through the sub-topology.

        ``headers``: each record's, or None when none has any; ``offsets``: each
        record's offset (None: unknown, -1 in the record context). A record that
        fails raises :class:`RecordFailedError` with its index in the batch.
        """
        path = self._batch_paths.get(topic)
        if path is None or headers is not None or self._stream_schedules:
            if topic not in self._sources:
                raise TopologyError(f'task {self.task_id} does not read topic "{topic}"')
            # What a failing record's bytes are found in (see _raw_bytes): set per batch,
            # not per record, since nothing is spent on records that do not fail.
            self._batch = _Batch(topic, partition, offsets or (), keys, values)
            for i in range(len(keys)):
                try:
                    self.process(
                        topic,
                        keys[i],
                        values[i],
                        timestamps[i],
                        () if headers is None else headers[i],
                        partition=partition,
                        offset=-1 if offsets is None else offsets[i],
                    )
                except Exception as exc:
                    raise RecordFailedError(i, exc) from exc
            return
        if not keys:
            return
        key_serde, value_serde, handler = path
        offsets = [-1] * len(keys) if offsets is None else offsets
        try:
            items = Items(
                deserialize_all(key_serde, keys),
                deserialize_all(value_serde, values),
                range(len(keys)),
            )
        except Exception:
            # Find the records it was, the slow way; the rest go on as a smaller batch.
            kept = self._deserializable(
                topic, keys, values, timestamps, partition=partition, offsets=offsets
            )
            if len(kept) < len(keys):
                if kept:
                    try:
                        self.process_batch(
                            topic,
                            [keys[i] for i in kept],
                            [values[i] for i in kept],
                            [timestamps[i] for i in kept],
                            partition=partition,
                            offsets=[offsets[i] for i in kept],
                        )
                    except RecordFailedError as failure:  # its index in this whole batch
                        raise RecordFailedError(
                            kept[failure.index], failure.cause, partial=failure.partial
                        ) from failure.cause
                return
            raise  # deserialize_all failed, but no record alone does: not the records'
        self._batch = _Batch(topic, partition, offsets, keys, values)
        self._batch_topic, self._batch_partition = topic, partition
        self._batch_offsets = offsets
        self._enter(timestamps, 0)
        handler(items, timestamps)
        # Leave the record context, stream time and lateness as the last record leaves them.
        last = len(keys) - 1
        self._enter(timestamps, last)
        newest = max(timestamps)
        self.stream_time = max(self.stream_time, newest)
        self.record_lateness = self.stream_time - timestamps[last]

    def _deserializable(
        self,
        topic: str,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        *,
        partition: int,
        offsets: Sequence[int],
    ) -> list[int]:
        """The indices of the batch's records that deserialize; each other one goes to
        the deserialization handler (which skips it, or fails the task)."""
        key_serde, value_serde = self._serdes[self._sources[topic].name]
        kept: list[int] = []
        for i, (key, value) in enumerate(zip(keys, values, strict=True)):
            try:
                key_serde.deserialize(key)
                value_serde.deserialize(value)
            except Exception as exc:
                self.record_context = _new_context(
                    RecordContext, (timestamps[i], (), topic, partition, offsets[i])
                )
                self._record_failed(
                    ExceptionHandlerKind.DESERIALIZATION, None, None, None, exc, raw=(key, value)
                )
                continue
            kept.append(i)
        return kept

    # -- records that cannot be processed (engine.record_failures) -----------------

    def _record_failed(
        self,
        kind: ExceptionHandlerKind,
        node: str | None,
        key: Any,
        value: Any,
        exception: Exception,
        *,
        raw: tuple[bytes | None, bytes | None] | None = None,
    ) -> None:
        """The record being processed failed in ``node``: ask the handler; a resuming
        answer drops it and queues its dead-letter records with the task's outputs.
        ``raw``: the input record's bytes, when the caller has them."""
        context = self.record_context
        raw_key, raw_value = self._raw_bytes(context) if raw is None else raw
        topic = context.topic
        self._answer(
            ErrorHandlerContext(
                kind=kind,
                task_id=self.task_id,
                topic=None if topic is None else self.failures.topic_names.get(topic, topic),
                partition=context.partition,
                offset=context.offset,
                timestamp=context.timestamp,
                headers=context.headers,
                processor_node_id=node,
                source_raw_key=raw_key,
                source_raw_value=raw_value,
                key=key,
                value=value,
                dead_letter_queue_topic=self.failures.dead_letter_queue_topic,
            ),
            exception,
        )

    def _punctuation_failed(self, scheduled: _Schedule, now: int, exception: Exception) -> None:
        """A punctuator raised: ask the processing handler, as Kafka's
        ``StreamTask.punctuate`` does (KIP-1033), with a context naming its processor and
        the punctuation and no input record. Resumed, the failure counts as a dropped
        record (Kafka's ``droppedRecordsSensor``); the punctuation is next due as usual."""
        self._answer(
            ErrorHandlerContext(
                kind=ExceptionHandlerKind.PROCESSING,
                task_id=self.task_id,
                topic=None,
                partition=-1,
                offset=-1,
                timestamp=now,
                headers=(),
                processor_node_id=scheduled.node,
                source_raw_key=None,
                source_raw_value=None,
                dead_letter_queue_topic=self.failures.dead_letter_queue_topic,
                punctuation_type=scheduled.punctuation_type,
            ),
            exception,
        )

    def _answer(self, context: ErrorHandlerContext, exception: Exception) -> None:
        """Hand a failure to its handler; a resuming answer drops what failed and queues
        the handler's dead-letter records with the task's outputs."""
        records = self.failures.handle(context, exception)
        self.dropped_records += 1
        self.dropped_records_sensor.record()
        if records:
            self._send_dead_letters(records, context)

    def _send_dead_letters(
        self, records: Sequence[DeadLetterRecord], context: ErrorHandlerContext
    ) -> None:
        known = self.failures.dead_letter_queue_topic
        timestamp = context.timestamp
        for record in records:
            if not isinstance(record, DeadLetterRecord) or record.topic != known:
                raise TopologyError(
                    f"task {self.task_id}: an exception handler returned a dead-letter record "
                    f"for {getattr(record, 'topic', record)!r}, but the dead-letter topic is "
                    f"{known!r}; set errors.dead.letter.queue.topic.name to the (existing) "
                    "topic the handler writes to"
                )
            limit = self._record_limits.get(record.topic)
            if limit is not None:
                too_large = self._too_large(
                    record.topic,
                    limit,
                    record.key,
                    record.value,
                    record.headers,
                    what="its dead-letter record",
                )
                if too_large is not None:
                    # Dropping it would lose the record the handler set aside; writing part
                    # of it would mislead. Stop, as a refusal by the log does.
                    raise self.failures.dead_letter_too_large(context, too_large)
            self._output_columns(record.topic).append(
                record.key,
                record.value,
                timestamp if record.timestamp is None else record.timestamp,
                record.headers,
            )
            self.output_bytes += len(record.key or b"") + len(record.value or b"")
        self.failures.sent_to_dead_letter_queue(len(records))

    def _raw_bytes(self, context: RecordContext) -> tuple[bytes | None, bytes | None]:
        """The bytes of the input record ``context`` describes, as read: found by its offset
        in the batch being processed (offsets rise within a batch, and an offset names one
        record of its partition, so what is found is right even for a cached write's
        context); none for a punctuation's context or an earlier batch's record."""
        batch = self._batch
        offset = context.offset
        if offset < 0 or context.topic != batch.topic or context.partition != batch.partition:
            return None, None
        i = bisect_left(batch.offsets, offset)
        if i < len(batch.offsets) and batch.offsets[i] == offset:
            return batch.keys[i], batch.values[i]
        return None, None

    # -- punctuation ---------------------------------------------------------------

    def schedule(
        self,
        node: str,
        interval_ms: int,
        punctuation_type: PunctuationType | str,
        punctuator: Punctuator,
    ) -> _Schedule:
        """Kafka's ``ProcessorContext.schedule``: stream-time punctuations are aligned
        to 0 (the first fires with the first record), wall-clock ones start one
        interval from now."""
        if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or interval_ms < 1:
            raise TopologyError(
                f'processor "{node}": a punctuation interval must be a whole number of '
                f"milliseconds >= 1, got {interval_ms!r}"
            )
        try:
            kind = PunctuationType(punctuation_type)
        except ValueError:
            raise TopologyError(
                f'processor "{node}": unknown punctuation type {punctuation_type!r}; use '
                "PunctuationType.STREAM_TIME or PunctuationType.WALL_CLOCK_TIME"
            ) from None
        if kind is PunctuationType.STREAM_TIME:
            scheduled = _Schedule(self, node, interval_ms, kind, punctuator, 0)
            self._stream_schedules.append(scheduled)
        else:
            due = self._wall_clock_ms() + interval_ms
            scheduled = _Schedule(self, node, interval_ms, kind, punctuator, due)
            self._wall_schedules.append(scheduled)
        self._recompute_next_punctuation()
        return scheduled

    def maybe_punctuate_wall_clock(self, now_ms: int | None = None) -> bool:
        """Run the wall-clock punctuations due by ``now_ms`` (default: the clock)."""
        now = self._wall_clock_ms() if now_ms is None else now_ms
        if now < self.next_wall_clock_punctuation:
            return False
        return self._punctuate(self._wall_schedules, now)

    def _punctuate(self, schedules: list[_Schedule], now: int) -> bool:
        fired = False
        for scheduled in sorted(schedules, key=lambda s: s.due):
            if scheduled.cancelled or scheduled.due > now:
                continue
            saved = self.record_context
            # Kafka's punctuation context: its time, no headers, no topic.
            self.record_context = RecordContext(now)
            try:
                scheduled.punctuator(now)
            except Exception as exc:
                # A failure of the runtime or a store, or one a child already answered
                # with "fail" (a TaskProcessingError), is not the punctuator's to handle.
                if is_fatal(exc) or isinstance(exc, RecordFailedError):
                    raise
                self._punctuation_failed(scheduled, now, exc)
            finally:
                self.record_context = saved
            scheduled.advance(now)
            fired = True
        schedules[:] = [s for s in schedules if not s.cancelled]
        self._recompute_next_punctuation()
        return fired

    def _recompute_next_punctuation(self) -> None:
        self._next_stream_punctuation = min(
            (s.due for s in self._stream_schedules if not s.cancelled), default=_NEVER
        )
        self.next_wall_clock_punctuation = min(
            (s.due for s in self._wall_schedules if not s.cancelled), default=_NEVER
        )

    # -- outputs -------------------------------------------------------------------

    def drain_outputs(self) -> list[Output]:
        """What the sinks emitted since the last drain, record by record."""
        return [
            Output(topic, key, value, timestamp, headers)
            for topic, columns in self.drain_output_columns().items()
            for key, value, timestamp, headers in zip(
                columns.keys,
                columns.values,
                columns.timestamps,
                repeat(()) if columns.headers is None else columns.headers,
                strict=False,
            )
        ]

    def drain_output_columns(self) -> dict[str, RecordColumns]:
        """What the sinks emitted since the last drain, per topic, as columns."""
        outputs, self.outputs = self.outputs, {}
        self.output_bytes = 0
        return outputs

    def close(self) -> None:
        for processor in self._processors.values():
            processor.close()

    def _deliver(self, name: str, key: Any, value: Any) -> None:
        """Hand a record to node ``name``. A failure is answered at the node it happened
        in (Kafka's ``ProcessorNode.process``): a resumed one ends this node's work on
        the record, and whoever forwarded it goes on (its other children, its caller)."""
        node = self._nodes[name]
        if node.kind == "sink":
            key_serde, value_serde = self._serdes[name]
            try:
                key_bytes, value_bytes = key_serde.serialize(key), value_serde.serialize(value)
            except Exception as exc:
                if is_fatal(exc):
                    raise
                self._record_failed(ExceptionHandlerKind.PRODUCTION, name, key, value, exc)
                return
            context = self.record_context
            topic = node.topics[0]
            limit = self._record_limits.get(topic)
            if limit is not None:
                too_large = self._too_large(topic, limit, key_bytes, value_bytes, context.headers)
                if too_large is not None:
                    self._record_failed(
                        ExceptionHandlerKind.PRODUCTION, name, key, value, too_large
                    )
                    return
            columns = self._output_columns(topic)
            columns.append(key_bytes, value_bytes, context.timestamp, context.headers)
            self.output_bytes += (0 if key_bytes is None else len(key_bytes)) + (
                0 if value_bytes is None else len(value_bytes)
            )
        else:
            try:
                self._processors[name].process(key, value)
            except Exception as exc:
                if is_fatal(exc) or isinstance(exc, RecordFailedError):
                    raise
                self._record_failed(ExceptionHandlerKind.PROCESSING, name, key, value, exc)

    def _output_columns(self, topic: str) -> RecordColumns:
        columns = self.outputs.get(topic)
        if columns is None:
            columns = self.outputs[topic] = RecordColumns()
        return columns

    def _enter(self, timestamps: Sequence[int], i: int) -> None:
        """Make input ``i`` of the batch being processed the current record (its whole
        context: a cached store write keeps it, and forwards it when flushed)."""
        self.record_context = _new_context(
            RecordContext,
            (timestamps[i], (), self._batch_topic, self._batch_partition, self._batch_offsets[i]),
        )

    def _compile_batch_path(self, source: Node) -> _BatchHandler | None:
        """The batch path below ``source``, or None when it must go record by record."""
        chain: list[Node] = []
        node = source
        while node.children:
            if len(node.children) != 1:
                return None  # a branch: depth-first interleaves the children per record
            node = self._nodes[node.children[0]]
            if node.kind == "processor":
                processor = self._processors.get(node.name)
                if not isinstance(processor, BatchProcessor) or not processor.batchable:
                    return None
                if any(self._store_shared(store, node.name) for store in node.stores):
                    return None
            chain.append(node)
        handler: _BatchHandler = _drop
        for node in reversed(chain):
            if node.kind == "sink":
                handler = self._sink_handler(node)
            else:
                handler = self._processor_handler(node, handler)
        return handler

    def _store_shared(self, store: str, owner: str) -> bool:
        return any(store in node.stores for node in self._nodes.values() if node.name != owner)

    def _processor_handler(self, node: Node, child: _BatchHandler) -> _BatchHandler:
        processor = self._processors[node.name]
        assert isinstance(processor, BatchProcessor)
        step = processor.process_batch
        enter = self._enter
        name = node.name

        def handle(items: Items, timestamps: Sequence[int]) -> None:
            at = partial(enter, timestamps)
            try:
                forwarded = step(items, timestamps, at)
            except RecordFailedError as failure:
                if failure.partial or is_fatal(failure.cause):
                    raise
                forwarded = self._one_by_one(name, step, items, timestamps)
            if forwarded.keys:
                child(forwarded, timestamps)

        return handle

    def _one_by_one(
        self,
        name: str,
        step: Callable[[Items, Sequence[int], Callable[[int], None]], Items],
        items: Items,
        timestamps: Sequence[int],
    ) -> Items:
        """A batch step failed on a record without applying any of the batch (a failure
        after a partial application is ``partial`` and ends the task): run it again one
        item at a time, so each earlier record is applied once, the failing ones go to
        the processing handler and the later ones go on. What it forwards, in order."""
        at = partial(self._enter, timestamps)
        keys: list[Any] = []
        values: list[Any] = []
        indices: list[int] = []
        for key, value, index in zip(*items, strict=True):
            try:
                forwarded = step(Items([key], [value], [index]), timestamps, at)
            except RecordFailedError as failure:
                if failure.partial or is_fatal(failure.cause):
                    raise
                if not isinstance(failure.cause, Exception):
                    raise
                self._enter(timestamps, index)
                self._record_failed(
                    ExceptionHandlerKind.PROCESSING, name, key, value, failure.cause
                )
                continue
            keys.extend(forwarded.keys)
            values.extend(forwarded.values)
            indices.extend(forwarded.indices)
        return Items(keys, values, indices)

    def _sink_handler(self, node: Node) -> _BatchHandler:
        key_serde, value_serde = self._serdes[node.name]
        topic = node.topics[0]

        def handle(items: Items, timestamps: Sequence[int]) -> None:
            key_objects, value_objects, indices = items
            if not key_objects:
                return
            try:
                keys = serialize_all(key_serde, key_objects)
                values = serialize_all(value_serde, value_objects)
            except Exception:  # find the records it was, the slow way
                items = self._serializable(node.name, items, timestamps)
                key_objects, value_objects, indices = items
                keys = serialize_all(key_serde, key_objects)
                values = serialize_all(value_serde, value_objects)
            size = sum(map(len, filter(None, keys))) + sum(map(len, filter(None, values)))
            limit = self._record_limits.get(topic)
            # Most batches are far under the limit as a whole (the sum is counted anyway),
            # or else by their longest key and value: no record is looked at alone.
            if (
                limit is not None
                and size + MOST_OVERHEAD_WITHOUT_HEADERS > limit.max_bytes
                and max(map(len, filter(None, keys)), default=0)
                + max(map(len, filter(None, values)), default=0)
                + MOST_OVERHEAD_WITHOUT_HEADERS
                > limit.max_bytes
            ):
                keys, values, indices = self._within_limit(
                    node.name,
                    topic,
                    limit,
                    keys=keys,
                    values=values,
                    items=items,
                    timestamps=timestamps,
                )
                if not keys:
                    return
                size = sum(map(len, filter(None, keys))) + sum(map(len, filter(None, values)))
            # A batch carries no headers.
            self._output_columns(topic).extend(
                keys, values, list(map(timestamps.__getitem__, indices))
            )
            self.output_bytes += size

        return handle

    def _too_large(
        self,
        topic: str,
        limit: RecordSizeLimit,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        *,
        what: str = "this record",
    ) -> RecordTooLargeError | None:
        """The error for a serialized record over ``topic``'s limit, None when it fits.
        Checked before anything is sent, so it holds under exactly-once too: the
        transaction never meets the broker's refusal."""
        quick = (0 if key is None else len(key)) + (0 if value is None else len(value))
        if headers:
            quick += headers_size_bound(headers)
        if quick + MOST_OVERHEAD_WITHOUT_HEADERS <= limit.max_bytes:
            return None  # far under the limit: no need of the exact estimate
        size = record_size_upper_bound(key, value, headers)
        if size <= limit.max_bytes:
            return None
        return RecordTooLargeError(
            self.failures.topic_names.get(topic, topic), size, limit, what=what
        )

    def _within_limit(
        self,
        sink: str,
        topic: str,
        limit: RecordSizeLimit,
        *,
        keys: list[bytes | None],
        values: list[bytes | None],
        items: Items,
        timestamps: Sequence[int],
    ) -> tuple[list[bytes | None], list[bytes | None], list[int]]:
        """The serialized batch without the records over ``topic``'s limit; each of those
        goes to the production handler (which skips it, or fails the task)."""
        kept: list[bool] = []
        for key_bytes, value_bytes, key, value, i in zip(keys, values, *items, strict=True):
            too_large = self._too_large(topic, limit, key_bytes, value_bytes, ())
            if too_large is not None:
                self._enter(timestamps, i)
                self._record_failed(ExceptionHandlerKind.PRODUCTION, sink, key, value, too_large)
            kept.append(too_large is None)
        return (
            list(compress(keys, kept)),
            list(compress(values, kept)),
            list(compress(items.indices, kept)),
        )

    def _serializable(self, sink: str, items: Items, timestamps: Sequence[int]) -> Items:
        """The items sink ``sink`` can serialize; each other one goes to the production
        handler (which skips it, or fails the task)."""
        key_serde, value_serde = self._serdes[sink]
        kept: list[bool] = []
        for key, value, i in zip(*items, strict=True):
            try:
                key_serde.serialize(key)
                value_serde.serialize(value)
            except Exception as exc:
                if is_fatal(exc):
                    raise
                self._enter(timestamps, i)
                self._record_failed(ExceptionHandlerKind.PRODUCTION, sink, key, value, exc)
                kept.append(False)
                continue
            kept.append(True)
        return Items(*(list(compress(column, kept)) for column in items))


def _drop(items: Items, timestamps: Sequence[int]) -> None:
    """The end of a chain without a sink."""
