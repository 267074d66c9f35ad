"""Kafka log URLs and client settings: what the pod reads from the log Secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.log.kafka_settings import (
    LOG_SETTINGS_ENV,
    kafka_log_settings,
    parse_kafka_url,
    read_client_settings,
    settings_from_environment,
)


def test_a_kafka_url_lists_the_bootstrap_servers() -> None:
    assert parse_kafka_url("kafka://a:9092,b.svc:9093") == "a:9092,b.svc:9093"
    assert parse_kafka_url("kafka://my-cluster-kafka-bootstrap:9092/") == (
        "my-cluster-kafka-bootstrap:9092"
    )


@pytest.mark.parametrize("url", ["kafka://", "kafka://host", "kafka://host:0", "kafka://a:1,b"])
def test_a_kafka_url_without_host_and_port_is_refused_with_the_form(url: str) -> None:
    with pytest.raises(ConfigError, match=r"kafka://host:port"):
        parse_kafka_url(url)


def test_eddyline_keys_are_taken_out_of_the_client_settings() -> None:
    settings = kafka_log_settings(
        "kafka://k:9092",
        {"replication.factor": "3", "min.insync.replicas": 2, "security.protocol": "SSL"},
    )
    assert (settings.replication_factor, settings.min_insync_replicas) == (3, 2)
    assert dict(settings.client) == {"security.protocol": "SSL"}
    assert kafka_log_settings("kafka://k:9092", {}).replication_factor == -1


@pytest.mark.parametrize(
    "bad", [{"replication.factor": "0"}, {"replication.factor": "x"}, {"min.insync.replicas": "0"}]
)
def test_bad_replication_settings_name_the_key(bad: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad)).replace(".", r"\.")):
        kafka_log_settings("kafka://k:9092", bad)


def test_a_strimzi_scram_user_secret_becomes_librdkafka_settings() -> None:
    settings = kafka_log_settings(
        "kafka://k:9092",
        {
            "password": "s3cr3t",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
            'required username="word-count" password="s3cr3t";',
            "security.protocol": "SASL_SSL",
        },
    )
    assert dict(settings.client) == {
        "sasl.username": "word-count",
        "sasl.password": "s3cr3t",
        "security.protocol": "SASL_SSL",
    }


def test_a_strimzi_tls_user_secret_becomes_pem_settings() -> None:
    settings = kafka_log_settings(
        "kafka://k:9093",
        {"user.crt": "CERT", "user.key": "KEY", "user.p12": "P12", "user.password": "pw"},
    )
    assert dict(settings.client) == {"ssl.certificate.pem": "CERT", "ssl.key.pem": "KEY"}


def test_secret_values_are_redacted_and_never_in_errors() -> None:
    settings = kafka_log_settings(
        "kafka://k:9092", {"sasl.password": "hunter2", "ssl.key.pem": "KEY", "sasl.username": "u"}
    )
    assert settings.redacted() == {
        "sasl.password": "***",
        "ssl.key.pem": "***",
        "sasl.username": "u",
    }
    with pytest.raises(ConfigError) as raised:
        kafka_log_settings("kafka://k:9092", {"sasl.jaas.config": "password=hunter2"})
    assert "hunter2" not in str(raised.value)


def test_bootstrap_servers_in_the_settings_must_agree_with_the_url() -> None:
    with pytest.raises(ConfigError, match=r"spec\.log\.url"):
        kafka_log_settings("kafka://a:9092", {"bootstrap.servers": "b:9092"})


def test_a_mounted_secret_directory_is_one_setting_per_file(tmp_path: Path) -> None:
    (tmp_path / "security.protocol").write_text("SASL_SSL\n")
    (tmp_path / "sasl.password").write_text("s3cr3t")
    (tmp_path / "..data").mkdir()  # what the kubelet adds beside the keys
    assert read_client_settings(tmp_path) == {
        "sasl.password": "s3cr3t",
        "security.protocol": "SASL_SSL",
    }


def test_settings_come_from_the_file_the_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert settings_from_environment() == {}
    properties = tmp_path / "kafka.properties"
    properties.write_text("# client settings\nsecurity.protocol=SSL\nlinger.ms=10\n")
    monkeypatch.setenv(LOG_SETTINGS_ENV, str(properties))
    assert settings_from_environment() == {"security.protocol": "SSL", "linger.ms": "10"}
    monkeypatch.setenv(LOG_SETTINGS_ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=LOG_SETTINGS_ENV):
        settings_from_environment()
