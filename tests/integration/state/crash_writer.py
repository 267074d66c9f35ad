"""Child process for the crash test: commit deterministic writes until SIGKILLed.

The record at changelog offset ``o`` writes key ``o % KEYS``: a delete when
``o % 7 == 3``, else the value ``v<o>``. So the store's contents at any
committed offset are a pure function of that offset, whatever commit sizes
and crashes came before. Each commit is announced before (``committing N``)
and acknowledged after (``committed N``) on stdout.
"""

from __future__ import annotations

import random
import sys

from eddyline_runtime.state import (
    DurabilityBound,
    RocksDBStore,
    RocksDBStoreOptions,
    TopicPartition,
)

CHANGELOG = TopicPartition("crash-changelog", 0)
KEYS = 5_000
MAX_COMMIT = 3_000


def key_of(offset: int) -> bytes:
    return b"k%05d" % (offset % KEYS)


def value_of(offset: int) -> bytes | None:
    return None if offset % 7 == 3 else b"v%d" % offset


def contents_at(offset: int | None) -> dict[bytes, bytes]:
    """What a store that includes records 0..offset holds."""
    if offset is None:
        return {}
    expected = {}
    for slot in range(KEYS):
        last = offset - ((offset - slot) % KEYS)
        value = value_of(last) if last >= 0 else None
        if value is not None:
            expected[key_of(last)] = value
    return expected


def main(directory: str, seed: int, max_records: int) -> None:
    rng = random.Random(seed)
    bound = DurabilityBound(max_records=max_records, max_seconds=3600)
    store = RocksDBStore("crash", directory, RocksDBStoreOptions(durability=bound))
    committed = store.committed_offset(CHANGELOG)
    next_offset = 0 if committed is None else committed + 1
    print(f"open {committed}", flush=True)
    while True:
        last = next_offset + rng.randint(1, MAX_COMMIT) - 1
        for offset in range(next_offset, last + 1):
            value = value_of(offset)
            if value is None:
                store.delete(key_of(offset))
            else:
                store.put(key_of(offset), value)
        print(f"committing {last}", flush=True)
        store.commit({CHANGELOG: last})
        print(f"committed {last}", flush=True)
        next_offset = last + 1


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
