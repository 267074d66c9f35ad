"""How the stream thread sizes and routes batches.

``record_collector.split_columns`` moves a task's outputs for one topic into the
per-partition columns a commit appends; what it must keep is each output's
key, value, timestamp and headers, in emission order per partition, next to
what earlier tasks already put there. ``task.next_process_batch`` sizes a task's
next turn: large while turns are quick, small for a slow topology, so a
commit, a punctuation or a shutdown never waits long behind one turn.
"""

from __future__ import annotations

import random

import pytest

from eddyline_runtime.engine.record_collector import split_columns
from eddyline_runtime.engine.task import (
    PROCESS_BATCH_LIMITS,
    PROCESS_SECONDS,
    next_process_batch,
)
from eddyline_runtime.log.port import RecordColumns

Headers = tuple[tuple[str, bytes], ...]
Row = tuple[bytes | None, bytes | None, int, Headers]


def outputs(count: int, *, with_headers: bool, seed: int) -> RecordColumns:
    rng = random.Random(seed)
    columns = RecordColumns()
    for i in range(count):
        columns.keys.append(None if i % 7 == 0 else b"k%d" % rng.randrange(50))
        columns.values.append(b"v%d" % i)
        columns.timestamps.append(1_000 + i)
    if with_headers:
        columns.headers = [(("n", b"%d" % i),) if i % 3 == 0 else () for i in range(count)]
    return columns


def rows(columns: RecordColumns) -> list[Row]:
    headers = columns.headers
    assert headers is None or len(headers) == len(columns.keys)
    return list(
        zip(
            columns.keys,
            columns.values,
            columns.timestamps,
            headers or [()] * len(columns.keys),
            strict=True,
        )
    )


@pytest.mark.parametrize("partition_count", [1, 2, 3, 8])
@pytest.mark.parametrize("earlier_headers", [False, True], ids=["earlier-plain", "earlier-headed"])
@pytest.mark.parametrize("with_headers", [False, True], ids=["plain", "headed"])
def test_each_partition_gets_its_outputs_in_order_after_what_it_held(
    partition_count: int, earlier_headers: bool, with_headers: bool
) -> None:
    columns = outputs(300, with_headers=with_headers, seed=partition_count)
    rng = random.Random(7)
    partitions = [rng.randrange(partition_count) for _ in columns.keys]
    earlier: Row = (b"old", b"old", 1, (("e", b"1"),) if earlier_headers else ())
    targets = {p: RecordColumns() for p in sorted(set(partitions))}
    for target in targets.values():
        target.append(*earlier)
    split_columns(columns, partitions, targets)
    everything = rows(columns)
    for p, target in targets.items():
        expected = [earlier] + [
            row for row, q in zip(everything, partitions, strict=True) if q == p
        ]
        assert rows(target) == expected, p


def test_a_turn_grows_while_quick_and_shrinks_when_slow_within_bounds() -> None:
    low, high = PROCESS_BATCH_LIMITS
    limit = 1_000
    for _ in range(10):  # a fast topology: 1 µs per record
        limit = next_process_batch(limit, limit * 1e-6)
    assert limit == high
    for _ in range(20):  # then 1 ms per record: long turns shrink
        limit = next_process_batch(limit, limit * 1e-3)
    # Turns of half to twice the target: neither too quick nor too slow.
    assert PROCESS_SECONDS / 2 <= limit * 1e-3 <= PROCESS_SECONDS * 2
    assert next_process_batch(low, 10.0) == low  # never below the floor
    assert next_process_batch(800, PROCESS_SECONDS) == 800  # on target: kept
