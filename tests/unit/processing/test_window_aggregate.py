"""Windowed aggregations (tumbling and hopping ``TimeWindows``), as Kafka Streams runs them.

Worked from Kafka Streams' ``KStreamWindowAggregateTest`` (apache/kafka,
streams/src/test/java/org/apache/kafka/streams/kstream/internals/): the input
sequences, timestamps and expected outputs of ``testAggBasic``,
``shouldLogAndMeterWhenSkippingExpiredWindow``,
``shouldLogAndMeterWhenSkippingExpiredWindowByGrace`` and
``shouldLogAndMeterWhenSkippingNullKey`` are carried over as facts (Kafka's
deprecated ``TimeWindows.of(size)`` had a grace of one day minus the size, and
``until(100)`` a grace of 100 - size, written out below); the tests are ours.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import (
    StreamsBuilder,
    TimeWindow,
    TimeWindowedSerde,
    TimeWindows,
    Topology,
    TopologyError,
    Windowed,
)
from eddyline_runtime.serde import serde_for
from tests.support.stores import StoreFactory

DAY = 86_400_000
STORE = "topic1-Canonized"


def string_adder(separator: str = "+"):  # type: ignore[no-untyped-def]
    """Kafka's MockAggregator.toStringInstance: aggregate + separator + value."""
    return lambda _key, value, aggregate: f"{aggregate}{separator}{value}"


def windowed_topology(windows: TimeWindows, initial: str = "0") -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("topic", key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(windows)
        .aggregate(lambda: initial, string_adder(), STORE, value_serde="string")
        .to_stream()
        .map(lambda key, value: (str(key), value))
        .to("output", key_serde="string", value_serde="string")
    )
    return builder.build()


def run(
    topology: Topology,
    records: list[tuple[str | None, str, int]],
    store: object,
) -> tuple[TaskTopology, list[tuple[str, str, int]]]:
    (sub,) = topology.subtopologies()
    task = TaskTopology(topology, sub, 0, {STORE: store})  # type: ignore[dict-item]
    for offset, (key, value, timestamp) in enumerate(records):
        task.process(
            "topic",
            None if key is None else key.encode(),
            value.encode(),
            timestamp,
            partition=0,
            offset=offset,
        )
    outputs = [
        (o.key.decode(), o.value.decode(), o.timestamp)
        for o in task.drain_outputs()
        if o.key is not None and o.value is not None
    ]
    return task, outputs


def test_windows_for_a_timestamp_are_epoch_aligned_start_inclusive_end_exclusive() -> None:
    tumbling = TimeWindows.of_size_with_grace(10, 0)
    assert tumbling.windows_for(0) == [TimeWindow(0, 10)]
    assert tumbling.windows_for(9) == [TimeWindow(0, 10)]
    assert tumbling.windows_for(10) == [TimeWindow(10, 20)]
    hopping = TimeWindows.of_size_with_grace(10, 0).advance_by(5)
    assert hopping.windows_for(4) == [TimeWindow(0, 10)]
    assert hopping.windows_for(5) == [TimeWindow(0, 10), TimeWindow(5, 15)]
    assert hopping.windows_for(10) == [TimeWindow(5, 15), TimeWindow(10, 20)]
    assert hopping.retention_ms == 10
    with pytest.raises(TopologyError, match="cannot exceed the window size"):
        tumbling.advance_by(11)
    with pytest.raises(TopologyError, match="size must be"):
        TimeWindows.of_size_with_grace(0, 0)


def test_windowed_keys_print_and_serialize_as_kafka_streams_does() -> None:
    key = Windowed("k", TimeWindow(95, 105))
    assert str(key) == "[k@95/105]"
    serde = TimeWindowedSerde(serde_for("string"), 10)
    data = serde.serialize(key)
    assert data == b"k" + (95).to_bytes(8, "big")
    assert serde.deserialize(data) == Windowed("k", TimeWindow(95, 105))


