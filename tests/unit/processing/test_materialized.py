"""``Materialized``: a store's name, serdes, retention and caching, through the DSL and
the test driver (the engine's tasks, record cache and changelogs)."""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.processing import (
    Materialized,
    SessionWindow,
    SessionWindows,
    SlidingWindows,
    StreamsBuilder,
    TimeWindows,
    TopologyError,
    Windowed,
)
from eddyline_runtime.testing import TestRecord, TopologyTestDriver


def grouped(builder: StreamsBuilder) -> Any:
    return builder.stream("in", key_serde="string", value_serde="string").group_by_key()


def test_a_store_takes_its_name_and_serdes_from_materialized() -> None:
    builder = StreamsBuilder()
    (
        grouped(builder)
        .aggregate(
            lambda: "",
            lambda _key, value, aggregate: aggregate + value,
            Materialized.as_("joined").with_value_serde("string"),
        )
        .to_stream()
        .to("out", key_serde="string", value_serde="string")
    )
    spec = builder.build().stores["joined"]
    assert (spec.key_serde, spec.value_serde, spec.cached) == ("string", "string", True)
    with TopologyTestDriver(builder, {"application.id": "m"}) as driver:
        driver.create_input_topic("in").pipe_key_value_list([("k", "a"), ("k", "b")])
        assert driver.get_key_value_store("joined").get("k") == "ab"
        # The changelog carries the value with the store's serde: a plain string, not JSON.
        changelog = driver.create_output_topic("m-joined-changelog", "string", "bytes")
        assert changelog.read_key_values_to_list()[-1] == ("k", b"ab")


def test_a_plain_name_is_materialized_as_that_name_with_the_operations_serdes() -> None:
    builder = StreamsBuilder()
    grouped(builder).count("counts")
    spec = builder.build().stores["counts"]
    assert (spec.name, spec.key_serde, spec.value_serde, spec.cached) == (
        "counts",
        "string",
        "long",
        True,
    )


def test_materialized_key_serde_wins_over_the_streams() -> None:
    builder = StreamsBuilder()
    builder.stream("in", value_serde="string").group_by_key().count(
        Materialized.as_("c").with_key_serde("string")
    )
    assert builder.build().stores["c"].key_serde == "string"


def test_table_sources_filters_and_table_aggregations_take_materialized() -> None:
    builder = StreamsBuilder()
    table = builder.table(
        "t", Materialized.as_("source").with_value_serde("string"), key_serde="string"
    )
    table.filter(lambda _k, v: v != "x", materialized=Materialized.as_("kept"))
    table.group_by(lambda k, v: (v, k), repartition_name="by-value").count(
        Materialized.as_("per-value").with_caching_disabled()
    )
    stores = builder.build().stores
    assert (stores["source"].key_serde, stores["source"].value_serde) == ("string", "string")
    assert stores["kept"].value_serde == "string"
    assert stores["per-value"].cached is False
    with TopologyTestDriver(builder) as driver:
        driver.create_input_topic("t", value_serde="string").pipe_input("k", "v")
        assert driver.get_key_value_store("source").get("k") == "v"
        assert driver.get_key_value_store("kept").get("k") == "v"
        assert driver.get_key_value_store("per-value").get("v") == 1


def test_a_key_value_store_refuses_a_retention() -> None:
    with pytest.raises(TopologyError, match='store "c": with_retention applies to window'):
        grouped(StreamsBuilder()).count(Materialized.as_("c").with_retention(1_000))


@pytest.mark.parametrize("bad", ["", None])
def test_materialized_needs_a_store_name(bad: Any) -> None:
    with pytest.raises(TopologyError, match="Materialized needs a non-empty store name"):
        Materialized.as_(bad)


def test_a_negative_retention_is_refused() -> None:
    with pytest.raises(TopologyError, match='store "w": retention -1 is not a number'):
        Materialized.as_("w").with_retention(-1)


# -- retention ------------------------------------------------------------------------


def test_window_retention_defaults_to_size_plus_grace_and_may_be_longer() -> None:
    windows = TimeWindows.of_size_with_grace(100, 20)
    builder = StreamsBuilder()
    windowed = grouped(builder).windowed_by(windows)
    windowed.count("default")
    windowed.count(Materialized.as_("long").with_retention(5_000))
    stores = builder.build().stores
    assert stores["default"].window_retention_ms == 120
    assert stores["long"].window_retention_ms == 5_000


def test_a_window_store_shorter_than_size_plus_grace_is_refused_with_kafkas_message() -> None:
    windowed = grouped(StreamsBuilder()).windowed_by(TimeWindows.of_size_with_grace(100, 20))
    with pytest.raises(TopologyError) as refused:
        windowed.count(Materialized.as_("w").with_retention(119))
    assert str(refused.value) == (
        "The retention period of the window store w must be no smaller than its window "
        "size plus the grace period. Got size=[100], grace=[20], retention=[119]"
    )


def test_a_session_store_shorter_than_gap_plus_grace_is_refused_with_kafkas_message() -> None:
    builder = StreamsBuilder()
    sessions = grouped(builder).windowed_by(SessionWindows.of_inactivity_gap_with_grace(50, 10))
    sessions.count(Materialized.as_("ok").with_retention(60))
    assert builder.build().stores["ok"].session_retention_ms == 60
    with pytest.raises(TopologyError) as refused:
        sessions.count(Materialized.as_("s").with_retention(59))
    assert str(refused.value) == (
        "The retention period of the session store s must be no smaller than the session "
        "inactivity gap plus the grace period. Got gap=[50], grace=[10], retention=[59]"
    )


