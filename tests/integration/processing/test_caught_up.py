"""``StreamsInstance.caught_up()`` says true only once what it covers is committed.

A thread's ``idle`` flag is set at the end of an iteration and stays set while the
next iteration fetches, processes and commits: records produced to an idle instance
were processed (their position at the log's end, nothing buffered) before their
commit, and the old check answered true then (under exactly-once with
``commit.interval.ms=0``, a caller saw 88 of 200 outputs). Here the log holds the
commit of the last input offset open until the test has asked, so the moment is
not a matter of luck.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.log.port import CommittedTransaction, Headers, TransactionalProducer
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import StreamsBuilder, Topology

INPUT = TopicPartition("words", 0)
OUTPUT = TopicPartition("upper", 0)
RECORDS = 200
# How long the log holds a commit open at most: far beyond what the test needs, so that
# a defect shows as a failed assertion instead of a hang.
HOLD_S = 60.0


class HeldCommitLog(SqliteLog):
    """The embedded log, holding open the commit that covers input offset ``RECORDS``
    (transactional or not) until the test releases it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.holding = threading.Event()
        self.release = threading.Event()

    def hold_if_last(self, offsets: Mapping[TopicPartition, int]) -> None:
        if offsets.get(INPUT) == RECORDS:
            self.holding.set()
            self.release.wait(HOLD_S)

    def commit_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        self.hold_if_last(offsets)
        super().commit_offsets(group, offsets)

    def transactional_producer(self, transactional_id: str) -> TransactionalProducer:
        return HeldProducer(super().transactional_producer(transactional_id), self)


class HeldProducer(TransactionalProducer):
    """A transactional producer whose commit waits while its log holds it."""

    def __init__(self, inner: TransactionalProducer, log: HeldCommitLog) -> None:
        self._inner, self._log = inner, log
        self.transactional_id, self.epoch = inner.transactional_id, inner.epoch
        self._offsets: Mapping[TopicPartition, int] = {}

    def begin(self) -> None:
        self._offsets = {}
        self._inner.begin()

    def send(self, tp: TopicPartition, record: Record) -> None:
        self._inner.send(tp, record)

    def send_columns(
        self,
        tp: TopicPartition,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[Headers] | None = None,
    ) -> None:
        self._inner.send_columns(tp, keys, values, timestamps, headers)

    def send_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        self._offsets = dict(offsets)
        self._inner.send_offsets(group, offsets)

    def commit(self) -> CommittedTransaction:
        self._log.hold_if_last(self._offsets)
        return self._inner.commit()

    def abort(self) -> None:
        self._inner.abort()

    def close(self) -> None:
        self._inner.close()


@pytest.fixture
def log(tmp_path: Path) -> Iterator[HeldCommitLog]:
    log = HeldCommitLog(tmp_path / "log.db")
    log.create_topic(INPUT.topic, 1)
    yield log
    log.release.set()
    log.close()


def uppercase() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream(INPUT.topic, key_serde="string", value_serde="string")
        .map_values(str.upper)
        .to(OUTPUT.topic, key_serde="string", value_serde="string")
    )
    return builder.build()


@pytest.mark.parametrize("guarantee", ["exactly_once_v2", "at_least_once"])
def test_caught_up_waits_for_the_commit(log: HeldCommitLog, tmp_path: Path, guarantee: str) -> None:
    config = StreamsConfig.from_properties(
        {
            "application.id": "app",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": guarantee,
            "commit.interval.ms": "0",
        }
    )
    instance = StreamsInstance(uppercase(), config, log)
    instance.start()
    try:
        instance.wait_until_caught_up(60)  # nothing to do yet: the thread idles
        log.produce(INPUT, [Record(b"k", f"w{i}".encode(), i) for i in range(RECORDS)])
        assert log.holding.wait(HOLD_S), "the instance never committed the records"
        # Every record is processed (the commit covering the last one is under way)
        # and none is committed: not caught up, however idle the thread looked.
        assert not instance.caught_up()
        with pytest.raises(TimeoutError):
            instance.wait_until_caught_up(0.2, poll_seconds=0.01)
        log.release.set()
        instance.wait_until_caught_up(60)
        # Caught up means committed: every output is there for a committed reader, and
        # the group's offset covers every input.
        upper = log.fetch(OUTPUT, 0, 10 * RECORDS).records
        assert [r.value for r in upper] == [f"W{i}".encode() for i in range(RECORDS)]
        assert log.committed_offsets("app", [INPUT]) == {INPUT: RECORDS}
    finally:
        log.release.set()
        instance.close()
