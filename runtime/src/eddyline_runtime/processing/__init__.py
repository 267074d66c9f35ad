"""Processing: what runs between the log and the stores (tasks, threads, caches).

Start from :class:`StreamsInstance`: it resolves a :class:`Topology` (built
with :class:`StreamsBuilder` or the Processor API) against a log, and runs its
tasks on stream threads with exactly-once or at-least-once commits, the
record cache (KIP-63), timestamp synchronization (KIP-695) and restoration
of the changelog tail.
"""

from eddyline_runtime.partitions import TaskId
from eddyline_runtime.processing.dsl import KGroupedStream, KStream, KTable, StreamsBuilder
from eddyline_runtime.processing.instance import InstanceState, StreamsFailedError, StreamsInstance
from eddyline_runtime.processing.loader import TopologyLoadError, load_topology
from eddyline_runtime.processing.partition_group import PartitionGroup
from eddyline_runtime.processing.record_cache import (
    CachingKeyValueStore,
    Change,
    NamedCache,
    RecordContext,
    ThreadCache,
)
from eddyline_runtime.processing.restoration import RestoreResult, restore
from eddyline_runtime.processing.stream_thread import CommitReport, RestoreReport
from eddyline_runtime.processing.task import TaskProcessingError
from eddyline_runtime.processing.task_store import TaskStore
from eddyline_runtime.processing.task_topology import Output, PunctuationError, TaskTopology
from eddyline_runtime.processing.topics import TopicLayout, TopologyLayoutError
from eddyline_runtime.processing.topology import (
    Cancellable,
    Processor,
    ProcessorContext,
    PunctuationType,
    Punctuator,
    StoreSpec,
    SubTopology,
    Topology,
    TopologyError,
)

__all__ = [
    "CachingKeyValueStore",
    "Cancellable",
    "Change",
    "CommitReport",
    "InstanceState",
    "KGroupedStream",
    "KStream",
    "KTable",
    "NamedCache",
    "Output",
    "PartitionGroup",
    "Processor",
    "ProcessorContext",
    "PunctuationError",
    "PunctuationType",
    "Punctuator",
    "RecordContext",
    "RestoreReport",
    "RestoreResult",
    "StoreSpec",
    "StreamsBuilder",
    "StreamsFailedError",
    "StreamsInstance",
    "SubTopology",
    "TaskId",
    "TaskProcessingError",
    "TaskStore",
    "TaskTopology",
    "ThreadCache",
    "TopicLayout",
    "Topology",
    "TopologyError",
    "TopologyLayoutError",
    "TopologyLoadError",
    "load_topology",
    "restore",
]
