"""Consumer groups' offsets: one consumer per group, which never joins it.

The runtime assigns partitions itself (no group rebalance), so a group is
only where offsets are kept: read with ``committed``, written with ``commit``
by the plain path, and by a transaction through ``send_offsets_to_transaction``
with the group's metadata (:meth:`KafkaGroups.metadata`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaPartition

from eddyline_runtime.log.kafka.connection import KafkaConnection
from eddyline_runtime.log.kafka.errors import coordinator_moving, kafka_error


class KafkaGroups:
    """The groups one log handle read or wrote offsets of, each with its consumer."""

    def __init__(self, connection: KafkaConnection) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._consumers: dict[str, Consumer] = {}
        self._metadata: dict[str, Any] = {}

    def _consumer(self, group: str) -> Consumer:
        consumer = self._consumers.get(group)
        if consumer is None:
            with self._lock:
                consumer = self._consumers.get(group)
                if consumer is None:
                    consumer = self._consumers[group] = self._connection.group_consumer(group)
        return consumer

    def metadata(self, group: str) -> Any:
        """The consumer group metadata ``send_offsets_to_transaction`` needs.

        Kept per group: the group's consumer never joins it (no member id, no generation),
        so its metadata never changes, and each commit need not ask librdkafka again."""
        metadata = self._metadata.get(group)
        if metadata is None:
            metadata = self._metadata[group] = self._consumer(group).consumer_group_metadata()
        return metadata

    def committed(self, group: str, wanted: list[KafkaPartition]) -> list[KafkaPartition]:
        """The group's committed offsets of ``wanted`` (negative: none committed)."""
        consumer = self._consumer(group)
        timeout_s = self._connection.request_timeout_s
        return self._request(
            group,
            f'reading the offsets of group "{group}"',
            lambda: consumer.committed(wanted, timeout=timeout_s),
        )

    def commit(self, group: str, offsets: list[KafkaPartition]) -> None:
        consumer = self._consumer(group)
        self._request(
            group,
            f'committing offsets of group "{group}"',
            lambda: consumer.commit(offsets=offsets, asynchronous=False) or [],
        )

    def _request(
        self, group: str, action: str, request: Callable[[], list[KafkaPartition]]
    ) -> list[KafkaPartition]:
        """A request to the group's coordinator, repeated while the coordinator is
        loading or moving (a new cluster, a broker restart, a leader change) and
        librdkafka did not retry it itself, for at most the request timeout."""
        deadline = time.monotonic() + self._connection.request_timeout_s
        while True:
            problem: KafkaException | KafkaError | None = None
            try:
                partitions = request()
            except KafkaException as exc:
                problem = exc
            else:
                problem = next((tp.error for tp in partitions if tp.error is not None), None)
                if problem is None:
                    return partitions
            error = problem if isinstance(problem, KafkaError) else kafka_error(problem)
            if not coordinator_moving(error) or time.monotonic() > deadline:
                raise self._connection.error(problem, action=action, group=group) from None
            time.sleep(0.1)

    def close(self) -> None:
        with self._lock:
            consumers, self._consumers = self._consumers, {}
            self._metadata = {}
        for consumer in consumers.values():
            consumer.close()
