"""``KTable.transform_values``, ``KStream.transform_values`` and ``KStream.process_values``.

Worked from Kafka Streams' ``KTableTransformValuesTest`` (its exclamation, stateful
and stateless transformers and their expected outputs) and ``KStreamTransformValuesTest``
(apache/kafka, streams/src/test/java/org/apache/kafka/streams/kstream/internals/).
The tests are ours. One difference, as in test_table_operations.py: a re-grouped
aggregation's result carries its update's timestamp, where Kafka takes the later of
the update's and the aggregate's previous one (Kafka's third result is at 15, ours at 10).
"""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.processing import (
    Materialized,
    Processor,
    ProcessorContext,
    StoreSpec,
    StreamsBuilder,
    TopologyError,
    ValueTransformerWithKey,
)
from eddyline_runtime.processing.operators.value_processors import ProcessValuesProcessor
from tests.support.stores import StoreFactory
from tests.unit.processing.join_driver import JoinDriver


class Exclamation(ValueTransformerWithKey):
    """Kafka's ``ExclamationValueTransformer``: ``key->value!``, failing in ``init``
    when a store it was given is not reachable."""

    def __init__(self, *stores: str) -> None:
        self._stores = stores

    def init(self, context: ProcessorContext) -> None:
        missing = [name for name in self._stores if context.get_state_store(name) is None]
        assert not missing, f"stores not accessible: {missing}"

    def transform(self, key: Any, value: Any) -> str:
        return f"{key}->{value}!"


class Counter(ValueTransformerWithKey):
    """Kafka's ``StatefulTransformer``: 1, 2, 3... whatever the input."""

    def __init__(self) -> None:
        self.count = 0

    def transform(self, key: Any, value: Any) -> int:
        self.count += 1
        return self.count


class Length(ValueTransformerWithKey):
    """Kafka's ``StatelessTransformer``: the value's length, None for None."""

    def transform(self, key: Any, value: Any) -> int | None:
        return None if value is None else len(value)


def test_table_transform_values_reaches_its_store_and_transforms_tombstones(
    store_factory: StoreFactory,
) -> None:
    """shouldTransformValuesWithKey: a tombstone is transformed too ("D->None!")."""
    builder = StreamsBuilder()
    table = builder.table("input", "source", key_serde="string", value_serde="string")
    table.transform_values(
        lambda: Exclamation("side-store"), value_serde="string", stores=["side-store"]
    ).to_stream().to("output", key_serde="string", value_serde="string")
    driver = JoinDriver(builder.build(), store_factory)
    driver.pipe("input", "A", "a", 5)
    driver.pipe("input", "B", "b", 10)
    driver.pipe("input", "D", None, 15)
    assert driver.read() == [("A", "A->a!", 5), ("B", "B->b!", 10), ("D", "D->None!", 15)]


def test_table_transform_values_materialized_keeps_its_results(
    store_factory: StoreFactory,
) -> None:
    """shouldTransformValuesWithKeyAndMaterialize: the store holds what was forwarded."""
    builder = StreamsBuilder()
    table = builder.table("input", "source", key_serde="string", value_serde="string")
    result = table.transform_values(
        Exclamation,
        materialized=Materialized.as_("queryable").with_value_serde("string"),
        value_serde="string",
    )
    result.to_stream().to("output", key_serde="string", value_serde="string")
    assert result.store == "queryable"
    driver = JoinDriver(builder.build(), store_factory)
    driver.pipe("input", "A", "a", 5)
    driver.pipe("input", "B", "b", 10)
    driver.pipe("input", "C", None, 15)
    assert driver.read() == [("A", "A->a!", 5), ("B", "B->b!", 10), ("C", "C->None!", 15)]
    stored = driver.stores["queryable"]
    assert [stored.get(key.encode()) for key in "ABC"] == [b"A->a!", b"B->b!", b"C->None!"]


def _summed(
    transformed: Any, store_factory: StoreFactory, inputs: list[tuple[str, str, int]]
) -> list[tuple[str | None, str | None, int]]:
    """``transformed.group_by((k, v)).reduce(+, -)`` as strings, fed ``inputs``."""
    transformed.group_by(lambda k, v: (k, v), repartition_name="summed").reduce(
        lambda agg, v: agg + v, lambda agg, v: agg - v, "sums"
    ).map_values(str, value_serde="string").to_stream().to(
        "output", key_serde="string", value_serde="string"
    )
    topology = transformed._builder.build()
    upstream = JoinDriver(topology, store_factory, subtopology=0)
    downstream = JoinDriver(topology, store_factory, subtopology=1)
    for key, value, timestamp in inputs:
        upstream.pipe("input", key, value, timestamp)
        for k, v, ts in upstream.read("summed-repartition"):
            downstream.pipe("summed-repartition", k, v, ts)
    return downstream.read()


def test_a_materialized_stateful_transformer_gives_old_values_from_its_store(
    store_factory: StoreFactory,
) -> None:
    """shouldCalculateCorrectOldValuesIfMaterializedEvenIfStateful: the counter runs once
    per update (1, 2, 3) and the sum subtracts what it added, so it reads 1, 2, 3.
    Transforming the old value again would have counted twice per update."""
    builder = StreamsBuilder()
    table = builder.table("input", "source", key_serde="string", value_serde="string")
    transformed = table.transform_values(Counter, materialized="queryable", value_serde="json")
    out = _summed(transformed, store_factory, [("A", "x", 5), ("A", "x1", 15), ("A", "x2", 10)])
    assert out == [("A", "1", 5), ("A", "2", 15), ("A", "3", 10)]


