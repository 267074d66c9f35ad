"""Sliding-window aggregations (``SlidingWindows``), eager and with ``emit_final``.

Worked from Kafka Streams' ``KStreamSlidingWindowAggregateTest`` (apache/kafka,
streams/src/test/java/org/apache/kafka/streams/kstream/internals/): the input
sequences, timestamps and expected outputs of ``testAggregateSmallInput``,
``testReduceSmallInput``, ``testEarlyRecordsSmallInput``,
``shouldLogAndMeterWhenSkippingExpiredWindowByGrace`` and
``testAggregateRandomInput`` (there checked against fixed windows; here against
the windows the definition gives, computed by brute force) are carried over
as facts, for both emit strategies; the DSL surface follows
``SlidingWindowedKStreamImplTest``. The tests are ours.
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import (
    Processor,
    SlidingWindows,
    StreamsBuilder,
    TimeWindow,
    Topology,
    TopologyError,
    Windowed,
)
from tests.support.stores import StoreFactory

STORE = "topic-Canonized"


def string_adder(_key: Any, value: str, aggregate: str) -> str:
    """Kafka's MockAggregator.TOSTRING_ADDER."""
    return f"{aggregate}+{value}"


def sliding_topology(
    windows: SlidingWindows, emit_final: bool = False, reduce: bool = False
) -> Topology:
    builder = StreamsBuilder()
    grouped = builder.stream("topic", key_serde="string", value_serde="string").group_by_key()
    windowed = grouped.windowed_by(windows)
    if emit_final:
        windowed = windowed.emit_final()
    if reduce:
        table = windowed.reduce(lambda a, b: f"{a}+{b}", STORE, value_serde="string")
    else:
        table = windowed.aggregate(lambda: "0", string_adder, STORE, value_serde="string")
    table.to_stream().process(Collect)
    return builder.build()


class Collect(Processor):
    """A sink processor keeping what reaches it as Python objects, in ``Collect.seen``."""

    seen: ClassVar[list[tuple[Windowed[str], Any, int]]] = []

    def process(self, key: Any, value: Any) -> None:
        Collect.seen.append((key, value, self.context.timestamp))


def run(
    topology: Topology,
    records: Sequence[tuple[str | None, str | None, int]],
    stores: dict[str, Any],
) -> tuple[TaskTopology, list[tuple[Windowed[str], Any, int]]]:
    Collect.seen = []
    (sub,) = topology.subtopologies()
    task = TaskTopology(topology, sub, 0, stores)
    for offset, (key, value, timestamp) in enumerate(records):
        task.process(
            "topic",
            None if key is None else key.encode(),
            None if value is None else value.encode(),
            timestamp,
            partition=0,
            offset=offset,
        )
    return task, list(Collect.seen)


def by_start(outputs: list[tuple[Windowed[str], Any, int]]) -> dict[int, set[tuple[Any, int]]]:
    """Kafka's gatherOutput: window start -> {(value, timestamp)}; checks every window's size."""
    gathered: dict[int, set[tuple[Any, int]]] = defaultdict(set)
    for key, value, timestamp in outputs:
        assert key.window.end - key.window.start == 10 or key.window.end - key.window.start == 50
        gathered[key.window.start].add((value, timestamp))
    return dict(gathered)


def stores_for(store_factory: StoreFactory, topology: Topology) -> dict[str, Any]:
    (sub,) = topology.subtopologies()
    return {name: store_factory(name) for name in sub.stores}


SMALL = [("A", "1", 10), ("A", "2", 10), ("A", "3", 14), ("A", "4", 15), ("A", "5", 20),
         ("A", "6", 22), ("A", "7", 30)]  # fmt: skip


def test_aggregate_small_input(store_factory: StoreFactory) -> None:
    """testAggregateSmallInput, eager: time difference 10, grace 5."""
    topology = sliding_topology(SlidingWindows.of_time_difference_and_grace(10, 5))
    _, outputs = run(topology, SMALL, stores_for(store_factory, topology))
    assert by_start(outputs) == {
        0: {("0+1", 10), ("0+1+2", 10)},
        4: {("0+1+2+3", 14)},
        5: {("0+1+2+3+4", 15)},
        10: {("0+1+2+3+4+5", 20)},
        11: {("0+3", 14), ("0+3+4", 15), ("0+3+4+5", 20)},
        12: {("0+3+4+5+6", 22)},
        15: {("0+4", 15), ("0+4+5", 20), ("0+4+5+6", 22)},
        16: {("0+5", 20), ("0+5+6", 22)},
        20: {("0+5+6+7", 30)},
        21: {("0+6", 22), ("0+6+7", 30)},
        23: {("0+7", 30)},
    }
    # Windows are [start, start + 10], both ends inclusive, keyed as Kafka keys them.
    assert outputs[0][0] == Windowed("A", TimeWindow(0, 10))


