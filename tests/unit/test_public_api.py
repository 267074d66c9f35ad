"""Each package exports what its users need, and only that (its public face)."""

from __future__ import annotations

from types import ModuleType

import pytest

from eddyline_runtime import log, processing, restore, state

EXPECTED: dict[ModuleType, set[str]] = {
    state: {
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
        "parse_task_directory",
        "quarantine_directory",
        "store_directory",
        "task_directory",
        "uncommitted_bytes",
    },
    processing: {
        "BytesSerde",
        "Cancellable",
        "Change",
        "Headers",
        "IntSerde",
        "JsonSerde",
        "KGroupedStream",
        "KStream",
        "KTable",
        "LongSerde",
        "Processor",
        "ProcessorContext",
        "PunctuationType",
        "Punctuator",
        "RecordContext",
        "Serde",
        "StoreSpec",
        "StreamsBuilder",
        "StringSerde",
        "Topology",
        "TopologyError",
    },
    restore: {
        "ChangelogBehindStoreError",
        "ChangelogGapError",
        "ChangelogMismatchError",
        "ChangelogReplacedError",
        "ForeignStoreError",
        "DEFAULT_BATCH_RECORDS",
        "ReplayStart",
        "ReplayVerdict",
        "RestoreResult",
        "judge",
        "mismatch_error",
        "next_offset_after",
        "open_trusted",
        "replay_batch",
        "replay_start",
        "restore",
    },
    log: {
        "BrokerUnreachableError",
        "ChangeBatch",
        "CommittedTransaction",
        "FetchResult",
        "FetchedColumns",
        "InvalidTopicError",
        "LagTracker",
        "Log",
        "LogAuthorizationError",
        "LogError",
        "OffsetChanges",
        "OffsetOutOfRangeError",
        "ProducerFencedError",
        "Record",
        "SqliteLog",
        "TopicConflictError",
        "TopicSpec",
        "TransactionAbortedError",
        "TransactionStateError",
        "TransactionTimeoutError",
        "TransactionalProducer",
        "UnknownTopicError",
        "UnsupportedLogUrlError",
        "open_log",
        "read_partition",
    },
}


@pytest.mark.parametrize("package", list(EXPECTED), ids=lambda p: p.__name__)
def test_a_package_exports_the_intended_names(package: ModuleType) -> None:
    exported = set(package.__all__)
    assert exported == EXPECTED[package]
    assert all(hasattr(package, name) for name in exported)


def test_a_topology_author_finds_everything_in_processing() -> None:
    """The authoring face: builders, the Processor API, store specs and serdes; no engine."""
    authoring = {"StreamsBuilder", "Topology", "Processor", "ProcessorContext", "StoreSpec"}
    assert authoring <= set(processing.__all__)
    assert {"StringSerde", "LongSerde", "JsonSerde"} <= set(processing.__all__)
    engine = {"StreamsInstance", "StreamTask", "TaskStore", "ThreadCache", "restore"}
    assert not engine & set(processing.__all__)
