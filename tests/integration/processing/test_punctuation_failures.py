"""A punctuator that raises, on the embedded log: KIP-1033 hands it to the processing handler.

Kafka's ``StreamTask.punctuate`` asks the ``processing.exception.handler``
about a punctuator's exception, with a context that names the processor and
has no input record (no topic, partition and offset -1): log-and-continue
counts it as a dropped record and the task goes on (the punctuation is next
due as usual); log-and-fail, the default, stops the task. No dead-letter
record is written, since there is no input record to set aside (Kafka's
``ProcessingExceptionHandlerIntegrationTest`` covers the punctuation too).
One process, the real SQLite log and RocksDB stores, under exactly-once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsFailedError, StreamsInstance
from eddyline_runtime.engine.record_failures import PunctuationError
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Processor, PunctuationType, Topology

TIMEOUT = 60
# The stream time whose punctuation raises (punctuations are aligned to 0, every 10 ms).
FAILING_AT = 20


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("events", 1)
    log.create_topic("out", 1)
    log.create_topic("dlq", 1)
    log.produce(
        TopicPartition("events", 0), [Record(b"k", str(t).encode(), t) for t in (0, 10, 20, 30)]
    )
    yield log
    log.close()


class Ticking(Processor):
    """Forwards each record, and a tick per stream-time punctuation but the failing one."""

    def init(self, context: Any) -> None:
        super().init(context)
        context.schedule(10, PunctuationType.STREAM_TIME, self.tick)

    def tick(self, now: int) -> None:
        if now == FAILING_AT:
            raise ValueError(f"no tick at {now}")
        self.context.forward(b"tick", str(now).encode())

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value)


def ticking() -> Topology:
    topology = Topology()
    topology.add_source("in", ["events"])
    topology.add_processor("ticking", Ticking, "in")
    topology.add_sink("sink", "out", "ticking")
    return topology


def config(tmp_path: Path, **settings: str) -> StreamsConfig:
    return StreamsConfig.from_properties(
        {
            "application.id": "app",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": "exactly_once_v2",
            "errors.dead.letter.queue.topic.name": "dlq",
            **settings,
        }
    )


def values(log: SqliteLog, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    tp = TopicPartition(topic, 0)
    return [(r.key, r.value) for r in log.fetch(tp, 0, 1_000).records]


def test_log_and_continue_skips_a_failing_punctuation_and_the_task_goes_on(
    tmp_path: Path, log: SqliteLog
) -> None:
    settings = {"processing.exception.handler": "log-and-continue"}
    instance = StreamsInstance(ticking(), config(tmp_path, **settings), log)
    instance.start()
    try:
        instance.wait_until_caught_up(TIMEOUT)
        thread = instance.threads[0].name
        task = {"thread-id": thread, "task-id": "0_0"}
        dropped = instance.metrics.value("stream-task-metrics", "dropped-records-total", task)
        by_reason = instance.metrics.value(
            "stream-task-metrics",
            "dropped-records-by-reason-total",
            {**task, "reason": "processing-error"},
        )
    finally:
        instance.close()
    # Each record, then the punctuation it made due; the one at 20 raised and was skipped.
    assert values(log, "out") == [
        (b"k", b"0"),
        (b"tick", b"0"),
        (b"k", b"10"),
        (b"tick", b"10"),
        (b"k", b"20"),
        (b"k", b"30"),
        (b"tick", b"30"),
    ]
    assert (dropped, by_reason) == (1, 1)
    assert values(log, "dlq") == []  # no input record to set aside


def test_log_and_fail_stops_the_task_naming_the_punctuator(tmp_path: Path, log: SqliteLog) -> None:
    instance = StreamsInstance(ticking(), config(tmp_path), log)
    instance.start()
    with pytest.raises(StreamsFailedError) as failed:
        try:
            instance.wait_until_caught_up(TIMEOUT)
        finally:
            instance.close()
    cause = failed.value.__cause__
    assert isinstance(cause, PunctuationError), failed.value
    assert 'the STREAM_TIME punctuator of processor "ticking" failed: ValueError' in str(cause)
    assert "processing.exception.handler" in str(cause)
    assert "\n" not in str(cause)
    assert (b"tick", b"30") not in values(log, "out")
    assert values(log, "dlq") == []
