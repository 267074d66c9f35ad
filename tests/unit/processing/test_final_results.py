"""Final results: ``suppress(Suppressed.until_window_closes())`` and ``emit_final()``.

Worked from Kafka Streams' ``SuppressScenarioTest`` (apache/kafka,
streams/src/test/java/org/apache/kafka/streams/kstream/internals/): the inputs,
timestamps and expected raw and suppressed outputs of
``shouldSupportFinalResultsForTimeWindows``, ``...ForTimeWindowsWithLargeJump``,
``...ForSlidingWindows`` and ``...ForSessionWindows`` are carried over as facts
(there the stream is re-keyed with ``groupBy``; here ``group_by_key``, which
changes no result). The buffer's crash behaviour (uncommitted evictions rolled
back, committed ones never repeated, the clock restored) is ours: Kafka's
buffer is in memory with a changelog, eddyline's a transactional store.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, ClassVar

from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import (
    KTable,
    Processor,
    SessionWindows,
    SlidingWindows,
    StreamsBuilder,
    Suppressed,
    TimeWindows,
    Topology,
    WindowedKTable,
)
from tests.support.stores import StoreFactory

_LONG = struct.Struct(">q")


class Sink(Processor):
    """Records ``(str(key), value, timestamp)`` per output name."""

    seen: ClassVar[dict[str, list[tuple[str, Any, int]]]] = {}

    def __init__(self, name: str) -> None:
        self._name = name

    def process(self, key: Any, value: Any) -> None:
        Sink.seen.setdefault(self._name, []).append((str(key), value, self.context.timestamp))


def scenario(counts: KTable, builder: StreamsBuilder) -> Topology:
    """Kafka's scenario: the raw counts and the suppressed counts, side by side."""
    assert isinstance(counts, WindowedKTable)
    counts.suppress(Suppressed.until_window_closes()).to_stream().process(
        lambda: Sink("suppressed")
    )
    counts.to_stream().process(lambda: Sink("raw"))
    return builder.build()


def run(topology: Topology, records: list[tuple[str, int]], stores: dict[str, Any]) -> TaskTopology:
    (sub,) = topology.subtopologies()
    task = TaskTopology(topology, sub, 0, stores)
    feed(task, records)
    return task


def feed(task: TaskTopology, records: list[tuple[str, int]], first_offset: int = 0) -> None:
    for offset, (key, timestamp) in enumerate(records, first_offset):
        task.process("input", key.encode(), b"v1", timestamp, partition=0, offset=offset)


def open_stores(store_factory: StoreFactory, topology: Topology, **kwargs: Any) -> dict[str, Any]:
    (sub,) = topology.subtopologies()
    return {name: store_factory(name, **kwargs.get(name, {})) for name in sub.stores}


def grouped(builder: StreamsBuilder) -> Any:
    return builder.stream("input", key_serde="string", value_serde="string").group_by_key()


def test_final_results_for_time_windows(store_factory: StoreFactory) -> None:
    """shouldSupportFinalResultsForTimeWindows: size 2, grace 1."""
    Sink.seen = {}
    builder = StreamsBuilder()
    counts = grouped(builder).windowed_by(TimeWindows.of_size_with_grace(2, 1)).count("counts")
    topology = scenario(counts, builder)
    # The last record is beyond grace: dropped from every output.
    inputs = [("k1", 0), ("k1", 1), ("k1", 2), ("k1", 1), ("k1", 0), ("k1", 5), ("k1", 0)]
    task = run(topology, inputs, open_stores(store_factory, topology))
    assert Sink.seen["raw"] == [
        ("[k1@0/2]", 1, 0),
        ("[k1@0/2]", 2, 1),
        ("[k1@2/4]", 1, 2),
        ("[k1@0/2]", 3, 1),
        ("[k1@0/2]", 4, 1),
        ("[k1@4/6]", 1, 5),
    ]
    assert Sink.seen["suppressed"] == [("[k1@0/2]", 4, 1), ("[k1@2/4]", 1, 2)]
    assert task.dropped_records == 1
    # The buffer is a store of its own, named after the aggregation's store.
    assert "counts-suppress-buffer" in topology.subtopologies()[0].stores


