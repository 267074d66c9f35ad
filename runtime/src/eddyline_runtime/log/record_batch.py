"""The SQLite log's on-disk record batch: many records in one row, as columns.

A row per record cost the embedded log most of its CPU (an index insert and
a row object per record, each way). A batch row holds up to
:data:`MAX_BATCH_RECORDS` consecutive records of one partition, like a Kafka
record batch: the keys and the values are each one list of ``bytes``/None in
:mod:`marshal` format (version 4, which every later Python reads: this is
CPython's own ``.pyc`` data format, and loading it builds the list in C, ~15 ns
per item against ~130 for slicing a concatenation), timestamps are an
``int64`` array, and the offsets are implied (``base_offset + index``) unless
compaction left gaps, when they are an ``int64`` array of their own.

The log file is local storage that only eddyline writes, trusted as the state
directory is: marshal data builds values, never runs code, and a malformed
column fails the read with an error. Arrays are stored in the machine's byte
order (little-endian on every platform eddyline supports).
"""

from __future__ import annotations

import json
import marshal
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eddyline_runtime.log.port import Headers

# marshal's format version: fixed, so a newer Python writes what an older one reads.
_MARSHAL_VERSION = 4
# Records per stored batch: large enough that a batch's SQLite row costs little
# per record, small enough that reading a few records from a batch's middle
# does not decode much more than it returns.
MAX_BATCH_RECORDS = 1024


class DamagedBatchError(ValueError):
    """A stored batch does not decode: something other than eddyline changed it."""


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """One stored batch: the values bound to the batch row's columns."""

    base_offset: int
    last_offset: int
    record_count: int
    offsets: bytes | None  # None: consecutive from base_offset
    keys: bytes
    values: bytes
    timestamps: bytes
    headers: str | None  # JSON, one entry per record; None when no record has any


def encode_batch(
    offsets: Sequence[int] | range,
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    timestamps: Sequence[int],
    headers: Sequence[Headers] | None,
) -> EncodedBatch:
    """Encode records (at least one) with the given, strictly rising, offsets."""
    base, last, count = offsets[0], offsets[-1], len(offsets)
    consecutive = last - base + 1 == count
    return EncodedBatch(
        base,
        last,
        count,
        None if consecutive else array("q", offsets).tobytes(),
        marshal.dumps(_as_list(keys), _MARSHAL_VERSION),
        marshal.dumps(_as_list(values), _MARSHAL_VERSION),
        array("q", timestamps).tobytes(),
        _encode_headers(headers) if headers is not None and any(headers) else None,
    )


# The batch row's columns in the order DecodedBatch reads them.
SELECT_COLUMNS = ", ".join(
    (
        "base_offset",
        "record_count",
        "offsets",
        "keys",
        "vals",
        "timestamps",
        "headers",
    )
)


class DecodedBatch:
    """A stored batch row (its :data:`SELECT_COLUMNS`), decoded column by column on demand."""

    __slots__ = ("_offsets", "_row", "base_offset", "record_count")

    def __init__(self, row: Sequence[Any]) -> None:
        self._row = row
        self.base_offset: int = row[0]
        self.record_count: int = row[1]
        self._offsets: array[int] | None = None
        if row[2] is not None:
            self._offsets = array("q")
            self._offsets.frombytes(row[2])

    def index_of(self, offset: int) -> int:
        """The index of the first record at or after ``offset`` (``record_count`` if none)."""
        if self._offsets is None:
            return min(max(offset - self.base_offset, 0), self.record_count)
        return bisect_left(self._offsets, offset)

    def offsets(self, start: int, stop: int) -> Sequence[int]:
        if self._offsets is None:
            return range(self.base_offset + start, self.base_offset + stop)
        return self._offsets[start:stop].tolist()

    def keys(self, start: int, stop: int) -> list[bytes | None]:
        return self._column(3, start, stop)

    def values(self, start: int, stop: int) -> list[bytes | None]:
        return self._column(4, start, stop)

    def timestamps(self, start: int, stop: int) -> list[int]:
        decoded = array("q")
        decoded.frombytes(self._row[5][start * 8 : stop * 8])
        return decoded.tolist()

    def headers(self, start: int, stop: int) -> list[Headers] | None:
        """Each record's headers, or None when no record of the batch has any."""
        encoded: str | None = self._row[6]
        if encoded is None:
            return None
        records: list[Any] = json.loads(encoded)[start:stop]
        return [
            tuple((name, bytes.fromhex(value)) for name, value in record) if record else ()
            for record in records
        ]

    def _column(self, index: int, start: int, stop: int) -> list[bytes | None]:
        try:
            items = marshal.loads(self._row[index])
        except (EOFError, ValueError, TypeError) as error:
            raise DamagedBatchError(f"a column does not read: {error}") from error
        if type(items) is not list or len(items) != self.record_count:
            raise DamagedBatchError("a column does not hold one item per record")
        return items if start == 0 and stop == len(items) else items[start:stop]


def _as_list(items: Sequence[bytes | None]) -> list[bytes | None]:
    """marshal writes a list, a tuple or a slice of one alike; anything else becomes a list."""
    return items if type(items) is list else list(items)


def _encode_headers(headers: Sequence[Headers]) -> str:
    return json.dumps(
        [[[name, value.hex()] for name, value in record] if record else None for record in headers]
    )
