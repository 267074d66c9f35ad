"""``suppress(Suppressed.until_time_limit(...))`` and bounded buffers, through the test driver.

Worked from Kafka Streams' ``SuppressScenarioTest`` and ``KTableSuppressProcessorTest``
(apache/kafka, streams/src/test/java/org/apache/kafka/streams/kstream/internals/): the
inputs, timestamps and expected raw and suppressed outputs of
``shouldImmediatelyEmitEventsWithZeroEmitAfter``,
``shouldSuppressIntermediateEventsWithTimeLimit``, ``...WithRecordLimit`` and
``...WithBytesLimit`` (a table of values counted by ``groupBy((k, v) -> (v, k))``),
``shouldWorkBeforeJoinRight``, and the processor test's record and byte capacity
cases (emit early, shut down) and tombstone cases, are carried over as facts. The
byte bound differs in its number only: Kafka counts a little over 100 bytes an
entry, eddyline 27 for these (see ``processing/operators/suppress.py``), so the
bound that holds one entry and not two is 40 here, 200 there.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from eddyline_runtime.processing import (
    BufferConfig,
    KTable,
    Materialized,
    SessionWindows,
    StreamsBuilder,
    Suppressed,
    SuppressionBufferFullError,
    TimeWindows,
    TopologyError,
)
from eddyline_runtime.testing import TestRecord, TopologyTestDriver

CONFIG = {"application.id": "suppress", "statestore.cache.max.bytes": "0"}
FOREVER = 2**62  # Kafka's tests wait Long.MAX_VALUE: nothing is ever due by time


def value_counts(suppressed: Suppressed) -> StreamsBuilder:
    """Kafka's scenario: a table re-keyed by its values and counted; the raw counts and
    the suppressed counts side by side."""
    builder = StreamsBuilder()
    counts = (
        builder.table(
            "input",
            Materialized.as_("input-store").with_caching_disabled(),
            key_serde="string",
            value_serde="string",
        )
        .group_by(lambda key, value: (value, key), repartition_name="by-value")
        .count("counts")
    )
    counts.suppress(suppressed).to_stream().to(
        "output-suppressed", key_serde="string", value_serde="long"
    )
    counts.to_stream().to("output-raw", key_serde="string", value_serde="long")
    return builder


def drain(driver: TopologyTestDriver, topic: str) -> list[tuple[Any, Any, int]]:
    out = driver.create_output_topic(topic, "string", "long")
    return [(r.key, r.value, r.timestamp) for r in out.read_records_to_list()]


RAW_FIRST_THREE = [("v1", 1, 0), ("v1", 0, 1), ("v2", 1, 1), ("v1", 1, 2)]


def pipe_first_three(driver: TopologyTestDriver) -> None:
    inputs = driver.create_input_topic("input", "string", "string")
    for key, value, timestamp in (("k1", "v1", 0), ("k1", "v2", 1), ("k2", "v1", 2)):
        inputs.pipe_input(key, value, timestamp=timestamp)


def test_a_zero_time_limit_emits_every_update_at_once() -> None:
    """shouldImmediatelyEmitEventsWithZeroEmitAfter."""
    suppressed = Suppressed.until_time_limit(0, BufferConfig.unbounded())
    with TopologyTestDriver(value_counts(suppressed), CONFIG) as driver:
        pipe_first_three(driver)
        assert drain(driver, "output-raw") == RAW_FIRST_THREE
        assert drain(driver, "output-suppressed") == RAW_FIRST_THREE
        inputs = driver.create_input_topic("input", "string", "string")
        inputs.pipe_input("x", "x", timestamp=3)
        assert drain(driver, "output-raw") == [("x", 1, 3)]
        assert drain(driver, "output-suppressed") == [("x", 1, 3)]
        inputs.pipe_input("x", "y", timestamp=4)
        assert drain(driver, "output-raw") == [("x", 0, 4), ("y", 1, 4)]
        assert drain(driver, "output-suppressed") == [("x", 0, 4), ("y", 1, 4)]
        # Nothing is left in the buffer but its clock.
        assert driver.get_key_value_store("counts-suppress-buffer").all() == [
            (b"\xffstream-time", (4).to_bytes(8, "big"))
        ]


def test_a_time_limit_holds_a_key_from_its_first_buffered_update() -> None:
    """shouldSuppressIntermediateEventsWithTimeLimit: 2 ms. v1's first update (at 0) is
    due at 2, and its latest value (1 at 2) comes out then; v2 (first at 1) at 3; tick's
    first update at 3 keeps it held at 4, although tick changed at 4."""
    suppressed = Suppressed.until_time_limit(2, BufferConfig.unbounded())
    with TopologyTestDriver(value_counts(suppressed), CONFIG) as driver:
        pipe_first_three(driver)
        assert drain(driver, "output-raw") == RAW_FIRST_THREE
        assert drain(driver, "output-suppressed") == [("v1", 1, 2)]
        inputs = driver.create_input_topic("input", "string", "string")
        inputs.pipe_input("tick", "tick", timestamp=3)
        assert drain(driver, "output-raw") == [("tick", 1, 3)]
        assert drain(driver, "output-suppressed") == [("v2", 1, 1)]
        inputs.pipe_input("tick", "tock", timestamp=4)
        assert drain(driver, "output-raw") == [("tick", 0, 4), ("tock", 1, 4)]
        assert drain(driver, "output-suppressed") == []


def test_the_buffer_publishes_kafkas_size_and_count_metrics() -> None:
    """suppression-buffer-count/-size-avg/-max, recorded after each update: the first
    three updates leave v1; v1; v1 and v2; v2 (v1 due at 2), entries of 27 bytes."""
    suppressed = Suppressed.until_time_limit(2, BufferConfig.unbounded())
    with TopologyTestDriver(value_counts(suppressed), CONFIG) as driver:
        pipe_first_three(driver)
        (node,) = {
            dict(name.tags)["processor-node-id"]
            for name in driver.metrics()
            if name.name == "suppression-buffer-count-max"
        }
        assert node.startswith("KTABLE-SUPPRESS")
        tags = {"thread-id": "suppress-test-driver", "task-id": "1_0", "processor-node-id": node}
        group = "stream-processor-node-metrics"
        assert driver.metric(group, "suppression-buffer-count-max", tags) == 2
        assert driver.metric(group, "suppression-buffer-count-avg", tags) == 1.25
        assert driver.metric(group, "suppression-buffer-size-max", tags) == 54
        assert driver.metric(group, "suppression-buffer-size-avg", tags) == 27 * 1.25
        assert driver.metric(group, "suppression-emit-total", tags) == 1


def test_a_record_bound_emits_the_oldest_key_early() -> None:
    """shouldSuppressIntermediateEventsWithRecordLimit: max_records(1), emit early."""
    suppressed = Suppressed.until_time_limit(FOREVER, BufferConfig.max_records(1))
    with TopologyTestDriver(value_counts(suppressed), CONFIG) as driver:
        pipe_first_three(driver)
        assert drain(driver, "output-raw") == RAW_FIRST_THREE
        # v1's consecutive updates come out as the latter, when v2 takes the buffer over.
        assert drain(driver, "output-suppressed") == [("v1", 0, 1), ("v2", 1, 1)]
        driver.create_input_topic("input", "string", "string").pipe_input("x", "x", timestamp=3)
        assert drain(driver, "output-raw") == [("x", 1, 3)]
        # v1's last update comes out; x stays until another key pushes it.
        assert drain(driver, "output-suppressed") == [("v1", 1, 2)]


def test_a_byte_bound_emits_the_oldest_key_early() -> None:
    """shouldSuppressIntermediateEventsWithBytesLimit, with a bound that holds one entry
    of 27 bytes (8 buffer time + 2 key + 8 timestamp + 1 + 8 count) and not two."""
    suppressed = Suppressed.until_time_limit(FOREVER, BufferConfig.max_bytes(40))
    with TopologyTestDriver(value_counts(suppressed), CONFIG) as driver:
        pipe_first_three(driver)
        assert drain(driver, "output-raw") == RAW_FIRST_THREE
        assert drain(driver, "output-suppressed") == [("v1", 0, 1), ("v2", 1, 1)]
        driver.create_input_topic("input", "string", "string").pipe_input("x", "x", timestamp=3)
        assert drain(driver, "output-suppressed") == [("v1", 1, 2)]


def test_combined_bounds_emit_until_both_hold() -> None:
    """max_records(3).with_max_bytes(40): the byte bound is the tighter one here."""
    suppressed = Suppressed.until_time_limit(
        FOREVER, BufferConfig.max_records(3).with_max_bytes(40)
    )
    with TopologyTestDriver(value_counts(suppressed), CONFIG) as driver:
        pipe_first_three(driver)
        assert drain(driver, "output-suppressed") == [("v1", 0, 1), ("v2", 1, 1)]


@pytest.mark.parametrize(
    ("config", "bound"),
    [
        (BufferConfig.max_records(1).shut_down_when_full(), r"max_records\(1\)"),
        (BufferConfig.max_bytes(40).shut_down_when_full(), r"max_bytes\(40\)"),
    ],
    ids=["records", "bytes"],
)
def test_a_full_buffer_that_shuts_down_fails_the_task_naming_node_bound_and_way_out(
    config: BufferConfig, bound: str
) -> None:
    """suppressShouldShutDownWhenOverRecordCapacity / ...OverByteCapacity: the second key
    takes the buffer over its bound; the task fails, the processing handler aside."""
    suppressed = Suppressed.until_time_limit(FOREVER, config)
    settings = {**CONFIG, "processing.exception.handler": "log-and-continue"}
    with TopologyTestDriver(value_counts(suppressed), settings) as driver:
        inputs = driver.create_input_topic("input", "string", "string")
        inputs.pipe_input("k1", "v1", timestamp=0)
        # A fatal error (an EddylineError): it never reaches the handler, which would
        # have skipped the record.
        with pytest.raises(SuppressionBufferFullError) as failed:
            inputs.pipe_input("k2", "v2", timestamp=1)
        message = str(failed.value)
        assert re.search(r'suppress node "KTABLE-SUPPRESS-\d+"', message)
        assert 'buffer store "counts-suppress-buffer"' in message
        assert re.search(bound + r"\.shut_down_when_full\(\)", message)
        assert "holds 2 records, 54 bytes" in message
        assert "emit_early_when_full()" in message and "unbounded()" in message


def test_until_window_closes_refuses_a_buffer_that_emits_early() -> None:
    """Kafka's untilWindowCloses takes a StrictBufferConfig only (a type error there)."""
    for config in (
        BufferConfig.max_records(3),
        BufferConfig.max_bytes(100),
        BufferConfig.max_records(3).shut_down_when_full().emit_early_when_full(),
    ):
        with pytest.raises(TopologyError, match="strict buffer config") as refused:
            Suppressed.until_window_closes(config)
        assert "shut_down_when_full()" in str(refused.value)
        assert "until_time_limit" in str(refused.value)
    # Strict configs are taken.
    Suppressed.until_window_closes(BufferConfig.max_records(3).shut_down_when_full())
    Suppressed.until_window_closes(
        BufferConfig.max_bytes(10).emit_early_when_full().with_no_bound()
    )


