"""Processing: what runs between the log and the stores (tasks, threads, caches).

Issue 3 grows this package; today it holds the record cache (KIP-63) and
timestamp synchronization (KIP-695).
"""

from eddyline_runtime.processing.partition_group import PartitionGroup
from eddyline_runtime.processing.record_cache import (
    CachingKeyValueStore,
    Change,
    NamedCache,
    ThreadCache,
)

__all__ = ["CachingKeyValueStore", "Change", "NamedCache", "PartitionGroup", "ThreadCache"]
