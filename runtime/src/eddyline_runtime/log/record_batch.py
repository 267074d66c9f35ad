"""The SQLite log's on-disk record batch: many records in one row, as columns.

A row per record cost the embedded log most of its CPU (an index insert and
a row object per record, each way). A batch row holds up to
:data:`MAX_BATCH_RECORDS` consecutive records of one partition, like a Kafka
record batch: each byte column is its items concatenated plus an ``int32``
length per item (-1 for None), timestamps are ``int64``s, and the offsets are
implied (``base_offset + index``) unless compaction left gaps, when they are
an ``int64`` array of their own. Encoding and decoding run in C (``join``,
``array``, ``map`` over slices): no Python work per record.

Arrays are stored in the machine's byte order (little-endian on every
platform eddyline supports); the log file is a local file, never shipped.
"""

from __future__ import annotations

import json
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import Any

from eddyline_runtime.log.port import Headers

# Records per stored batch: large enough that a batch's SQLite row costs little
# per record, small enough that reading a few records from a batch's middle
# does not decode much more than it returns.
MAX_BATCH_RECORDS = 1024


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """One stored batch: the values bound to the batch row's columns."""

    base_offset: int
    last_offset: int
    record_count: int
    offsets: bytes | None  # None: consecutive from base_offset
    keys: bytes
    key_lengths: bytes
    values: bytes
    value_lengths: bytes
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
    key_data, key_lengths = _encode_column(keys)
    value_data, value_lengths = _encode_column(values)
    return EncodedBatch(
        base,
        last,
        count,
        None if consecutive else array("q", offsets).tobytes(),
        key_data,
        key_lengths,
        value_data,
        value_lengths,
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
        "key_lengths",
        "vals",
        "value_lengths",
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
        return _decode_column(self._row[3], self._row[4], start, stop)

    def values(self, start: int, stop: int) -> list[bytes | None]:
        return _decode_column(self._row[5], self._row[6], start, stop)

    def timestamps(self, start: int, stop: int) -> list[int]:
        decoded = array("q")
        decoded.frombytes(self._row[7][start * 8 : stop * 8])
        return decoded.tolist()

    def headers(self, start: int, stop: int) -> list[Headers] | None:
        """Each record's headers, or None when no record of the batch has any."""
        encoded: str | None = self._row[8]
        if encoded is None:
            return None
        records: list[Any] = json.loads(encoded)[start:stop]
        return [
            tuple((name, bytes.fromhex(value)) for name, value in record) if record else ()
            for record in records
        ]


def _encode_column(items: Sequence[bytes | None]) -> tuple[bytes, bytes]:
    nones = items.count(None)
    if nones == len(items):  # keyless records' keys
        return b"", array("i", [-1]).tobytes() * nones
    if nones:
        lengths = array("i", [-1 if item is None else len(item) for item in items])
    else:
        lengths = array("i", map(len, items))  # type: ignore[arg-type]
    # filter(None) drops the None items and the empty ones: neither adds a byte.
    return b"".join(filter(None, items)), lengths.tobytes()


def _decode_column(
    data: bytes, encoded_lengths: bytes, start: int, stop: int
) -> list[bytes | None]:
    lengths = array("i")
    lengths.frombytes(encoded_lengths)
    nones = lengths.count(-1)
    if nones == len(lengths):  # a keyless batch's keys
        return [None] * (stop - start)
    # A None adds no byte: its bounds are those of an empty item, then it is put back.
    sizes = map(max, lengths, repeat(0)) if nones else lengths
    bounds = list(accumulate(sizes, initial=0))
    # Slices made and applied in C: no Python frame per item.
    slices = map(slice, bounds[start:stop], bounds[start + 1 : stop + 1])
    items: list[bytes | None] = list(map(data.__getitem__, slices))
    if nones:
        index = -1
        for _ in range(nones):
            index = lengths.index(-1, index + 1)
            if start <= index < stop:
                items[index - start] = None
    return items


def _encode_headers(headers: Sequence[Headers]) -> str:
    return json.dumps(
        [[[name, value.hex()] for name, value in record] if record else None for record in headers]
    )
