"""KStream-GlobalKTable joins (inner and left), through the test driver.

Ported from Kafka Streams' ``KStreamGlobalKTableJoinTest`` and
``KStreamGlobalKTableLeftJoinTest`` (apache/kafka,
streams/src/test/java/org/apache/kafka/streams/kstream/internals/): integer stream
keys 0..3, stream values ``X<k>,FKey<k>`` whose second token is the global table's
key (the key mapper returns None when there is none), global values ``Y<k>``, the
``value1+value2`` joiner. The expected outputs follow those tests' assertions; the
code is ours.
"""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.processing import StreamsBuilder, Topology
from eddyline_runtime.processing.topology import TopologyError
from eddyline_runtime.testing import TopologyTestDriver

STREAM, GLOBAL, OUTPUT = "streamTopic", "globalTopic", "output"
KEYS = (0, 1, 2, 3)


def key_mapper(key: Any, value: str) -> str | None:
    """Kafka's test mapper: the value's second comma-separated token, else no match."""
    tokens = value.split(",")
    return tokens[1] if len(tokens) > 1 else None


def joiner(left: Any, right: Any) -> str:
    return f"{left}+{right}"


def topology(*, left: bool) -> Topology:
    builder = StreamsBuilder()
    stream = builder.stream(STREAM, key_serde="int", value_serde="string")
    table = builder.global_table(GLOBAL, "global-store", key_serde="string", value_serde="string")
    join = stream.left_join if left else stream.join
    join(table, key_mapper, joiner).to(OUTPUT, key_serde="int", value_serde="string")
    return builder.build()


class Harness:
    def __init__(self, driver: TopologyTestDriver) -> None:
        self.driver = driver
        self.stream = driver.create_input_topic(STREAM)
        self.table = driver.create_input_topic(GLOBAL)
        self.output = driver.create_output_topic(OUTPUT)

    def push_to_stream(self, count: int, prefix: str, *, include_foreign_key: bool = True) -> None:
        for i in range(count):
            key = KEYS[i]
            value = f"{prefix}{key},FKey{key}" if include_foreign_key else f"{prefix}{key}"
            self.stream.pipe_input(key, value, timestamp=i)

    def push_to_global(self, count: int, prefix: str) -> None:
        for i in range(count):
            self.table.pipe_input(f"FKey{KEYS[i]}", f"{prefix}{KEYS[i]}")

    def push_null_to_global(self, count: int) -> None:
        for i in range(count):
            self.table.pipe_input(f"FKey{KEYS[i]}", None)

    def results(self) -> list[tuple[Any, Any, int]]:
        return [(r.key, r.value, r.timestamp) for r in self.output.read_records_to_list()]


@pytest.fixture(params=[False, True], ids=["inner", "left"])
def harness(request: pytest.FixtureRequest) -> Any:
    with TopologyTestDriver(topology(left=request.param)) as driver:
        yield request.param, Harness(driver)


def test_should_not_join_with_empty_global_table_on_stream_updates(harness: Any) -> None:
    """KStreamGlobalKTableJoinTest.shouldNotJoinWithEmptyGlobalTableOnStreamUpdates /
    KStreamGlobalKTableLeftJoinTest.shouldJoinWithEmptyGlobalTableOnStreamUpdates."""
    left, h = harness
    h.push_to_stream(2, "X")
    expected = [(0, "X0,FKey0+None", 0), (1, "X1,FKey1+None", 1)] if left else []
    assert h.results() == expected


def test_should_not_join_on_global_table_updates(harness: Any) -> None:
    """KStreamGlobalKTableJoinTest.shouldNotJoinOnGlobalTableUpdates: table updates alone
    never produce; the stream joins the table's current value."""
    _, h = harness
    h.push_to_stream(2, "X")
    h.results()
    h.push_to_global(4, "Y")
    assert h.results() == []
    h.push_to_global(4, "YY")
    assert h.results() == []
    h.push_to_stream(4, "X")
    assert h.results() == [(k, f"X{k},FKey{k}+YY{k}", k) for k in KEYS]
    h.push_to_global(4, "YYY")
    assert h.results() == []


def test_should_join_only_if_match_found_on_stream_updates(harness: Any) -> None:
    """KStreamGlobalKTableJoinTest.shouldJoinOnlyIfMatchFoundOnStreamUpdates /
    the left join's shouldJoinRegardlessIfMatchFoundOnStreamUpdates."""
    left, h = harness
    h.push_to_global(2, "Y")
    h.push_to_stream(4, "X")
    expected = [(k, f"X{k},FKey{k}+Y{k}", k) for k in KEYS[:2]]
    if left:
        expected += [(k, f"X{k},FKey{k}+None", k) for k in KEYS[2:]]
    assert h.results() == expected


