"""What every part of the Kafka log shares: one handle's way to the cluster.

:class:`KafkaConnection` holds the settings, the timeouts, topic naming (the
prefix, the topics last listed), the librdkafka configuration and factory of
every client kind, and the mapping of librdkafka's errors to the port's. The
parts (``reader``, ``producer``, ``admin``, ``groups``) each take the
connection and the few parts they need, never the :class:`KafkaLog` that
composes them: a property a client is created with is set here and only here.
(What the user wrote, the URL and the log Secret, is read and validated by
``log/kafka_settings.py``, which needs no librdkafka: the operator reads it.)

Every config is ``defaults`` (tuning the log settings may change), then the
log settings, then ``overrides`` (what the adapter's semantics rest on, which
no setting can change).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.log.errors import BrokerUnreachableError, LogError
from eddyline_runtime.log.kafka.errors import kafka_error, log_error
from eddyline_runtime.log.kafka_settings import KafkaLogSettings

logger = logging.getLogger(__name__)

# Metadata, admin, watermark and group-offset calls: long enough for a leader
# election or a broker restart, short enough that a wrong address fails.
REQUEST_TIMEOUT_S = 30.0
# init/commit/abort of a transaction: the broker's transaction.timeout.ms
# default (60 s) bounds how long an answer can take.
TRANSACTION_TIMEOUT_S = 60.0
# The statistics interval of transactional producers: the only place librdkafka
# reports the producer epoch; each report is a small JSON document.
EPOCH_STATS_INTERVAL_MS = 1_000
# Internal topics (__consumer_offsets, __transaction_state) are not the app's.
INTERNAL_PREFIX = "__"

# Client defaults the log settings may override (librdkafka's names).
PRODUCER_TUNING = {"linger.ms": 5}
READER_TUNING = {
    # Bounds how late data is seen after a seek or on an idle partition.
    "fetch.wait.max.ms": 100,
    # librdkafka's own prefetch queue, on top of the per-partition buffers.
    "queued.max.messages.kbytes": 32_768,
}
# What the reader's semantics rest on (the settings cannot change these).
READER_CONFIG = {
    # Required by librdkafka; this consumer never joins or commits.
    "group.id": "eddyline-reader",
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": False,
    "auto.offset.reset": "error",
    "allow.auto.create.topics": False,
}
# Watermark queries go over their own connection: a broker answers one
# connection's requests in order, so behind the reader's long-polling fetch
# they would wait up to fetch.wait.max.ms.
OFFSETS_CONFIG = {
    "group.id": "eddyline-reader",
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "allow.auto.create.topics": False,
}


class KafkaClients:
    """Makes the librdkafka clients; the boundary tests replace with a fake."""

    def producer(self, config: Mapping[str, Any]) -> Producer:
        return Producer(dict(config))

    def consumer(self, config: Mapping[str, Any]) -> Consumer:
        return Consumer(dict(config))

    def admin(self, config: Mapping[str, Any]) -> AdminClient:
        return AdminClient(dict(config))


class ConnectionOptions(TypedDict, total=False):
    """:class:`KafkaConnection`'s options, as ``KafkaLog`` and ``KafkaLog.open`` take them."""

    topic_prefix: str
    clients: KafkaClients | None
    request_timeout_s: float
    transaction_timeout_s: float


