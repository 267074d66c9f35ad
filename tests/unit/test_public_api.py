"""Each package exports what its users need, and only that (its public face)."""

from __future__ import annotations

from types import ModuleType

import pytest

from eddyline_runtime import engine, log, processing, restore, state, testing
from eddyline_runtime.restore import ingest, replay, spark

EXPECTED: dict[ModuleType, set[str]] = {
    state: {
        "CheckpointFileError",
        "DetachedSessionReader",
        "DetachedWindowReader",
        "CommitReason",
        "DurabilityBound",
        "InMemoryStore",
        "InvalidChangelogOffsetError",
        "IsolationLevel",
        "KeyRange",
        "KeyValue",
        "KeyValueBytesStore",
        "ReadableKeyValueStore",
        "Retention",
        "SegmentedSessionStore",
        "SessionStoreReader",
        "SegmentedWindowStore",
        "WindowStoreReader",
        "VersionedKeyValueStore",
        "VersionedRecord",
        "VersionedStoreReader",
        "PUT_RETURN_CODE_NOT_PUT",
        "PUT_RETURN_CODE_VALID_TO_UNDEFINED",
        "changelog_retention_ms",
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
        "global_store_directory",
        "store_directory",
        "task_directory",
        "uncommitted_bytes",
    },
    processing: {
        "BranchedKStream",
        "Materialized",
        "SlidingWindowedKStream",
        "SlidingWindows",
        "Suppressed",
        "SuppressionBufferFullError",
        "BufferConfig",
        "WindowedKTable",
        "BytesSerde",
        "Cancellable",
        "Change",
        "Headers",
        "IntSerde",
        "JoinWindows",
        "JsonSerde",
        "KGroupedStream",
        "KGroupedTable",
        "GlobalKTable",
        "KStream",
        "KTable",
        "KeyValueStore",
        "LongSerde",
        "Processor",
        "ProcessorContext",
        "PunctuationType",
        "Punctuator",
        "RecordContext",
        "Serde",
        "SessionStore",
        "SessionWindow",
        "SessionWindowedKStream",
        "SessionWindowedSerde",
        "SessionWindows",
        "StoreSpec",
        "StreamsBuilder",
        "StringSerde",
        "TableChange",
        "TimeWindow",
        "TimeWindowedKStream",
        "TimeWindowedSerde",
        "TimeWindows",
        "TimestampedKeyValueStore",
        "Topology",
        "TopologyError",
        "WindowStore",
        "Windowed",
        "WindowedSerdes",
        "ValueTransformerWithKey",
    },
    replay: {
        "ChangelogBehindStoreError",
        "ChangelogGapError",
        "ChangelogHeldError",
        "ChangelogLossError",
        "ChangelogMismatchError",
        "ChangelogReplacedError",
        "ForeignStoreError",
        "DEFAULT_BATCH_RECORDS",
        "LagInfo",
        "ReplayStart",
        "ReplayVerdict",
        "RestoreResult",
        "StandbyTask",
        "judge",
        "loses_records",
        "mismatch_error",
        "next_offset_after",
        "open_trusted",
        "replay_batch",
        "replay_start",
        "restore",
    },
    testing: {
        "EmptyTopicError",
        "ReadOnlyKeyValueStore",
        "ReadOnlySessionStore",
        "ReadOnlyWindowStore",
        "TestDriverError",
        "TestInputTopic",
        "TestOutputTopic",
        "TestRecord",
        "TopologyTestDriver",
        "read_store",
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
        "RecordRefusedError",
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


# Packages whose modules are imported by path, each for one program or side: their own
# namespace stays empty, so importing one module (the operator imports the job result)
# pulls in nothing else (the stores, the log, pyspark).
BY_MODULE = (engine, restore, spark, ingest)


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
    engine_names = {"StreamsInstance", "StreamTask", "TaskStore", "ThreadCache", "restore"}
    assert not engine_names & set(processing.__all__)


def test_a_topology_test_finds_the_driver_in_testing_and_not_in_the_authoring_face() -> None:
    assert {"TopologyTestDriver", "TestInputTopic", "TestOutputTopic"} <= set(testing.__all__)
    assert "TopologyTestDriver" not in processing.__all__


@pytest.mark.parametrize("package", BY_MODULE, ids=lambda p: p.__name__)
def test_a_package_of_modules_imported_by_path_exports_nothing(package: ModuleType) -> None:
    assert not hasattr(package, "__all__")
    public = {name for name in vars(package) if not name.startswith("_")}
    # Only submodules already imported (by this or another test) may show as attributes.
    assert all(isinstance(getattr(package, name), ModuleType) for name in public), public
