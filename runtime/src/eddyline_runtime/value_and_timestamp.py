"""A stored value with its timestamp: Kafka Streams' ``ValueAndTimestamp`` bytes, spelled once.

Windowed aggregations store each window's aggregate with the timestamp of the
newest record folded in; a table-table join side stores each row with the
timestamp of its update, so a result takes the later of two updates' times.
Both are these bytes: the timestamp as an 8-byte big-endian signed long, then
the serialized value. Stores, changelogs, interactive queries and the DSL's
operators all read them through the two functions below, so the layout a
changelog carries has one definition.
"""

from __future__ import annotations

import struct
from typing import Final

_TIMESTAMP: Final = struct.Struct(">q")
TIMESTAMP_SIZE: Final = _TIMESTAMP.size


def timestamped_value(timestamp: int, value: bytes) -> bytes:
    """``value`` stored with ``timestamp`` in front of it."""
    return _TIMESTAMP.pack(timestamp) + value


def split_timestamped(data: bytes) -> tuple[int, bytes]:
    """(timestamp, value) of :func:`timestamped_value` bytes."""
    timestamp: int = _TIMESTAMP.unpack_from(data, 0)[0]
    return timestamp, data[TIMESTAMP_SIZE:]
