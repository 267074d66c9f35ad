"""Outputs larger than their topic takes go to the production handler before they are sent.

Kafka's producer checks ``max.request.size`` with
``AbstractRecords.estimateSizeInBytesUpperBound`` before sending (so the
record reaches ``ProductionExceptionHandler`` with its context, KAFKA-15259);
eddyline checks each serialized output against its topic's ``max.message.bytes``
the same way at the sink (docs/errors.md, "A record the log refuses"). The
real-broker side: tests/integration/processing/test_record_size_limits_kafka.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.config import ExceptionHandlerKind
from eddyline_runtime.engine.record_failures import RecordFailures, TaskProcessingError
from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.log.record_size import (
    MOST_OVERHEAD_WITHOUT_HEADERS,
    RecordSizeLimit,
    RecordTooLargeError,
    headers_size_bound,
    record_size_upper_bound,
)
from eddyline_runtime.processing import StreamsBuilder
from eddyline_runtime.processing.exception_handlers import (
    ErrorHandlerContext,
    Response,
    log_and_continue,
    log_and_fail,
)

PRODUCTION = ExceptionHandlerKind.PRODUCTION


def _zigzag_varint_size(value: int) -> int:
    unsigned = (value << 1) ^ (value >> 31)
    return len(_unsigned_varint(unsigned & 0xFFFFFFFF))


def _unsigned_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(data: bytes | None) -> int:
    return 1 if data is None else _zigzag_varint_size(len(data)) + len(data)


def written_batch_size(
    key: bytes | None, value: bytes | None, headers: tuple[tuple[str, bytes], ...] = ()
) -> int:
    """The size of a v2 record batch holding only this record, as a producer writes it
    (KIP-98's format: the 61-byte batch header, then the record with its length varint,
    attributes, zero timestamp and offset deltas, key, value and headers)."""
    body = 1 + 1 + 1 + _field(key) + _field(value) + _zigzag_varint_size(len(headers))
    for name, header_value in headers:
        body += _field(name.encode()) + _field(header_value)
    return 61 + _zigzag_varint_size(body) + body


@pytest.mark.parametrize(
    ("key", "value", "headers"),
    [
        (None, None, ()),
        (b"k", b"v" * 100, ()),
        (b"k" * 63, b"v" * 64, ()),  # the varint of a length grows at 64
        (b"", b"v" * 20_000, (("h", b"x" * 300), ("trace", b""))),
        (None, b"v" * 1_000_000, ()),
        (b"k", b"v", (("\u00fcber-\U0001f600", b"x" * 200), ("n", b""))),
    ],
)
def test_the_estimate_is_kafkas_upper_bound_of_the_written_batch(
    key: bytes | None, value: bytes | None, headers: tuple[tuple[str, bytes], ...]
) -> None:
    """Kafka: DefaultRecordBatch.RECORD_BATCH_OVERHEAD (61) + DefaultRecord's
    MAX_RECORD_OVERHEAD (21) + the fields; never under what is written, at most 17 bytes
    over (the varints at their largest)."""
    estimate = record_size_upper_bound(key, value, headers)
    written = written_batch_size(key, value, headers)
    assert 0 <= estimate - written <= 17
    # The sink's quick bound, which skips the estimate for records far under the limit.
    quick = len(key or b"") + len(value or b"") + MOST_OVERHEAD_WITHOUT_HEADERS
    assert estimate <= quick + (headers_size_bound(headers) if headers else 0)


def test_the_estimate_of_known_records() -> None:
    """By hand: 61 + 21 + a null key (1) + a null value (1) + no headers (1)."""
    assert record_size_upper_bound(None, None) == 85
    # key: varint(1) 1 byte + 1; value: varint(100) 2 bytes + 100; no headers: 1.
    assert record_size_upper_bound(b"k", b"v" * 100) == 61 + 21 + 2 + 102 + 1


def upper_cased() -> Any:
    builder = StreamsBuilder()
    builder.stream("in", value_serde="string").map_values(str.upper).to("out", value_serde="string")
    return builder.build()


LIMIT = RecordSizeLimit(300, "max.message.bytes")
BIG = "x" * 400  # 400 bytes of value: over 300 whatever the overhead


def task(
    production: Any = log_and_fail,
    *,
    dead_letter_topic: str | None = None,
    dlq_limit: RecordSizeLimit | None = None,
) -> TaskTopology:
    topology = upper_cased()
    failures = RecordFailures({PRODUCTION: production}, dead_letter_queue_topic=dead_letter_topic)
    limits = {"out": LIMIT}
    if dead_letter_topic is not None and dlq_limit is not None:
        limits[dead_letter_topic] = dlq_limit
    return TaskTopology(
        topology,
        topology.subtopologies()[0],
        0,
        {},
        failures=failures,
        physical_topics={"in": "app-in", "out": "app-out"},
        record_limits=limits,
    )


def values_out(topology: TaskTopology, topic: str = "out") -> list[bytes | None]:
    return [output.value for output in topology.drain_outputs() if output.topic == topic]


@pytest.mark.parametrize("path", ["records", "batch", "headers"])
def test_continue_drops_the_record_over_the_limit_and_counts_it(path: str) -> None:
    topology = task(log_and_continue)
    values = [b"a", BIG.encode(), b"c"]
    if path == "batch":
        topology.process_batch("in", [None] * 3, values, [1, 2, 3], offsets=[10, 11, 12])
    else:
        headers = (("trace", b"t"),) if path == "headers" else ()
        for offset, value in enumerate(values, start=10):
            topology.process("in", None, value, offset, headers, partition=0, offset=offset)
    assert values_out(topology) == [b"A", b"C"]
    assert topology.failures.dropped_by_reason["production-error"] == 1
    assert topology.dropped_records == 1


def test_a_record_at_the_limit_is_kept() -> None:
    """The limit is inclusive: 85 for a null key and an empty value, and a value of 214
    bytes adds itself and one byte to its length's varint."""
    value = b"y" * 214
    assert record_size_upper_bound(None, value) == LIMIT.max_bytes
    topology = task()
    topology.process_batch("in", [None], [value], [1], offsets=[0])
    topology.process("in", None, value, 2, partition=0, offset=1)
    assert values_out(topology) == [value.upper(), value.upper()]


