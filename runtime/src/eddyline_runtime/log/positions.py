"""Where a consumer group reads an input partition next: one rule for every reader.

A group resumes at its committed offset. Where it has none (a new
application, or a partition it never committed) it starts at the partition's
*beginning* offset, as a Kafka consumer with ``auto.offset.reset=earliest``
does. That is 0 only until retention or ``delete_records`` truncates the
partition, so nothing may count from 0 instead: the engine starts its tasks
here, and ``eddyline run --until-caught-up`` and the demo call an input caught
up when this position reaches the end offset. Counting from 0, they would wait
for records the log no longer holds, which the engine never reads nor commits.
"""

from __future__ import annotations

from collections.abc import Sequence

from eddyline_runtime.log.port import Log
from eddyline_runtime.partitions import TopicPartition


def read_positions(
    log: Log, group: str, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, int]:
    """The next offset ``group`` reads in each of ``partitions``: its committed offset,
    else the partition's beginning offset."""
    committed = log.committed_offsets(group, partitions)
    return {tp: committed[tp] if tp in committed else log.beginning_offset(tp) for tp in partitions}