def test_aggregate_small_input_emit_final(store_factory: StoreFactory) -> None:
    """testAggregateSmallInput, emit on window close: one result per window whose end is
    before stream time (30) - grace (5), each its final value."""
    topology = sliding_topology(SlidingWindows.of_time_difference_and_grace(10, 5), True)
    _, outputs = run(topology, SMALL, stores_for(store_factory, topology))
    assert by_start(outputs) == {
        0: {("0+1+2", 10)},
        4: {("0+1+2+3", 14)},
        5: {("0+1+2+3+4", 15)},
        10: {("0+1+2+3+4+5", 20)},
        11: {("0+3+4+5", 20)},
        12: {("0+3+4+5+6", 22)},
    }
    assert len(outputs) == 6


REDUCE = [("A", "1", 10), ("A", "2", 14), ("A", "3", 15), ("A", "4", 22), ("A", "5", 26),
          ("A", "6", 30)]  # fmt: skip


@pytest.mark.parametrize("emit_final", [False, True])
def test_reduce_small_input(store_factory: StoreFactory, emit_final: bool) -> None:
    """testReduceSmallInput: the first value seeds each window (no initializer)."""
    topology = sliding_topology(
        SlidingWindows.of_time_difference_and_grace(10, 5), emit_final, reduce=True
    )
    _, outputs = run(topology, REDUCE, stores_for(store_factory, topology))
    if emit_final:
        assert by_start(outputs) == {
            0: {("1", 10)},
            4: {("1+2", 14)},
            5: {("1+2+3", 15)},
            11: {("2+3", 15)},
            12: {("2+3+4", 22)},
        }
    else:
        assert by_start(outputs) == {
            0: {("1", 10)},
            4: {("1+2", 14)},
            5: {("1+2+3", 15)},
            11: {("2", 14), ("2+3", 15)},
            12: {("2+3+4", 22)},
            15: {("3", 15), ("3+4", 22)},
            16: {("4", 22), ("4+5", 26)},
            20: {("4+5+6", 30)},
            23: {("5", 26), ("5+6", 30)},
            27: {("6", 30)},
        }


EARLY = [("A", "1", 0), ("A", "2", 5), ("A", "3", 6), ("A", "4", 3), ("A", "5", 13),
         ("A", "6", 10), ("A", "7", 70)]  # fmt: skip


@pytest.mark.parametrize("emit_final", [False, True])
def test_early_records_small_input(store_factory: StoreFactory, emit_final: bool) -> None:
    """testEarlyRecordsSmallInput: time difference 50, no grace; records before 50 share
    the window [0, 50], out-of-order ones included."""
    topology = sliding_topology(SlidingWindows.of_time_difference_and_grace(50, 0), emit_final)
    _, outputs = run(topology, EARLY, stores_for(store_factory, topology))
    if emit_final:
        assert by_start(outputs) == {
            0: {("0+1+2+3+4+5+6", 13)},
            1: {("0+2+3+4+5+6", 13)},
            4: {("0+2+3+5+6", 13)},
            6: {("0+3+5+6", 13)},
            7: {("0+5+6", 13)},
            11: {("0+5", 13)},
        }
    else:
        assert by_start(outputs) == {
            0: {("0+1", 0), ("0+1+2", 5), ("0+1+2+3", 6), ("0+1+2+3+4", 6),
                ("0+1+2+3+4+5", 13), ("0+1+2+3+4+5+6", 13)},
            1: {("0+2", 5), ("0+2+3", 6), ("0+2+3+4", 6), ("0+2+3+4+5", 13),
                ("0+2+3+4+5+6", 13)},
            4: {("0+2+3", 6), ("0+2+3+5", 13), ("0+2+3+5+6", 13)},
            6: {("0+3", 6), ("0+3+5", 13), ("0+3+5+6", 13)},
            7: {("0+5", 13), ("0+5+6", 13)},
            11: {("0+5", 13)},
            20: {("0+7", 70)},
        }  # fmt: skip


