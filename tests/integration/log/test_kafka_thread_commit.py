"""A stream thread committing its tasks on a real Apache Kafka broker: under
``commit.mode=concurrent`` the tasks' transactions commit together, each still fenced by its
own transactional id (docs/kafka.md, "Committing a thread's tasks together").

Concurrency is shown without timing: each ``commit_transaction`` waits (bounded) until
another task's is in flight, and the test asserts that two were; serial commits never have
two in flight. A failing task is a real fencing by the broker: a second producer of the
task's transactional id is initialised in the middle of the task's commit.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from eddyline_runtime.config import CommitMode, StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.stream_thread import CommitReport
from eddyline_runtime.log import CommittedTransaction, Record, TransactionTimeoutError
from eddyline_runtime.log.kafka import KafkaClients, KafkaLog
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing import StreamsBuilder
from tests.integration.log.test_kafka_broker_runtime import (
    EXPECTED,
    LINES,
    config,
    produce_lines,
    published,
    run_until_caught_up,
    settled_counts,
)
from tests.support.word_count import word_count

# Not a timing assertion: how long a commit_transaction waits for another task's to be in
# flight before it goes on alone (a cycle may hold one task's commit only).
PAIR_WAIT_S = 3.0
# init_transactions of the fencing producer (the coordinator first aborts the open one).
FENCE_TIMEOUT_S = 60.0


class _Commits:
    """What the thread's producers' ``commit_transaction`` calls did, across threads."""

    def __init__(self, fence: str | None) -> None:
        self.cond = threading.Condition()
        self.in_flight = 0
        self.most_in_flight = 0
        self.fence = fence  # this transactional id's first commit is fenced mid-way
        self.fenced = threading.Event()


class _CountingProducer(Producer):
    """A real producer whose ``commit_transaction`` meets the thread's others in flight,
    and, for ``commits.fence``'s id, is fenced by a newer producer of the id first."""

    commits: _Commits | None = None
    transactional_id = ""
    bootstrap = ""

    def commit_transaction(self, *args: Any) -> None:
        commits = self.commits
        if commits is None:
            super().commit_transaction(*args)
            return
        with commits.cond:
            commits.in_flight += 1
            commits.most_in_flight = max(commits.most_in_flight, commits.in_flight)
            commits.cond.notify_all()
            paired = commits.cond.wait_for(lambda: commits.in_flight >= 2, timeout=PAIR_WAIT_S)
        try:
            if paired and self.transactional_id == commits.fence and not commits.fenced.is_set():
                commits.fenced.set()
                newer = Producer(
                    {"bootstrap.servers": self.bootstrap, "transactional.id": self.transactional_id}
                )
                newer.init_transactions(FENCE_TIMEOUT_S)  # bumps the epoch: this one is fenced
            super().commit_transaction(*args)
        finally:
            with commits.cond:
                commits.in_flight -= 1


class _CommitClients(KafkaClients):
    def __init__(self, bootstrap: str, fence: str | None = None) -> None:
        self.commits = _Commits(fence)
        self._bootstrap = bootstrap

    def producer(self, config: Mapping[str, Any]) -> Producer:
        transactional_id = config.get("transactional.id")
        if transactional_id is None:
            return Producer(dict(config))
        producer = _CountingProducer(dict(config))
        producer.commits = self.commits
        producer.transactional_id = str(transactional_id)
        producer.bootstrap = self._bootstrap
        return producer


@pytest.fixture
def prefix() -> str:
    return f"tcommit-{uuid.uuid4().hex[:8]}."


@pytest.fixture
def log(kafka_bootstrap: str, prefix: str) -> Iterator[KafkaLog]:
    log = KafkaLog.open(f"kafka://{kafka_bootstrap}", {}, topic_prefix=prefix)
    yield log
    log.close()


def with_mode(tmp_path: Path, application_id: str, mode: CommitMode) -> StreamsConfig:
    return config(tmp_path, application_id).model_copy(update={"commit_mode": mode})


