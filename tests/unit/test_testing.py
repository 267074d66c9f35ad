"""The topology test driver: what Kafka's TopologyTestDriver promises, on the engine's tasks."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.engine.task import TaskProcessingError
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.processing import (
    Processor,
    ProcessorContext,
    PunctuationType,
    StoreSpec,
    StreamsBuilder,
    Suppressed,
    TimeWindows,
    Topology,
)
from eddyline_runtime.serde import LongSerde
from eddyline_runtime.testing import (
    EmptyTopicError,
    TestDriverError,
    TestRecord,
    TopologyTestDriver,
)


def word_count() -> StreamsBuilder:
    builder = StreamsBuilder()
    (
        builder.stream("lines", value_serde="string")
        .flat_map_values(str.split)
        .group_by(lambda _key, word: word, value_serde="string", repartition_name="by-word")
        .count("counts")
        .to_stream()
        .to("word-counts", key_serde="string", value_serde="long")
    )
    return builder


def test_a_piped_record_is_processed_through_every_sub_topology_before_the_call_returns() -> None:
    with TopologyTestDriver(word_count(), {"application.id": "wc"}) as driver:
        lines = driver.create_input_topic("lines")
        counts = driver.create_output_topic("word-counts")

        lines.pipe_input(None, "the fox the", timestamp=7)

        assert counts.read_records_to_list() == [
            TestRecord("the", 1, 7),
            TestRecord("fox", 1, 7),
            TestRecord("the", 2, 7),
        ]
        assert counts.is_empty()
        assert driver.get_key_value_store("counts").get("the") == 2
        assert driver.get_key_value_store("counts").all() == [("fox", 1), ("the", 2)]


def test_internal_topics_and_changelogs_are_named_as_in_a_run_and_readable() -> None:
    with TopologyTestDriver(word_count(), {"application.id": "wc"}) as driver:
        driver.create_input_topic("lines").pipe_input(None, "a b", timestamp=1)

        assert driver.produced_topic_names() == {
            "lines",
            "wc-by-word-repartition",
            "wc-counts-changelog",
            "word-counts",
        }
        repartitioned = driver.create_output_topic("by-word-repartition", "string", "string")
        assert repartitioned.read_key_values_to_list() == [("a", "a"), ("b", "b")]
        changelog = driver.create_output_topic("wc-counts-changelog", "string", LongSerde)
        assert changelog.read_key_values_to_map() == {"a": 1, "b": 1}


def test_reading_an_empty_topic_raises_and_every_reader_shares_the_unread_records() -> None:
    with TopologyTestDriver(word_count()) as driver:
        first = driver.create_output_topic("word-counts")
        second = driver.create_output_topic("word-counts")
        with pytest.raises(EmptyTopicError, match='topic "word-counts" has no unread record'):
            first.read_value()
        driver.create_input_topic("lines").pipe_value_list(["x", "y"])
        assert first.read_key_value() == ("x", 1)
        assert second.queue_size == 1
        assert second.read_value() == 1
        assert first.is_empty()


def test_records_piped_without_a_timestamp_take_the_topics_time_and_advance_it() -> None:
    with TopologyTestDriver(word_count()) as driver:
        lines = driver.create_input_topic("lines", start_timestamp=1_000, auto_advance_ms=10)
        lines.pipe_value_list(["a", "b"])
        lines.advance_time(100)
        lines.pipe_input(None, "c")
        lines.pipe_input(None, "d", timestamp=5)
        timestamps = [
            r.timestamp for r in driver.create_output_topic("word-counts").read_records_to_list()
        ]
        assert timestamps == [1_000, 1_010, 1_120, 5]


def test_unknown_topics_and_stores_are_refused_naming_what_there_is() -> None:
    with TopologyTestDriver(word_count()) as driver:
        with pytest.raises(TestDriverError, match=r'no topic "line" \(its inputs: lines\)'):
            driver.create_input_topic("line")
        with pytest.raises(TestDriverError, match='no topic "by-word-repartition"'):
            # Internal: only the topology writes it.
            driver.create_input_topic("by-word-repartition")
        with pytest.raises(TestDriverError, match=r'no store "count" \(its stores: counts\)'):
            driver.get_key_value_store("count")
        with pytest.raises(TestDriverError, match='"counts" is a key-value store, not a window'):
            driver.get_window_store("counts")


def test_a_closed_driver_refuses_work_and_leaves_no_state_directory() -> None:
    driver = TopologyTestDriver(word_count())
    lines = driver.create_input_topic("lines")
    lines.pipe_value_list(["a"])
    state_dir = Path(driver.config.state_dir)
    assert state_dir.is_dir()  # RocksDB stores in a temporary directory of the driver's own
    driver.close()
    assert not state_dir.exists()
    with pytest.raises(TestDriverError, match="closed"):
        lines.pipe_value_list(["b"])
    driver.close()  # twice is fine


def test_a_failing_processor_raises_the_engines_error_naming_the_record() -> None:
    builder = StreamsBuilder()
    builder.stream("in", value_serde="string").map_values(int).to("out", value_serde="long")
    with TopologyTestDriver(builder) as driver:
        topic = driver.create_input_topic("in")
        topic.pipe_input(None, "1")
        with pytest.raises(TaskProcessingError, match="failed processing in-0 at offset 1"):
            topic.pipe_input(None, "one")


# -- punctuations ---------------------------------------------------------------------------


class Ticker(Processor):
    """Forwards ("tick", time) at each punctuation of the given type, every 1,000 ms."""

    def __init__(self, kind: PunctuationType) -> None:
        self.kind = kind

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        context.schedule(1_000, self.kind, lambda now: context.forward("tick", now))

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value)


def ticker(kind: PunctuationType) -> Topology:
    return (
        Topology()
        .add_source("source", ["in"], key_serde="string", value_serde="long")
        .add_processor("ticker", lambda: Ticker(kind), "source")
        .add_sink("sink", "out", "ticker", key_serde="string", value_serde="long")
    )


def test_wall_clock_punctuations_fire_only_when_the_drivers_clock_is_advanced() -> None:
    with TopologyTestDriver(
        ticker(PunctuationType.WALL_CLOCK_TIME), initial_wall_clock_time_ms=10_000
    ) as driver:
        out = driver.create_output_topic("out")
        driver.create_input_topic("in").pipe_input("k", 1, timestamp=50_000)
        assert out.read_key_values_to_list() == [("k", 1)]  # records never move the clock

        driver.advance_wall_clock_time(999)
        assert out.is_empty()
        driver.advance_wall_clock_time(1)
        assert out.read_records_to_list() == [TestRecord("tick", 11_000, 11_000)]
        # Several intervals at once punctuate once (Kafka's PunctuationSchedule.next).
        driver.advance_wall_clock_time(5_500)
        assert out.read_key_values_to_list() == [("tick", 16_500)]
        assert driver.wall_clock_time_ms == 16_500


def test_stream_time_punctuations_fire_as_records_advance_stream_time() -> None:
    with TopologyTestDriver(ticker(PunctuationType.STREAM_TIME)) as driver:
        out = driver.create_output_topic("out")
        topic = driver.create_input_topic("in")
        topic.pipe_input("a", 1, timestamp=500)  # the first punctuation, aligned to 0
        topic.pipe_input("b", 2, timestamp=999)
        topic.pipe_input("c", 3, timestamp=2_100)
        driver.advance_wall_clock_time(60_000)  # the clock drives no stream-time punctuation
        assert out.read_key_values_to_list() == [
            ("a", 1),
            ("tick", 500),
            ("b", 2),
            ("c", 3),
            ("tick", 2_100),
        ]


# -- max.task.idle.ms on the driver's clock ----------------------------------------------------


def enrichment() -> StreamsBuilder:
    builder = StreamsBuilder()
    profiles = builder.table("profiles", "profiles", key_serde="string", value_serde="string")
    (
        builder.stream("clicks", key_serde="string", value_serde="string")
        .join(profiles, lambda click, region: f"{click}@{region}")
        .to("enriched", key_serde="string", value_serde="string")
    )
    return builder


def test_a_record_held_back_by_max_task_idle_ms_waits_for_the_drivers_clock() -> None:
    config = {"max.task.idle.ms": 100}
    with TopologyTestDriver(enrichment(), config, initial_wall_clock_time_ms=0) as driver:
        enriched = driver.create_output_topic("enriched")
        profiles = driver.create_input_topic("profiles")
        clicks = driver.create_input_topic("clicks")
        profiles.pipe_input("ann", "eu", timestamp=1)
        clicks.pipe_input("ann", "/home", timestamp=2)  # the profiles input is empty: wait
        assert enriched.is_empty()
        driver.advance_wall_clock_time(99)
        assert enriched.is_empty()
        driver.advance_wall_clock_time(1)
        assert enriched.read_key_values_to_list() == [("ann", "/home@eu")]


def test_without_idling_each_record_is_processed_as_it_is_piped() -> None:
    with TopologyTestDriver(enrichment()) as driver:
        driver.create_input_topic("profiles").pipe_input("ann", "eu", timestamp=1)
        driver.create_input_topic("clicks").pipe_input("ann", "/home", timestamp=2)
        assert driver.create_output_topic("enriched").read_value() == "/home@eu"


# -- stores ------------------------------------------------------------------------------------


class Remember(Processor):
    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = context.get_state_store("seen")

    def process(self, key: Any, value: Any) -> None:
        self.store.put(key.encode(), value.encode())


def test_get_state_store_gives_the_store_as_processors_see_it() -> None:
    topology = (
        Topology()
        .add_source("source", ["in"], key_serde="string", value_serde="string")
        .add_processor("remember", Remember, "source")
        .add_state_store(StoreSpec("seen", key_serde="string", value_serde="string"), "remember")
    )
    with TopologyTestDriver(topology) as driver:
        driver.create_input_topic("in").pipe_input("k", "v", timestamp=1)
        store = driver.get_state_store("seen")
        assert isinstance(store, TaskStore)  # record cache, changelog, transactional store
        assert store.get(b"k") == b"v"
        assert driver.get_key_value_store("seen").range("a", "z") == [("k", "v")]
        assert driver.get_key_value_store("seen").approximate_num_entries() == 1
        assert driver.create_output_topic("scenario-unused").is_empty()


def test_dropped_records_are_counted() -> None:
    builder = StreamsBuilder()
    (
        builder.stream("in", key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(TimeWindows.of_size_with_grace(10, 0))
        .count("c")
    )
    with TopologyTestDriver(builder) as driver:
        topic = driver.create_input_topic("in")
        topic.pipe_input("k", "v", timestamp=100)
        topic.pipe_input("k", "late", timestamp=5)  # its window closed at 10
        assert driver.dropped_records == 1
        assert driver.get_window_store("c").fetch_range("k", 0, 200) == [(100, 1)]


def test_the_example_in_docs_testing_md_passes() -> None:
    """docs/testing.md's example is a test: run it as written."""
    page = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
    match = re.search(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)
    assert match is not None
    namespace: dict[str, Any] = {}
    exec(compile(match.group(1), str(page), "exec"), namespace)
    namespace["test_a_minute_is_counted_once_it_closes"]()


