"""One sub-topology instantiated for one task: records in, forwards, sink output out.

A task runs its sub-topology for one input partition. :class:`TaskTopology`
creates the processors (one instance per task, as Kafka Streams does), pushes
each input record from its source through ``forward`` calls depth-first, and
collects what sinks emit, serialized, for the task to send in its log
transaction. It does no I/O itself, which is also what makes it the unit that
tests drive directly.

Batch-at-a-time: :meth:`TaskTopology.process_batch` takes the records a
fetch gave one input partition. When everything below the source is one
chain of the DSL's batch processors ending in a sink (or nothing), the batch
goes down the chain list by list: serdes convert whole lists, each step calls
the user's function once per record and nothing else, and the sink appends
columns. The outputs are the ones depth-first processing gives, in the same
order: a chain has one path, so only the interleaving of calls on different
nodes differs, and no node of such a chain can observe it (stateless steps,
and aggregations whose store no other node touches). Any other shape (a
branch, a Processor API processor, a shared store) runs record by record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from eddyline_runtime.processing.task_store import TaskStore
from eddyline_runtime.processing.topology import (
    BatchProcessor,
    Item,
    Node,
    Processor,
    RecordFailedError,
    SubTopology,
    Topology,
    TopologyError,
)
from eddyline_runtime.serde import deserialize_all, serde_for, serialize_all
from eddyline_runtime.state import StateStore


@dataclass(frozen=True, slots=True)
class Output:
    """A record a sink emitted: serialized, for the task's producer."""

    topic: str
    key: bytes | None
    value: bytes | None
    timestamp: int


class OutputColumns:
    """What the sinks emitted to one topic since the last drain, as columns
    (what a batch insert wants), in emission order."""

    __slots__ = ("keys", "timestamps", "values")

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []

    def __len__(self) -> int:
        return len(self.keys)


# A compiled batch path: takes a batch's items and its input timestamps.
_BatchHandler = Callable[[list[Item], Sequence[int]], None]


class _Context:
    """The ProcessorContext of one node in one task."""

    def __init__(self, task: TaskTopology, node: Node) -> None:
        self._task = task
        self._node = node

    def forward(self, key: Any, value: Any, *, to: str | None = None) -> None:
        children = self._node.children if to is None else [to]
        for child in children:
            if child not in self._node.children:
                raise TopologyError(f'"{self._node.name}" has no child "{child}"')
            self._task._deliver(child, key, value)

    def get_state_store(self, name: str) -> TaskStore:
        if name not in self._node.stores:
            attached = ", ".join(self._node.stores) or "none"
            raise TopologyError(
                f'processor "{self._node.name}" is not connected to store "{name}" '
                f"(connected: {attached}); attach it with add_state_store"
            )
        return self._task.stores[name]

    @property
    def timestamp(self) -> int:
        return self._task.timestamp

    @property
    def task_id(self) -> str:
        return self._task.task_id


