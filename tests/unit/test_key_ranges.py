"""Key ranges in byte order: Kafka's inclusive ranges and prefixes as half-open ones."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from eddyline_runtime.key_ranges import KeyRange, prefix_successor


def test_prefix_successor_skips_trailing_ff_bytes() -> None:
    assert prefix_successor(b"ab") == b"ac"
    assert prefix_successor(b"a\xff") == b"b"
    assert prefix_successor(b"\xff\xff") is None
    assert prefix_successor(b"") is None


@given(prefix=st.binary(max_size=3), key=st.binary(max_size=4))
def test_prefix_range_holds_exactly_the_keys_with_the_prefix(prefix: bytes, key: bytes) -> None:
    assert (key in KeyRange.prefix(prefix)) == key.startswith(prefix)


@given(low=st.binary(max_size=3), high=st.binary(max_size=3), key=st.binary(max_size=4))
def test_closed_range_includes_both_ends(low: bytes, high: bytes, key: bytes) -> None:
    assert (key in KeyRange.closed(low, high)) == (low <= key <= high)
