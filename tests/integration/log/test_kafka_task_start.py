"""Starting a thread's tasks on a real Apache Kafka broker: their transactional producers'
``init_transactions`` round trips are made together (docs/kafka.md, "Starting tasks"),
and each still fences its own id's zombie and reports its own failure.

Concurrency is shown without timing: the clients hold every ``init_transactions`` at a
barrier that only opens once all of them are in flight, so serial starts would break it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from eddyline_runtime.engine.instance import StreamsFailedError, StreamsInstance
from eddyline_runtime.log import LogError, ProducerFencedError, Record
from eddyline_runtime.log.kafka import KafkaClients, KafkaLog
from eddyline_runtime.partitions import TopicPartition
from tests.integration.log.test_kafka_broker_runtime import (
    EXPECTED,
    LINES,
    config,
    produce_lines,
    published,
    run_until_caught_up,
    settled_counts,
)
from tests.support.crash_runs import committed_records
from tests.support.waiting import wait_for
from tests.support.word_count import word_count

# The word count on PARTITIONS (2) input partitions: two subtopologies, four tasks.
WORD_COUNT_TASKS = 4
# Not a timing assertion: how long a broken start may hang before the barrier says so.
BARRIER_TIMEOUT_S = 60.0
# Above the broker's transaction.max.timeout.ms (15 minutes by default): init_transactions
# is refused with INVALID_TRANSACTION_TIMEOUT, for this producer alone.
REFUSED_TIMEOUT_MS = 3_600_000


class _BarrierProducer(Producer):
    """A real producer whose ``init_transactions`` waits until ``barrier`` has all its parties."""

    barrier: threading.Barrier | None = None

    def init_transactions(self, *args: Any) -> None:
        if self.barrier is not None:
            self.barrier.wait()
        super().init_transactions(*args)


class _StartClients(KafkaClients):
    """Real clients: the first ``together`` transactional producers meet at a barrier in
    ``init_transactions`` (BrokenBarrierError if they are started one after another), and
    the producer of ``refused`` asks for a transaction timeout the broker refuses."""

    def __init__(self, together: int = 0, refused: str | None = None) -> None:
        self._barrier = threading.Barrier(together, timeout=BARRIER_TIMEOUT_S) if together else None
        self._left = together
        self._refused = refused
        self._lock = threading.Lock()
        self.started: list[str] = []

    def producer(self, config: Mapping[str, Any]) -> Producer:
        transactional_id = config.get("transactional.id")
        if transactional_id is None:
            return Producer(dict(config))
        settings = dict(config)
        if transactional_id == self._refused:
            settings["transaction.timeout.ms"] = REFUSED_TIMEOUT_MS
        producer = _BarrierProducer(settings)
        with self._lock:
            self.started.append(transactional_id)
            if self._left > 0:
                self._left -= 1
                producer.barrier = self._barrier
        return producer


@pytest.fixture
def prefix() -> str:
    return f"start-{uuid.uuid4().hex[:8]}."


@pytest.fixture
def log(kafka_bootstrap: str, prefix: str) -> Iterator[KafkaLog]:
    log = KafkaLog.open(f"kafka://{kafka_bootstrap}", {}, topic_prefix=prefix)
    yield log
    log.close()


def open_log(kafka_bootstrap: str, prefix: str, clients: KafkaClients) -> KafkaLog:
    return KafkaLog.open(f"kafka://{kafka_bootstrap}", {}, topic_prefix=prefix, clients=clients)


@pytest.mark.slow
def test_a_threads_tasks_start_with_their_init_transactions_in_flight_together(
    tmp_path: Path, log: KafkaLog, kafka_bootstrap: str, prefix: str
) -> None:
    """Every task of the word count starts on one concurrent round of init_transactions
    (the barrier opens only with all four in flight), and the counts are still exact."""
    produce_lines(log, LINES)
    clients = _StartClients(together=WORD_COUNT_TASKS)
    started = open_log(kafka_bootstrap, prefix, clients)
    try:
        run_until_caught_up(StreamsInstance(word_count(), config(tmp_path, "ts"), started))
    finally:
        started.close()
    assert sorted(clients.started[:WORD_COUNT_TASKS]) == [
        f"ts-{task}" for task in ("0_0", "0_1", "1_0", "1_1")
    ]
    assert settled_counts(log, EXPECTED) == dict(EXPECTED)
    for word, counts in published(log).items():  # a duplicated commit would repeat a count
        assert counts == sorted(set(counts)), f"{word}: {counts}"


@pytest.mark.slow
def test_producers_started_together_each_fence_their_ids_zombie(
    log: KafkaLog, kafka_bootstrap: str, prefix: str
) -> None:
    """A zombie of one of the ids has an open transaction: the concurrent start aborts it
    (nothing of it is read) and fences it (its commit is refused), as a serial start did."""
    out = TopicPartition("out", 0)
    log.create_topic("out", 1)
    zombie = log.transactional_producer("zf-0_1")
    zombie.begin()
    zombie.send(out, Record(None, b"zombie", 1))
    ids = ["zf-0_0", "zf-0_1", "zf-0_2"]
    starter = open_log(kafka_bootstrap, prefix, _StartClients(together=len(ids)))
    try:
        started = starter.transactional_producers(ids)
        producers = [started.take(transactional_id) for transactional_id in ids]
        with pytest.raises(ProducerFencedError):
            zombie.commit()
        zombie.close()
        for i, producer in enumerate(producers):
            producer.begin()
            producer.send(out, Record(None, b"new %d" % i, 2))
            producer.commit()
            producer.close()
        started.close()
    finally:
        starter.close()
    values = [r.value or b"" for r in committed_records(log, out.topic, 1)]
    assert sorted(values) == [b"new 0", b"new 1", b"new 2"]


@pytest.mark.slow
def test_a_producer_that_fails_to_start_reports_its_own_error_and_the_others_start(
    log: KafkaLog, kafka_bootstrap: str, prefix: str
) -> None:
    """The broker refuses one id's init_transactions: take() raises for that id the error
    its serial start raises (same type and message), and the other ids' producers work."""
    serial = open_log(kafka_bootstrap, prefix, _StartClients(refused="bad-0_1"))
    try:
        with pytest.raises(LogError) as alone:
            serial.transactional_producer("bad-0_1")
    finally:
        serial.close()
    # (The refusal is fatal in librdkafka, which the mapping reads as a fencing.)
    assert "bad-0_1" in str(alone.value) and "max.transaction.timeout.ms" in str(alone.value)

    ids = ["bad-0_0", "bad-0_1", "bad-0_2"]
    starter = open_log(kafka_bootstrap, prefix, _StartClients(len(ids), refused="bad-0_1"))
    out = TopicPartition("out", 0)
    log.create_topic("out", 1)
    try:
        started = starter.transactional_producers(ids)
        with pytest.raises(LogError) as together:
            started.take("bad-0_1")
        for transactional_id in ("bad-0_0", "bad-0_2"):
            producer = started.take(transactional_id)
            producer.begin()
            producer.send(out, Record(None, transactional_id.encode(), 1))
            producer.commit()
            producer.close()
        started.close()
    finally:
        starter.close()
    assert type(together.value) is type(alone.value)
    assert str(together.value) == str(alone.value)
    # A commit returns before its markers reach the partition; until they do the second
    # commit's record is above the end a read_committed fetch stops at (once seen failing).
    wait_for(lambda: not log.undecided(out), "both commits' markers in the partition")
    # The two commits are two record batches, and one fetch returns what has arrived (the
    # first alone, once): read on to the end offset.
    values = [r.value or b"" for r in committed_records(log, out.topic, 1)]
    assert sorted(values) == [b"bad-0_0", b"bad-0_2"]


@pytest.mark.slow
def test_a_task_whose_producer_fails_to_start_fails_its_thread_with_that_error(
    tmp_path: Path, log: KafkaLog, kafka_bootstrap: str, prefix: str
) -> None:
    """In the engine: the thread fails with the refused task's own error, as a serial
    start failed it (the tasks' other producers started with it are closed)."""
    produce_lines(log, LINES)
    starter = open_log(kafka_bootstrap, prefix, _StartClients(refused="tf-1_0"))
    try:
        with pytest.raises(LogError) as alone:
            starter.transactional_producer("tf-1_0")
        instance = StreamsInstance(word_count(), config(tmp_path, "tf"), starter)
        instance.start()
        with pytest.raises(StreamsFailedError) as failed:  # close() raises it too
            try:
                instance.wait_until_caught_up(120)
            finally:
                instance.close()
    finally:
        starter.close()
    cause = failed.value.__cause__
    assert type(cause) is type(alone.value), failed.value
    assert str(cause) == str(alone.value)
