"""KTable operations (filter, filter_not, map_values, to_stream, group_by(...).aggregate/
count/reduce) and KStream split/branch, merge, select_key and repartition.

Worked from Kafka Streams' ``KTableFilterTest``, ``KTableMapValuesTest``,
``KTableAggregateTest.testAggBasic`` (its input sequence and, since KIP-904, one
record per update when the group does not change) and ``KStreamSplitTest``
(apache/kafka, streams/src/test/java/org/apache/kafka/streams/kstream/internals/).
The tests are ours. One difference: a re-grouped aggregation's result carries its
update's timestamp (as eddyline's stream aggregations do), where Kafka takes the
later of the update and the aggregate's previous timestamp.
"""

from __future__ import annotations

import pytest

from eddyline_runtime.engine.topics import TopologyLayoutError, resolve_topics
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.processing import JoinWindows, StreamsBuilder, TopologyError
from tests.support.stores import StoreFactory
from tests.unit.processing.join_driver import JoinDriver, to_string_joiner


def test_filter_forwards_a_tombstone_for_a_failing_update(store_factory: StoreFactory) -> None:
    """KTableFilterTest: without old values asked for, every update goes on; a failing
    one as a tombstone."""
    builder = StreamsBuilder()
    table = builder.table("topic1", "source", key_serde="string", value_serde="string")
    table.filter(lambda _k, v: int(v) % 2 == 0).to_stream().to(
        "output", key_serde="string", value_serde="string"
    )
    table.filter_not(lambda _k, v: int(v) % 2 == 0).to_stream().to(
        "odd", key_serde="string", value_serde="string"
    )
    driver = JoinDriver(builder.build(), store_factory)
    for key, value, timestamp in (("A", "1", 5), ("B", "2", 6), ("C", "3", 7), ("A", "4", 8)):
        driver.pipe("topic1", key, value, timestamp)
    driver.pipe("topic1", "B", None, 9)
    outputs = driver.task.drain_outputs()
    even = [(o.key, o.value, o.timestamp) for o in outputs if o.topic == "output"]
    odd = [(o.key, o.value, o.timestamp) for o in outputs if o.topic == "odd"]
    assert even == [
        (b"A", None, 5),
        (b"B", b"2", 6),
        (b"C", None, 7),
        (b"A", b"4", 8),
        (b"B", None, 9),
    ]
    assert odd == [
        (b"A", b"1", 5),
        (b"B", None, 6),
        (b"C", b"3", 7),
        (b"A", None, 8),
        (b"B", None, 9),
    ]


def test_map_values_keeps_tombstones(store_factory: StoreFactory) -> None:
    builder = StreamsBuilder()
    table = builder.table("topic1", "source", key_serde="string", value_serde="string")
    table.map_values(lambda v: v * 2).to_stream().to(
        "output", key_serde="string", value_serde="string"
    )
    driver = JoinDriver(builder.build(), store_factory)
    driver.pipe("topic1", "A", "x", 1)
    driver.pipe("topic1", "A", None, 2)
    assert driver.read() == [("A", "xx", 1), ("A", None, 2)]


def grouped_topology(kind: str):  # type: ignore[no-untyped-def]
    builder = StreamsBuilder()
    table = builder.table("topic1", "source", key_serde="string", value_serde="string")
    grouped = table.group_by(lambda k, v: (k, v), repartition_name="regrouped")
    if kind == "aggregate":
        result = grouped.aggregate(
            lambda: "0",
            lambda _k, v, agg: f"{agg}+{v}",
            lambda _k, v, agg: f"{agg}-{v}",
            "topic1-Canonized",
            value_serde="string",
        )
    else:
        result = grouped.count("counts")
    result.to_stream().to(
        "output", key_serde="string", value_serde="string" if kind == "aggregate" else "long"
    )
    return builder.build()


def run_grouped(
    kind: str, records: list[tuple[str, str | None, int]], store_factory: StoreFactory
) -> list[tuple[str | None, str | None, int]]:
    topology = grouped_topology(kind)
    assert topology.internal_topics == ["regrouped-repartition"]
    upstream = JoinDriver(topology, store_factory, subtopology=0)
    downstream = JoinDriver(topology, store_factory, subtopology=1)
    for key, value, timestamp in records:
        upstream.pipe("topic1", key, value, timestamp)
        for k, v, ts in upstream.read("regrouped-repartition"):
            downstream.pipe("regrouped-repartition", k, v, ts)
    if kind == "aggregate":
        return downstream.read()
    return [
        (o.key.decode() if o.key else None, str(int.from_bytes(o.value or b"", "big")), o.timestamp)
        for o in downstream.task.drain_outputs()
    ]


