"""``last-commit-timestamp``: each active task's last commit, wall-clock ms (stream-task-metrics).

``make bench-scale`` reads it from every pod to find the longest pause between two commits of
a task while it moves between members; NaN until the task's first commit on this member.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Processor, Topology


class Noop(Processor):
    def process(self, key: object, value: object) -> None:
        pass


def test_a_task_reports_when_it_last_committed(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("events", 1)
    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("noop", Noop, "in")
    config = StreamsConfig.from_properties(
        {
            "application.id": "last-commit",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": "exactly_once_v2",
        }
    )
    instance = StreamsInstance(topology, config, log)
    instance.start()
    try:
        thread = instance.threads[0].name
        tags = {"thread-id": thread, "task-id": "0_0"}

        def value() -> float:
            return instance.metrics.value("stream-task-metrics", "last-commit-timestamp", tags)

        deadline = time.monotonic() + 60
        while True:  # the task exists once the thread applied its assignment
            try:
                before_input = value()
                break
            except KeyError:
                assert time.monotonic() < deadline, "task 0_0 never started"
                time.sleep(0.05)
        assert math.isnan(before_input)  # nothing to commit yet
        produced = time.time() * 1000
        log.produce(TopicPartition("events", 0), [Record(b"k", b"v", i) for i in range(10)])
        instance.wait_until_caught_up(60)
        while math.isnan(value()):
            assert time.monotonic() < deadline, "no commit reported"
            time.sleep(0.05)
        assert produced <= value() <= time.time() * 1000
    finally:
        instance.close()
        log.close()
