"""An output over its topic's ``max.message.bytes``, on a real Kafka broker.

The output topic's ``max.message.bytes`` is lowered to 2048 bytes and one
input among normal ones grows past it in the topology. The sink hands it to
the ``production.exception.handler`` before anything is sent
(docs/errors.md, "A record the log refuses"), so: continue drops and counts it
and the others arrive exactly once, under exactly-once and at-least-once
alike; fail stops the task naming the topic, the size and the limit; with a
dead-letter topic the input record is set aside there. Without the check the
broker refuses the record and the task stops whatever the handler says
(tests/integration/log/test_kafka_mock_errors.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsFailedError, StreamsInstance
from eddyline_runtime.engine.record_failures import TaskProcessingError
from eddyline_runtime.log import Record, RecordRefusedError
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.log.record_size import (
    RecordSizeLimit,
    RecordTooLargeError,
    record_size_upper_bound,
)
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import StreamsBuilder, Topology
from tests.support.crash_runs import committed_records

pytestmark = pytest.mark.slow

LIMIT = 2048
TIMEOUT = 120
# Twenty small records (a librdkafka batch of them stays far under the limit) and one that
# the topology makes 4000 bytes long.
INPUTS = [f"v{i}" for i in range(10)] + ["big"] + [f"w{i}" for i in range(10)]
EXPECTED = [value.encode() for value in INPUTS if value != "big"]


def grow(value: str) -> str:
    return "x" * 4000 if value == "big" else value


def growing() -> Topology:
    builder = StreamsBuilder()
    builder.stream("in", value_serde="string").map_values(grow).to("out", value_serde="string")
    return builder.build()


@pytest.fixture
def log(kafka_bootstrap: str) -> Iterator[KafkaLog]:
    log = KafkaLog.open(
        f"kafka://{kafka_bootstrap}", {}, topic_prefix=f"size-{uuid.uuid4().hex[:8]}."
    )
    create_limited(kafka_bootstrap, log.real_topic("out"))
    log.create_topic("in", 1)
    log.create_topic("dlq", 1)
    log.produce(
        TopicPartition("in", 0),
        [Record(f"k{i}".encode(), value.encode(), i + 1) for i, value in enumerate(INPUTS)],
    )
    yield log
    log.close()


def create_limited(bootstrap: str, real: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(real, 1, 1, config={"max.message.bytes": str(LIMIT)})
    admin.create_topics([topic])[real].result(30)


def config(tmp_path: Path, guarantee: str, **settings: str) -> StreamsConfig:
    return StreamsConfig.from_properties(
        {
            "application.id": f"app-{uuid.uuid4().hex[:6]}",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": guarantee,
            "commit.interval.ms": 100,
            **settings,
        }
    )


def values(log: KafkaLog, topic: str) -> list[Record]:
    # To the end offset: one fetch returns what has arrived (maybe one batch).
    return list(committed_records(log, topic, 1))


@pytest.mark.parametrize("guarantee", ["exactly_once_v2", "at_least_once"])
def test_continue_drops_the_record_over_the_limit_and_the_others_arrive_once(
    tmp_path: Path, log: KafkaLog, guarantee: str
) -> None:
    settings = {"production.exception.handler": "log-and-continue"}
    instance = StreamsInstance(growing(), config(tmp_path, guarantee, **settings), log)
    instance.start()
    try:
        instance.wait_until_caught_up(TIMEOUT)
        task = {"thread-id": instance.threads[0].name, "task-id": "0_0"}
        by_reason = instance.metrics.value(
            "stream-task-metrics",
            "dropped-records-by-reason-total",
            {**task, "reason": "production-error"},
        )
        dropped = instance.metrics.value("stream-task-metrics", "dropped-records-total", task)
    finally:
        instance.close()
    assert [record.value for record in values(log, "out")] == EXPECTED
    assert (by_reason, dropped) == (1, 1)
    assert log.record_size_limit("out") == RecordSizeLimit(LIMIT, "max.message.bytes")


def test_fail_stops_the_task_naming_the_topic_the_size_and_the_limit(
    tmp_path: Path, log: KafkaLog
) -> None:
    instance = StreamsInstance(growing(), config(tmp_path, "exactly_once_v2"), log)
    instance.start()
    with pytest.raises(StreamsFailedError) as failed:
        try:
            instance.wait_until_caught_up(TIMEOUT)
        finally:
            instance.close()
    cause = failed.value.__cause__
    assert isinstance(cause, TaskProcessingError), failed.value
    assert isinstance(cause.cause, RecordTooLargeError)
    size = record_size_upper_bound(b"k10", b"x" * 4000)
    message = str(cause)
    assert "\n" not in message
    assert f"at offset 10: RecordTooLargeError: this record is {size} bytes" in message
    assert f'over "out"\'s max.message.bytes={LIMIT}; raise it' in message
    assert "raise it or shrink the record" in message
    assert "production.exception.handler" in message
    assert all(len(record.value or b"") < LIMIT for record in values(log, "out"))


def test_the_dead_letter_topic_gets_the_input_record_with_the_reason(
    tmp_path: Path, log: KafkaLog
) -> None:
    settings = {"errors.dead.letter.queue.topic.name": "dlq"}  # the handler still fails
    for handler in ("log-and-continue", "log-and-fail"):
        settings["production.exception.handler"] = handler
        instance = StreamsInstance(
            growing(), config(tmp_path / handler, "exactly_once_v2", **settings), log
        )
        instance.start()
        if handler == "log-and-fail":
            with pytest.raises(StreamsFailedError):  # close() raises what failed the task
                try:
                    instance.wait_until_caught_up(TIMEOUT)
                finally:
                    instance.close()
        else:
            try:
                instance.wait_until_caught_up(TIMEOUT)
            finally:
                instance.close()
    # The continuing run wrote the dead-letter record once; the failing one wrote none
    # (a failing answer's dead-letter records are not written: docs/errors.md).
    [dead] = values(log, "dlq")
    assert (dead.key, dead.value, dead.timestamp) == (b"k10", b"big", 11)
    headers = dict(dead.headers)
    exception = b"eddyline_runtime.log.record_size.RecordTooLargeError"
    assert headers["__streams.errors.exception"] == exception
    assert b"max.message.bytes=2048" in headers["__streams.errors.message"]
    assert headers["__streams.errors.offset"] == b"10"


def test_what_the_check_lets_through_the_broker_takes(log: KafkaLog) -> None:
    """The estimate is never under the written size: a record estimated at the limit is
    stored, and one written one byte over it is refused by the broker itself."""
    out = TopicPartition("out", 0)
    at_limit = b"y" * (LIMIT - record_size_upper_bound(None, b"") - 1)
    assert record_size_upper_bound(None, at_limit) == LIMIT
    log.produce(out, [Record(None, at_limit, 1)])
    # Written: 61 + a 2-byte length + 3 (attributes, deltas) + 1 (null key) + 2 + value + 1.
    over = b"z" * (LIMIT + 1 - (61 + 2 + 3 + 1 + 2 + 1))
    with pytest.raises(RecordRefusedError, match="MSG_SIZE_TOO_LARGE"):
        log.produce(out, [Record(None, over, 2)])
    assert [record.value for record in values(log, "out")] == [at_limit]