def test_regrouped_aggregate_subtracts_the_old_value_and_adds_the_new(
    store_factory: StoreFactory,
) -> None:
    """KTableAggregateTest.testAggBasic's input."""
    records = [
        ("A", "1", 10), ("B", "2", 15), ("A", "3", 20), ("B", "4", 18),
        ("C", "5", 5), ("D", "6", 25), ("B", "7", 15), ("C", "8", 10),
    ]  # fmt: skip
    assert run_grouped("aggregate", records, store_factory) == [
        ("A", "0+1", 10),
        ("B", "0+2", 15),
        ("A", "0+1-1+3", 20),
        ("B", "0+2-2+4", 18),
        ("C", "0+5", 5),
        ("D", "0+6", 25),
        ("B", "0+2-2+4-4+7", 15),
        ("C", "0+5-5+8", 10),
    ]


def test_regrouped_count_moves_rows_between_groups(store_factory: StoreFactory) -> None:
    """Re-keying by value: an update moves its row from the old value's group to the new."""
    builder_records = [("u1", "red", 1), ("u2", "red", 2), ("u1", "blue", 3), ("u2", None, 4)]
    topology = StreamsBuilder()
    table = topology.table("topic1", "source", key_serde="string", value_serde="string")
    table.group_by(lambda _k, v: (v, v), repartition_name="by-colour").count(
        "colours"
    ).to_stream().to("output", key_serde="string", value_serde="long")
    built = topology.build()
    upstream = JoinDriver(built, store_factory, subtopology=0)
    downstream = JoinDriver(built, store_factory, subtopology=1)
    for key, value, timestamp in builder_records:
        upstream.pipe("topic1", key, value, timestamp)
        for k, v, ts in upstream.read("by-colour-repartition"):
            downstream.pipe("by-colour-repartition", k, v, ts)
    counts = [
        (o.key.decode(), int.from_bytes(o.value or b"", "big"), o.timestamp)  # type: ignore[union-attr]
        for o in downstream.task.drain_outputs()
    ]
    assert counts == [("red", 1, 1), ("red", 2, 2), ("red", 1, 3), ("blue", 1, 3), ("red", 0, 4)]


def test_group_by_needs_a_table_that_forwards_old_values() -> None:
    builder = StreamsBuilder()
    counts = builder.stream("topic1").group_by_key().count("counts")
    with pytest.raises(TopologyError, match="old values"):
        counts.group_by(lambda k, v: (k, v), repartition_name="regrouped")
    table = builder.table("topic2", "table")
    with pytest.raises(TopologyError, match="repartition_name"):
        table.group_by(lambda k, v: (k, v), repartition_name="")
    with pytest.raises(TopologyError, match=r"Repartitioned\.as"):
        builder.stream("topic3").repartition("")


def test_split_routes_each_record_to_its_first_matching_branch(
    store_factory: StoreFactory,
) -> None:
    """KStreamSplitTest: first match wins, the rest to the default branch."""
    builder = StreamsBuilder()
    stream = builder.stream("topic1", key_serde="string", value_serde="string")
    branches = (
        stream.split("split-")
        .branch(lambda k, _v: int(k) % 2 == 0, "even")
        .branch(lambda k, _v: int(k) % 3 == 0)
        .default_branch()
    )
    assert list(branches) == ["split-even", "split-2", "split-0"]
    for name, branch in branches.items():
        branch.to(name, key_serde="string", value_serde="string")
    driver = JoinDriver(builder.build(), store_factory)
    for key in ("1", "2", "3", "4", "5", "6", "7"):
        driver.pipe("topic1", key, f"v{key}", int(key))
    outputs = driver.task.drain_outputs()
    routed = {name: [o.key.decode() for o in outputs if o.topic == name] for name in branches}  # type: ignore[union-attr]
    assert routed == {"split-even": ["2", "4", "6"], "split-2": ["3"], "split-0": ["1", "5", "7"]}


def test_merge_select_key_and_repartition(store_factory: StoreFactory) -> None:
    builder = StreamsBuilder()
    one = builder.stream("topic1", key_serde="string", value_serde="string")
    two = builder.stream("topic2", key_serde="string", value_serde="string")
    (
        one.merge(two)
        .select_key(lambda _k, v: v.upper())
        .repartition("by-value", key_serde="string", value_serde="string")
        .to("output", key_serde="string", value_serde="string")
    )
    topology = builder.build()
    assert topology.internal_topics == ["by-value-repartition"]
    driver = JoinDriver(topology, store_factory)
    driver.pipe("topic1", "a", "x", 1)
    driver.pipe("topic2", "b", "y", 2)
    assert driver.read("by-value-repartition") == [("X", "x", 1), ("Y", "y", 2)]


