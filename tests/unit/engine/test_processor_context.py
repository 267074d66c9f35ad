"""What a processor sees and may ask for: record context, stream time, punctuation, commits."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.record_failures import PunctuationError
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_topology import Output, TaskTopology
from eddyline_runtime.processing import StreamsBuilder
from eddyline_runtime.processing.topology import (
    Processor,
    ProcessorContext,
    PunctuationType,
    StoreSpec,
    Topology,
    TopologyError,
)
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import InMemoryStore, TopicPartition
from tests.support.stores import StoreFactory

STRINGS = serde_for("string")


class Observe(Processor):
    """Records what the context says about each record, and forwards the value."""

    seen: list[tuple[Any, ...]]
    last: ClassVar[Observe]

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.seen = []
        Observe.last = self

    def process(self, key: Any, value: Any) -> None:
        context = self.context
        self.seen.append(
            (value, context.timestamp, context.stream_time, context.record_lateness, context.topic)
        )
        context.forward(key, value)


def observing() -> Topology:
    topology = Topology()
    topology.add_source("in", ["events"], value_serde="string")
    topology.add_processor("observe", Observe, "in")
    topology.add_sink("out", "observed", "observe", value_serde="string")
    return topology


def task_of(
    topology: Topology, stores: dict[str, Any] | None = None, **kwargs: Any
) -> TaskTopology:
    return TaskTopology(topology, topology.subtopologies()[0], 0, stores or {}, **kwargs)


def test_headers_travel_from_the_input_record_to_what_sinks_emit() -> None:
    task = task_of(observing())
    task.process("events", None, b"a", 5, (("trace-id", b"t1"),), partition=0, offset=7)
    assert task.drain_outputs() == [Output("observed", None, b"a", 5, (("trace-id", b"t1"),))]


def test_stream_time_is_the_largest_timestamp_and_lateness_the_distance_behind_it() -> None:
    task = task_of(observing())
    assert task.stream_time == -1
    for value, timestamp in (("a", 10), ("b", 30), ("c", 20), ("d", 40)):
        task.process("events", None, value.encode(), timestamp)
    assert Observe.last.seen == [
        ("a", 10, 10, 0, "events"),
        ("b", 30, 30, 0, "events"),
        ("c", 20, 30, 10, "events"),
        ("d", 40, 40, 0, "events"),
    ]


class Ticker(Processor):
    """Schedules a punctuation in init; each punctuation forwards its time."""

    last: ClassVar[Ticker]

    def __init__(self, punctuation_type: PunctuationType, interval: int = 10) -> None:
        self._type, self._interval = punctuation_type, interval

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.schedule = context.schedule(self._interval, self._type, self.tick)
        Ticker.last = self

    def tick(self, now: int) -> None:
        self.context.forward("tick", str(now))

    def process(self, key: Any, value: Any) -> None:
        pass


def ticking(punctuation_type: PunctuationType) -> Topology:
    topology = Topology()
    topology.add_source("in", ["events"], value_serde="string")
    topology.add_processor("ticker", lambda: Ticker(punctuation_type), "in")
    topology.add_sink("out", "ticks", "ticker", key_serde="string", value_serde="string")
    return topology


def ticks(task: TaskTopology) -> list[tuple[str, int]]:
    return [(STRINGS.deserialize(o.value), o.timestamp) for o in task.drain_outputs()]


def test_stream_time_punctuation_fires_with_the_first_record_then_once_per_interval() -> None:
    task = task_of(ticking(PunctuationType.STREAM_TIME))
    assert ticks(task) == []
    task.process("events", None, b"x", 3)
    assert ticks(task) == [("3", 3)]  # aligned to 0: due at once
    task.process("events", None, b"x", 9)
    assert ticks(task) == []
    task.process("events", None, b"x", 10)
    assert ticks(task) == [("10", 10)]
    task.process("events", None, b"x", 5)  # late: stream time stays at 10
    task.process("events", None, b"x", 47)  # a gap of several intervals punctuates once
    assert ticks(task) == [("47", 47)]
    task.process("events", None, b"x", 49)
    task.process("events", None, b"x", 50)
    assert ticks(task) == [("50", 50)]


def test_wall_clock_punctuation_follows_the_clock_and_stops_when_cancelled() -> None:
    now = [1_000]
    task = task_of(ticking(PunctuationType.WALL_CLOCK_TIME), wall_clock_ms=lambda: now[0])
    assert not task.maybe_punctuate_wall_clock()
    now[0] = 1_009
    assert not task.maybe_punctuate_wall_clock()
    now[0] = 1_010
    assert task.maybe_punctuate_wall_clock()
    assert ticks(task) == [("1010", 1010)]
    task.process("events", None, b"x", 5)  # records do not drive wall-clock punctuation
    assert ticks(task) == []
    Ticker.last.schedule.cancel()
    now[0] = 5_000
    assert not task.maybe_punctuate_wall_clock()


def test_a_punctuation_interval_below_one_millisecond_is_refused() -> None:
    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("ticker", lambda: Ticker(PunctuationType.STREAM_TIME, interval=0), "in")
    with pytest.raises(TopologyError, match=">= 1"):
        task_of(topology)


def test_a_failing_punctuator_names_its_processor() -> None:
    class Failing(Ticker):
        def tick(self, now: int) -> None:
            raise RuntimeError("no")

    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("failing", lambda: Failing(PunctuationType.STREAM_TIME), "in")
    task = task_of(topology)
    with pytest.raises(PunctuationError, match='STREAM_TIME punctuator of processor "failing"'):
        task.process("events", None, b"x", 1)


def test_a_processor_may_ask_for_a_commit() -> None:
    class Committing(Processor):
        def process(self, key: Any, value: Any) -> None:
            if value == b"now":
                self.context.commit()

    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("committing", Committing, "in")
    task = task_of(topology)
    task.process("events", None, b"later", 1)
    assert not task.commit_requested
    task.process("events", None, b"now", 2)
    assert task.commit_requested


def test_forward_may_set_the_timestamp_and_headers_of_what_it_sends() -> None:
    class Stamping(Processor):
        def process(self, key: Any, value: Any) -> None:
            self.context.forward(key, value, timestamp=99, headers=(("h", b"1"),))
            self.context.forward(key, value)

    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("stamp", Stamping, "in")
    topology.add_sink("out", "stamped", "stamp")
    task = task_of(topology)
    task.process("events", None, b"v", 5, (("h", b"0"),))
    assert [(o.timestamp, o.headers) for o in task.drain_outputs()] == [
        (99, (("h", b"1"),)),
        (5, (("h", b"0"),)),
    ]


def test_a_cached_aggregation_forwards_each_key_with_the_context_of_its_last_write(
    store_factory: StoreFactory,
) -> None:
    builder = StreamsBuilder()
    (
        builder.stream("events", key_serde="string", value_serde="string")
        .group_by_key()
        .count("counts")
        .to_stream()
        .to("counted", key_serde="string", value_serde="long")
    )
    topology = builder.build()
    cache = ThreadCache(1024 * 1024)
    store = TaskStore(
        store_factory("counts"),
        changelog=TopicPartition("app-counts-changelog", 0),
        cache=cache,
        cache_name="0_0/counts",
    )
    task = task_of(topology, {"counts": store})
    task.process("events", b"a", b"x", 10, (("from", b"a"),))
    task.process("events", b"b", b"x", 40, (("from", b"b"),))
    cache.flush()
    assert [(o.key, o.timestamp, o.headers) for o in task.drain_outputs()] == [
        (b"a", 10, (("from", b"a"),)),
        (b"b", 40, (("from", b"b"),)),
    ]
    assert task.timestamp == 40  # the task's own context is back after the flush


def test_writes_in_a_punctuation_carry_the_punctuation_time(store_factory: StoreFactory) -> None:
    class Summarize(Ticker):
        def tick(self, now: int) -> None:
            self.context.get_state_store("last").put(b"tick", str(now).encode())

    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("summarize", lambda: Summarize(PunctuationType.STREAM_TIME), "in")
    topology.add_state_store(StoreSpec("last", persistent=False), "summarize")
    cache = ThreadCache(1024)
    flushed: list[int | None] = []
    store = TaskStore(InMemoryStore("last"), changelog=None, cache=cache, cache_name="last")
    store.set_flush_listener(lambda key, change: flushed.append(task.timestamp))
    task = task_of(topology, {"last": store})
    task.process("events", None, b"x", 25)
    cache.flush()
    assert flushed == [25]
