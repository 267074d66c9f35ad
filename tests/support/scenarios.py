"""A topology scenario run two ways: through the test driver, and by a ``StreamsInstance``
on the embedded log; both give a :class:`ScenarioResult` to compare.

A scenario is steps of input records. The driver processes each record as it
is piped (Kafka's ``TopologyTestDriver``); the instance gets each step
produced into its log and is waited for until it caught up before the next
step is produced, so records of different steps are processed in step order,
whatever their timestamps, on both sides (within a step, the instance takes
several inputs in timestamp order: a step that mixes topics keeps their
timestamps ascending). Outputs are read back with their sinks' serdes, stores
with theirs: the instance's from its RocksDB directories once it closed (its
committed data), the driver's through its store views.

A scenario may restart the instance between steps (close it, optionally wipe its
state directory, start a new one on the same log). The driver cannot reopen a kept
state directory (its ``state.dir`` is a temporary one, removed when it closes), so
it runs the same steps without a stop: a restart must change nothing a user sees,
which is what comparing the two results asserts.

Besides final outputs and stores, both sides report how many records each output
held after every step (when results came out, not only which) and how many records
the processors dropped in each of the instance's runs (the driver's counted over
the same steps).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eddyline_runtime.config import IsolationLevel, StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing import Topology
from eddyline_runtime.processing.topology import Node
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import (
    DetachedSessionReader,
    DetachedWindowReader,
    Retention,
    RocksDBStore,
    StoreReader,
    store_directory,
)
from eddyline_runtime.testing import TopologyTestDriver, read_store

APPLICATION_ID = "scenario"
# How long a step may take on the instance: it processes a handful of records.
STEP_TIMEOUT_SECONDS = 60

# (topic, key, value, timestamp), key and value as the topology's source deserializes them.
Input = tuple[str, Any, Any, int]
# (key, value, timestamp) as the sink's serdes read them back.
Output = tuple[Any, Any, int]


@dataclass(frozen=True)
class Scenario:
    name: str
    topology: Callable[[], Topology]
    steps: Sequence[Sequence[Input]]
    outputs: Sequence[str]
    stores: Sequence[str] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    # Indexes of the steps after which the instance is closed and a new one started on
    # the same log, its state directory deleted first when ``wipe_on_restart``.
    restart_after: Sequence[int] = ()
    wipe_on_restart: bool = False

    def __post_init__(self) -> None:
        between = range(len(self.steps) - 1)
        if any(index not in between for index in self.restart_after):
            raise ValueError(
                f"scenario {self.name!r}: restart_after={list(self.restart_after)} must name "
                f"steps that another step follows, 0 to {len(self.steps) - 2}"
            )


@dataclass(frozen=True)
class ScenarioResult:
    outputs: dict[str, list[Output]]
    stores: dict[str, list[tuple[Any, Any]]]
    # How many records each output topic held after each step.
    emitted: list[dict[str, int]]
    # Records dropped (every task's dropped-records-total) in each run of the instance:
    # one entry, plus one per restart.
    dropped: list[int]


def _properties(scenario: Scenario) -> dict[str, Any]:
    return {"application.id": APPLICATION_ID, **scenario.config}


def run_on_driver(scenario: Scenario) -> ScenarioResult:
    with TopologyTestDriver(scenario.topology(), _properties(scenario)) as driver:
        inputs: dict[str, Any] = {}
        readers = {topic: driver.create_output_topic(topic) for topic in scenario.outputs}
        outputs: dict[str, list[Output]] = {topic: [] for topic in scenario.outputs}
        emitted: list[dict[str, int]] = []
        dropped: list[int] = []
        dropped_before = 0
        for index, step in enumerate(scenario.steps):
            for topic, key, value, timestamp in step:
                if topic not in inputs:
                    inputs[topic] = driver.create_input_topic(topic)
                inputs[topic].pipe_input(key, value, timestamp)
            for topic, reader in readers.items():
                outputs[topic].extend(
                    (r.key, r.value, r.timestamp) for r in reader.read_records_to_list()
                )
            emitted.append({topic: len(records) for topic, records in outputs.items()})
            if index in scenario.restart_after or index == len(scenario.steps) - 1:
                dropped.append(driver.dropped_records - dropped_before)
                dropped_before = driver.dropped_records
        stores = {
            name: read_store(driver.get_state_store(name), driver.topology.stores[name])  # type: ignore[arg-type]
            for name in scenario.stores
        }
    return ScenarioResult(outputs, stores, emitted, dropped)


def _dropped(instance: StreamsInstance) -> int:
    return int(
        sum(
            value
            for name, value in instance.final_metrics.items()
            if (name.group, name.name) == ("stream-task-metrics", "dropped-records-total")
        )
    )


def _node(topology: Topology, kind: str, topic: str) -> Node:
    return next(n for n in topology.nodes.values() if n.kind == kind and topic in n.topics)


def source_node(topology: Topology, topic: str) -> Node:
    """The source that reads ``topic``: its serdes write a step's records."""
    return _node(topology, "source", topic)


