"""``process-ratio``: the share of wall-clock time a stream thread spends processing.

An autoscaler reads it as the thread's utilisation (Kafka Streams' KIP-444
metric of the same name): the unit test drives the meter with a fake clock,
the integration test reads it from a real thread, busy and then idle.
"""

from __future__ import annotations

import time
from pathlib import Path

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.thread_metrics import ThreadMetrics
from eddyline_runtime.log import LagTracker, Record, SqliteLog
from eddyline_runtime.metrics import MetricsRegistry
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Processor, Topology


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_ratio_is_busy_seconds_per_second_of_the_window() -> None:
    clock = Clock()
    registry = MetricsRegistry()
    metrics = ThreadMetrics(registry, "t-1", ThreadCache(0), LagTracker(), clock=clock)
    # Ten loop turns, one a second, each processing for a quarter of it.
    for _ in range(10):
        metrics.iterated(0.25)
        clock.now += 1.0
    ratio = registry.value("stream-thread-metrics", "process-ratio", {"thread-id": "t-1"})
    assert ratio == 0.25
    # Idle turns bring it down; it never exceeds 1 however the turns are timed.
    for _ in range(30):
        metrics.iterated(0.0)
        clock.now += 1.0
    assert metrics.process_ratio() == 2.5 / 40
    metrics.iterated(5.0)
    assert metrics.process_ratio() <= 1.0


class Slow(Processor):
    """Spends 2 ms of CPU on each record."""

    def process(self, key: object, value: object) -> None:
        deadline = time.perf_counter() + 0.002
        while time.perf_counter() < deadline:
            pass


def test_a_busy_thread_reports_a_high_ratio_and_an_idle_one_a_low_one(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("events", 1)
    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("slow", Slow, "in")
    config = StreamsConfig.from_properties(
        {"application.id": "ratio", "state.dir": str(tmp_path / "state")}
    )
    idle = StreamsInstance(topology, config, log)
    idle.start()
    try:
        time.sleep(1.5)
        thread = idle.threads[0].name
        idle_ratio = idle.metrics.value(
            "stream-thread-metrics", "process-ratio", {"thread-id": thread}
        )
    finally:
        idle.close()
    log.produce(TopicPartition("events", 0), [Record(b"k", b"v", i) for i in range(500)])
    busy = StreamsInstance(topology, config, log)
    busy.start()
    try:
        busy.wait_until_caught_up(60)
        thread = busy.threads[0].name
        busy_ratio = busy.metrics.value(
            "stream-thread-metrics", "process-ratio", {"thread-id": thread}
        )
    finally:
        busy.close()
        log.close()
    # 1 s of records at 2 ms each, in a run of about that long.
    assert busy_ratio > 0.5, busy_ratio
    assert idle_ratio < 0.05, idle_ratio