def test_a_join_of_topics_with_different_partition_counts_fails_naming_both(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Co-partitioning is checked when the layout is computed, before any task starts."""
    builder = StreamsBuilder()
    left = builder.stream("clicks", key_serde="string", value_serde="string")
    right = builder.stream("views", key_serde="string", value_serde="string")
    left.join(
        right,
        to_string_joiner,
        JoinWindows.of_time_difference_without_grace(10),
        store_name="clicks-views",
    ).to("output")
    log = SqliteLog(tmp_path / "log.db")
    try:
        log.create_topic("clicks", 2)
        log.create_topic("views", 3)
        with pytest.raises(TopologyLayoutError, match=r"clicks \(2\), views \(3\)"):
            resolve_topics(builder.build(), "app", log)
    finally:
        log.close()


def test_a_materialized_filter_can_be_joined_with_a_stream(store_factory: StoreFactory) -> None:
    """``filter(..., materialized=...)`` (Kafka's ``Materialized.as``) keeps the filtered
    table in a store: a stream-table join reads it, and a key leaving the filter
    leaves the store."""
    builder = StreamsBuilder()
    users = builder.table("users", "users", key_serde="string", value_serde="string")
    active = users.filter(lambda _k, v: v != "inactive", materialized="active-users")
    assert active.store == "active-users"
    clicks = builder.stream("clicks", key_serde="string", value_serde="string")
    clicks.join(active, to_string_joiner).to("output", key_serde="string", value_serde="string")
    driver = JoinDriver(builder.build(), store_factory)
    driver.pipe("users", "u1", "ann", 1)
    driver.pipe("users", "u2", "inactive", 2)
    driver.pipe("clicks", "u1", "c1", 3)
    driver.pipe("clicks", "u2", "c2", 4)
    driver.pipe("users", "u1", "inactive", 5)
    driver.pipe("clicks", "u1", "c3", 6)
    assert driver.read() == [("u1", "c1+ann", 3)]
    assert driver.stores["active-users"].get(b"u1") is None


def test_a_materialized_table_join_keeps_its_result(store_factory: StoreFactory) -> None:
    builder = StreamsBuilder()
    left = builder.table("topic1", "l", key_serde="string", value_serde="string")
    right = builder.table("topic2", "r", key_serde="string", value_serde="string")
    joined = left.join(
        right, to_string_joiner, store_name="lr", materialized="lr-result", value_serde="string"
    )
    joined.to_stream().to("output", key_serde="string", value_serde="string")
    driver = JoinDriver(builder.build(), store_factory)
    driver.pipe("topic1", "k", "A", 1)
    driver.pipe("topic2", "k", "a", 2)
    assert driver.stores["lr-result"].get(b"k") == b"A+a"
    driver.pipe("topic2", "k", None, 3)
    assert driver.stores["lr-result"].get(b"k") is None
    assert driver.read() == [("k", "A+a", 2), ("k", None, 3)]


def test_regrouped_aggregation_results_go_through_the_record_cache(
    store_factory: StoreFactory,
) -> None:
    """With a record cache in front of the aggregation's store (the runtime's default),
    a group's updates before a flush go downstream once, with its latest aggregate."""
    builder = StreamsBuilder()
    table = builder.table("topic1", "source", key_serde="string", value_serde="string")
    table.group_by(lambda _k, v: (v, v), repartition_name="by-colour").reduce(
        lambda agg, v: f"{agg}+{v}", lambda agg, v: f"{agg}-{v}", "colours", value_serde="string"
    ).to_stream().to("output", key_serde="string", value_serde="string")
    built = builder.build()
    upstream = JoinDriver(built, store_factory, subtopology=0)
    downstream = JoinDriver(built, store_factory, subtopology=1, cached=["colours"])
    for key, value, timestamp in [("u1", "red", 1), ("u2", "red", 2), ("u1", "blue", 3)]:
        upstream.pipe("topic1", key, value, timestamp)
        for k, v, ts in upstream.read("by-colour-repartition"):
            downstream.pipe("by-colour-repartition", k, v, ts)
    assert downstream.read() == []  # held by the cache
    downstream.flush()
    assert sorted(downstream.read()) == [("blue", "blue", 3), ("red", "red+red-red", 3)]
