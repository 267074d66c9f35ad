"""Where the Kafka log is and how to reach it: the URL, and the client settings.

A StreamApp names its log by URL (``kafka://host:port,host:port``) and, on a
cluster, the Secret holding the client settings (``spec.log.secretName``):
SASL and TLS settings under librdkafka's own names (``security.protocol``,
``sasl.mechanism``, ``sasl.username``, ``sasl.password``, ``ssl.ca.pem``, ...).
The pod sees that Secret as a directory (one file per key) or a
``.properties`` file, named by the environment variable
:data:`LOG_SETTINGS_ENV`; tests and tools pass a mapping instead.

Two keys are eddyline's, not librdkafka's, and are taken out before the
client sees the settings: ``replication.factor`` and ``min.insync.replicas``
for the topics eddyline creates (Kafka Streams' names; the broker's defaults
when absent).

A Strimzi ``KafkaUser`` Secret works as it is: its ``sasl.jaas.config`` (SCRAM
users) becomes ``sasl.username`` and ``sasl.password``, its ``user.crt`` and
``user.key`` (TLS users) become ``ssl.certificate.pem`` and ``ssl.key.pem``;
the keys meant for Java clients (``password``, ``user.p12``, ``user.password``)
are dropped.

Nothing here ever prints a value: :meth:`KafkaLogSettings.redacted` masks
every value whose key looks secret, and errors name keys only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from eddyline_runtime.config import read_settings_file
from eddyline_runtime.errors import ConfigError

KAFKA_SCHEME = "kafka://"
# The pod's environment names the mounted log Secret (a directory, one file per
# key) or a .properties file with the client settings.
LOG_SETTINGS_ENV = "EDDYLINE_LOG_SETTINGS"

_REPLICATION_FACTOR = "replication.factor"
_MIN_INSYNC_REPLICAS = "min.insync.replicas"
# Keys a Strimzi KafkaUser Secret carries for Java clients only.
_JAVA_ONLY_KEYS = frozenset({"password", "user.p12", "user.password"})
_STRIMZI_PEM_KEYS = {"user.crt": "ssl.certificate.pem", "user.key": "ssl.key.pem"}
_JAAS_CREDENTIAL = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')
_SECRET_KEY = re.compile(r"password|secret|jaas|token|credential|\.key|key\.pem|\.pem$", re.I)
_URL_FORM = "kafka://host:port[,host:port...], e.g. kafka://my-cluster-kafka-bootstrap:9092"
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


@dataclass(frozen=True)
class KafkaLogSettings:
    """A Kafka log's address and client settings, ready for the adapter."""

    bootstrap: str
    client: Mapping[str, str] = field(default_factory=dict)
    # -1: the broker's default.replication.factor (KIP-464), as Kafka Streams does.
    replication_factor: int = -1
    min_insync_replicas: int | None = None

    def redacted(self) -> dict[str, str]:
        """The client settings with every secret-looking value masked (for logs)."""
        return {key: "***" if is_secret_key(key) else value for key, value in self.client.items()}


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def parse_kafka_url(url: str) -> str:
    """``kafka://host:port,host:port`` -> librdkafka's ``bootstrap.servers``."""
    if not url.startswith(KAFKA_SCHEME):
        raise ConfigError("spec.log.url", url, _URL_FORM)
    servers = [part.strip() for part in url[len(KAFKA_SCHEME) :].rstrip("/").split(",")]
    bad = [server for server in servers if not _HOST_PORT.match(server)]
    if not servers or bad or any(not 0 < int(s.rsplit(":", 1)[1]) < 65536 for s in servers):
        raise ConfigError("spec.log.url", url, _URL_FORM, hint=f"not host:port: {bad}")
    return ",".join(servers)


def read_client_settings(path: Path | str) -> dict[str, str]:
    """Client settings from a mounted Secret (a directory, one file per key) or a
    ``.properties``/YAML file."""
    path = Path(path)
    if path.is_dir():
        # Kubernetes mounts a Secret as one file per key plus hidden ..data links.
        return {
            entry.name: entry.read_text(encoding="utf-8").rstrip("\n")
            for entry in sorted(path.iterdir())
            if not entry.name.startswith(".") and entry.is_file()
        }
    if not path.is_file():
        raise ConfigError(
            LOG_SETTINGS_ENV,
            str(path),
            "a directory (the mounted log Secret, one file per key) or a .properties file",
        )
    return {key: str(value) for key, value in read_settings_file(path).items()}


def settings_from_environment() -> dict[str, str]:
    """The settings file or directory :data:`LOG_SETTINGS_ENV` names; empty when unset."""
    location = os.environ.get(LOG_SETTINGS_ENV)
    return read_client_settings(location) if location else {}


def kafka_log_settings(url: str, settings: Mapping[str, object]) -> KafkaLogSettings:
    """Split settings into librdkafka's and eddyline's, translating a Strimzi KafkaUser Secret."""
    client = {key: str(value) for key, value in settings.items()}
    replication_factor = _int_setting(client.pop(_REPLICATION_FACTOR, None), _REPLICATION_FACTOR)
    min_insync = _int_setting(client.pop(_MIN_INSYNC_REPLICAS, None), _MIN_INSYNC_REPLICAS)
    if replication_factor is not None and (replication_factor == 0 or replication_factor < -1):
        raise ConfigError(
            _REPLICATION_FACTOR, replication_factor, "-1 (the broker's default) or at least 1"
        )
    if min_insync is not None and min_insync < 1:
        raise ConfigError(_MIN_INSYNC_REPLICAS, min_insync, "a number of at least 1")
    _translate_strimzi_user(client)
    bootstrap = parse_kafka_url(url)
    given = client.pop("bootstrap.servers", None)
    if given is not None and given != bootstrap:
        raise ConfigError(
            "bootstrap.servers",
            given,
            "nothing: spec.log.url names the brokers",
            hint="remove bootstrap.servers from the log settings",
        )
    return KafkaLogSettings(
        bootstrap=bootstrap,
        client=client,
        replication_factor=-1 if replication_factor is None else replication_factor,
        min_insync_replicas=min_insync,
    )


def _translate_strimzi_user(client: dict[str, str]) -> None:
    jaas = client.pop("sasl.jaas.config", None)
    if jaas is not None:
        credentials = dict(_JAAS_CREDENTIAL.findall(jaas))
        if "username" not in credentials or "password" not in credentials:
            raise ConfigError(
                "sasl.jaas.config",
                "(hidden)",
                'a JAAS line with username="..." and password="..."',
                hint="or set sasl.username and sasl.password instead",
            )
        client.setdefault("sasl.username", credentials["username"])
        client.setdefault("sasl.password", credentials["password"])
    for strimzi_key, librdkafka_key in _STRIMZI_PEM_KEYS.items():
        value = client.pop(strimzi_key, None)
        if value is not None:
            client.setdefault(librdkafka_key, value)
    for key in _JAVA_ONLY_KEYS:
        client.pop(key, None)


def _int_setting(value: str | None, key: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise ConfigError(key, value, "a whole number") from None