def test_agg_basic(store_factory: StoreFactory) -> None:
    """KStreamWindowAggregateTest.testAggBasic: hopping windows of 10 advancing by 5."""
    windows = TimeWindows.of_size_with_grace(10, DAY - 10).advance_by(5)
    records = [
        ("A", "1", 0), ("B", "2", 1), ("C", "3", 2), ("D", "4", 3), ("A", "1", 4),
        ("A", "1", 5), ("B", "2", 6), ("D", "4", 7), ("B", "2", 8), ("C", "3", 9),
        ("A", "1", 10), ("B", "2", 11), ("D", "4", 12), ("B", "2", 13), ("C", "3", 14),
        ("B", "1", 3), ("B", "2", 2), ("B", "3", 9),
    ]  # fmt: skip
    task, outputs = run(windowed_topology(windows), records, store_factory(STORE))
    assert outputs == [
        ("[A@0/10]", "0+1", 0),
        ("[B@0/10]", "0+2", 1),
        ("[C@0/10]", "0+3", 2),
        ("[D@0/10]", "0+4", 3),
        ("[A@0/10]", "0+1+1", 4),
        ("[A@0/10]", "0+1+1+1", 5),
        ("[A@5/15]", "0+1", 5),
        ("[B@0/10]", "0+2+2", 6),
        ("[B@5/15]", "0+2", 6),
        ("[D@0/10]", "0+4+4", 7),
        ("[D@5/15]", "0+4", 7),
        ("[B@0/10]", "0+2+2+2", 8),
        ("[B@5/15]", "0+2+2", 8),
        ("[C@0/10]", "0+3+3", 9),
        ("[C@5/15]", "0+3", 9),
        ("[A@5/15]", "0+1+1", 10),
        ("[A@10/20]", "0+1", 10),
        ("[B@5/15]", "0+2+2+2", 11),
        ("[B@10/20]", "0+2", 11),
        ("[D@5/15]", "0+4+4", 12),
        ("[D@10/20]", "0+4", 12),
        ("[B@5/15]", "0+2+2+2+2", 13),
        ("[B@10/20]", "0+2+2", 13),
        ("[C@5/15]", "0+3+3", 14),
        ("[C@10/20]", "0+3", 14),
        # Out of order: the window keeps the newest timestamp it has seen.
        ("[B@0/10]", "0+2+2+2+1", 8),
        ("[B@0/10]", "0+2+2+2+1+2", 8),
        ("[B@0/10]", "0+2+2+2+1+2+3", 9),
        ("[B@5/15]", "0+2+2+2+2+3", 13),
    ]
    assert task.dropped_records == 0