def assert_exact(log: KafkaLog) -> None:
    assert settled_counts(log, EXPECTED) == dict(EXPECTED)
    for word, counts in published(log).items():  # a duplicated commit would repeat a count
        assert counts == sorted(set(counts)), f"{word}: {counts}"


@pytest.mark.slow
def test_a_threads_task_transactions_commit_together(
    tmp_path: Path, log: KafkaLog, kafka_bootstrap: str, prefix: str
) -> None:
    """Under commit.mode=concurrent two tasks' commit_transaction calls were in flight at
    once (serial commits never have more than one), and the counts are exact."""
    produce_lines(log, LINES)
    clients = _CommitClients(kafka_bootstrap)
    committing = KafkaLog.open(
        f"kafka://{kafka_bootstrap}", {}, topic_prefix=prefix, clients=clients
    )
    try:
        run_until_caught_up(
            StreamsInstance(
                word_count(), with_mode(tmp_path, "tc", CommitMode.CONCURRENT), committing
            )
        )
    finally:
        committing.close()
    assert clients.commits.most_in_flight >= 2
    assert_exact(log)


@pytest.mark.slow
def test_one_task_fenced_in_a_commit_cycle_loses_and_doubles_nothing(
    tmp_path: Path, log: KafkaLog, kafka_bootstrap: str, prefix: str
) -> None:
    """Task 0_1's commit is fenced by the broker (a newer producer of its id, initialised
    inside its commit_transaction) while another task's commit is in flight in the same
    cycle: that one's commit stands, 0_1 is dropped uncommitted and taken back (still
    assigned here: its new producer fences the intruder), reprocesses from its last
    committed offsets, and every count is published exactly once."""
    produce_lines(log, LINES)
    clients = _CommitClients(kafka_bootstrap, fence="tf-0_1")
    reports: list[CommitReport] = []
    committing = KafkaLog.open(
        f"kafka://{kafka_bootstrap}", {}, topic_prefix=prefix, clients=clients
    )
    try:
        instance = StreamsInstance(
            word_count(),
            with_mode(tmp_path, "tf", CommitMode.CONCURRENT),
            committing,
            on_commit=[reports.append],
        )
        run_until_caught_up(instance)
    finally:
        committing.close()
    assert clients.commits.fenced.is_set()
    fenced_cycles = [r for r in reports if r.migrated]
    assert [r.migrated for r in fenced_cycles] == [(TaskId(0, 1),)]
    # The task whose commit was in flight beside it committed in the same cycle.
    assert fenced_cycles[0].transactions >= 1
    assert_exact(log)


class _StuckProducer(Producer):
    """A real producer whose ``commit_transaction`` first blocks until ``release`` is set:
    a call that ignores its timeout, which the stream thread must not wait for."""

    release: threading.Event | None = None

    def commit_transaction(self, *args: Any) -> None:
        if self.release is not None:
            self.release.wait()
        super().commit_transaction(*args)


class _StuckClients(KafkaClients):
    def __init__(self, stuck: str) -> None:
        self.release = threading.Event()
        self._stuck = stuck

    def producer(self, config: Mapping[str, Any]) -> Producer:
        producer = _StuckProducer(dict(config))
        if config.get("transactional.id") == self._stuck:
            producer.release = self.release
        return producer


