"""The log port's ranged read (``fetch_changes_between``), run on every adapter of the contract
suite: what parallel changelog readers (Spark restore tasks) rely on."""

from __future__ import annotations

import pytest

from eddyline_runtime.log import Log, OffsetOutOfRangeError, Record
from eddyline_runtime.partitions import TopicPartition
from tests.unit.log.test_log_contract import log, open_again, rec

__all__ = ["log", "open_again"]  # fixtures, shared with the contract suite


def test_fetch_changes_between_gives_keyed_changes_with_offsets_inside_the_range(
    log: Log,
) -> None:
    # Not compacted: Kafka refuses keyless records on compacted topics.
    log.create_topic("changes", 1)
    tp = TopicPartition("changes", 0)
    log.produce(
        tp,
        [rec(b"1", key=b"a"), rec(b"x", key=None), Record(b"b", None, 1), rec(b"2"), rec(b"3")],
    )
    # The adapter's own read and the port's default (through fetch) agree.
    for fetch in (
        log.fetch_changes_between,
        lambda *a, **k: Log.fetch_changes_between(log, *a, **k),
    ):
        inside = fetch(tp, 0, 4)
        assert list(inside.offsets) == [0, 2, 3]
        assert list(inside.keys) == [b"a", b"b", b"k"]
        assert list(inside.values) == [b"1", None, b"2"]
        assert inside.last_offset == 3  # the end is exclusive even while more records follow
        limited = fetch(tp, 0, 4, max_records=2)
        assert (list(limited.offsets), limited.last_offset) == ([0], 1)  # keyless 1 was read
        only_keyless = fetch(tp, 1, 2)
        assert (list(only_keyless.keys), only_keyless.last_offset) == ([], 1)
        assert fetch(tp, 4, 4).last_offset == -1  # an empty range reads nothing
        assert fetch(tp, 5, 9).last_offset == -1  # nothing at the end yet
    with pytest.raises(OffsetOutOfRangeError):
        log.fetch_changes_between(tp, 6, 9)
