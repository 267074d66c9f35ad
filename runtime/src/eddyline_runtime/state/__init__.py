"""The state store engine: transactional stores on RocksDB (KIP-892) and in memory.

Start from :class:`RocksDBStore` (or :class:`InMemoryStore`); both implement
:class:`StateStore`. Other threads read through ``store.reader(isolation)``.
Window and session stores (:class:`SegmentedWindowStore`, :class:`SegmentedSessionStore`) are
views over a key-value store in the key layout of
:mod:`~eddyline_runtime.state.window_layout`; so is the versioned store of KIP-889
(:class:`VersionedKeyValueStore`, :mod:`~eddyline_runtime.state.versioned_store`).
Where stores live on disk (``state.dir/<task>/<store>``) is spelled only by
:mod:`~eddyline_runtime.state.state_directory`; KIP-816 relocation of misplaced
stores is :mod:`~eddyline_runtime.state.relocation`.
"""

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state.errors import (
    CheckpointFileError,
    InvalidChangelogOffsetError,
    StateStoreError,
    StoreClosedError,
    StoreCommitError,
    StoreCorruptedError,
    StoreLockedError,
)
from eddyline_runtime.state.memory_store import InMemoryStore
from eddyline_runtime.state.rocksdb_store import (
    DurabilityBound,
    RocksDBStore,
    RocksDBStoreOptions,
)
from eddyline_runtime.state.state_directory import (
    global_store_directory,
    parse_task_directory,
    quarantine_directory,
    store_directory,
    task_directory,
)
from eddyline_runtime.state.store import (
    KeyValue,
    KeyValueBytesStore,
    ReadableKeyValueStore,
    StateStore,
    StoreReader,
)
from eddyline_runtime.state.uncommitted_budget import (
    CommitReason,
    UncommittedBytesBudget,
    uncommitted_bytes,
)
from eddyline_runtime.state.versioned_store import (
    PUT_RETURN_CODE_NOT_PUT,
    PUT_RETURN_CODE_VALID_TO_UNDEFINED,
    VersionedKeyValueStore,
    VersionedRecord,
    VersionedStoreReader,
)
from eddyline_runtime.state.window_layout import Retention, changelog_retention_ms
from eddyline_runtime.state.window_store import (
    DetachedSessionReader,
    DetachedWindowReader,
    SegmentedSessionStore,
    SegmentedWindowStore,
    SessionStoreReader,
    WindowStoreReader,
)

__all__ = [
    "PUT_RETURN_CODE_NOT_PUT",
    "PUT_RETURN_CODE_VALID_TO_UNDEFINED",
    "CheckpointFileError",
    "CommitReason",
    "DetachedSessionReader",
    "DetachedWindowReader",
    "DurabilityBound",
    "InMemoryStore",
    "InvalidChangelogOffsetError",
    "IsolationLevel",
    "KeyRange",
    "KeyValue",
    "KeyValueBytesStore",
    "ReadableKeyValueStore",
    "Retention",
    "RocksDBStore",
    "RocksDBStoreOptions",
    "SegmentedSessionStore",
    "SegmentedWindowStore",
    "SessionStoreReader",
    "StateStore",
    "StateStoreError",
    "StoreClosedError",
    "StoreCommitError",
    "StoreCorruptedError",
    "StoreLockedError",
    "StoreReader",
    "TopicPartition",
    "UncommittedBytesBudget",
    "VersionedKeyValueStore",
    "VersionedRecord",
    "VersionedStoreReader",
    "WindowStoreReader",
    "changelog_retention_ms",
    "global_store_directory",
    "parse_task_directory",
    "quarantine_directory",
    "store_directory",
    "task_directory",
    "uncommitted_bytes",
]
