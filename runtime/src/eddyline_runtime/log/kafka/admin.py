"""Topics on the cluster: metadata, partition checks, creation, cleanup policies.

Topics are created with the admin client (changelogs compacted, the
replication factor and ``min.insync.replicas`` from the settings); an
existing topic is checked for its partition count and cleanup policy, and
never altered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.cimpl import NewTopic

from eddyline_runtime.log.errors import (
    BrokerUnreachableError,
    InvalidTopicError,
    TopicConflictError,
    UnknownTopicError,
)
from eddyline_runtime.log.kafka.errors import kafka_error
from eddyline_runtime.log.port import TopicSpec
from eddyline_runtime.partitions import TopicPartition

if TYPE_CHECKING:
    from eddyline_runtime.log.kafka.log import KafkaLog

# Internal topics (__consumer_offsets, __transaction_state) are not the app's.
INTERNAL_PREFIX = "__"


class KafkaTopics:
    """One log handle's view of the cluster's topics, cached between metadata requests."""

    def __init__(self, log: KafkaLog) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._client: AdminClient | None = None
        # Real topic name -> partition count, and -> compacted, as last seen.
        self.partition_counts: dict[str, int] = {}
        self.compacted: dict[str, bool] = {}

    def client(self) -> AdminClient:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    log = self._log
                    self._client = log.new_client("admin", log.client_config())
        assert self._client is not None
        return self._client

    def close(self) -> None:
        self._client = None

    def visible(self, real: str) -> bool:
        return real.startswith(self._log.topic_prefix) and not real.startswith(INTERNAL_PREFIX)

    def known(self) -> list[str]:
        return sorted(self._log.port_topic(real) for real in self.partition_counts)

    def refresh(self) -> dict[str, int]:
        """Partition counts of every visible topic (one Metadata request)."""
        log = self._log
        try:
            metadata = self.client().list_topics(timeout=log.request_timeout_s)
        except KafkaException as exc:
            raise log.error(exc, action="listing topics", acl="DESCRIBE on the topics") from None
        counts = {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None and self.visible(name)
        }
        self.partition_counts = counts
        return counts

    def check_partition(self, tp: TopicPartition) -> str:
        """The partition's real topic name, after checking the partition exists."""
        real = self._log.real_topic(tp.topic)
        count = self.partition_counts.get(real)
        if count is None or tp.partition >= count:
            count = self.refresh().get(real)
        if count is None:
            raise UnknownTopicError(f'topic "{tp.topic}"', self.known())
        if not 0 <= tp.partition < count:
            raise UnknownTopicError(f"partition {tp} (topic has {count} partitions)", self.known())
        return real

    def topic_id(self, tp: TopicPartition) -> str:
        """The topic's id (KIP-516), looked up by name each time: a topic deleted and
        created again, by anyone, has another id, so a store kept beside the old one's
        offsets is rebuilt (``Log.partition_epoch``)."""
        real = self.check_partition(tp)
        try:
            futures = self.client().describe_topics(
                TopicCollection([real]), request_timeout=self._log.request_timeout_s
            )
            return str(futures[real].result().topic_id)
        except KafkaException as exc:
            raise self._log.error(
                exc, action=f'describing topic "{tp.topic}"', acl=f'DESCRIBE on topic "{real}"'
            ) from None

    def cleanup_compacted(self, reals: Sequence[str]) -> dict[str, bool]:
        """Whether each topic's cleanup.policy includes compact (one DescribeConfigs)."""
        missing = [real for real in reals if real not in self.compacted]
        if missing:
            resources = [ConfigResource("topic", real) for real in missing]
            try:
                futures = self.client().describe_configs(
                    resources, request_timeout=self._log.request_timeout_s
                )
                for resource, future in futures.items():
                    entry = future.result().get("cleanup.policy")
                    policy = entry.value if entry is not None and entry.value else "delete"
                    self.compacted[resource.name] = "compact" in policy.split(",")
            except KafkaException as exc:
                raise self._log.error(
                    exc,
                    action=f"reading the configuration of {', '.join(missing)}",
                    acl="DESCRIBE_CONFIGS on the topics",
                ) from None
        return {real: self.compacted[real] for real in reals}

    def topics(self) -> Mapping[str, TopicSpec]:
        counts = self.refresh()
        compacted = self.cleanup_compacted(sorted(counts))
        port_topic = self._log.port_topic
        return {
            port_topic(real): TopicSpec(port_topic(real), count, compacted[real])
            for real, count in counts.items()
        }

    def existing(self, real: str) -> TopicSpec | None:
        count = self.refresh().get(real)
        if count is None:
            return None
        compacted = self.cleanup_compacted([real])[real]
        return TopicSpec(self._log.port_topic(real), count, compacted)

    def create(self, name: str, partitions: int, *, compacted: bool = False) -> TopicSpec:
        if partitions < 1:
            raise InvalidTopicError(name, f"needs at least 1 partition, got {partitions}")
        log = self._log
        real = log.real_topic(name)
        requested = TopicSpec(name, partitions, compacted)
        existing = self.existing(real)
        if existing is None:
            config = {"cleanup.policy": "compact" if compacted else "delete"}
            if log.settings.min_insync_replicas is not None:
                config["min.insync.replicas"] = str(log.settings.min_insync_replicas)
            topic = NewTopic(
                real,
                num_partitions=partitions,
                replication_factor=log.settings.replication_factor,
                config=config,
            )
            futures = self.client().create_topics(
                [topic],
                request_timeout=log.request_timeout_s,
                operation_timeout=log.request_timeout_s,
            )
            try:
                futures[real].result()
            except KafkaException as exc:
                error = kafka_error(exc)
                if error is None or error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise log.error(
                        exc,
                        action=f'creating topic "{name}"',
                        acl=f'CREATE on topic "{real}" (or on the cluster)',
                    ) from None
                existing = self.existing(real)  # someone else created it meanwhile
            else:
                self.compacted[real] = compacted
                self._await_topic(real, partitions)
                return requested
        if existing is None or existing == requested:
            return requested
        raise TopicConflictError(
            name, _describe(existing), _describe(requested), _conflict_fix(real, requested)
        )

    def _await_topic(self, real: str, partitions: int) -> None:
        """Topic creation propagates to the brokers' metadata asynchronously."""
        log = self._log
        deadline = time.monotonic() + log.request_timeout_s
        while self.refresh().get(real) != partitions:
            if time.monotonic() > deadline:
                raise BrokerUnreachableError(
                    log.settings.bootstrap, log.request_timeout_s, f'topic "{real}" never appeared'
                )
            time.sleep(0.05)


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