def test_bad_bounds_and_waits_are_refused_with_the_way_out() -> None:
    with pytest.raises(TopologyError, match=r"max_records must be a whole number >= 0, got -1"):
        BufferConfig.max_records(-1)
    with pytest.raises(TopologyError, match=r"max_bytes must be .*got 1.5.*unbounded\(\)"):
        BufferConfig.max_bytes(1.5)  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="time to wait must be a whole number"):
        Suppressed.until_time_limit(-5, BufferConfig.unbounded())
    with pytest.raises(TopologyError, match="takes a BufferConfig, got 'name'"):
        Suppressed.until_window_closes("name")  # type: ignore[arg-type]


def test_until_window_closes_on_a_table_without_windows_is_refused() -> None:
    builder = StreamsBuilder()
    table = builder.table("input", "input-store", key_serde="string", value_serde="string")
    with pytest.raises(TopologyError, match="needs the table of a windowed aggregation"):
        table.suppress(Suppressed.until_window_closes())


def test_a_table_without_a_store_names_its_buffer() -> None:
    builder = StreamsBuilder()
    table = builder.table("input", "input-store", key_serde="string", value_serde="string")
    mapped = table.map_values(str.upper, value_serde="string")
    with pytest.raises(TopologyError, match=r"names its buffer: .*name=\.\.\."):
        mapped.suppress(Suppressed.until_time_limit(10, BufferConfig.unbounded()))
    named = mapped.suppress(Suppressed.until_time_limit(10, BufferConfig.unbounded(), name="up"))
    assert isinstance(named, KTable)


