"""The store interfaces the DSL's operators reach their stores through (operators/stores.py)."""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.processing import (
    Processor,
    ProcessorContext,
    StoreSpec,
    TimestampedKeyValueStore,
    Topology,
    TopologyError,
)
from eddyline_runtime.processing.operators.stores import (
    key_value_store,
    session_store,
    window_store,
)
from eddyline_runtime.state import InMemoryStore

LOOKUPS = {"key-value": key_value_store, "window": window_store, "session": session_store}
SPECS = {
    "key-value": StoreSpec("store"),
    "window": StoreSpec("store", window_retention_ms=60_000),
    "session": StoreSpec("store", session_retention_ms=60_000),
}


def task_with(spec: StoreSpec, wanted: str) -> TaskTopology:
    """A task whose one processor looks its store up as a ``wanted`` store at init."""

    class LookUp(Processor):
        def init(self, context: ProcessorContext) -> None:
            super().init(context)
            LOOKUPS[wanted](context, "store")

        def process(self, key: Any, value: Any) -> None:
            self.context.forward(key, value)

    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("look-up", LookUp, "in")
    topology.add_state_store(spec, "look-up")
    return TaskTopology(topology, topology.subtopologies()[0], 0, {"store": InMemoryStore("store")})


@pytest.mark.parametrize("kind", sorted(LOOKUPS))
def test_each_store_kind_is_found_by_its_own_look_up(kind: str) -> None:
    task_with(SPECS[kind], kind).close()


@pytest.mark.parametrize(
    ("attached", "wanted"),
    [(a, w) for a in sorted(SPECS) for w in sorted(LOOKUPS) if a != w],
)
def test_a_store_of_another_kind_is_refused_naming_it_and_what_it_is(
    attached: str, wanted: str
) -> None:
    with pytest.raises(TopologyError) as refused:
        task_with(SPECS[attached], wanted)
    message = str(refused.value)
    assert f'store "store" is a {attached} store' in message
    assert f"needs a {wanted} store" in message


def test_a_timestamped_store_keeps_each_value_with_its_timestamp() -> None:
    store = InMemoryStore("rows")
    rows = TimestampedKeyValueStore(store)  # type: ignore[arg-type]
    rows.put(b"k", b"v", 1_700_000_000_000)
    assert rows.get(b"k") == (1_700_000_000_000, b"v")
    assert rows.get(b"missing") is None
    rows.delete(b"k")
    assert rows.get(b"k") is None


def test_a_processor_api_processor_counts_what_it_drops() -> None:
    class DropOdd(Processor):
        def process(self, key: Any, value: Any) -> None:
            if int(value) % 2:
                self.context.record_dropped()
            else:
                self.context.forward(key, value)

    topology = Topology()
    topology.add_source("in", ["events"], value_serde="string")
    topology.add_processor("drop-odd", DropOdd, "in")
    task = TaskTopology(topology, topology.subtopologies()[0], 0, {})
    for i, value in enumerate([b"1", b"2", b"3"]):
        task.process("events", None, value, i)
    assert task.dropped_records == 2
