"""A topology test driver for the join tests: one task, real RocksDB stores, records
piped in one by one with their timestamps and what the sinks emitted read back
(Kafka's ``TopologyTestDriver`` with its ``TestInputTopic``/``TestOutputTopic``)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Topology
from tests.support.stores import StoreFactory


def to_string_joiner(left: Any, right: Any) -> str:
    """Kafka's ``MockValueJoiner.TOSTRING_JOINER``: ``left + "+" + right``, null as "null"."""
    return f"{'null' if left is None else left}+{'null' if right is None else right}"


class JoinDriver:
    """Drives sub-topology ``subtopology`` of ``topology`` as task ``<id>_0``."""

    def __init__(
        self,
        topology: Topology,
        store_factory: StoreFactory,
        *,
        subtopology: int = 0,
        cached: Collection[str] = (),
    ) -> None:
        """``cached`` names stores to put behind a record cache (1 MiB, flushed by
        ``flush``), as the runtime does by default."""
        sub = topology.subtopologies()[subtopology]
        self.stores = {name: store_factory(name) for name in sub.stores}
        self.cached = {
            name: TaskStore(
                self.stores[name],
                changelog=TopicPartition(f"app-{name}-changelog", 0),
                cache=ThreadCache(1024 * 1024),
                cache_name=name,
            )
            for name in cached
        }
        opened = {**self.stores, **self.cached}
        self.task = TaskTopology(topology, sub, 0, opened)  # type: ignore[arg-type]
        self._offset = 0

    def flush(self) -> None:
        """Flush the record caches (what a commit does first)."""
        for store in self.cached.values():
            store.flush()

    def pipe(self, topic: str, key: str | None, value: str | None, timestamp: int) -> None:
        self.task.process(
            topic,
            None if key is None else key.encode(),
            None if value is None else value.encode(),
            timestamp,
            partition=0,
            offset=self._offset,
        )
        self._offset += 1

    def read(self, topic: str = "output") -> list[tuple[str | None, str | None, int]]:
        """What ``topic`` got since the last read: (key, value, timestamp)."""
        return [
            (
                None if o.key is None else o.key.decode(),
                None if o.value is None else o.value.decode(),
                o.timestamp,
            )
            for o in self.task.drain_outputs()
            if o.topic == topic
        ]

    def close(self) -> None:
        """Close the task and its stores (a later driver may open the same names)."""
        self.task.close()
        for store in self.stores.values():
            store.close()
