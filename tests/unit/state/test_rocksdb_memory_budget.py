"""The shared RocksDB memory of a process: budget from the config, one cache for all stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.errors import InvalidArgumentError
from eddyline_runtime.metrics import MetricsRegistry
from eddyline_runtime.state import RocksDBStore, RocksDBStoreOptions, TopicPartition
from eddyline_runtime.state.rocksdb_store import (
    MEMORY_METRICS_GROUP,
    RocksDBMemory,
    shared_memory,
)

MIB = 1024 * 1024


def test_the_budget_is_the_share_of_the_limit_and_none_without_a_limit() -> None:
    assert RocksDBStoreOptions.from_config(StreamsConfig()).memory_budget_bytes is None
    config = StreamsConfig.from_properties(
        {"memory.limit.bytes": 512 * MIB, "rocksdb.memory.limit.share": 0.25}
    )
    assert RocksDBStoreOptions.from_config(config).memory_budget_bytes == 128 * MIB


def test_stores_with_a_budget_share_one_cache_and_export_its_usage(tmp_path: Path) -> None:
    registry = MetricsRegistry()
    options = RocksDBStoreOptions(memory_budget_bytes=64 * MIB)
    stores = [
        RocksDBStore(f"s{i}", tmp_path / f"s{i}", options, metrics=registry) for i in range(3)
    ]
    try:
        for index, store in enumerate(stores):
            store.put(b"k", b"v" * 100_000)
            store.commit({TopicPartition("c", index): 0})
        memory = shared_memory(64 * MIB)
        assert memory is shared_memory(64 * MIB)  # one per process
        usage = memory.usage()
        assert usage.write_buffer_bytes > 0  # the three memtables, counted together
        assert usage.cache_bytes <= 64 * MIB // 2 + usage.write_buffer_bytes
        assert registry.value(MEMORY_METRICS_GROUP, "budget-bytes") == 64 * MIB
        assert registry.value(MEMORY_METRICS_GROUP, "write-buffer-usage-bytes") > 0
    finally:
        for store in stores:
            store.close()


def test_a_budget_that_is_not_positive_says_how_to_set_it() -> None:
    with pytest.raises(InvalidArgumentError, match="EDDYLINE_MEMORY_LIMIT_BYTES"):
        RocksDBMemory(0)
