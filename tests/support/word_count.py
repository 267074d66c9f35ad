"""The word-count app the runtime tests run: its topology, its config and its input.

Sub-topology 0 splits lines into words and repartitions by word; sub-topology
1 counts into the store ``counts`` and publishes every new count. With
``new_first_sub_topology`` an unrelated stateless sub-topology comes first,
so every ordinal shifts by one (what KIP-816 relocation exists for).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.log import Log, Record
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import StreamsBuilder, Topology

APP = "app"
INPUT = "lines"
OUTPUT = "word-counts"
STORE = "counts"


def add_word_count(
    builder: StreamsBuilder, *, store: str = STORE, output: str = OUTPUT
) -> StreamsBuilder:
    (
        builder.stream(INPUT, value_serde="string")
        .flat_map_values(str.split)
        .group_by(lambda _, word: word, value_serde="string")
        .count(store)
        .to_stream()
        .to(output, key_serde="string", value_serde="long")
    )
    return builder


def word_count_builder(
    *, store: str = STORE, output: str = OUTPUT, new_first_sub_topology: bool = False
) -> StreamsBuilder:
    builder = StreamsBuilder()
    if new_first_sub_topology:
        builder.stream("other").to("elsewhere")
    return add_word_count(builder, store=store, output=output)


def word_count(
    *, store: str = STORE, output: str = OUTPUT, new_first_sub_topology: bool = False
) -> Topology:
    return word_count_builder(
        store=store, output=output, new_first_sub_topology=new_first_sub_topology
    ).build()


def streams_config(state_dir: Path, **settings: Any) -> StreamsConfig:
    """Exactly-once with one standby, as the multi-instance tests run it."""
    return StreamsConfig.from_properties(
        {
            "application.id": APP,
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            "num.standby.replicas": 1,
            **settings,
        }
    )


def produce_lines(log: Log, lines: list[str], partitions: int) -> None:
    """Keyless lines round-robin over the partitions, timestamps counting up in each."""
    for partition in range(partitions):
        chunk = lines[partition::partitions]
        if chunk:
            log.produce(
                TopicPartition(INPUT, partition),
                [Record(None, line.encode(), i) for i, line in enumerate(chunk)],
            )
