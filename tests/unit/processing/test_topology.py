"""The Processor API: sub-topologies by position, describe(), and one task's data flow."""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.engine.task_topology import Output, TaskTopology
from eddyline_runtime.processing.topology import (
    Processor,
    StoreSpec,
    Topology,
    TopologyError,
)
from tests.support.stores import StoreFactory


class Upper(Processor):
    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value.upper())


class CountWords(Processor):
    """Counts each word in a store and forwards the new count."""

    def process(self, key: Any, value: Any) -> None:
        store = self.context.get_state_store("counts")
        for word in value.split():
            count = int(store.get(word.encode()) or b"0") + 1
            store.put(word.encode(), str(count).encode())
            self.context.forward(word, count)


def word_count() -> Topology:
    topology = Topology()
    topology.add_source("lines", ["text"], value_serde="string")
    topology.add_processor("upper", Upper, "lines")
    topology.add_processor("count", CountWords, "upper")
    topology.add_state_store(StoreSpec("counts"), "count")
    topology.add_sink("out", "word-counts", "count", key_serde="string", value_serde="long")
    return topology


def test_subtopologies_are_numbered_by_position_and_joined_by_stores() -> None:
    topology = word_count()
    topology.add_source("audit-in", ["audit"])
    topology.add_processor("audit", Upper, "audit-in")
    topology.add_source("other-in", ["other"])
    topology.add_processor("recount", CountWords, "other-in")
    topology.add_state_store(StoreSpec("counts"), "recount")  # shares "counts" with sub-topology 0
    subs = topology.subtopologies()
    assert [(s.id, s.source_topics) for s in subs] == [(0, ("text", "other")), (1, ("audit",))]
    assert subs[0].stores == ("counts",)
    assert subs[0].sink_topics == ("word-counts",)
    assert subs[1].task_id(3) == "1_3"


def test_describe_uses_kafka_streams_layout() -> None:
    assert word_count().describe() == "\n".join(
        [
            "Topologies:",
            "   Sub-topology: 0",
            "    Source: lines (topics: [text])",
            "      --> upper",
            "    Processor: upper (stores: [])",
            "      --> count",
            "      <-- lines",
            "    Processor: count (stores: [counts])",
            "      --> out",
            "      <-- upper",
            "    Sink: out (topic: word-counts)",
            "      <-- count",
            "",
            "",
        ]
    )


def test_a_task_pushes_records_through_processors_stores_and_sinks(
    store_factory: StoreFactory,
) -> None:
    topology = word_count()
    (sub,) = topology.subtopologies()
    task = TaskTopology(topology, sub, 2, {"counts": store_factory("counts")})
    assert task.task_id == "0_2"
    task.process("text", None, b"to be or not to be", 1_000)
    outputs = task.drain_outputs()
    assert [(o.key, o.value) for o in outputs][-2:] == [
        (b"TO", (2).to_bytes(8, "big")),
        (b"BE", (2).to_bytes(8, "big")),
    ]
    assert outputs[0] == Output("word-counts", b"TO", (1).to_bytes(8, "big"), 1_000)
    assert task.stores["counts"].get(b"NOT") == b"1"
    assert task.drain_outputs() == []


def test_processors_only_reach_the_stores_attached_to_them(store_factory: StoreFactory) -> None:
    topology = Topology()
    topology.add_source("lines", ["text"], value_serde="string")
    topology.add_processor("count", CountWords, "lines")
    topology.add_processor("other", Upper, "lines")
    topology.add_state_store(StoreSpec("elsewhere"), "other")
    (sub,) = topology.subtopologies()
    task = TaskTopology(topology, sub, 0, {"elsewhere": store_factory("elsewhere")})
    with pytest.raises(TopologyError, match='not connected to store "counts"'):
        task.process("text", None, b"word", 0)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda t: t.add_source("lines", ["again"]), 'node named "lines" already exists'),
        (lambda t: t.add_source("more", ["text"]), 'topic "text" is already read by source'),
        (lambda t: t.add_processor("p", Upper, "nope"), 'unknown node "nope"'),
        (lambda t: t.add_processor("p", Upper, "out"), 'sink "out" cannot be a parent'),
        (lambda t: t.add_state_store(StoreSpec("s"), "lines"), "only attach to processors"),
        (lambda t: t.add_sink("s2", "x"), "needs at least one parent"),
    ],
)
def test_invalid_topologies_are_refused_with_the_reason(build: Any, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        build(word_count())
