"""The state package exports what a user needs, and only that."""

from __future__ import annotations

from eddyline_runtime import state


def test_state_package_exports_the_intended_names() -> None:
    assert set(state.__all__) == {
        "CheckpointFileError",
        "CommitReason",
        "DurabilityBound",
        "InMemoryStore",
        "InvalidChangelogOffsetError",
        "IsolationLevel",
        "KeyRange",
        "KeyValue",
        "ReadableKeyValueStore",
        "RocksDBStore",
        "RocksDBStoreOptions",
        "StateStore",
        "StateStoreError",
        "StoreClosedError",
        "StoreCommitError",
        "StoreCorruptedError",
        "StoreLockedError",
        "StoreReader",
        "TopicPartition",
        "UncommittedBytesBudget",
        "uncommitted_bytes",
    }
    assert all(hasattr(state, name) for name in state.__all__)
