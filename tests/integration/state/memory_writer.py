"""Child process for the memory test: 64 RocksDB stores written steadily, memory sampled.

Run with the memory limit in EDDYLINE_MEMORY_LIMIT_BYTES (as the downward API
sets it) or without one; prints one JSON line: the peak RSS of the process
(its high-water mark, ``VmHWM``), the highest usage RocksDB reported through
the shared cache and write buffer manager, and the budget.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.state import RocksDBStore, RocksDBStoreOptions, TopicPartition
from eddyline_runtime.state.rocksdb_store import memory_usage

STORES = 64
VALUE_BYTES = 4096
ROUNDS = 16
# Per store and round: 64 values of 4 KiB, 256 KiB; 64 stores x 16 rounds write 256 MiB.
PER_ROUND = 64


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(directory: Path) -> None:
    config = StreamsConfig.from_properties({})  # the default share of the limit
    options = RocksDBStoreOptions.from_config(config)
    stores = [RocksDBStore(f"s{i}", directory / f"s{i}", options) for i in range(STORES)]
    most_reported = most_cache = most_write_buffers = 0
    offset = 0
    for round_ in range(ROUNDS):
        for index, store in enumerate(stores):
            for n in range(PER_ROUND):
                # Random bytes: compression cannot shrink what the memtables hold.
                store.put(b"k%d-%d" % (round_, n), os.urandom(VALUE_BYTES))
            offset += PER_ROUND
            store.commit({TopicPartition("memory-changelog", index): offset})
            usage = memory_usage()
            if usage is not None:
                most_reported = max(most_reported, usage.total_bytes)
                most_cache = max(most_cache, usage.cache_bytes)
                most_write_buffers = max(most_write_buffers, usage.write_buffer_bytes)
    for store in stores:
        store.close()
    print(
        json.dumps(
            {
                "peak_rss": peak_rss(),
                "most_reported": most_reported,
                "most_cache": most_cache,
                "most_write_buffers": most_write_buffers,
                "budget": options.memory_budget_bytes,
                "written": STORES * ROUNDS * PER_ROUND * VALUE_BYTES,
            }
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
