"""Splitting a changelog partition into offset ranges that tasks read in parallel.

A store partition's changelog is one ordered sequence; a single reader would
make its size the build's critical path. Ranges are cut by offset value, not
by record count: after compaction offsets have gaps, and a range over a gap
simply holds fewer records, which is still correct because the latest
version of a key is picked by offset across all ranges.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one changelog partition."""

    partition: int
    start: int
    end: int


def split_offset_ranges(
    partition: int, start: int, end: int, max_records: int
) -> list[OffsetRange]:
    """Cut ``[start, end)`` into consecutive ranges of at most ``max_records`` offsets.

    Ranges are as even as they can be (sizes differ by at most one), so no
    task gets a sliver; an empty partition gives no range.
    """
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records}")
    if end <= start:
        return []
    span = end - start
    count = -(-span // max_records)
    size, extra = divmod(span, count)
    ranges = []
    position = start
    for index in range(count):
        stop = position + size + (1 if index < extra else 0)
        ranges.append(OffsetRange(partition, position, stop))
        position = stop
    return ranges