@pytest.mark.parametrize("emit_final", [False, True])
def test_skips_and_counts_records_beyond_grace(
    store_factory: StoreFactory, caplog: pytest.LogCaptureFixture, emit_final: bool
) -> None:
    """shouldLogAndMeterWhenSkippingExpiredWindowByGrace: difference 10, grace 90."""
    caplog.set_level(logging.WARNING)
    topology = sliding_topology(SlidingWindows.of_time_difference_and_grace(10, 90), emit_final)
    records = [("k", "100", 200)] + [("k", str(i), 100 + i) for i in range(6)]
    records += [("k", "6", 15), ("k", "101", 300), ("k", "102", 400)]
    task, outputs = run(topology, records, stores_for(store_factory, topology))
    assert task.dropped_records == 7
    for offset, (start, end) in enumerate(
        [(90, 100), (91, 101), (92, 102), (93, 103), (94, 104), (95, 105), (15, 25)], 1
    ):
        assert (
            f"Skipping record for expired window. topic=[topic] partition=[0] offset=[{offset}] "
            f"timestamp=[{records[offset][2]}] window=[{start},{end}] expiration=[110] "
            "streamTime=[200]"
        ) in caplog.messages
    expected = [
        (Windowed("k", TimeWindow(190, 200)), "0+100", 200),
        (Windowed("k", TimeWindow(290, 300)), "0+101", 300),
    ]
    if not emit_final:
        expected.append((Windowed("k", TimeWindow(390, 400)), "0+102", 400))
    assert outputs == expected


def test_a_record_without_key_or_value_is_dropped(
    store_factory: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """shouldLogAndMeterWhenSkippingNullKey."""
    caplog.set_level(logging.WARNING)
    topology = sliding_topology(SlidingWindows.of_time_difference_and_grace(10, 100))
    task, outputs = run(
        topology, [(None, "1", 0), ("k", None, 1)], stores_for(store_factory, topology)
    )
    assert outputs == []
    assert task.dropped_records == 2
    assert (
        "Skipping record due to null key or value. topic=[topic] partition=[0] offset=[0]"
        in caplog.messages
    )


RANDOM = [("A", 10), ("B", 15), ("C", 16), ("D", 18), ("E", 30), ("F", 40), ("G", 55),
          ("H", 56), ("I", 58), ("J", 58), ("K", 62), ("L", 63), ("M", 63), ("N", 63),
          ("O", 76), ("P", 77), ("Q", 80), ("R", 2), ("S", 3), ("T", 5), ("U", 8)]  # fmt: skip


def brute_force_windows(
    records: list[tuple[str, int]], difference: int
) -> dict[int, tuple[str, int]]:
    """The sliding windows by definition: each record's left window (``[0, d]`` below d),
    and its right window when a later record falls in it; value = sorted letters."""
    starts: set[int] = set()
    for _, t in records:
        starts.add(max(0, t - difference))
        if any(t < other <= t + 1 + difference for _, other in records):
            starts.add(t + 1)
    windows = {}
    for start in starts:
        inside = [(v, t) for v, t in records if start <= t <= start + difference]
        windows[start] = ("".join(sorted(v for v, _ in inside)), max(t for _, t in inside))
    return windows


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("cached", [False, True])
def test_random_order_input_ends_in_the_windows_of_the_definition(
    store_factory: StoreFactory, seed: int, cached: bool
) -> None:
    """testAggregateRandomInput: difference 10, grace 100 (nothing late), input shuffled;
    the last result of each window is the window the definition gives."""
    builder = StreamsBuilder()
    (
        builder.stream("topic", key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(SlidingWindows.of_time_difference_and_grace(10, 100))
        .aggregate(lambda: "", lambda _k, v, agg: "".join(sorted(agg + v)), STORE, "string")
        .to_stream()
        .process(Collect)
    )
    topology = builder.build()
    records = list(RANDOM)
    random.Random(seed).shuffle(records)
    rocks = store_factory(STORE)
    store: Any = rocks
    if cached:
        store = TaskStore(
            rocks,
            changelog=TopicPartition("app-topic-Canonized-changelog", 0),
            cache=ThreadCache(1024 * 1024),
            cache_name=STORE,
        )
    _, outputs = run(topology, [("A", v, t) for v, t in records], {STORE: store})
    if cached:
        store.flush()
        outputs = list(Collect.seen)
    final: dict[int, tuple[str, int]] = {}
    for key, value, timestamp in outputs:
        final[key.window.start] = (value, timestamp)
    assert final == brute_force_windows(RANDOM, 10)


def test_sliding_windows_check_their_arguments() -> None:
    with pytest.raises(TopologyError, match="time difference must be"):
        SlidingWindows.of_time_difference_and_grace(-1, 0)
    with pytest.raises(TopologyError, match="grace period must be"):
        SlidingWindows.of_time_difference_and_grace(10, -5)
    windows = SlidingWindows.of_time_difference_without_grace(10)
    assert (windows.grace_ms, windows.retention_ms) == (0, 20)
    builder = StreamsBuilder()
    grouped = builder.stream("t").group_by_key()
    with pytest.raises(TopologyError, match="needs a store name"):
        grouped.windowed_by(windows).count("")