def test_a_suppressed_source_table_joins_with_what_it_emitted() -> None:
    """shouldWorkBeforeJoinRight: the right table, suppressed 10 ms, joined outer."""
    builder = StreamsBuilder()
    left = builder.table("left", "left-store", key_serde="string", value_serde="string")
    right = builder.table(
        "right", "right-store", key_serde="string", value_serde="string"
    ).suppress(Suppressed.until_time_limit(10, BufferConfig.unbounded(), name="right-buffer"))
    left.outer_join(
        right,
        lambda a, b: f"({a},{b})",
        store_name="joined",
        value_serde="string",
    ).to_stream().to("output", key_serde="string", value_serde="string")
    with TopologyTestDriver(builder, CONFIG) as driver:
        lefts = driver.create_input_topic("left", "string", "string")
        rights = driver.create_input_topic("right", "string", "string")
        out = driver.create_output_topic("output", "string", "string")

        def emitted() -> list[tuple[Any, Any, int]]:
            return [(r.key, r.value, r.timestamp) for r in out.read_records_to_list()]

        rights.pipe_input("B", "1", timestamp=0)
        rights.pipe_input("A", "1", timestamp=0)
        assert emitted() == []
        rights.pipe_input("tick", "tick", timestamp=10)
        assert emitted() == [("A", "(None,1)", 0), ("B", "(None,1)", 0)]
        rights.pipe_input("A", "2", timestamp=11)
        assert emitted() == []
        lefts.pipe_input("A", "a", timestamp=12)
        assert emitted() == [("A", "(a,1)", 12)]
        lefts.pipe_input("B", "b", timestamp=12)
        assert emitted() == [("B", "(b,1)", 12)]
        lefts.pipe_input("A", "b", timestamp=13)
        assert emitted() == [("A", "(b,1)", 13)]
        rights.pipe_input("tick", "tick1", timestamp=21)
        assert emitted() == [("tick", "(None,tick1)", 21), ("A", "(b,2)", 13)]