def test_should_clear_global_table_entry_on_null_value_updates(harness: Any) -> None:
    """KStreamGlobalKTableJoinTest.shouldClearGlobalTableEntryOnNullValueUpdates: a
    tombstone on the global topic removes the entry."""
    left, h = harness
    h.push_to_global(4, "Y")
    h.push_to_stream(4, "X")
    assert h.results() == [(k, f"X{k},FKey{k}+Y{k}", k) for k in KEYS]
    h.push_null_to_global(2)
    h.push_to_stream(4, "XX")
    expected = [(k, f"XX{k},FKey{k}+Y{k}", k) for k in KEYS[2:]]
    if left:
        expected = [(k, f"XX{k},FKey{k}+None", k) for k in KEYS[:2]] + expected
    assert h.results() == expected
    assert h.driver.get_key_value_store("global-store").get("FKey0") is None
    assert h.driver.get_key_value_store("global-store").get("FKey2") == "Y2"


def test_should_not_join_on_null_key_mapper_values(harness: Any) -> None:
    """KStreamGlobalKTableJoinTest.shouldNotJoinOnNullKeyMapperValues (inner: nothing,
    counted as dropped) / the left join's shouldJoinOnNullKeyMapperValues (joined with
    None)."""
    left, h = harness
    h.push_to_global(4, "Y")
    h.push_to_stream(4, "XXX", include_foreign_key=False)
    if left:
        assert h.results() == [(k, f"XXX{k}+None", k) for k in KEYS]
        assert h.driver.dropped_records == 0
    else:
        assert h.results() == []
        assert h.driver.dropped_records == 4


def test_should_join_on_null_key_with_non_null_key_mapper_value(harness: Any) -> None:
    """KStreamGlobalKTableJoinTest.shouldJoinOnNullKeyWithNonNullKeyMapperValues: the
    stream's own key takes no part in the look-up, so a keyless record joins."""
    _, h = harness
    h.push_to_global(4, "Y")
    h.stream.pipe_input(None, "XXX0,FKey0", timestamp=7)
    assert h.results() == [(None, "XXX0,FKey0+Y0", 7)]


def test_should_drop_null_stream_values(harness: Any) -> None:
    """KStreamGlobalKTableJoinTest.shouldLogAndMeterWhenSkippingNullLeftValue (the key
    mapper is never asked: a null value is an empty message, in both joins)."""
    _, h = harness
    h.push_to_global(4, "Y")
    h.stream.pipe_input(0, None, timestamp=0)
    assert h.results() == []
    assert h.driver.dropped_records == 1


def test_should_not_require_copartitioning() -> None:
    """KStreamGlobalKTableJoinTest.shouldNotRequireCopartitioning: the join lives in the
    stream's sub-topology alone (the global table is no sub-topology's), even after the
    stream was re-keyed."""
    builder = StreamsBuilder()
    stream = builder.stream(STREAM, key_serde="int", value_serde="string")
    table = builder.global_table(GLOBAL, "global-store", key_serde="string", value_serde="string")
    stream.select_key(lambda k, v: k).join(table, key_mapper, joiner).to(OUTPUT)
    built = builder.build()
    (sub,) = built.subtopologies()
    assert sub.source_topics == (STREAM,)
    assert sub.stores == ()
    assert "Processor: KTABLE-SOURCE-0000000002 (stores: [global-store])" in built.describe()


def test_global_table_refusals() -> None:
    builder = StreamsBuilder()
    stream = builder.stream(STREAM, key_serde="int", value_serde="string")
    table = builder.global_table(GLOBAL, "global-store", key_serde="string")
    with pytest.raises(TopologyError, match="key_mapper"):
        stream.join(table, joiner)  # type: ignore[call-overload]
    with pytest.raises(TopologyError, match="already read by"):
        builder.global_table(GLOBAL, "other-store")
    with pytest.raises(TopologyError, match="already exists"):
        builder.global_table("another-topic", "global-store")
    with pytest.raises(TopologyError, match="already read by global store"):
        builder.stream(GLOBAL)
    from eddyline_runtime.processing import Materialized

    with pytest.raises(TopologyError, match="logging cannot be disabled"):
        builder.global_table("t3", Materialized.as_("s3").with_logging_disabled())


def test_processors_cannot_write_a_global_store() -> None:
    from eddyline_runtime.engine.global_thread import GlobalStoreError

    with TopologyTestDriver(topology(left=False)) as driver:
        task = driver._tasks[0]
        view = next(iter(task.topology.global_stores.values()))
        with pytest.raises(GlobalStoreError, match="read-only"):
            view.put(b"k", b"v")