def test_skips_and_counts_records_for_expired_windows(
    store_factory: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """shouldLogAndMeterWhenSkippingExpiredWindow: size 10, advance 5, grace 90."""
    caplog.set_level(logging.WARNING)
    windows = TimeWindows.of_size_with_grace(10, 90).advance_by(5)
    records = [("k", "100", 100)] + [("k", str(t), t) for t in range(7)]
    task, outputs = run(windowed_topology(windows, initial=""), records, store_factory(STORE))
    assert outputs == [
        ("[k@95/105]", "+100", 100),
        ("[k@100/110]", "+100", 100),
        ("[k@5/15]", "+5", 5),
        ("[k@5/15]", "+5+6", 6),
    ]
    # Records 0..4 fall only in [0, 10); 5 and 6 also in [0, 10): seven drops.
    assert task.dropped_records == 7
    for offset in range(1, 8):
        assert (
            f"Skipping record for expired window. key=[k] topic=[topic] partition=[0] "
            f"offset=[{offset}] timestamp=[{offset - 1}] window=[0,10) expiration=[10] "
            "streamTime=[100]"
        ) in caplog.messages


def test_skips_records_beyond_grace(
    store_factory: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """shouldLogAndMeterWhenSkippingExpiredWindowByGrace: tumbling 10, grace 90."""
    caplog.set_level(logging.WARNING)
    windows = TimeWindows.of_size_with_grace(10, 90)
    records = [("k", "100", 200)] + [("k", str(i), 100 + i) for i in range(6)] + [("k", "6", 6)]
    task, outputs = run(windowed_topology(windows, initial=""), records, store_factory(STORE))
    assert outputs == [("[k@200/210]", "+100", 200)]
    assert task.dropped_records == 7
    assert (
        "Skipping record for expired window. key=[k] topic=[topic] partition=[0] offset=[1] "
        "timestamp=[100] window=[100,110) expiration=[110] streamTime=[200]"
    ) in caplog.messages
    assert (
        "Skipping record for expired window. key=[k] topic=[topic] partition=[0] offset=[7] "
        "timestamp=[6] window=[0,10) expiration=[110] streamTime=[200]"
    ) in caplog.messages


def test_a_record_exactly_at_the_close_is_dropped_one_before_is_kept(
    store_factory: StoreFactory,
) -> None:
    # Window [0, 10) with grace 5 closes when stream time reaches 15.
    windows = TimeWindows.of_size_with_grace(10, 5)
    records = [("k", "a", 14), ("k", "b", 3), ("k", "c", 15), ("k", "d", 4)]
    task, outputs = run(windowed_topology(windows, initial=""), records, store_factory(STORE))
    assert outputs == [("[k@10/20]", "+a", 14), ("[k@0/10]", "+b", 3), ("[k@10/20]", "+a+c", 15)]
    assert task.dropped_records == 1


def test_null_keys_are_skipped_and_counted(
    store_factory: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """shouldLogAndMeterWhenSkippingNullKey."""
    caplog.set_level(logging.WARNING)
    windows = TimeWindows.of_size_with_grace(10, DAY - 10).advance_by(5)
    task, outputs = run(windowed_topology(windows), [(None, "1", 0)], store_factory(STORE))
    assert outputs == []
    assert task.dropped_records == 1
    assert (
        "Skipping record due to null key. value=[1] topic=[topic] partition=[0] offset=[0]"
        in caplog.messages
    )


def count_topology() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("topic", key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(TimeWindows.of_size_with_grace(60_000, 10_000))
        .count(STORE)
        .to_stream()
        .map(lambda key, value: (str(key), str(value)))
        .to("output", key_serde="string", value_serde="string")
    )
    return builder.build()


def test_tumbling_count_through_the_record_cache(store_factory: StoreFactory) -> None:
    rocks = store_factory(STORE)
    store = TaskStore(
        rocks,
        changelog=TopicPartition("app-topic1-Canonized-changelog", 0),
        cache=ThreadCache(1024 * 1024),
        cache_name=STORE,
    )
    records = [("u", "x", 1_000), ("u", "x", 59_999), ("v", "x", 2_000), ("u", "x", 60_000)]
    task, outputs = run(count_topology(), records, store)
    assert outputs == []  # held by the cache until it flushes
    store.flush()
    outputs = sorted(
        (o.key.decode(), o.value.decode(), o.timestamp)
        for o in task.drain_outputs()
        if o.key is not None and o.value is not None
    )
    assert outputs == [
        ("[u@0/60000]", "2", 59_999),
        ("[u@60000/120000]", "1", 60_000),
        ("[v@0/60000]", "1", 2_000),
    ]
    # The changelog records are the store's raw keys: what replay writes back.
    changelog = store.logging.drain_changelog()
    assert sorted(changelog) == sorted((raw, value) for raw, value in rocks.all())


def test_counts_survive_commit_and_lose_the_uncommitted_after_a_crash(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    directory = tmp_path / "window-store"
    topology = count_topology()
    rocks = store_factory(STORE, directory=directory)
    run(topology, [("u", "x", 1_000), ("u", "x", 2_000)], rocks)
    rocks.commit({TopicPartition("app-topic1-Canonized-changelog", 0): 1})
    run(topology, [("u", "x", 3_000)], rocks)  # a new task instance, same store
    rocks.close()  # crash: no commit
    reopened = store_factory(STORE, directory=directory)
    _, outputs = run(topology, [("u", "x", 4_000)], reopened)
    assert outputs == [("[u@0/60000]", "3", 4_000)]


def test_a_window_closed_before_a_restart_stays_closed(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    # Tumbling 10 ms, grace 5: [0, 10) closes when stream time reaches 15.
    windows = TimeWindows.of_size_with_grace(10, 5)
    directory = tmp_path / "restart"
    rocks = store_factory(STORE, directory=directory)
    _, outputs = run(windowed_topology(windows, ""), [("k", "a", 5), ("k", "b", 16)], rocks)
    assert outputs == [("[k@0/10]", "+a", 5), ("[k@10/20]", "+b", 16)]
    rocks.commit({})
    rocks.close()
    # A new task starts its stream time over; the store still knows 16.
    reopened = store_factory(STORE, directory=directory)
    task, outputs = run(
        windowed_topology(windows, ""), [("k", "late", 7), ("k", "c", 12)], reopened
    )
    assert outputs == [("[k@10/20]", "+b+c", 16)]
    assert task.dropped_records == 1


def test_reduce_after_group_by_with_hopping_windows(store_factory: StoreFactory) -> None:
    builder = StreamsBuilder()
    (
        builder.stream("orders", key_serde="string", value_serde="json")
        .group_by(lambda _key, order: order["region"], repartition_name="by-region")
        .windowed_by(TimeWindows.of_size_with_grace(100, 0).advance_by(50))
        .reduce(lambda total, order: {**total, "amount": total["amount"] + order["amount"]},
                "region-totals")
        .to_stream()
        .map(lambda window, order: (str(window), str(order["amount"])))
        .to("totals", key_serde="string", value_serde="string")
    )  # fmt: skip
    topology = builder.build()
    first, second = topology.subtopologies()
    assert second.stores == ("region-totals",)
    assert topology.stores["region-totals"].window_retention_ms == 100
    splitter = TaskTopology(topology, first, 0, {})
    totals = TaskTopology(topology, second, 0, {"region-totals": store_factory("region-totals")})
    json = serde_for("json")
    orders = [("eu", 5, 10), ("us", 7, 60), ("eu", 1, 70), ("eu", 2, 160)]
    for region, amount, timestamp in orders:
        splitter.process("orders", None, json.serialize({"region": region, "amount": amount}),
                         timestamp)  # fmt: skip
        for record in splitter.drain_outputs():
            totals.process(record.topic, record.key, record.value, record.timestamp)
    assert [(o.key, o.value, o.timestamp) for o in totals.drain_outputs()] == [
        (b"[eu@0/100]", b"5", 10),
        (b"[us@0/100]", b"7", 60),
        (b"[us@50/150]", b"7", 60),
        (b"[eu@0/100]", b"6", 70),
        (b"[eu@50/150]", b"1", 70),
        # 160 closes [0, 100) and [50, 150) (grace 0): only its own windows get it.
        (b"[eu@100/200]", b"2", 160),
        (b"[eu@150/250]", b"2", 160),
    ]
    assert totals.dropped_records == 0


def test_a_windowed_aggregation_needs_a_store_name() -> None:
    grouped = StreamsBuilder().stream("in").group_by_key()
    with pytest.raises(TopologyError, match="needs a store name"):
        grouped.windowed_by(TimeWindows.of_size_with_grace(10, 0)).count("")
    with pytest.raises(TopologyError, match="takes TimeWindows"):
        grouped.windowed_by(10)  # type: ignore[arg-type]
