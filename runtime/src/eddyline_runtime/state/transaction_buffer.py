"""The owner's uncommitted writes, and how other threads read them safely.

KIP-892 keeps a transaction's writes in memory until commit. RocksDB's
``WriteBatch`` is not safe to read while it is written, which is why the KIP
deferred ``READ_UNCOMMITTED`` for transactional stores. We keep the buffer as
a Python dict instead, by *generations*:

* the owner thread is the only one that mutates the current generation's dict;
* a commit never clears a dict: it installs a fresh one, so a dict that has
  been replaced is never written again;
* a reader thread that wants a consistent view copies the current dict with
  ``dict.copy()``, a single C call that runs under the GIL and calls no Python
  code for ``bytes`` keys, so it cannot interleave with an owner write.

A point read by another thread needs no copy: it reads the current dict (one
atomic lookup) and then the database; a commit writes the database *before*
installing the new generation, so a key is always in one or the other.

A deleted key is kept as a tombstone (value ``None``) until commit. Keys are
never removed from a generation's dict, so the owner keeps its sorted key list
up to date by adding only the keys first written since the last ordered read
(remembered in write order): inserted one by one when they are few, merged by
one sort when they are many.
"""

from __future__ import annotations

import enum
from bisect import insort
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from typing import Final

from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.partitions import TopicPartition

KeyValue = tuple[bytes, bytes]


class _Absent(enum.Enum):
    """Marks a key the buffer knows nothing about (as opposed to a tombstone, None).

    An enum member, so that ``value is ABSENT`` narrows types for mypy.
    """

    ABSENT = enum.auto()


ABSENT: Final = _Absent.ABSENT


# Up to this many new keys, an ordered read inserts them one by one into the sorted list.
_INSORT_MAX: Final = 32


class TransactionBuffer:
    """Uncommitted writes of one store, owned by one thread."""

    __slots__ = ("_new_keys", "_sorted_keys", "num_bytes", "positions", "writes")

    def __init__(self) -> None:
        # key -> value, or None for a delete; replaced (never cleared) on reset().
        self.writes: dict[bytes, bytes | None] = {}
        # Key + value bytes of what `writes` holds now (overwrites replace, not add).
        self.num_bytes = 0
        # KIP-796 input positions of the open transaction.
        self.positions: dict[TopicPartition, int] = {}
        # The keys of `writes` before the last ordered read, sorted; owner-only.
        self._sorted_keys: list[bytes] = []
        # Keys first written since the last ordered read, in write order; owner-only.
        self._new_keys: list[bytes] = []

    def __len__(self) -> int:
        return len(self.writes)

    def put(self, key: bytes, value: bytes | None) -> None:
        """Buffer a write (``None`` deletes); the owner thread only."""
        writes = self.writes
        previous = writes.get(key, ABSENT)
        writes[key] = value
        added = 0 if value is None else len(value)
        if previous is ABSENT:
            self.num_bytes += len(key) + added
            self._new_keys.append(key)
        else:
            self.num_bytes += added - (0 if previous is None else len(previous))

    def reset(self) -> None:
        """Start a new, empty generation (after its writes reached the database)."""
        self.writes = {}
        self.num_bytes = 0
        self.positions = {}
        self._sorted_keys = []
        self._new_keys = []

    def sorted_keys_in(self, key_range: KeyRange) -> Sequence[bytes]:
        """The owner's buffered keys inside ``key_range``, sorted (a copy, safe to hold)."""
        sorted_keys = self._sorted_keys
        new_keys = self._new_keys
        if new_keys:
            if len(new_keys) <= _INSORT_MAX:
                # Reads between few writes (a session store looks up sessions for
                # every record): a binary search and a memmove per new key, not a
                # pass over every buffered key.
                for key in new_keys:
                    insort(sorted_keys, key)
            else:
                # Only the new keys are unsorted; timsort merges the two runs in
                # linear time.
                sorted_keys.extend(new_keys)
                sorted_keys.sort()
            self._new_keys = []
        return key_range.slice_of(sorted_keys)

    def snapshot(self) -> BufferSnapshot:
        """A private copy for another thread; see the module docstring for why this is safe."""
        return BufferSnapshot(self.writes.copy())


class BufferSnapshot:
    """A reader's frozen copy of one generation of a buffer."""

    __slots__ = ("writes",)

    def __init__(self, writes: dict[bytes, bytes | None]) -> None:
        self.writes = writes

    def sorted_keys_in(self, key_range: KeyRange) -> Sequence[bytes]:
        if key_range.lower is None and key_range.upper is None:
            return sorted(self.writes)
        return sorted(k for k in self.writes if k in key_range)


def merge_sorted(
    buffered_keys: Sequence[bytes],
    buffered: Mapping[bytes, bytes | None],
    stored: Iterator[KeyValue],
) -> Iterator[KeyValue]:
    """Merge buffered writes over stored entries, both in key order.

    A buffered value wins over the stored one for the same key; a buffered
    tombstone hides it.
    """
    if not buffered_keys:
        yield from stored
        return
    index, count = 0, len(buffered_keys)
    for key, value in stored:
        while index < count and buffered_keys[index] < key:
            pending = buffered_keys[index]
            index += 1
            pending_value = buffered[pending]
            if pending_value is not None:
                yield pending, pending_value
        if index < count and buffered_keys[index] == key:
            index += 1
            override = buffered[key]
            if override is not None:
                yield key, override
            continue
        yield key, value
    for pending in islice(buffered_keys, index, None):
        pending_value = buffered[pending]
        if pending_value is not None:
            yield pending, pending_value