def test_metrics_are_the_task_metrics_a_stream_thread_keeps() -> None:
    builder = StreamsBuilder()
    (
        builder.stream("in", key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(TimeWindows.of_size_with_grace(10, 0))
        .count("c")
    )
    with TopologyTestDriver(builder, {"application.id": "m"}) as driver:
        topic = driver.create_input_topic("in")
        # 90 is 10 late, 108 is 2 late; their windows closed at 100 and 110: both dropped.
        for timestamp in (100, 90, 110, 108):
            topic.pipe_input("k", "v", timestamp)
        tags = {"thread-id": "m-test-driver", "task-id": "0_0"}
        assert driver.metric("stream-task-metrics", "record-lateness-max", tags) == 10
        assert driver.metric("stream-task-metrics", "record-lateness-avg", tags) == 3
        assert driver.metric("stream-task-metrics", "dropped-records-total", tags) == 2
        assert driver.metric("stream-task-metrics", "process-total", tags) == 4
        assert ("stream-thread-metrics", "process-total") in {
            (name.group, name.name) for name in driver.metrics()
        }


def final_counts(emit_final: bool) -> StreamsBuilder:
    builder = StreamsBuilder()
    windowed = (
        builder.stream("in", key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(TimeWindows.of_size_with_grace(10, 0))
    )
    counts = windowed.emit_final().count("c") if emit_final else windowed.count("c")
    if not emit_final:
        counts = counts.suppress(Suppressed.until_window_closes())  # type: ignore[attr-defined]
    counts.to_stream().map(lambda window, n: (str(window), n)).to(
        "out", key_serde="string", value_serde="long"
    )
    return builder


@pytest.mark.parametrize(
    ("emit_final", "metric"),
    [(True, "window-aggregate-final-emit"), (False, "suppression-emit")],
    ids=["emit-final", "suppress"],
)
def test_final_results_count_what_they_emit_as_kafkas_node_metrics(
    emit_final: bool, metric: str
) -> None:
    with TopologyTestDriver(final_counts(emit_final), {"application.id": "f"}) as driver:
        topic = driver.create_input_topic("in")
        for key, timestamp in [("a", 1), ("b", 2), ("a", 5), ("c", 12), ("c", 25)]:
            topic.pipe_input(key, "v", timestamp)
        assert driver.create_output_topic("out").read_key_values_to_list() == [
            ("[a@0/10]", 2),
            ("[b@0/10]", 1),
            ("[c@10/20]", 1),
        ]
        (node,) = {
            dict(name.tags)["processor-node-id"]
            for name in driver.metrics()
            if name.group == "stream-processor-node-metrics"
        }
        assert node.startswith("KTABLE-SUPPRESS")
        tags = {"thread-id": "f-test-driver", "task-id": "0_0", "processor-node-id": node}
        group = "stream-processor-node-metrics"
        assert driver.metric(group, f"{metric}-total", tags) == 3
        assert driver.metric(group, f"{metric}-rate", tags) > 0
        if emit_final:
            assert driver.metric(group, f"{metric}-latency-max", tags) > 0
            assert driver.metric(group, f"{metric}-latency-avg", tags) > 0
        else:  # Kafka's suppress has no latency metric
            with pytest.raises(KeyError):
                driver.metric(group, f"{metric}-latency-max", tags)