@pytest.mark.slow
def test_a_commit_stuck_past_every_timeout_is_abandoned_and_the_others_commit(
    kafka_bootstrap: str, prefix: str
) -> None:
    """One task's commit_transaction never returns: commit_transactions still returns once
    every call's timeout could have expired, with a TransactionTimeoutError for that task (a
    fencing: the stream thread drops it and rejoins) whose producer refuses every later
    call, and the other task's transaction committed."""
    clients = _StuckClients("st-0_0")
    # The ids' coordinators loaded first, with the usual timeouts (a fresh broker may take
    # longer than the short transaction timeout below to load them).
    warm = KafkaLog.open(f"kafka://{kafka_bootstrap}", {}, topic_prefix=prefix)
    try:
        for transactional_id in ("st-0_0", "st-0_1"):
            warm.transactional_producer(transactional_id).close()
    finally:
        warm.close()
    log = KafkaLog.open(
        f"kafka://{kafka_bootstrap}",
        {},
        topic_prefix=prefix,
        clients=clients,
        transaction_timeout_s=2.0,
    )
    try:
        out = TopicPartition("out", 0)
        log.create_topic("out", 1)
        stuck, other = log.transactional_producer("st-0_0"), log.transactional_producer("st-0_1")
        for producer in (stuck, other):
            producer.begin()
            producer.send(out, Record(None, producer.transactional_id.encode(), 1))
        outcomes = log.commit_transactions([stuck, other])
        assert isinstance(outcomes[0], TransactionTimeoutError)
        assert outcomes[0].transactional_id == "st-0_0"
        assert isinstance(outcomes[1], CommittedTransaction)
        with pytest.raises(TransactionTimeoutError):
            stuck.begin()
    finally:
        clients.release.set()
        log.close()


class _Events:
    """What happened, in order, across the stream thread and its producers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[str] = []

    def add(self, event: str) -> None:
        with self.lock:
            self.seen.append(event)


class _WatchedProducer(Producer):
    events: _Events | None = None

    def produce(self, *args: Any, **kwargs: Any) -> None:
        if self.events is not None:
            self.events.add("produce")
        super().produce(*args, **kwargs)

    def flush(self, *args: Any) -> int:
        if self.events is not None:
            self.events.add("flush")
        return int(super().flush(*args))


class _WatchedClients(KafkaClients):
    def __init__(self, events: _Events) -> None:
        self.events = events

    def producer(self, config: Mapping[str, Any]) -> Producer:
        producer = _WatchedProducer(dict(config))
        if config.get("transactional.id") is not None:
            producer.events = self.events
        return producer


@pytest.mark.slow
def test_pipelined_outputs_go_to_the_open_transaction_while_processing_goes_on(
    tmp_path: Path, log: KafkaLog, kafka_bootstrap: str, prefix: str
) -> None:
    """Under commit.mode=pipelined a task's outputs are handed to its
    producer after each iteration, not at the commit: outputs are produced and then more
    input is processed, all before the transaction's first flush; read_committed sees
    each output once, after the commit."""
    log.create_topic("lines", 1)
    log.create_topic("copies", 1)
    lines = [f"line {i}" for i in range(2_000)]
    log.produce(
        TopicPartition("lines", 0),
        [Record(None, line.encode(), i + 1) for i, line in enumerate(lines)],
    )
    events = _Events()

    def processed(key: Any, value: Any) -> None:
        events.add("processed")
        time.sleep(0.0005)  # more than a first turn of 1,000 records: several iterations

    builder = StreamsBuilder()
    builder.stream("lines").peek(processed).to("copies")
    settings = config(tmp_path, "tp").model_copy(
        update={"commit_interval_ms": 60_000, "commit_mode": CommitMode.PIPELINED}
    )
    watched = KafkaLog.open(
        f"kafka://{kafka_bootstrap}", {}, topic_prefix=prefix, clients=_WatchedClients(events)
    )
    try:
        run_until_caught_up(StreamsInstance(builder.build(), settings, watched))
    finally:
        watched.close()
    with events.lock:
        seen = list(events.seen)
    before_flush = seen[: seen.index("flush")]
    first_produce = before_flush.index("produce")
    assert "processed" in before_flush[first_produce:], "every output waited for the commit"
    copies: list[bytes | None] = []
    tp, offset = TopicPartition("copies", 0), 0
    while offset < log.end_offset(tp):
        fetched = log.fetch(tp, offset).records
        copies += [r.value for r in fetched]
        offset = fetched[-1].offset + 1 if fetched else log.end_offset(tp)
    assert copies == [line.encode() for line in lines]
