"""The key-value aggregation's batch helpers (``processing/operators/aggregations.py``)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from eddyline_runtime.processing.operators.aggregations import _first_and_last_index


@pytest.mark.parametrize("distinct", [1, 3, 16, 17, 200])
def test_each_keys_first_and_last_record_are_found_however_many_keys_a_batch_has(
    distinct: int,
) -> None:
    rng = random.Random(distinct)
    keys: list[bytes | None] = [b"k%d" % rng.randrange(distinct) for _ in range(2_000)]
    keys += [b"rare"]  # a key first and last seen at the very end
    indices = range(5, 5 + len(keys))  # the input records' indices, not positions
    first, last = _first_and_last_index(keys, indices, Counter(keys))
    for key in set(keys):
        positions = [i for i, k in enumerate(keys) if k == key]
        assert first[key] == indices[positions[0]] and last[key] == indices[positions[-1]], key
