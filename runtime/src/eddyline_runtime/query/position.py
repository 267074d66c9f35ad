"""Queries bounded by position (Kafka's ``PositionBound``, KIP-796).

A store copy's *position* is, per input partition, the offset of the last
input record its data reflects. A query may name the position it must
reflect (say, the offset its own write got): a copy that has not reached it
answers "not yet" instead of older data (HTTP 409 with the position reached
so far; :class:`PositionNotReachedError` in Python), and the router tries
another copy. With a bound, a standby copy that reached it is as good as the
active one: the bound, not the lag, says what is fresh enough.

Over HTTP a bound is ``position_bound=TOPIC:PARTITION:OFFSET[,...]``; in JSON
a position is ``{"topic": {"partition": offset}}`` as Kafka's ``Position``
prints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eddyline_runtime.errors import EddylineError, InvalidArgumentError
from eddyline_runtime.partitions import TopicPartition

Position = Mapping[TopicPartition, int]

# The query parameter a bound travels in.
POSITION_BOUND_PARAMETER = "position_bound"


class PositionNotReachedError(EddylineError):
    """No copy of the store reflects the bound yet; ``reached`` is the best position seen."""

    def __init__(self, store: str, bound: Position, reached: Position) -> None:
        self.store = store
        self.bound = dict(bound)
        self.reached = dict(reached)
        missing = ", ".join(
            f"{tp} at {offset} (reached {reached.get(tp, 'nothing')})"
            for tp, offset in sorted(unreached(reached, bound).items())
        )
        super().__init__(
            f'no copy of store "{store}" has reached the position bound yet: {missing}; '
            "retry shortly (the copies are still processing up to it)"
        )


def parse_position_bound(text: str) -> dict[TopicPartition, int]:
    """``TOPIC:PARTITION:OFFSET[,...]`` as a position; an error naming the form otherwise."""
    bound: dict[TopicPartition, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        topic, _, rest = item.rpartition(":")
        topic, _, partition = topic.rpartition(":")
        if not topic or not partition.isdigit() or not rest.lstrip("-").isdigit():
            raise InvalidArgumentError(
                f"{POSITION_BOUND_PARAMETER} {text!r}: each item must be TOPIC:PARTITION:OFFSET "
                "(e.g. orders:0:41,orders:1:17)"
            )
        bound[TopicPartition(topic, int(partition))] = int(rest)
    return bound


def format_position_bound(bound: Position) -> str:
    return ",".join(f"{tp.topic}:{tp.partition}:{offset}" for tp, offset in sorted(bound.items()))


def unreached(position: Position, bound: Position) -> dict[TopicPartition, int]:
    """The partitions of ``bound`` that ``position`` has not reached, with the bound's offset."""
    return {tp: offset for tp, offset in bound.items() if position.get(tp, -1) < offset}


def position_to_json(position: Position) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tp, offset in sorted(position.items()):
        out.setdefault(tp.topic, {})[str(tp.partition)] = offset
    return out


def position_from_json(data: Any) -> dict[TopicPartition, int]:
    if not isinstance(data, dict):
        return {}
    return {
        TopicPartition(str(topic), int(partition)): int(offset)
        for topic, partitions in data.items()
        if isinstance(partitions, dict)
        for partition, offset in partitions.items()
    }
