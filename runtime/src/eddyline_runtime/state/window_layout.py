"""The byte layout of window and session stores: the one place it is spelled.

Window and session stores are views over an ordinary transactional key-value
store (:class:`~eddyline_runtime.state.RocksDBStore` under KIP-892); they own
no data of their own. Every raw key they write is what the changelog carries,
what restoration and standbys replay, and what a Spark restore build writes
into SST files: replaying a window store's changelog into a plain key-value
store reproduces the window store byte for byte. Nothing else in eddyline
may build or parse these keys; use the functions below.

Window store raw key (all integers unsigned big-endian, so byte order is
numeric order)::

    segment start (8) | key bytes (n) | window start (8) | sequence number (4)

Session store raw key::

    segment start (8) | key bytes (n) | session end (8) | session start (8)

* ``key bytes + window start + sequence number`` is Kafka Streams' own
  window-store key (``WindowKeySchema``), and ``key bytes + end + start`` its
  session-store key (``SessionKeySchema``); the sequence number is 0 unless a
  store keeps duplicates (stream-stream joins will).
* The 8-byte prefix is the start of the time *segment* the entry belongs to:
  ``t - t % segment_interval`` of the window start (window store) or session
  end (session store). Retention drops whole segments, and a segment is one
  contiguous key range, so finding what expired never scans live data. Inside
  a segment entries are key-first, so one key's windows are one short range.
* Keys of different lengths can share a prefix (``b"a"`` and ``b"ab"``), so a
  scan over ``segment | key | ...`` also meets longer keys; readers keep only
  raw keys of exactly the expected length (:func:`window_key_matches`).

Values of windowed aggregations are *timestamped* (Kafka Streams'
``ValueAndTimestamp`` bytes): the 8-byte big-endian timestamp of the newest
record folded in, then the serialized aggregate
(:mod:`eddyline_runtime.value_and_timestamp`, the one place that layout is spelled).

Timestamps are milliseconds since the epoch and must be >= 0 (Kafka Streams
windows start at 0 or later).

Retention follows Kafka Streams: a window store keeps at least size + grace
(sliding windows: 2 * time difference + grace), a session store at least gap +
grace; the DSL refuses less when it builds the topology
(:mod:`eddyline_runtime.processing.materialized`, ``store_retention_ms``); the segment
interval is ``max(retention / 2, 60 s)``; reads never return an entry whose
segment-time (window start, session end) is older than ``observed stream time -
retention + 1``, and a segment older than the one holding ``observed stream time
- retention`` is expired: it takes no writes and is dropped whole. The changelog
topic is ``cleanup.policy=compact,delete`` with
``retention.ms = retention + windowstore.changelog.additional.retention.ms``
(1 day by default): :func:`changelog_retention_ms`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from eddyline_runtime.config import DEFAULT_WINDOW_CHANGELOG_ADDITIONAL_RETENTION_MS
from eddyline_runtime.errors import InvalidArgumentError

_U64: Final = struct.Struct(">Q")
_U32: Final = struct.Struct(">I")
TIMESTAMP_SIZE: Final = 8
SEQUENCE_SIZE: Final = 4
SEGMENT_PREFIX_SIZE: Final = 8
_MAX_TIMESTAMP: Final = (1 << 63) - 1

# Kafka Streams' defaults (StreamsConfig / Segments).
DEFAULT_CHANGELOG_ADDITIONAL_RETENTION_MS: Final = DEFAULT_WINDOW_CHANGELOG_ADDITIONAL_RETENTION_MS
MIN_SEGMENT_INTERVAL_MS: Final = 60_000
CHANGELOG_CLEANUP_POLICY: Final = "compact,delete"


def check_timestamp(store: str, what: str, timestamp: int) -> None:
    """Raise naming the store when ``timestamp`` cannot be part of a key."""
    if type(timestamp) is not int or not 0 <= timestamp <= _MAX_TIMESTAMP:
        raise InvalidArgumentError(
            f'state store "{store}": {what} {timestamp!r} is not a timestamp in '
            "milliseconds >= 0; windows start at the epoch or later (give the record a "
            "timestamp, or drop it before the windowed operation)"
        )


@dataclass(frozen=True, slots=True)
class Retention:
    """How long a window or session store keeps entries, and how it segments them."""

    retention_ms: int
    segment_interval_ms: int

    @classmethod
    def of(cls, retention_ms: int, segment_interval_ms: int | None = None) -> Retention:
        """Kafka Streams' segment interval unless one is given: max(retention / 2, 60 s)."""
        if retention_ms < 0:
            raise InvalidArgumentError(
                f"retention {retention_ms} ms is negative; give 0 or more milliseconds"
            )
        interval = (
            max(retention_ms // 2, MIN_SEGMENT_INTERVAL_MS)
            if segment_interval_ms is None
            else segment_interval_ms
        )
        if interval <= 0:
            raise InvalidArgumentError(
                f"segment interval {interval} ms must be > 0; leave it unset for "
                "Kafka Streams' max(retention / 2, 60 s)"
            )
        return cls(retention_ms, interval)

    def segment_of(self, timestamp: int) -> int:
        """The start of the segment holding ``timestamp``."""
        return timestamp - timestamp % self.segment_interval_ms

    def min_live(self, observed_stream_time: int) -> int:
        """The oldest segment-time reads still return (Kafka's ``actualFrom``): every
        read starts at ``max(from, observed - retention + 1)``."""
        return observed_stream_time - self.retention_ms + 1

    def oldest_live_segment(self, observed_stream_time: int) -> int:
        """The start of the oldest segment still live (Kafka's ``Segments``: the segment
        of ``observed - retention``). A write into a live segment is kept, even when
        reads already hide its time; older segments take no writes and are dropped."""
        return self.segment_of(observed_stream_time - self.retention_ms)


def changelog_retention_ms(
    store_retention_ms: int,
    additional_retention_ms: int = DEFAULT_CHANGELOG_ADDITIONAL_RETENTION_MS,
) -> int:
    """``retention.ms`` of a window or session store's changelog topic, as Kafka Streams sets it."""
    return store_retention_ms + additional_retention_ms


def segment_prefix(segment_start: int) -> bytes:
    return _U64.pack(segment_start)


def segment_of_raw(raw: bytes) -> int:
    start: int = _U64.unpack_from(raw, 0)[0]
    return start


# -- window store ---------------------------------------------------------------------

WINDOW_SUFFIX_SIZE: Final = TIMESTAMP_SIZE + SEQUENCE_SIZE


def window_key(segment_start: int, key: bytes, window_start: int, seq: int = 0) -> bytes:
    return b"".join((_U64.pack(segment_start), key, _U64.pack(window_start), _U32.pack(seq)))


def window_key_matches(raw: bytes, key: bytes) -> bool:
    """Whether ``raw`` (found by a scan starting at ``segment | key``) belongs to ``key``."""
    return len(raw) == SEGMENT_PREFIX_SIZE + len(key) + WINDOW_SUFFIX_SIZE


def decode_window_key(raw: bytes) -> tuple[bytes, int, int]:
    """(key, window start, sequence number) of a window store raw key."""
    end = len(raw) - WINDOW_SUFFIX_SIZE
    start: int = _U64.unpack_from(raw, end)[0]
    seq: int = _U32.unpack_from(raw, end + TIMESTAMP_SIZE)[0]
    return raw[SEGMENT_PREFIX_SIZE:end], start, seq


def window_start_of_raw(raw: bytes) -> int:
    start: int = _U64.unpack_from(raw, len(raw) - WINDOW_SUFFIX_SIZE)[0]
    return start


# -- session store --------------------------------------------------------------------

SESSION_SUFFIX_SIZE: Final = 2 * TIMESTAMP_SIZE


def session_key(segment_start: int, key: bytes, start: int, end: int) -> bytes:
    return b"".join((_U64.pack(segment_start), key, _U64.pack(end), _U64.pack(start)))


def session_key_matches(raw: bytes, key: bytes) -> bool:
    return len(raw) == SEGMENT_PREFIX_SIZE + len(key) + SESSION_SUFFIX_SIZE


def decode_session_key(raw: bytes) -> tuple[bytes, int, int]:
    """(key, session start, session end) of a session store raw key."""
    cut = len(raw) - SESSION_SUFFIX_SIZE
    end: int = _U64.unpack_from(raw, cut)[0]
    start: int = _U64.unpack_from(raw, cut + TIMESTAMP_SIZE)[0]
    return raw[SEGMENT_PREFIX_SIZE:cut], start, end


def session_end_of_raw(raw: bytes) -> int:
    end: int = _U64.unpack_from(raw, len(raw) - SESSION_SUFFIX_SIZE)[0]
    return end


def timestamp_bytes(timestamp: int) -> bytes:
    return _U64.pack(timestamp)
