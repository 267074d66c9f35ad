"""The Kafka adapter's record size limit without a broker: the choice between the topic's
max.message.bytes and the producer's message.max.bytes, the cache, and an app without
DESCRIBE_CONFIGS (the real broker's answer: tests/integration/processing/
test_record_size_limits_kafka.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from eddyline_runtime.log.errors import LogAuthorizationError
from eddyline_runtime.log.kafka.admin import KafkaTopics
from eddyline_runtime.log.record_size import RecordSizeLimit


def topics(client: dict[str, str], answers: list[Any]) -> KafkaTopics:
    """KafkaTopics whose DescribeConfigs answers come from ``answers`` (a config dict, or
    an exception to raise), one per call."""
    connection: Any = SimpleNamespace(settings=SimpleNamespace(client=client))
    admin = KafkaTopics(connection)
    admin.check_partition = lambda tp: f"p.{tp.topic}"  # type: ignore[method-assign]

    def ask(request: Any, *, action: str, acl: str) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return {"resource": answer}

    admin._ask = ask  # type: ignore[method-assign]
    return admin


def entry(value: str) -> Any:
    return SimpleNamespace(value=value)


def test_the_topics_limit_is_asked_once() -> None:
    admin = topics({}, [{"max.message.bytes": entry("2048")}])
    assert admin.record_size_limit("out") == RecordSizeLimit(2048, "max.message.bytes")
    assert admin.record_size_limit("out") == RecordSizeLimit(2048, "max.message.bytes")


def test_the_producers_smaller_limit_wins_and_is_named() -> None:
    """librdkafka refuses a record over its message.max.bytes (default 1,000,000) itself."""
    admin = topics({}, [{"max.message.bytes": entry("5000000")}])
    expected = RecordSizeLimit(1_000_000, "message.max.bytes (log settings)")
    assert admin.record_size_limit("out") == expected
    admin = topics({"message.max.bytes": "3000"}, [{"max.message.bytes": entry("4000")}])
    assert admin.record_size_limit("out") == RecordSizeLimit(
        3000, "message.max.bytes (log settings)"
    )


def test_without_describe_configs_the_topic_goes_unchecked_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = LogAuthorizationError("reading", 'DESCRIBE_CONFIGS on topic "p.out"')
    admin = topics({}, [refused])
    with caplog.at_level(logging.WARNING):
        assert admin.record_size_limit("out") is None
        assert admin.record_size_limit("out") is None
    [warning] = caplog.records
    assert 'DESCRIBE_CONFIGS on topic "p.out"' in warning.getMessage()