def test_a_stateless_transformer_not_materialized_transforms_the_old_value(
    store_factory: StoreFactory,
) -> None:
    """shouldCalculateCorrectOldValuesIfNotStatefulEvenIfNotMaterialized: the lengths
    1, 2, 3 replace each other, the sum following them."""
    builder = StreamsBuilder()
    table = builder.table("input", "source", key_serde="string", value_serde="string")
    transformed = table.transform_values(Length, value_serde="json")
    out = _summed(transformed, store_factory, [("A", "a", 5), ("A", "aa", 15), ("A", "aaa", 10)])
    assert out == [("A", "1", 5), ("A", "2", 15), ("A", "3", 10)]


class Forwarding(ValueTransformerWithKey):
    def init(self, context: ProcessorContext) -> None:
        self._context = context

    def transform(self, key: Any, value: Any) -> Any:
        self._context.forward(key, value)
        return value


def test_a_transformer_forwarding_is_refused_with_the_way_out(
    store_factory: StoreFactory,
) -> None:
    """Kafka's ForwardingDisabledProcessorContext: the node forwards the result."""
    builder = StreamsBuilder()
    table = builder.table("input", "source", key_serde="string", value_serde="string")
    table.transform_values(Forwarding).to_stream().to("output")
    driver = JoinDriver(builder.build(), store_factory)
    with pytest.raises(Exception, match=r"KTable.transform_values called context.forward"):
        driver.pipe("input", "A", "a", 1)


class Summing(ValueTransformerWithKey):
    """A running sum per key in a store: state a stream transformer keeps."""

    def init(self, context: ProcessorContext) -> None:
        self._store = context.get_state_store("running")

    def transform(self, key: Any, value: Any) -> str:
        before = self._store.get(key.encode())
        total = int(value) + (0 if before is None else int(before))
        self._store.put(key.encode(), str(total).encode())
        return str(total)


def test_stream_transform_values_keeps_state_and_keys(store_factory: StoreFactory) -> None:
    """KStreamTransformValuesTest's shape: one result per record, under its key."""
    builder = StreamsBuilder()
    stream = builder.stream("input", key_serde="string", value_serde="string")
    stream.transform_values(Summing, stores=[StoreSpec("running", logged=False)]).to(
        "output", key_serde="string", value_serde="string"
    )
    driver = JoinDriver(builder.build(), store_factory)
    for key, value, timestamp in (("a", "1", 1), ("b", "10", 2), ("a", "2", 3), ("a", "3", 4)):
        driver.pipe("input", key, value, timestamp)
    assert driver.read() == [("a", "1", 1), ("b", "10", 2), ("a", "3", 3), ("a", "6", 4)]


class Doubling(Processor):
    """Forwards each value twice, under the record's key or (``rekey``) another."""

    def __init__(self, rekey: bool = False) -> None:
        self._rekey = rekey

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value)
        self.context.forward(f"{key}!" if self._rekey else key, value + value)


def test_process_values_keeps_keys_so_a_join_needs_no_repartition() -> None:
    """KIP-820: a stream after process_values is still partitioned by its key, so it may
    join a table; after process (which may change keys) the join is refused until the
    stream is repartitioned."""
    kept = StreamsBuilder()
    table = kept.table("table", "table-store")
    kept.stream("input").process_values(Doubling).join(table, lambda v, t: v)
    kept.stream("input2").transform_values(Length).join(table, lambda v, t: v)
    moved = StreamsBuilder()
    other = moved.table("table", "table-store")
    with pytest.raises(TopologyError, match="repartition"):
        moved.stream("input").process(Doubling).join(other, lambda v, t: v)


def test_process_values_forwards_under_the_key(store_factory: StoreFactory) -> None:
    builder = StreamsBuilder()
    builder.stream("input", key_serde="string", value_serde="string").process_values(Doubling).to(
        "output", key_serde="string", value_serde="string"
    )
    driver = JoinDriver(builder.build(), store_factory)
    driver.pipe("input", "k", "v", 7)
    assert driver.read() == [("k", "v", 7), ("k", "vv", 7)]


def test_process_values_refuses_another_key(store_factory: StoreFactory) -> None:
    builder = StreamsBuilder()
    builder.stream("input", key_serde="string", value_serde="string").process_values(
        lambda: Doubling(rekey=True)
    ).to("output", key_serde="string", value_serde="string")
    driver = JoinDriver(builder.build(), store_factory)
    with pytest.raises(Exception, match=r"forwarded key 'k!' while processing key 'k'.*"
                       r"KStream.process"):  # fmt: skip
        driver.pipe("input", "k", "v", 7)


def test_topology_error_is_what_a_refused_forward_raises() -> None:
    """The refusals are TopologyErrors (an author's mistake, not the data's)."""

    class Recorder:
        def forward(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("not reached")

    processor = ProcessValuesProcessor(Doubling(rekey=True))
    processor.init(Recorder())  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="outside process"):
        processor._fixed.forward("k", "v")