def test_final_results_for_time_windows_with_a_large_jump(store_factory: StoreFactory) -> None:
    """shouldSupportFinalResultsForTimeWindowsWithLargeJump: size 2, grace 2."""
    Sink.seen = {}
    builder = StreamsBuilder()
    counts = grouped(builder).windowed_by(TimeWindows.of_size_with_grace(2, 2)).count("counts")
    topology = scenario(counts, builder)
    inputs = [("k1", t) for t in (0, 1, 2, 0, 3, 0, 4, 0, 30)]
    run(topology, inputs, open_stores(store_factory, topology))
    assert Sink.seen["raw"] == [
        ("[k1@0/2]", 1, 0),
        ("[k1@0/2]", 2, 1),
        ("[k1@2/4]", 1, 2),
        ("[k1@0/2]", 3, 1),
        ("[k1@2/4]", 2, 3),
        ("[k1@0/2]", 4, 1),
        ("[k1@4/6]", 1, 4),
        ("[k1@30/32]", 1, 30),
    ]
    assert Sink.seen["suppressed"] == [
        ("[k1@0/2]", 4, 1),
        ("[k1@2/4]", 2, 3),
        ("[k1@4/6]", 1, 4),
    ]


def test_final_results_for_sliding_windows(store_factory: StoreFactory) -> None:
    """shouldSupportFinalResultsForSlidingWindows: time difference 5, grace 15."""
    Sink.seen = {}
    builder = StreamsBuilder()
    windows = SlidingWindows.of_time_difference_and_grace(5, 15)
    counts = grouped(builder).windowed_by(windows).count("counts")
    topology = scenario(counts, builder)
    inputs = [("k1", t) for t in (10, 11, 10, 13, 10, 24, 5, 7, 90)]
    run(topology, inputs, open_stores(store_factory, topology))
    assert sorted(Sink.seen["raw"], key=lambda r: (r[0], r[2])) == [
        ("[k1@11/16]", 1, 11),
        ("[k1@11/16]", 2, 13),
        ("[k1@12/17]", 1, 13),
        ("[k1@19/24]", 1, 24),
        ("[k1@5/10]", 1, 10),
        ("[k1@5/10]", 2, 10),
        ("[k1@5/10]", 3, 10),
        ("[k1@5/10]", 4, 10),
        ("[k1@5/10]", 5, 10),
        ("[k1@6/11]", 2, 11),
        ("[k1@6/11]", 3, 11),
        ("[k1@6/11]", 4, 11),
        ("[k1@6/11]", 5, 11),
        ("[k1@8/13]", 4, 13),
        ("[k1@8/13]", 5, 13),
        ("[k1@85/90]", 1, 90),
    ]
    assert Sink.seen["suppressed"] == [
        ("[k1@5/10]", 5, 10),
        ("[k1@6/11]", 5, 11),
        ("[k1@8/13]", 5, 13),
        ("[k1@11/16]", 2, 13),
        ("[k1@12/17]", 1, 13),
        ("[k1@19/24]", 1, 24),
    ]


def test_final_results_for_session_windows(store_factory: StoreFactory) -> None:
    """shouldSupportFinalResultsForSessionWindows: gap 5, no grace; a merged-away session
    never reaches the suppressed output."""
    Sink.seen = {}
    builder = StreamsBuilder()
    windows = SessionWindows.of_inactivity_gap_without_grace(5)
    counts = grouped(builder).windowed_by(windows).count("counts")
    topology = scenario(counts, builder)
    inputs = [("k1", 0), ("k1", 5), ("k1", 1), ("k2", 11), ("k1", 5), ("k1", 30)]
    run(topology, inputs, open_stores(store_factory, topology))
    assert Sink.seen["raw"] == [
        ("[k1@0/0]", 1, 0),
        ("[k1@0/0]", None, 0),
        ("[k1@0/5]", 2, 5),
        ("[k1@0/5]", None, 5),
        ("[k1@0/5]", 3, 5),
        ("[k2@11/11]", 1, 11),
        ("[k1@30/30]", 1, 30),
    ]
    assert Sink.seen["suppressed"] == [("[k1@0/5]", 3, 5), ("[k2@11/11]", 1, 11)]


