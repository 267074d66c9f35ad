"""Topics on the cluster: metadata, partition checks, creation, cleanup policies.

Topics are created with the admin client (changelogs compacted, the
replication factor and ``min.insync.replicas`` from the settings); an
existing topic is checked for its partition count and cleanup policy, and
never altered, except for its retention (``Log.set_topic_retention``: window
and session store changelogs), which eddyline sets with IncrementalAlterConfigs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.cimpl import NewTopic

from eddyline_runtime.log.errors import (
    InvalidTopicError,
    LogAuthorizationError,
    TopicConflictError,
    UnknownTopicError,
)
from eddyline_runtime.log.kafka.connection import KafkaConnection
from eddyline_runtime.log.kafka.errors import kafka_error
from eddyline_runtime.log.port import TopicSpec
from eddyline_runtime.log.record_size import RecordSizeLimit
from eddyline_runtime.partitions import TopicPartition

_T = TypeVar("_T")
logger = logging.getLogger(__name__)
# librdkafka's default message.max.bytes: it refuses a larger record before sending it.
_CLIENT_MESSAGE_MAX_BYTES = 1_000_000


class KafkaTopics:
    """One log handle's view of the cluster's topics, cached between metadata requests."""

    def __init__(self, connection: KafkaConnection) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._client: AdminClient | None = None
        # Real topic name -> compacted, as last seen (partition counts: connection.listed).
        self.compacted: dict[str, bool] = {}
        # Real topic name -> the largest record it takes (record_size_limit).
        self._record_limits: dict[str, RecordSizeLimit | None] = {}

    def client(self) -> AdminClient:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._connection.admin()
        assert self._client is not None
        return self._client

    def close(self) -> None:
        self._client = None

    def _ask(self, request: Callable[[AdminClient, float], _T], *, action: str, acl: str) -> _T:
        """``request`` of the admin client within the request timeout; librdkafka's
        error, raised by the call or by a future it returned, as the port's."""
        connection = self._connection
        try:
            return request(self.client(), connection.request_timeout_s)
        except KafkaException as exc:
            raise connection.error(exc, action=action, acl=acl) from None

    def refresh(self) -> dict[str, int]:
        """Partition counts of every visible topic (one Metadata request)."""
        connection = self._connection
        metadata = self._ask(
            lambda admin, timeout: admin.list_topics(timeout=timeout),
            action="listing topics",
            acl="DESCRIBE on the topics",
        )
        counts = {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None and connection.visible(name)
        }
        connection.listed = counts
        return counts

    def check_partition(self, tp: TopicPartition) -> str:
        """The partition's real topic name, after checking the partition exists."""
        connection = self._connection
        real = connection.real_topic(tp.topic)
        count = connection.listed.get(real)
        if count is None or tp.partition >= count:
            count = self.refresh().get(real)
        if count is None:
            raise UnknownTopicError(f'topic "{tp.topic}"', connection.known_topics())
        if not 0 <= tp.partition < count:
            raise UnknownTopicError(
                f"partition {tp} (topic has {count} partitions)", connection.known_topics()
            )
        return real

    def topic_id(self, tp: TopicPartition) -> str:
        """The topic's id (KIP-516), looked up by name each time: a topic deleted and
        created again, by anyone, has another id, so a store kept beside the old one's
        offsets is rebuilt (``Log.partition_epoch``)."""
        real = self.check_partition(tp)

        def describe(admin: AdminClient, timeout: float) -> str:
            futures = admin.describe_topics(TopicCollection([real]), request_timeout=timeout)
            return str(futures[real].result().topic_id)

        return self._ask(
            describe, action=f'describing topic "{tp.topic}"', acl=f'DESCRIBE on topic "{real}"'
        )

    def cleanup_compacted(self, reals: Sequence[str]) -> dict[str, bool]:
        """Whether each topic's cleanup.policy includes compact (one DescribeConfigs)."""
        missing = [real for real in reals if real not in self.compacted]
        if missing:
            resources = [ConfigResource("topic", real) for real in missing]
            described = self._ask(
                lambda admin, timeout: _results(
                    admin.describe_configs(resources, request_timeout=timeout)
                ),
                action=f"reading the configuration of {', '.join(missing)}",
                acl="DESCRIBE_CONFIGS on the topics",
            )
            for resource, configs in described.items():
                self.compacted[resource.name] = "compact" in _policy(configs).split(",")
        return {real: self.compacted[real] for real in reals}

    def set_retention(self, name: str, retention_ms: int | None) -> None:
        """``retention.ms``, and the cleanup policy that makes the broker apply it.

        A compacted topic becomes ``compact,delete`` (Kafka Streams' policy for window
        and session store changelogs: compaction keeps the latest value per key, age
        deletes the old segments); ``None`` makes it ``compact`` alone again. A topic
        that is not compacted keeps ``delete`` and gets ``retention.ms`` (``-1`` for
        ``None``: never deleted). One IncrementalAlterConfigs: the topic's other
        settings, a Strimzi KafkaTopic's included, stay as they are."""
        if retention_ms is not None and (type(retention_ms) is not int or retention_ms < 0):
            raise InvalidTopicError(
                name, f"retention.ms must be a number of milliseconds >= 0, got {retention_ms!r}"
            )
        connection = self._connection
        real = self.check_partition(TopicPartition(name, 0))
        compacted = self.cleanup_compacted([real])[real]
        if compacted:
            policy = "compact,delete" if retention_ms is not None else "compact"
        else:
            policy = "delete"
        entries = [
            ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET),
            ConfigEntry(
                "retention.ms",
                str(-1 if retention_ms is None else retention_ms),
                incremental_operation=AlterConfigOpType.SET,
            ),
        ]
        resource = ConfigResource("topic", real, incremental_configs=entries)
        self._ask(
            lambda admin, timeout: _results(
                admin.incremental_alter_configs([resource], request_timeout=timeout)
            ),
            action=f'setting retention.ms={retention_ms} on topic "{name}"',
            acl=f'ALTER_CONFIGS on topic "{real}"',
        )
        # The controller accepts the change, then each broker applies it from the metadata
        # log: until then a DescribeConfigs still answers the old values. Waiting here
        # makes what the call set what topic_retention reports next.
        deadline = time.monotonic() + connection.request_timeout_s
        while self._described(name, real) != (policy, retention_ms):
            if time.monotonic() > deadline:
                raise connection.unreachable(
                    f'topic "{real}" never showed cleanup.policy={policy}, '
                    f"retention.ms={retention_ms}"
                )
            time.sleep(0.05)

    def retention(self, name: str) -> int | None:
        """The topic's ``retention.ms`` when its cleanup policy deletes by age, else None
        (a compacted topic without ``delete``, or ``retention.ms=-1``, keeps its records)."""
        real = self.check_partition(TopicPartition(name, 0))
        policy, retention = self._described(name, real)
        return retention if "delete" in policy.split(",") else None

    def record_size_limit(self, name: str) -> RecordSizeLimit | None:
        """The topic's ``max.message.bytes``, or the producer's ``message.max.bytes``
        (librdkafka refuses a larger record itself) when that is smaller. Asked once per
        topic (DescribeConfigs) and kept: a limit raised later is seen by the next log
        handle, a restarted app; one lowered later is caught by the broker as before.
        None, said once, when the app may not read the topic's configuration: the check
        is a courtesy, and an app that ran without that ACL before keeps running."""
        real = self.check_partition(TopicPartition(name, 0))
        if real in self._record_limits:
            return self._record_limits[real]
        acl = f'DESCRIBE_CONFIGS on topic "{real}"'
        try:
            described = self._ask(
                lambda admin, timeout: _results(
                    admin.describe_configs([ConfigResource("topic", real)], request_timeout=timeout)
                ),
                action=f'reading the configuration of topic "{name}"',
                acl=acl,
            )
        except LogAuthorizationError:
            logger.warning(
                'records to topic "%s" are not checked against its max.message.bytes: the '
                "app lacks %s, so a record the broker refuses stops the task instead of "
                "reaching production.exception.handler; grant it to have them handled",
                name,
                acl,
            )
            self._record_limits[real] = None
            return None
        entry = next(iter(described.values())).get("max.message.bytes")
        # The broker's default (message.max.bytes, 1 MB + 12) when a topic sets none.
        topic_limit = int(entry.value) if entry is not None and entry.value else 1_048_588
        client_limit = int(
            self._connection.settings.client.get("message.max.bytes", _CLIENT_MESSAGE_MAX_BYTES)
        )
        limit = (
            RecordSizeLimit(topic_limit, "max.message.bytes")
            if topic_limit <= client_limit
            else RecordSizeLimit(client_limit, "message.max.bytes (log settings)")
        )
        self._record_limits[real] = limit
        return limit

    def _described(self, name: str, real: str) -> tuple[str, int | None]:
        """(cleanup.policy, retention.ms or None for -1) as a broker describes them."""
        described = self._ask(
            lambda admin, timeout: _results(
                admin.describe_configs([ConfigResource("topic", real)], request_timeout=timeout)
            ),
            action=f'reading the configuration of topic "{name}"',
            acl=f'DESCRIBE_CONFIGS on topic "{real}"',
        )
        configs = next(iter(described.values()))
        policy = _policy(configs)
        retention_entry = configs.get("retention.ms")
        retention = int(retention_entry.value or -1) if retention_entry is not None else -1
        return policy, None if retention < 0 else retention

    def topics(self) -> Mapping[str, TopicSpec]:
        counts = self.refresh()
        compacted = self.cleanup_compacted(sorted(counts))
        port_topic = self._connection.port_topic
        return {
            port_topic(real): TopicSpec(port_topic(real), count, compacted[real])
            for real, count in counts.items()
        }

    def existing(self, real: str) -> TopicSpec | None:
        count = self.refresh().get(real)
        return None if count is None else self._spec(real, count)

    def _spec(self, real: str, count: int) -> TopicSpec:
        compacted = self.cleanup_compacted([real])[real]
        return TopicSpec(self._connection.port_topic(real), count, compacted)

    def create(self, name: str, partitions: int, *, compacted: bool = False) -> TopicSpec:
        if partitions < 1:
            raise InvalidTopicError(name, f"needs at least 1 partition, got {partitions}")
        connection = self._connection
        real = connection.real_topic(name)
        requested = TopicSpec(name, partitions, compacted)
        existing = self.existing(real)
        if existing is None:
            config = {"cleanup.policy": "compact" if compacted else "delete"}
            if connection.settings.min_insync_replicas is not None:
                config["min.insync.replicas"] = str(connection.settings.min_insync_replicas)
            topic = NewTopic(
                real,
                num_partitions=partitions,
                replication_factor=connection.settings.replication_factor,
                config=config,
            )
            futures = self.client().create_topics(
                [topic],
                request_timeout=connection.request_timeout_s,
                operation_timeout=connection.request_timeout_s,
            )
            try:
                futures[real].result()
            except KafkaException as exc:
                error = kafka_error(exc)
                if error is None or error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise connection.error(
                        exc,
                        action=f'creating topic "{name}"',
                        acl=f'CREATE on topic "{real}" (or on the cluster)',
                    ) from None
                # Someone else created it meanwhile. The controller that refused ours knows
                # it, but the broker answering our metadata may not list it yet (a real
                # KRaft broker: 48 of 300 losers of a creation race read it missing at
                # once): wait for it, so its shape is checked and the caller's next listing
                # has it (pods racing to create the word count's output topic once left one
                # without it, and its stream thread failed with KeyError: 'word-counts').
                existing = self._spec(real, self._await_topic(real))
            else:
                self.compacted[real] = compacted
                self._await_topic(real, partitions)
                return requested
        if existing == requested:
            return requested
        raise TopicConflictError(
            name, _describe(existing), _describe(requested), _conflict_fix(real, requested)
        )

    def _await_topic(self, real: str, partitions: int | None = None) -> int:
        """Topic creation propagates to the brokers' metadata asynchronously: wait until the
        topic is listed (with ``partitions``, when given); returns its partition count."""
        connection = self._connection
        deadline = time.monotonic() + connection.request_timeout_s
        while True:
            count = self.refresh().get(real)
            if count is not None and (partitions is None or count == partitions):
                return count
            if time.monotonic() > deadline:
                raise connection.unreachable(f'topic "{real}" never appeared')
            time.sleep(0.05)


def _results(futures: Mapping[Any, Any]) -> dict[Any, Any]:
    """Each admin future's result, by its key (raising the first failure)."""
    return {key: future.result() for key, future in futures.items()}


def _policy(configs: Mapping[str, Any]) -> str:
    """A described topic's cleanup.policy (the broker's default when unset: delete)."""
    entry = configs.get("cleanup.policy")
    return entry.value if entry is not None and entry.value else "delete"


def _describe(spec: TopicSpec) -> str:
    kind = "compacted" if spec.compacted else "not compacted"
    return f"{spec.partitions} partitions, {kind}"


def _conflict_fix(real: str, requested: TopicSpec) -> str:
    policy = "compact" if requested.compacted else "delete"
    return (
        f"eddyline never alters an existing topic: delete it (kafka-topics.sh --delete "
        f"--topic {real}) so eddyline creates it, or make it {requested.partitions} "
        f"partitions with cleanup.policy={policy} (Strimzi: the KafkaTopic's spec.partitions "
        "and spec.config)"
    )
