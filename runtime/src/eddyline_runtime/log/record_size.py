"""How large a record is to the log, and the largest one a topic takes.

A broker refuses a record batch larger than its topic's ``max.message.bytes``
(``MESSAGE_TOO_LARGE``). The sink compares each serialized output with that
limit before anything is sent (as Kafka's producer checks ``max.request.size``
before sending), so that a record the log would refuse goes to the production
handler with its input record's context instead of failing the commit.

The size is Kafka's own upper bound for one record alone in an uncompressed
v2 batch (``AbstractRecords.estimateSizeInBytesUpperBound``: the batch header,
61 bytes, plus ``DefaultRecord.recordSizeUpperBound``: 21 bytes of the most
varint overhead, the key, value and headers with their length varints). It is
conservative: the broker measures the batch as written, so a record up to ~15
bytes under the bound (smaller varints) or one that compression would shrink
below the limit is still handed to the handler. A batch of several records
that fit alone but not together is not seen here (the broker refuses it:
``RECORD_LIST_TOO_LARGE``); see docs/errors.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

# Kafka's DefaultRecordBatch.RECORD_BATCH_OVERHEAD (with the log entry's offset and length).
RECORD_BATCH_OVERHEAD: Final = 61
# Kafka's DefaultRecord.MAX_RECORD_OVERHEAD: length, attributes, timestamp and offset deltas
# at their largest varint sizes.
MAX_RECORD_OVERHEAD: Final = 21
# The most a record without headers adds to its key and value: both overheads, two length
# varints of at most 5 bytes and the header count (1 byte for none). A record whose key and
# value plus this fit a limit fits it: the sink skips the exact estimate for it.
MOST_OVERHEAD_WITHOUT_HEADERS: Final = RECORD_BATCH_OVERHEAD + MAX_RECORD_OVERHEAD + 5 + 5 + 1


class RecordSizeLimit(NamedTuple):
    """The largest record a topic takes, in bytes as :func:`record_size_upper_bound`
    counts them, and the setting that sets it (named in the error, with the way out)."""

    max_bytes: int
    setting: str


class RecordTooLargeError(ValueError):
    """A serialized output is larger than its topic takes (Kafka's
    ``RecordTooLargeException``): handed to the ``production.exception.handler`` before
    anything is sent. A ``ValueError``, not an ``EddylineError``: the failure is the
    record's, so a handler may skip it."""

    def __init__(self, topic: str, size: int, limit: RecordSizeLimit, *, what: str) -> None:
        self.topic, self.size, self.limit = topic, size, limit
        # Short: the task's one-line failure keeps 120 characters of it.
        super().__init__(
            f'{what} is {size} bytes, over "{topic}"\'s {limit.setting}={limit.max_bytes}; '
            "raise it or shrink the record"
        )


def _varint_size(length: int) -> int:
    """Bytes of Kafka's zigzag varint for a length >= 0 (ByteUtils.sizeOfVarint): zigzag
    makes it ``2 * length``, written 7 bits a byte."""
    return ((length << 1).bit_length() + 6) // 7 or 1


def _field_size(data: bytes | None) -> int:
    return 1 if data is None else _varint_size(len(data)) + len(data)  # null: varint -1


def headers_size_bound(headers: Sequence[tuple[str, bytes | None]]) -> int:
    """A quick bound of what ``headers`` add over a record without any: each header's
    name (UTF-8: at most 4 bytes a character) and value with two length varints of at
    most 5 bytes, and up to 4 more bytes of the header count's varint."""
    return sum(len(name) * 4 + len(data or b"") + 10 for name, data in headers) + 4


def record_size_upper_bound(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] = ()
) -> int:
    """Kafka's upper bound of one record alone in an uncompressed batch, in bytes."""
    size = RECORD_BATCH_OVERHEAD + MAX_RECORD_OVERHEAD
    size += _field_size(key) + _field_size(value) + _varint_size(len(headers))
    for name, header_value in headers:
        size += _field_size(name.encode()) + _field_size(header_value)
    return size
