"""The DSL builds Kafka Streams-shaped topologies that run as tasks."""

from __future__ import annotations

from collections import Counter

from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.processing.dsl import StreamsBuilder
from eddyline_runtime.serde import serde_for
from tests.support.stores import StoreFactory

LINES = ["the quick brown fox", "the lazy dog", "the end"]


def word_count() -> StreamsBuilder:
    builder = StreamsBuilder()
    (
        builder.stream("lines", value_serde="string")
        .flat_map_values(str.split)
        .filter(lambda _, word: word != "end")
        .group_by(lambda _, word: word)
        .count("counts")
        .to_stream()
        .to("word-counts", key_serde="string", value_serde="long")
    )
    return builder


def test_group_by_repartitions_into_a_second_subtopology() -> None:
    builder = word_count()
    first, second = builder.build().subtopologies()
    assert first.source_topics == ("lines",)
    assert first.sink_topics == second.source_topics == tuple(builder.internal_topics)
    assert builder.internal_topics == ["KSTREAM-AGGREGATE-STATE-STORE-0000000004-repartition"]
    assert second.stores == ("counts",)
    assert second.sink_topics == ("word-counts",)
    assert "Source: KSTREAM-SOURCE-0000000000 (topics: [lines])" in builder.build().describe()


def test_word_count_runs_through_both_tasks(store_factory: StoreFactory) -> None:
    topology = word_count().build()
    first, second = topology.subtopologies()
    splitter = TaskTopology(topology, first, 0, {})
    counter = TaskTopology(topology, second, 0, {"counts": store_factory("counts")})
    for offset, line in enumerate(LINES):
        splitter.process("lines", None, line.encode(), offset)
        for record in splitter.drain_outputs():
            counter.process(record.topic, record.key, record.value, record.timestamp)
    longs = serde_for("long")
    latest = {o.key.decode(): longs.deserialize(o.value) for o in counter.drain_outputs() if o.key}
    expected = Counter(w for line in LINES for w in line.split() if w != "end")
    assert latest == dict(expected)
    assert counter.stores["counts"].get(b"the") == longs.serialize(3)


def test_stateless_operations_compose() -> None:
    builder = StreamsBuilder()
    seen: list[str] = []
    (
        builder.stream("in", key_serde="string", value_serde="string")
        .map(lambda k, v: (v, k))
        .map_values(str.upper)
        .peek(lambda k, v: seen.append(f"{k}={v}"))
        .flat_map(lambda k, v: [(k, v), (k, v + "!")])
        .to("out", key_serde="string", value_serde="string")
    )
    topology = builder.build()
    (sub,) = topology.subtopologies()
    task = TaskTopology(topology, sub, 0, {})
    task.process("in", b"key", b"value", 7)
    assert [(o.key, o.value) for o in task.drain_outputs()] == [
        (b"value", b"KEY"),
        (b"value", b"KEY!"),
    ]
    assert seen == ["value=KEY"]


def test_reduce_and_aggregate_keep_their_result_per_key(store_factory: StoreFactory) -> None:
    builder = StreamsBuilder()
    amounts = builder.stream("payments", key_serde="string", value_serde="json")
    amounts.group_by_key().reduce(max, "largest").to_stream().to(
        "largest", key_serde="string", value_serde="json"
    )
    amounts.group_by_key().aggregate(
        lambda: {"n": 0, "sum": 0},
        lambda _, amount, agg: {"n": agg["n"] + 1, "sum": agg["sum"] + amount},
        "totals",
    ).to_stream().to("totals", key_serde="string", value_serde="json")
    topology = builder.build()
    (sub,) = topology.subtopologies()
    stores = {name: store_factory(name) for name in sub.stores}
    task = TaskTopology(topology, sub, 0, stores)
    for amount in (5, 12, 7):
        task.process("payments", b"alice", str(amount).encode(), 0)
    last = {o.topic: o.value for o in task.drain_outputs()}
    assert last == {"largest": b"12", "totals": b'{"n":3,"sum":24}'}


def test_a_stream_joins_the_current_value_of_a_table(store_factory: StoreFactory) -> None:
    builder = StreamsBuilder()
    users = builder.table("users", "users-store", key_serde="string", value_serde="string")
    (
        builder.stream("clicks", key_serde="string", value_serde="string")
        .join(users, lambda page, name: f"{name} viewed {page}")
        .to("enriched", key_serde="string", value_serde="string")
    )
    topology = builder.build()
    (sub,) = topology.subtopologies()  # the shared store puts both in one task
    assert sub.source_topics == ("users", "clicks")
    task = TaskTopology(topology, sub, 0, {"users-store": store_factory("users-store")})
    task.process("clicks", b"u1", b"/home", 1)  # no user yet: an inner join emits nothing
    task.process("users", b"u1", b"Alice", 2)
    task.process("clicks", b"u1", b"/cart", 3)
    task.process("users", b"u1", None, 4)  # tombstone: the user is gone
    task.process("clicks", b"u1", b"/exit", 5)
    assert [o.value for o in task.drain_outputs() if o.topic == "enriched"] == [
        b"Alice viewed /cart"
    ]


def test_a_custom_processor_keeps_state_in_its_stores(store_factory: StoreFactory) -> None:
    from typing import Any

    from eddyline_runtime.processing import Processor, StoreSpec

    class FirstSeen(Processor):
        """Forwards a value the first time its key appears (dedup)."""

        def process(self, key: Any, value: Any) -> None:
            seen = self.context.get_state_store("seen")
            if seen.get(key.encode()) is None:
                seen.put(key.encode(), b"1")
                self.context.forward(key, value)

    builder = StreamsBuilder()
    (
        builder.stream("events", key_serde="string", value_serde="string")
        .process(FirstSeen, stores=["seen", StoreSpec("scratch", persistent=False)])
        .to("firsts", key_serde="string", value_serde="string")
    )
    topology = builder.build()
    assert topology.stores["seen"] == StoreSpec("seen")
    assert not topology.stores["scratch"].persistent
    (sub,) = topology.subtopologies()
    task = TaskTopology(
        topology,
        sub,
        0,
        {"seen": store_factory("seen"), "scratch": store_factory("scratch")},
    )
    for offset, (key, value) in enumerate([("a", "1"), ("b", "2"), ("a", "3")]):
        task.process("events", key.encode(), value.encode(), offset)
    assert [(o.key, o.value) for o in task.drain_outputs()] == [(b"a", b"1"), (b"b", b"2")]
