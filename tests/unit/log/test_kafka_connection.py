"""The Kafka log's connection: every client kind's librdkafka config, built in one place.

Each config is the client's defaults, then the log settings, then what the
adapter's semantics rest on; these check that rule for every kind through the
factories, with the clients faked (``tests/support/kafka/fake_clients.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from eddyline_runtime.log.kafka.connection import KafkaConnection
from eddyline_runtime.log.kafka_settings import kafka_log_settings
from tests.support.kafka.fake_clients import FakeBroker, FakeClients

BOOTSTRAP = "broker-0:9092,broker-1:9092"


def connection(settings: dict[str, object], broker: FakeBroker) -> KafkaConnection:
    return KafkaConnection(
        kafka_log_settings(f"kafka://{BOOTSTRAP}", settings),
        clients=FakeClients(broker),
        transaction_timeout_s=7.0,
    )


def _ignore(*_: Any) -> None:
    return None


# Each client kind with a property its semantics rest on (the admin client has none).
KINDS: dict[str, tuple[Callable[[KafkaConnection], object], str, object]] = {
    "reader": (KafkaConnection.reader_consumer, "isolation.level", "read_committed"),
    "offsets": (KafkaConnection.offsets_consumer, "isolation.level", "read_committed"),
    # Its high offset is the high watermark, undecided transactions counted (KafkaLog.undecided).
    "high watermark": (
        lambda c: c.offsets_consumer(committed=False),
        "isolation.level",
        "read_uncommitted",
    ),
    "plain producer": (KafkaConnection.plain_producer, "enable.idempotence", True),
    "group": (lambda c: c.group_consumer("app"), "isolation.level", "read_uncommitted"),
    "transactional producer": (
        lambda c: c.transactional_producer(
            "app-0_0", on_statistics=_ignore, on_delivery=_ignore, on_error=_ignore
        ),
        "transactional.id",
        "app-0_0",
    ),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_client_kind_gets_the_log_settings_but_keeps_what_it_rests_on(kind: str) -> None:
    factory, key, value = KINDS[kind]
    broker = FakeBroker()
    wrong = "read_uncommitted" if value == "read_committed" else "something-else"
    factory(connection({"security.protocol": "SASL_SSL", key: wrong}, broker))
    (config,) = broker.configs
    assert config["security.protocol"] == "SASL_SSL"
    assert config[key] == value
    assert config["bootstrap.servers"] == BOOTSTRAP


def test_client_tuning_is_a_default_the_log_settings_override() -> None:
    broker = FakeBroker()
    link = connection({"linger.ms": "50", "fetch.wait.max.ms": "20"}, broker)
    link.plain_producer()
    link.reader_consumer()
    producer, reader = broker.configs
    assert producer["linger.ms"] == "50"
    assert reader["fetch.wait.max.ms"] == "20"
    assert reader["queued.max.messages.kbytes"] == 32_768


def test_a_transactional_producer_times_out_its_transactions_as_the_connection_does() -> None:
    broker = FakeBroker()
    connection({}, broker).transactional_producer(
        "app-0_0", on_statistics=_ignore, on_delivery=_ignore, on_error=_ignore
    )
    (config,) = broker.configs
    assert config["transaction.timeout.ms"] == 7_000
    assert config["error_cb"] is _ignore


def test_every_client_reports_its_errors_to_the_connection() -> None:
    broker = FakeBroker()
    link = connection({}, broker)
    link.admin()
    (config,) = broker.configs
    assert config["error_cb"] == link.report_client_error


def test_topic_names_go_under_the_prefix_and_internal_topics_stay_hidden() -> None:
    link = KafkaConnection(kafka_log_settings(f"kafka://{BOOTSTRAP}", {}), topic_prefix="run-7.")
    assert link.real_topic("words") == "run-7.words"
    assert link.port_topic("run-7.words") == "words"
    assert link.visible("run-7.words")
    assert not link.visible("words")
    assert not link.visible("__consumer_offsets")