class KafkaConnection:
    """One log handle's settings, timeouts, topic names, clients and error mapping.

    ``topic_prefix`` puts every topic of the handle under a prefix (topics
    without it are invisible), so runs can share a cluster in isolation;
    group ids and transactional ids are not prefixed.
    """

    def __init__(
        self,
        settings: KafkaLogSettings,
        *,
        topic_prefix: str = "",
        clients: KafkaClients | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        transaction_timeout_s: float = TRANSACTION_TIMEOUT_S,
    ) -> None:
        self.settings = settings
        self.topic_prefix = topic_prefix
        self.request_timeout_s = request_timeout_s
        self.transaction_timeout_s = transaction_timeout_s
        self._clients = clients or KafkaClients()
        # Real topic name -> partition count, as the admin last listed them: what an
        # unknown topic's error offers instead.
        self.listed: dict[str, int] = {}
        # The last error any client reported: an unreachable cluster's error says it.
        self.last_client_error: str | None = None

    # -- topic names -------------------------------------------------------------------

    def real_topic(self, topic: str) -> str:
        return self.topic_prefix + topic

    def port_topic(self, real: str) -> str:
        return real[len(self.topic_prefix) :]

    def visible(self, real: str) -> bool:
        return real.startswith(self.topic_prefix) and not real.startswith(INTERNAL_PREFIX)

    def known_topics(self) -> list[str]:
        return sorted(self.port_topic(real) for real in self.listed)

    # -- clients, one factory per kind -------------------------------------------------

    def reader_consumer(self) -> Consumer:
        """A thread's ``read_committed`` consumer (manually assigned, never a member)."""
        consumer: Consumer = self._new("consumer", self._config(READER_TUNING, **READER_CONFIG))
        return consumer

    def offsets_consumer(self, *, committed: bool = True) -> Consumer:
        """A thread's consumer for watermark queries (see ``OFFSETS_CONFIG``): its high
        offset is the last stable offset, or with ``committed=False`` the high watermark
        (which counts records of transactions not decided yet, ``KafkaLog.undecided``)."""
        config = dict(OFFSETS_CONFIG)
        if not committed:
            config["isolation.level"] = "read_uncommitted"
        consumer: Consumer = self._new("consumer", self._config(**config))
        return consumer

    def plain_producer(self) -> Producer:
        """A thread's idempotent producer for the port's plain ``produce``."""
        producer: Producer = self._new(
            "producer",
            self._config(
                PRODUCER_TUNING,
                **{"enable.idempotence": True, "allow.auto.create.topics": False},
            ),
        )
        return producer

    def transactional_producer(
        self,
        transactional_id: str,
        *,
        on_statistics: Callable[[str], None],
        on_delivery: Callable[[KafkaError | None, Message], None],
        on_error: Callable[[KafkaError], None],
    ) -> Producer:
        """A producer of ``transactional_id``, reporting statistics (the epoch) every
        :data:`EPOCH_STATS_INTERVAL_MS`; ``on_error`` is to pass errors on to
        :meth:`report_client_error`."""
        producer: Producer = self._new(
            "producer",
            self._config(
                {
                    **PRODUCER_TUNING,
                    "transaction.timeout.ms": int(self.transaction_timeout_s * 1000),
                },
                **{
                    "transactional.id": transactional_id,
                    "allow.auto.create.topics": False,
                    "statistics.interval.ms": EPOCH_STATS_INTERVAL_MS,
                    "stats_cb": on_statistics,
                    "on_delivery": on_delivery,
                    "error_cb": on_error,
                },
            ),
        )
        return producer

    def group_consumer(self, group: str) -> Consumer:
        """A consumer of ``group``'s offsets; it never joins the group."""
        consumer: Consumer = self._new(
            "consumer",
            self._config(
                **{
                    "group.id": group,
                    "enable.auto.commit": False,
                    # committed() must not wait for open transactions: the runtime
                    # starts a task's producer, which settles its predecessor's
                    # transaction, before it reads offsets.
                    "isolation.level": "read_uncommitted",
                    "allow.auto.create.topics": False,
                }
            ),
        )
        return consumer

    def admin(self) -> AdminClient:
        client: AdminClient = self._new("admin", self._config())
        return client

    def _config(
        self, defaults: Mapping[str, Any] | None = None, /, **overrides: Any
    ) -> dict[str, Any]:
        return {
            **(defaults or {}),
            "bootstrap.servers": self.settings.bootstrap,
            **self.settings.client,
            "logger": logger,
            "error_cb": self.report_client_error,
            **overrides,
        }

    def _new(self, kind: str, config: Mapping[str, Any]) -> Any:
        try:
            return getattr(self._clients, kind)(config)
        except KafkaException as exc:
            error = kafka_error(exc)
            # librdkafka names the property it rejects; values are never echoed.
            raise ConfigError(
                "spec.log.secretName",
                "(hidden)",
                "librdkafka client properties (docs/kafka.md lists the usual ones)",
                hint=error.str() if error is not None else str(exc),
            ) from None

    # -- errors ------------------------------------------------------------------------

    def report_client_error(self, error: KafkaError) -> None:
        """Every client's error callback: logged, and kept for the next error message."""
        self.last_client_error = error.str()
        logger.warning("Kafka client error: %s", error.str())

    def error(
        self,
        problem: KafkaException | KafkaError,
        *,
        action: str,
        acl: str | None = None,
        group: str | None = None,
        transactional_id: str | None = None,
    ) -> LogError:
        """The port's error for a librdkafka error met while doing ``action``."""
        return log_error(
            problem,
            action=action,
            bootstrap=self.settings.bootstrap,
            timeout_s=self.request_timeout_s,
            known_topics=self.known_topics,
            last_client_error=self.last_client_error,
            acl=acl,
            group=group,
            transactional_id=transactional_id,
        )

    def unreachable(
        self, detail: str | None, timeout_s: float | None = None
    ) -> BrokerUnreachableError:
        """The cluster gave no answer within ``timeout_s`` (the request timeout by default)."""
        waited = self.request_timeout_s if timeout_s is None else timeout_s
        return BrokerUnreachableError(self.settings.bootstrap, waited, detail)