class TaskTopology:
    def __init__(
        self,
        topology: Topology,
        subtopology: SubTopology,
        partition: int,
        stores: Mapping[str, StateStore | TaskStore],
    ) -> None:
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
        self.timestamp = 0
        # Sink topic -> what was emitted to it since the last drain.
        self.outputs: dict[str, OutputColumns] = {}
        self.output_bytes = 0  # key + value bytes of ``outputs``
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
        self._processors: dict[str, Processor] = {}
        for node in self._nodes.values():
            if node.kind == "processor" and node.supplier is not None:
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

    def process(self, topic: str, key: bytes | None, value: bytes | None, timestamp: int) -> None:
        """Push one input record through the sub-topology."""
        source = self._sources.get(topic)
        if source is None:
            raise TopologyError(f'task {self.task_id} does not read topic "{topic}"')
        self.timestamp = timestamp
        key_serde, value_serde = self._serdes[source.name]
        for child in source.children:
            self._deliver(child, key_serde.deserialize(key), value_serde.deserialize(value))

    def process_batch(
        self,
        topic: str,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
    ) -> None:
        """Push a batch of input records (one partition's, in order) through the sub-topology.

        A record that fails raises :class:`RecordFailedError` with its index in the batch.
        """
        path = self._batch_paths.get(topic)
        if path is None:
            if topic not in self._sources:
                raise TopologyError(f'task {self.task_id} does not read topic "{topic}"')
            for i, (key, value, timestamp) in enumerate(zip(keys, values, timestamps, strict=True)):
                try:
                    self.process(topic, key, value, timestamp)
                except Exception as exc:
                    raise RecordFailedError(i, exc) from exc
            return
        key_serde, value_serde, handler = path
        try:
            items = list(
                zip(
                    deserialize_all(key_serde, keys),
                    deserialize_all(value_serde, values),
                    range(len(keys)),
                    strict=True,
                )
            )
        except Exception:  # find the record it was, the slow way
            for i, (key, value) in enumerate(zip(keys, values, strict=True)):
                try:
                    key_serde.deserialize(key)
                    value_serde.deserialize(value)
                except Exception as exc:
                    raise RecordFailedError(i, exc) from exc
            raise
        handler(items, timestamps)
        self.timestamp = timestamps[-1] if timestamps else self.timestamp

    def drain_outputs(self) -> list[Output]:
        """What the sinks emitted since the last drain, record by record."""
        return [
            Output(topic, key, value, timestamp)
            for topic, columns in self.drain_output_columns().items()
            for key, value, timestamp in zip(
                columns.keys, columns.values, columns.timestamps, strict=True
            )
        ]

    def drain_output_columns(self) -> dict[str, OutputColumns]:
        """What the sinks emitted since the last drain, per topic, as columns."""
        outputs, self.outputs = self.outputs, {}
        self.output_bytes = 0
        return outputs

    def close(self) -> None:
        for processor in self._processors.values():
            processor.close()

    def _deliver(self, name: str, key: Any, value: Any) -> None:
        node = self._nodes[name]
        if node.kind == "sink":
            key_serde, value_serde = self._serdes[name]
            key_bytes, value_bytes = key_serde.serialize(key), value_serde.serialize(value)
            columns = self._output_columns(node.topics[0])
            columns.keys.append(key_bytes)
            columns.values.append(value_bytes)
            columns.timestamps.append(self.timestamp)
            self.output_bytes += (0 if key_bytes is None else len(key_bytes)) + (
                0 if value_bytes is None else len(value_bytes)
            )
        else:
            self._processors[name].process(key, value)

    def _output_columns(self, topic: str) -> OutputColumns:
        columns = self.outputs.get(topic)
        if columns is None:
            columns = self.outputs[topic] = OutputColumns()
        return columns

    def _set_timestamp(self, timestamp: int) -> None:
        self.timestamp = timestamp

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
        set_timestamp = self._set_timestamp

        def handle(items: list[Item], timestamps: Sequence[int]) -> None:
            forwarded = step(items, timestamps, lambda i: set_timestamp(timestamps[i]))
            if forwarded:
                child(forwarded, timestamps)

        return handle

    def _sink_handler(self, node: Node) -> _BatchHandler:
        key_serde, value_serde = self._serdes[node.name]
        topic = node.topics[0]

        def handle(items: list[Item], timestamps: Sequence[int]) -> None:
            if not items:
                return
            # Columns picked in C (zip(*items) would make an iterator object per item).
            key_objects = list(map(_KEY, items))
            value_objects = list(map(_VALUE, items))
            indices = list(map(_INDEX, items))
            try:
                keys = serialize_all(key_serde, key_objects)
                values = serialize_all(value_serde, value_objects)
            except Exception:  # find the record it was, the slow way
                for key, value, i in items:
                    try:
                        key_serde.serialize(key)
                        value_serde.serialize(value)
                    except Exception as exc:
                        raise RecordFailedError(i, exc) from exc
                raise
            columns = self._output_columns(topic)
            columns.keys.extend(keys)
            columns.values.extend(values)
            columns.timestamps.extend(map(timestamps.__getitem__, indices))
            self.output_bytes += sum(map(len, filter(None, keys))) + sum(
                map(len, filter(None, values))
            )

        return handle


_KEY, _VALUE, _INDEX = itemgetter(0), itemgetter(1), itemgetter(2)


def _drop(items: list[Item], timestamps: Sequence[int]) -> None:
    """The end of a chain without a sink."""
