"""Topic partitions: the address of every offset eddyline stores.

A changelog offset kept by a state store, an input offset committed by a task
and a KIP-796 position all name a partition of a topic; they share this type.
"""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    """One partition of one topic, e.g. ``TopicPartition("app-counts-changelog", 3)``."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"