def test_a_time_limit_forwards_a_deleted_row() -> None:
    """suppressShouldNotDropTombstonesForKTable: a None update is buffered and forwarded
    like any other (only until_window_closes drops them)."""
    builder = StreamsBuilder()
    builder.table("input", "input-store", key_serde="string", value_serde="string").suppress(
        Suppressed.until_time_limit(0, BufferConfig.max_records(5))
    ).to_stream().to("output", key_serde="string", value_serde="string")
    with TopologyTestDriver(builder, CONFIG) as driver:
        inputs = driver.create_input_topic("input", "string", "string")
        inputs.pipe_input("hey", "there", timestamp=100)
        inputs.pipe_input("hey", None, timestamp=101)
        out = driver.create_output_topic("output", "string", "string")
        assert out.read_records_to_list() == [
            TestRecord("hey", "there", 100),
            TestRecord("hey", None, 101),
        ]


def windowed_counts(builder: StreamsBuilder, windows: Any) -> Any:
    return (
        builder.stream("input", key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(windows)
        .count(Materialized.as_("counts").with_caching_disabled())
    )


def test_a_time_limit_on_a_windowed_table_forwards_a_merged_away_session() -> None:
    """suppressShouldNotDropTombstonesForSessionWindows: with a zero time limit, a
    session merged away comes out as None (until_window_closes drops it)."""
    builder = StreamsBuilder()
    windowed_counts(builder, SessionWindows.of_inactivity_gap_with_grace(5, 0)).suppress(
        Suppressed.until_time_limit(0, BufferConfig.unbounded())
    ).to_stream().map(lambda key, value: (str(key), value)).to(
        "output", key_serde="string", value_serde="long"
    )
    with TopologyTestDriver(builder, CONFIG) as driver:
        inputs = driver.create_input_topic("input", "string", "string")
        inputs.pipe_input("k1", "v1", timestamp=0)
        inputs.pipe_input("k1", "v1", timestamp=5)
        assert drain(driver, "output") == [
            ("[k1@0/0]", 1, 0),
            ("[k1@0/0]", None, 0),
            ("[k1@0/5]", 2, 5),
        ]


def test_a_time_limit_on_a_windowed_table_holds_each_window_from_its_first_update() -> None:
    """windowedZeroTimeLimitShouldImmediatelyEmit's keys, with a 3 ms limit: a window's
    updates are held from its first, whatever the window's end."""
    builder = StreamsBuilder()
    windowed_counts(builder, TimeWindows.of_size_with_grace(100, 0)).suppress(
        Suppressed.until_time_limit(3, BufferConfig.unbounded())
    ).to_stream().map(lambda key, value: (str(key), value)).to(
        "output", key_serde="string", value_serde="long"
    )
    with TopologyTestDriver(builder, CONFIG) as driver:
        inputs = driver.create_input_topic("input", "string", "string")
        for timestamp in (0, 1, 2):
            inputs.pipe_input("k1", "v", timestamp=timestamp)
        assert drain(driver, "output") == []
        inputs.pipe_input("k2", "v", timestamp=3)
        assert drain(driver, "output") == [("[k1@0/100]", 3, 2)]
        inputs.pipe_input("k2", "v", timestamp=6)
        assert drain(driver, "output") == [("[k2@0/100]", 2, 6)]