def run_on_instance(scenario: Scenario, directory: Path) -> ScenarioResult:
    topology = scenario.topology()
    state_dir = directory / "state"
    config = StreamsConfig.from_properties(
        {**_properties(scenario), "state.dir": str(state_dir)}, environ={}
    )
    log = SqliteLog(directory / "log.db")
    try:
        for topic in {topic for step in scenario.steps for topic, *_ in step}:
            log.create_topic(topic, 1)
        emitted: list[dict[str, int]] = []
        dropped: list[int] = []
        steps = list(enumerate(scenario.steps))
        while steps:
            instance = StreamsInstance(topology, config, log)
            instance.start()
            try:
                while steps:
                    index, step = steps.pop(0)
                    for topic, key, value, timestamp in step:
                        source = source_node(topology, topic)
                        record = Record(
                            serde_for(source.key_serde).serialize(key),
                            serde_for(source.value_serde).serialize(value),
                            timestamp,
                        )
                        log.produce(TopicPartition(topic, 0), [record])
                    instance.wait_until_caught_up(STEP_TIMEOUT_SECONDS)
                    emitted.append(
                        {topic: len(read_topic(log, topology, topic)) for topic in scenario.outputs}
                    )
                    if index in scenario.restart_after:
                        break
            finally:
                instance.close()
            dropped.append(_dropped(instance))
            if steps and scenario.wipe_on_restart:
                shutil.rmtree(state_dir)
        outputs = {topic: read_topic(log, topology, topic) for topic in scenario.outputs}
    finally:
        log.close()
    return ScenarioResult(
        outputs, read_stores(topology, scenario.stores, state_dir), emitted, dropped
    )


def read_topic(log: SqliteLog, topology: Topology, topic: str) -> list[Output]:
    sink = _node(topology, "sink", topic)
    keys, values = serde_for(sink.key_serde), serde_for(sink.value_serde)
    tp = TopicPartition(topic, 0)
    found: list[Output] = []
    if topic not in log.topics():  # created by the first record written to it
        return found
    position = log.beginning_offset(tp)
    while True:
        fetched = log.fetch(tp, position)
        if not fetched.records:
            return found
        for record in fetched.records:
            found.append(
                (keys.deserialize(record.key), values.deserialize(record.value), record.timestamp)
            )
        position = fetched.records[-1].offset + 1


def read_stores(
    topology: Topology, names: Sequence[str], state_dir: Path
) -> dict[str, list[tuple[Any, Any]]]:
    """Each store's committed contents, opened from the instance's state directory."""
    owner = {name: sub.id for sub in topology.subtopologies() for name in sub.stores}
    contents: dict[str, list[tuple[Any, Any]]] = {}
    for name in names:
        spec = topology.stores[name]
        store = RocksDBStore(name, store_directory(state_dir, TaskId(owner[name], 0), name))
        try:
            reader: StoreReader | DetachedWindowReader | DetachedSessionReader
            reader = store.reader(IsolationLevel.READ_COMMITTED)
            if spec.window_retention_ms is not None:
                reader = DetachedWindowReader(reader, Retention.of(spec.window_retention_ms))
            elif spec.session_retention_ms is not None:
                reader = DetachedSessionReader(reader, Retention.of(spec.session_retention_ms))
            contents[name] = read_store(reader, spec)
        finally:
            store.close()
    return contents
