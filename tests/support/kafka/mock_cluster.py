"""librdkafka's built-in mock cluster, for wiring tests and benchmarks (not product code).

Faithful for produce, fetch, watermarks and group offsets only: never use it
as evidence for exactly-once (a read_committed consumer sees aborted records,
a fenced producer can still commit). The contract suite runs on a real broker
(``broker.py``).
"""

from __future__ import annotations

import logging

from confluent_kafka import Producer

logger = logging.getLogger(__name__)
_REQUEST_TIMEOUT_S = 30.0


class MockCluster:
    """librdkafka's built-in mock cluster, on local ports, for wiring tests and benchmarks.

    Faithful for produce, fetch, watermarks and group offsets; not for
    exactly-once (a read_committed consumer sees aborted records, a fenced
    producer can still commit) and its admin calls time out. Topics are
    created on first mention, with 4 partitions.
    """

    def __init__(self, brokers: int = 1) -> None:
        self._owner = Producer({"test.mock.num.brokers": brokers, "logger": logger})
        metadata = self._owner.list_topics(timeout=_REQUEST_TIMEOUT_S)
        self.bootstrap = ",".join(
            f"{broker.host}:{broker.port}" for broker in metadata.brokers.values()
        )

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def create_topic(self, name: str) -> None:
        self._owner.list_topics(topic=name, timeout=_REQUEST_TIMEOUT_S)

    def topic_names(self) -> set[str]:
        return set(self._owner.list_topics(timeout=_REQUEST_TIMEOUT_S).topics)

    def close(self) -> None:
        self._owner.flush(0)
