"""One sub-topology instantiated for one task: records in, forwards, sink output out.

A task runs its sub-topology for one input partition. :class:`TaskTopology`
creates the processors (one instance per task, as Kafka Streams does), pushes
each input record from its source through ``forward`` calls depth-first, and
collects what sinks emit, serialized, for the task to send in its log
transaction. It does no I/O itself, which is also what makes it the unit that
tests drive directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eddyline_runtime.processing.task_store import TaskStore
from eddyline_runtime.processing.topology import (
    Node,
    Processor,
    SubTopology,
    Topology,
    TopologyError,
)
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import StateStore


@dataclass(frozen=True, slots=True)
class Output:
    """A record a sink emitted: serialized, for the task's producer."""

    topic: str
    key: bytes | None
    value: bytes | None
    timestamp: int


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
        self.outputs: list[Output] = []
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

    def process(self, topic: str, key: bytes | None, value: bytes | None, timestamp: int) -> None:
        """Push one input record through the sub-topology."""
        source = self._sources.get(topic)
        if source is None:
            raise TopologyError(f'task {self.task_id} does not read topic "{topic}"')
        self.timestamp = timestamp
        key_serde, value_serde = self._serdes[source.name]
        for child in source.children:
            self._deliver(child, key_serde.deserialize(key), value_serde.deserialize(value))

    def drain_outputs(self) -> list[Output]:
        outputs, self.outputs = self.outputs, []
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
            self.outputs.append(Output(node.topics[0], key_bytes, value_bytes, self.timestamp))
            self.output_bytes += (0 if key_bytes is None else len(key_bytes)) + (
                0 if value_bytes is None else len(value_bytes)
            )
        else:
            self._processors[name].process(key, value)
