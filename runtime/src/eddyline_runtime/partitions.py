"""Topic partitions and tasks: the addresses eddyline keeps offsets and state under.

A changelog offset kept by a state store, an input offset committed by a task
and a KIP-796 position all name a partition of a topic; they share this type.
A task (a sub-topology on one partition) is what the assignor hands out and
what names a state directory. A logged store's changelog topic is named here
too (:func:`changelog_topic`): the topology's layout creates it, stores read
their offsets in it from Kafka Streams' ``.checkpoint`` files, and the restore
commands read it, so the name must be spelled once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from eddyline_runtime.errors import InvalidArgumentError


class TopicPartition(NamedTuple):
    """One partition of one topic, e.g. ``TopicPartition("app-counts-changelog", 3)``."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


# Kafka Streams' name for a changelog, so its tools (and its .checkpoint files) name the same topic.
_CHANGELOG_SUFFIX = "-changelog"


def changelog_topic(application_id: str, store: str) -> str:
    """The compacted topic a logged store writes its changes to:
    ``<application.id>-<store>-changelog``."""
    return f"{application_id}-{store}{_CHANGELOG_SUFFIX}"


def is_changelog_of(topic: str, store: str) -> bool:
    """Whether ``topic`` is ``store``'s changelog in some application.

    For readers that do not know the application id (a store reading a task's
    ``.checkpoint``, which names every store's changelog of that task).
    """
    return topic.endswith(f"-{store}{_CHANGELOG_SUFFIX}")


# Kafka's murmur2 constants (its default partitioner): keys land on the same
# partitions as Kafka clients would put them, so topics can be shared.
_MURMUR2_SEED = 0x9747B28C
_MURMUR2_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit hash of ``data``."""
    length = len(data)
    h = (_MURMUR2_SEED ^ length) & _MASK32
    body = length - length % 4
    for start in range(0, body, 4):
        k = int.from_bytes(data[start : start + 4], "little")
        k = (k * _MURMUR2_M) & _MASK32
        k ^= k >> 24
        k = (k * _MURMUR2_M) & _MASK32
        h = ((h * _MURMUR2_M) & _MASK32) ^ k
    tail = data[body:]
    if tail:
        for index in range(len(tail) - 1, -1, -1):
            h ^= tail[index] << (8 * index)
        h = (h * _MURMUR2_M) & _MASK32
    h ^= h >> 13
    h = (h * _MURMUR2_M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default partitioner gives a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


@dataclass(frozen=True, order=True)
class TaskId:
    """A task: one sub-topology on one partition, written ``<sub-topology>_<partition>``."""

    subtopology: int
    partition: int

    def __str__(self) -> str:
        return f"{self.subtopology}_{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        subtopology, _, partition = text.partition("_")
        try:
            return cls(int(subtopology), int(partition))
        except ValueError:
            raise InvalidArgumentError(
                f'"{text}" is not a task id; task ids are <sub-topology>_<partition>, e.g. 0_1'
            ) from None
