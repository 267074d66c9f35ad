"""Processing: what runs between the log and the stores (tasks, threads, caches).

Issue 3 grows this package; today it holds the DSL and the Processor API
(topologies, sub-topologies, one task's data flow), the record cache (KIP-63),
timestamp synchronization (KIP-695) and restoration.
"""

from eddyline_runtime.processing.dsl import KGroupedStream, KStream, KTable, StreamsBuilder
from eddyline_runtime.processing.partition_group import PartitionGroup
from eddyline_runtime.processing.record_cache import (
    CachingKeyValueStore,
    Change,
    NamedCache,
    ThreadCache,
)
from eddyline_runtime.processing.restoration import RestoreResult, restore
from eddyline_runtime.processing.task_topology import Output, TaskTopology
from eddyline_runtime.processing.topology import (
    Processor,
    ProcessorContext,
    StoreSpec,
    SubTopology,
    Topology,
    TopologyError,
)

__all__ = [
    "CachingKeyValueStore",
    "Change",
    "KGroupedStream",
    "KStream",
    "KTable",
    "NamedCache",
    "Output",
    "PartitionGroup",
    "Processor",
    "ProcessorContext",
    "RestoreResult",
    "StoreSpec",
    "StreamsBuilder",
    "SubTopology",
    "TaskTopology",
    "ThreadCache",
    "Topology",
    "TopologyError",
    "restore",
]
