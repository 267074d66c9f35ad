"""Topologies the backfill tests build, loadable by reference on Spark's workers."""

from __future__ import annotations

import os

from eddyline_runtime.processing import StreamsBuilder, TimeWindows, Topology

INPUT = "events"


def keyed_count() -> Topology:
    """A count per key (no repartition: the input's key is the count's)."""
    builder = StreamsBuilder()
    builder.stream(INPUT, key_serde="string", value_serde="string").group_by_key().count("counts")
    return builder.build()


def windowed_count() -> Topology:
    """Tumbling 1 s windows with 500 ms grace, emitted on window close (emit-final)."""
    builder = StreamsBuilder()
    (
        builder.stream(INPUT, key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(TimeWindows.of_size_with_grace(1_000, 500))
        .emit_final()
        .count("window-counts")
    )
    return builder.build()


def repartitioned_count() -> Topology:
    """A count per value: behind a repartition (two sub-topologies)."""
    builder = StreamsBuilder()
    builder.stream(INPUT, key_serde="string", value_serde="string").group_by(
        lambda _key, value: value, key_serde="string", value_serde="string"
    ).count("value-counts")
    return builder.build()


def count_joined_with_a_global_table() -> Topology:
    """A count of the input joined with a GlobalKTable of regions (one sub-topology)."""
    builder = StreamsBuilder()
    regions = builder.global_table(
        "regions", "region-names", key_serde="string", value_serde="string"
    )
    builder.stream(INPUT, key_serde="string", value_serde="string").join(
        regions, lambda key, _value: key, lambda value, region: f"{region}:{value}"
    ).group_by_key().count("region-counts")
    return builder.build()


def keyed_count_of_env() -> Topology:
    """:func:`keyed_count` over the topic ``EDDYLINE_TEST_BACKFILL_INPUT`` names (a test
    on a shared broker gives it a fresh one; Spark's local workers inherit the variable)."""
    builder = StreamsBuilder()
    topic = os.environ.get("EDDYLINE_TEST_BACKFILL_INPUT", INPUT)
    builder.stream(topic, key_serde="string", value_serde="string").group_by_key().count("counts")
    return builder.build()