def test_a_sliding_store_shorter_than_two_differences_plus_grace_is_refused() -> None:
    builder = StreamsBuilder()
    sliding = grouped(builder).windowed_by(SlidingWindows.of_time_difference_and_grace(30, 5))
    sliding.count("default")
    assert builder.build().stores["default"].window_retention_ms == 65
    with pytest.raises(TopologyError) as refused:
        sliding.count(Materialized.as_("s").with_retention(64))
    assert str(refused.value) == (
        "The retention period of the window store s must be no smaller than 2 * time "
        "difference plus the grace period. Got time difference=[30], grace=[5], "
        "retention=[64]"
    )


def test_a_longer_retention_keeps_closed_windows_readable() -> None:
    windows = TimeWindows.of_size_without_grace(10)
    builder = StreamsBuilder()
    windowed = grouped(builder).windowed_by(windows)
    windowed.count("short")
    windowed.count(Materialized.as_("kept").with_retention(1_000))
    with TopologyTestDriver(builder) as driver:
        events = driver.create_input_topic("in")
        events.pipe_input("k", "a", timestamp=5)
        events.pipe_input("k", "b", timestamp=500)  # window [0, 10) long closed
        assert driver.get_window_store("short").fetch("k", 0) is None
        assert driver.get_window_store("kept").fetch("k", 0) == 1
        assert driver.get_window_store("kept").fetch("k", 500) == 1


def test_a_longer_session_retention_keeps_closed_sessions_readable() -> None:
    windows = SessionWindows.of_inactivity_gap_without_grace(10)
    builder = StreamsBuilder()
    windowed = grouped(builder).windowed_by(windows)
    windowed.count("short")
    windowed.count(Materialized.as_("kept").with_retention(1_000))
    with TopologyTestDriver(builder) as driver:
        events = driver.create_input_topic("in")
        events.pipe_input("k", "a", timestamp=5)
        events.pipe_input("k", "b", timestamp=500)
        assert [w for w, _ in driver.get_session_store("short").fetch("k")] == [
            Windowed("k", SessionWindow(500, 500))
        ]
        assert [w for w, _ in driver.get_session_store("kept").fetch("k")] == [
            Windowed("k", SessionWindow(5, 5)),
            Windowed("k", SessionWindow(500, 500)),
        ]


# -- caching --------------------------------------------------------------------------


def two_counts() -> StreamsBuilder:
    """The same count kept twice per line key: in a cached store and in one without cache."""
    builder = StreamsBuilder()
    words = builder.stream("lines", key_serde="string", value_serde="string").flat_map_values(
        str.split
    )
    words.group_by_key().count("cached").to_stream().to(
        "cached-out", key_serde="string", value_serde="long"
    )
    (
        words.group_by_key()
        .count(Materialized.as_("uncached").with_caching_disabled())
        .to_stream()
        .to("uncached-out", key_serde="string", value_serde="long")
    )
    return builder


def test_a_store_with_caching_disabled_forwards_every_update_and_its_neighbour_does_not() -> None:
    with TopologyTestDriver(two_counts(), {"application.id": "c"}) as driver:
        # One record, three updates of key k between two commits.
        driver.create_input_topic("lines").pipe_input("k", "a b c", timestamp=3)
        cached = driver.create_output_topic("cached-out", "string", "long")
        uncached = driver.create_output_topic("uncached-out", "string", "long")
        assert cached.read_records_to_list() == [TestRecord("k", 3, 3)]
        assert uncached.read_records_to_list() == [
            TestRecord("k", 1, 3),
            TestRecord("k", 2, 3),
            TestRecord("k", 3, 3),
        ]
        # Both stores hold the same count (their changelogs carry a key's last write of
        # each commit either way: see engine/task_store.py).
        assert driver.get_key_value_store("cached").get("k") == 3
        assert driver.get_key_value_store("uncached").get("k") == 3


def test_a_windowed_store_with_caching_disabled_forwards_every_update() -> None:
    builder = StreamsBuilder()
    words = builder.stream("lines", key_serde="string", value_serde="string").flat_map_values(
        str.split
    )
    (
        words.group_by_key()
        .windowed_by(TimeWindows.of_size_without_grace(100))
        .count(Materialized.as_("w").with_caching_disabled())
        .to_stream()
        .map(lambda key, count: (key.key, count))
        .to("out", key_serde="string", value_serde="long")
    )
    with TopologyTestDriver(builder) as driver:
        driver.create_input_topic("lines").pipe_input("k", "a b", timestamp=7)
        assert driver.create_output_topic("out").read_values_to_list() == [1, 2]
        assert driver.get_window_store("w").fetch("k", 0) == 2


def test_logging_disabled_leaves_the_store_without_a_changelog() -> None:
    builder = StreamsBuilder()
    grouped(builder).count(Materialized.as_("local").with_logging_disabled())
    assert builder.build().stores["local"].logged is False
    with TopologyTestDriver(builder, {"application.id": "l"}) as driver:
        driver.create_input_topic("in").pipe_input("k", "a")
        assert driver.get_key_value_store("local").get("k") == 1
        assert "l-local-changelog" not in driver.produced_topic_names()
