"""Topologies the backfill tests build, loadable by reference on Spark's workers."""

from __future__ import annotations

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