def test_emit_final_closes_windows_on_the_newest_update(store_factory: StoreFactory) -> None:
    """emit_final (Kafka's EmitStrategy.onWindowClose): updates of other keys advance the
    clock too; each window comes out once."""
    Sink.seen = {}
    builder = StreamsBuilder()
    windows = TimeWindows.of_size_with_grace(10, 5)
    (
        grouped(builder)
        .windowed_by(windows)
        .emit_final()
        .count("counts")
        .to_stream()
        .process(lambda: Sink("final"))
    )
    topology = builder.build()
    assert "counts-final-buffer" in topology.subtopologies()[0].stores
    inputs = [("a", 1), ("a", 9), ("b", 12), ("a", 3), ("b", 14), ("c", 15), ("a", 2)]
    task = run(topology, inputs, open_stores(store_factory, topology))
    # Stream time 15 closes [0, 10) (10 + 5 <= 15): its final count 3; the record
    # at 2 after it is dropped.
    assert Sink.seen["final"] == [("[a@0/10]", 3, 9)]
    assert task.dropped_records == 1
    feed(task, [("z", 25)], first_offset=len(inputs))
    assert Sink.seen["final"] == [("[a@0/10]", 3, 9), ("[b@10/20]", 2, 14), ("[c@10/20]", 1, 15)]


