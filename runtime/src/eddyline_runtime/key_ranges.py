"""Key ranges in byte order, the order every store iterates in.

The public API speaks Kafka Streams' ranges (``range(from, to)`` with both
ends inclusive, ``None`` for unbounded, ``prefix_scan(prefix)``); underneath,
everything is one half-open interval ``[lower, upper)``, which is also what
RocksDB's ``iterate_upper_bound`` takes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeyRange:
    """Keys ``k`` with ``lower <= k < upper``; a ``None`` end is unbounded."""

    lower: bytes | None = None
    upper: bytes | None = None

    @classmethod
    def closed(cls, from_key: bytes | None, to_key: bytes | None) -> KeyRange:
        """Kafka's ``range(from, to)``: both ends inclusive."""
        # The smallest key greater than to_key is to_key followed by a zero byte.
        return cls(from_key, None if to_key is None else to_key + b"\x00")

    @classmethod
    def prefix(cls, prefix: bytes) -> KeyRange:
        """All keys starting with ``prefix``."""
        return cls(prefix or None, prefix_successor(prefix))

    @property
    def empty(self) -> bool:
        return self.lower is not None and self.upper is not None and self.lower >= self.upper

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes):
            return False
        return (self.lower is None or key >= self.lower) and (
            self.upper is None or key < self.upper
        )

    def slice_of(self, sorted_keys: Sequence[bytes]) -> Sequence[bytes]:
        """The run of ``sorted_keys`` inside this range (a copy, safe to hold)."""
        start = 0 if self.lower is None else bisect_left(sorted_keys, self.lower)
        end = len(sorted_keys) if self.upper is None else bisect_left(sorted_keys, self.upper)
        return sorted_keys[start:end]


def prefix_successor(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix``; None if unbounded.

    Trailing 0xff bytes cannot be incremented, so they are dropped first:
    the successor of b"a\\xff" is b"b"; b"\\xff\\xff" has none.
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])
