"""Processing: what runs between the log and the stores (tasks, threads, caches).

Issue 3 grows this package; today it holds the record cache (KIP-63),
timestamp synchronization (KIP-695) and restoration.
"""

from eddyline_runtime.processing.partition_group import PartitionGroup
from eddyline_runtime.processing.record_cache import (
    CachingKeyValueStore,
    Change,
    NamedCache,
    ThreadCache,
)
from eddyline_runtime.processing.restoration import RestoreResult, restore

__all__ = [
    "CachingKeyValueStore",
    "Change",
    "NamedCache",
    "PartitionGroup",
    "RestoreResult",
    "ThreadCache",
    "restore",
]
