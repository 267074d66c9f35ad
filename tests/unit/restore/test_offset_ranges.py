"""Offset ranges: a changelog partition cut into even, consecutive, non-overlapping pieces."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eddyline_runtime.restore.spark.offset_ranges import OffsetRange, split_offset_ranges


def test_a_partition_is_cut_into_even_consecutive_ranges() -> None:
    assert split_offset_ranges(3, 10, 20, 4) == [
        OffsetRange(3, 10, 14),
        OffsetRange(3, 14, 17),
        OffsetRange(3, 17, 20),
    ]


def test_an_empty_partition_gives_no_range() -> None:
    assert split_offset_ranges(0, 5, 5, 10) == []


def test_the_range_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_records"):
        split_offset_ranges(0, 0, 10, 0)


@given(st.integers(0, 1000), st.integers(0, 5000), st.integers(1, 700))
def test_ranges_cover_every_offset_once_within_the_size(start: int, span: int, size: int) -> None:
    ranges = split_offset_ranges(1, start, start + span, size)
    covered = [offset for r in ranges for offset in range(r.start, r.end)]
    assert covered == list(range(start, start + span))
    lengths = [r.end - r.start for r in ranges]
    assert all(1 <= n <= size for n in lengths)
    assert not lengths or max(lengths) - min(lengths) <= 1