def test_a_crash_rolls_back_uncommitted_evictions_and_never_repeats_committed_ones(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    """The window store is transactional: what a crash loses comes out again after
    the restart (once), what was committed never does, and what is still open stays."""
    Sink.seen = {}

    def topology() -> Topology:
        builder = StreamsBuilder()
        (
            grouped(builder)
            .windowed_by(TimeWindows.of_size_with_grace(10, 0))
            .emit_final()
            .count("counts")
            .to_stream()
            .process(lambda: Sink("final"))
        )
        return builder.build()

    directories = {
        name: {"directory": tmp_path / name} for name in ("counts", "counts-final-buffer")
    }
    stores = open_stores(store_factory, topology(), **directories)
    task = run(topology(), [("a", 1), ("a", 2), ("b", 11)], stores)
    assert Sink.seen["final"] == [("[a@0/10]", 2, 2)]
    for store in stores.values():
        store.commit({})
    feed(task, [("b", 12), ("c", 25)], first_offset=3)
    assert Sink.seen["final"][-1] == ("[b@10/20]", 2, 12)
    for store in stores.values():
        store.close()  # a crash: the open transaction is lost

    Sink.seen = {}
    stores = open_stores(store_factory, topology(), **directories)
    task = run(topology(), [], stores)
    # Replayed from the last commit: [b@10/20] again, [a@0/10] never.
    feed(task, [("b", 12), ("c", 25)], first_offset=3)
    assert Sink.seen["final"] == [("[b@10/20]", 2, 12)]
    for store in stores.values():
        store.commit({})
        store.close()

    # After a clean restart the store still holds [c@20/30]: 26 keeps it, 40 closes it.
    Sink.seen = {}
    stores = open_stores(store_factory, topology(), **directories)
    task = run(topology(), [], stores)
    feed(task, [("d", 26), ("d", 40)], first_offset=5)
    assert Sink.seen["final"] == [("[c@20/30]", 1, 25), ("[d@20/30]", 1, 26)]


def test_updates_a_record_cache_holds_back_are_final_once(store_factory: StoreFactory) -> None:
    """With a cached window store, updates arrive at a flush in last-write order; a window
    updated late (within grace) is forwarded after updates of later records. Its final
    result comes out once, with the late record in it (a clock taken from the task's
    stream time would close it at the first update of the flush, then again)."""
    Sink.seen = {}
    builder = StreamsBuilder()
    (
        grouped(builder)
        .windowed_by(TimeWindows.of_size_with_grace(10, 5))
        .emit_final()
        .count("counts")
        .to_stream()
        .process(lambda: Sink("final"))
    )
    topology = builder.build()
    stores = open_stores(store_factory, topology)
    cached = TaskStore(
        stores["counts"],
        changelog=TopicPartition("app-counts-changelog", 0),
        cache=ThreadCache(1024 * 1024),
        cache_name="counts",
    )
    task = run(topology, [("a", 5)], {**stores, "counts": cached})
    cached.flush()
    feed(task, [("b", 14), ("a", 6), ("c", 15)], first_offset=1)
    cached.flush()
    assert Sink.seen["final"] == [("[a@0/10]", 2, 6)]


def test_a_window_expiring_before_a_flush_still_gives_its_final_result(
    store_factory: StoreFactory,
) -> None:
    """Dropping an expired segment deletes its windows through the record cache: the
    cache is flushed first, so the updates it held are forwarded, not overwritten."""
    Sink.seen = {}
    builder = StreamsBuilder()
    (
        grouped(builder)
        .windowed_by(TimeWindows.of_size_with_grace(10, 0))
        .emit_final()
        .count("counts")
        .to_stream()
        .process(lambda: Sink("final"))
    )
    topology = builder.build()
    stores = open_stores(store_factory, topology)
    cached = TaskStore(
        stores["counts"],
        changelog=TopicPartition("app-counts-changelog", 0),
        cache=ThreadCache(1024 * 1024),
        cache_name="counts",
    )
    # 200 s later the first segment (60 s) is past the store's retention (10 ms).
    task = run(topology, [("a", 1), ("a", 2), ("b", 200_000)], {**stores, "counts": cached})
    cached.flush()
    assert Sink.seen["final"] == [("[a@0/10]", 2, 2)]
    assert task.dropped_records == 0


def emit_final_topology() -> Topology:
    builder = StreamsBuilder()
    (
        grouped(builder)
        .windowed_by(TimeWindows.of_size_with_grace(10, 0))
        .emit_final()
        .count("counts")
        .to_stream()
        .process(lambda: Sink("final"))
    )
    return builder.build()


def test_emit_final_reads_closed_windows_from_its_store_and_buffers_nothing(
    store_factory: StoreFactory,
) -> None:
    """KIP-825: a time-windowed emit_final forwards no update; the windows a record closes
    are read from the aggregation's store, so the final buffer (kept for the topology's
    shape) stays empty. Before, every update was written to it and read back."""
    Sink.seen = {}
    topology = emit_final_topology()
    stores = open_stores(store_factory, topology)
    run(topology, [("b", 3), ("a", 1), ("a", 12), ("c", 25)], stores)
    assert Sink.seen["final"] == [("[a@0/10]", 1, 1), ("[b@0/10]", 1, 3), ("[a@10/20]", 1, 12)]
    assert list(stores["counts-final-buffer"].scan(KeyRange(None, None))) == []


def test_emit_final_orders_a_close_by_window_end_then_key_bytes(
    store_factory: StoreFactory,
) -> None:
    """Hopping windows closed by one record come out oldest end first, then in the order
    of the windowed key's bytes (key, then start), as the suppression buffer gave them;
    the store's scan gives them in key order per segment instead."""
    Sink.seen = {}
    builder = StreamsBuilder()
    (
        grouped(builder)
        .windowed_by(TimeWindows.of_size_with_grace(10, 0).advance_by(5))
        .emit_final()
        .count("counts")
        .to_stream()
        .process(lambda: Sink("final"))
    )
    topology = builder.build()
    run(topology, [("a0", 7), ("a", 6), ("b", 2), ("z", 40)], open_stores(store_factory, topology))
    assert [key for key, _, _ in Sink.seen["final"]] == [
        "[a@0/10]",
        "[a0@0/10]",
        "[b@0/10]",
        "[a@5/15]",
        "[a0@5/15]",
    ]


def test_a_final_buffer_an_earlier_release_filled_is_emptied_and_emits_nothing_twice(
    store_factory: StoreFactory,
) -> None:
    """Before KIP-825's scan, emit_final buffered every open window in
    ``<store>-final-buffer``. A task restored with such a buffer emits each window once,
    from the aggregation's store, and empties the buffer at its first result."""
    Sink.seen = {}
    topology = emit_final_topology()
    stores = open_stores(store_factory, topology)
    task = run(topology, [("a", 1), ("a", 2)], stores)
    # What the earlier release's buffer held here: [a@0/10] = 2 (last update at 2), clock 2.
    buffer = stores["counts-final-buffer"]
    buffer.put(_LONG.pack(10) + b"a" + _LONG.pack(0), _LONG.pack(2) + _LONG.pack(2))
    buffer.put(b"\xffstream-time", _LONG.pack(2))
    feed(task, [("b", 11), ("c", 30)], first_offset=2)
    assert Sink.seen["final"] == [("[a@0/10]", 2, 2), ("[b@10/20]", 1, 11)]
    assert list(buffer.scan(KeyRange(None, None))) == []