def test_fail_stops_the_task_naming_the_topic_the_size_the_limit_and_the_way_out() -> None:
    topology = task()
    with pytest.raises(TaskProcessingError) as failed:
        topology.process_batch("in", [None] * 2, [b"a", BIG.encode()], [1, 2], offsets=[4, 5])
    error = failed.value
    assert (error.topic, error.offset) == ("app-in", 5)
    assert isinstance(error.cause, RecordTooLargeError)
    size = record_size_upper_bound(None, BIG.upper().encode())
    message = str(error)
    assert "\n" not in message
    assert f'this record is {size} bytes, over "app-out"\'s max.message.bytes=300' in message
    assert "raise it or shrink the record" in message
    assert "production.exception.handler" in message


@pytest.mark.parametrize("headers", [None, [(("trace", b"t"),)]])
def test_the_dead_letter_record_names_the_reason(headers: Any) -> None:
    """Both paths: a batch without headers, and record by record (a record with headers)."""
    topology = task(log_and_continue, dead_letter_topic="dlq")
    topology.process_batch("in", [b"k"], [BIG.encode()], [7], headers, partition=0, offsets=[3])
    [dead] = [output for output in topology.drain_outputs() if output.topic == "dlq"]
    # KIP-1034: the input record's bytes as read, and the failure in the headers.
    assert (dead.key, dead.value, dead.timestamp) == (b"k", BIG.encode(), 7)
    headers = dict(dead.headers)
    assert (
        headers["__streams.errors.exception"]
        == b"eddyline_runtime.log.record_size.RecordTooLargeError"
    )
    assert b'over "app-out"\'s max.message.bytes=300' in headers["__streams.errors.message"]
    assert topology.failures.dead_letter_records == 1


def test_a_dead_letter_record_too_large_for_its_topic_stops_the_task() -> None:
    """Dropping it would lose what the handler set aside: the task stops instead, naming
    the dead-letter topic's limit, and no handler setting (none would help)."""
    topology = task(
        log_and_continue,
        dead_letter_topic="dlq",
        dlq_limit=RecordSizeLimit(200, "max.message.bytes"),
    )
    with pytest.raises(TaskProcessingError) as failed:
        topology.process_batch("in", [b"k"], [BIG.encode()], [7], partition=0, offsets=[3])
    message = str(failed.value)
    assert "its dead-letter record is" in message
    assert '"dlq"\'s max.message.bytes=200' in message
    assert "exception.handler" not in message


def to_dead_letters_if_too_large(context: ErrorHandlerContext, exception: Exception) -> Response:
    if isinstance(exception, RecordTooLargeError):
        return Response.resume()
    return Response.fail()


def test_a_user_handler_sees_the_error_and_the_record() -> None:
    seen: list[tuple[Any, Exception]] = []

    def handler(context: ErrorHandlerContext, exception: Exception) -> Response:
        seen.append((context.value, exception))
        return to_dead_letters_if_too_large(context, exception)

    topology = task(handler)
    topology.process("in", None, BIG.encode(), 1, partition=0, offset=0)
    [(value, exception)] = seen
    assert value == BIG.upper()  # what the sink was given, as for a serde's failure
    assert isinstance(exception, RecordTooLargeError)
    assert (exception.topic, exception.limit) == ("app-out", LIMIT)


def test_without_limits_nothing_is_checked() -> None:
    topology = upper_cased()
    plain = TaskTopology(topology, topology.subtopologies()[0], 0, {})
    plain.process("in", None, BIG.encode(), 1, partition=0, offset=0)
    assert values_out(plain) == [BIG.upper().encode()]


def test_a_batch_over_the_limit_together_keeps_records_that_fit_alone() -> None:
    """The limit is per record (a broker batch of them is librdkafka's to size)."""
    topology = task()
    values = [b"z" * 150] * 3
    topology.process_batch("in", [None] * 3, values, [1, 2, 3], offsets=[0, 1, 2])
    assert values_out(topology) == [b"Z" * 150] * 3
    assert topology.output_bytes == 0  # drained
    topology.process_batch("in", [None] * 3, values, [1, 2, 3], offsets=[3, 4, 5])
    assert topology.output_bytes == 450
