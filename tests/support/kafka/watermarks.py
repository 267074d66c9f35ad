"""A partition's high watermark as the broker has it, records of open transactions included:
what a test polls to see a writer's progress before the writer commits."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaPartition

# A topic created a moment ago (by the process the test watches) has partitions whose
# leader this client's metadata does not know yet, or a broker that does not lead them yet:
# the query is answered with one of these until the metadata settles, and is asked again.
_SETTLING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._TIMED_OUT,
}
SETTLE_TIMEOUT_S = 30.0


@contextlib.contextmanager
def high_watermarks(bootstrap: str) -> Iterator[Callable[[str, int], int]]:
    """``high(topic, partition)`` on one consumer asked again and again (a new consumer per
    poll would be too slow to see a write that lasts a second)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"watermarks-{uuid.uuid4().hex}",
            # librdkafka's default (read_committed) would answer the last stable offset,
            # which an open transaction holds back.
            "isolation.level": "read_uncommitted",
        }
    )

    def high(topic: str, partition: int) -> int:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            try:
                _, end = consumer.get_watermark_offsets(
                    KafkaPartition(topic, partition), timeout=10
                )
                return int(end)
            except KafkaException as failure:
                error = failure.args[0]
                settling = isinstance(error, KafkaError) and error.code() in _SETTLING
                if not settling or time.monotonic() >= deadline:
                    raise
                consumer.list_topics(topic, timeout=10)  # ask the metadata again
                time.sleep(0.2)

    try:
        yield high
    finally:
        consumer.close()
