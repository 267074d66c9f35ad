"""Poison records to a dead-letter topic under exactly-once, through SIGKILLs.

The worker (``dead_letter_worker.py``) parses numbers; every 97th record is
not one, and ``log-and-continue`` with ``errors.dead.letter.queue.topic.name``
sends it to ``numbers-dlq`` (KIP-1034). Twice the worker SIGKILLs itself on
the record right after a poison one: the poison record's skip and its
dead-letter record are then in the open transaction, with the input offset
that skips it. A third run is SIGKILLed from outside soon after a commit
that wrote dead-letter records, and the last run finishes. Then every poison
record must be in the dead-letter topic exactly once, with its original
bytes and the partition and offset headers, and every number in the output
exactly once: a crash neither loses a skipped record nor writes it twice.

On the embedded log and on a real Kafka broker (read_committed readers,
the task's transactional producer). Kafka's side of this is its EOS
integration tests (``EosIntegrationTest``) with KIP-1034's dead-letter
records produced through the task's producer.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from eddyline_runtime.log import Log, Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.serde import serde_for
from tests.support.waiting import wait_for

WORKER = Path(__file__).with_name("dead_letter_worker.py")
PARTITIONS = 2
RECORDS = 30_000
POISON_EVERY = 97
LONGS = serde_for("long")


def poisoned(partition: int, index: int) -> bool:
    return index % POISON_EVERY == 5


def input_values(partition: int) -> list[bytes]:
    """Partition ``partition``'s values: numbers unique across partitions, some poison."""
    return [
        b"poison-%d-%d" % (partition, i) if poisoned(partition, i) else b"%d" % (i * 10 + partition)
        for i in range(RECORDS // PARTITIONS)
    ]


def read_all(log: Log, topic: str) -> list[tuple[int, Record]]:
    found = []
    if topic not in log.topics():
        return []
    for partition in range(PARTITIONS):
        tp = TopicPartition(topic, partition)
        position = log.beginning_offset(tp)
        while True:  # a Kafka fetch returns what one fetch holds, not everything
            records = log.fetch(tp, position, 100_000).records
            if not records:
                break
            found.extend((partition, record) for record in records)
            position = records[-1].offset + 1
    return found


def run_through_kills(log: Log, url: str, tmp_path: Path, prefix: str) -> None:
    log.create_topic("numbers", PARTITIONS)
    log.create_topic("numbers-dlq", PARTITIONS)  # the app never creates it (KIP-1034)
    for partition in range(PARTITIONS):
        log.produce(
            TopicPartition("numbers", partition),
            [Record(b"k", value, i) for i, value in enumerate(input_values(partition))],
        )
    # Numbers right after a poison record of partition 0: early, then later on.
    kill_after = [
        int(input_values(0)[i + 1]) for i in range(len(input_values(0)) - 1) if poisoned(0, i)
    ]
    rng = random.Random(7)
    stderr = (tmp_path / "worker.stderr").open("ab")
    state = tmp_path / "state"
    try:
        for run, kill in enumerate([kill_after[3], kill_after[40], -1, -1]):
            args = [sys.executable, str(WORKER), url, str(state), str(kill)]
            worker = subprocess.Popen([*args, prefix], stdout=subprocess.DEVNULL, stderr=stderr)
            try:
                if run < 2:  # it kills itself right after a skipped record
                    assert worker.wait(timeout=120) == -signal.SIGKILL, run
                    continue
                if run == 3:
                    assert worker.wait(timeout=120) == 0, (tmp_path / "worker.stderr").read_text()
                    continue
                before = len(read_all(log, "numbers-dlq"))
                wait_for(
                    lambda before=before: len(read_all(log, "numbers-dlq")) > before,  # type: ignore[misc]
                    f"run {run}: new committed dead-letter records",
                    timeout=60,
                )
                time.sleep(rng.uniform(0.0, 0.05))
                worker.send_signal(signal.SIGKILL)
                worker.wait(timeout=30)
            finally:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
    finally:
        stderr.close()


def check_exactly_once(log: Log) -> None:
    expected_poison = {
        (partition, i): value
        for partition in range(PARTITIONS)
        for i, value in enumerate(input_values(partition))
        if poisoned(partition, i)
    }
    dead = read_all(log, "numbers-dlq")
    seen: Counter[tuple[int, int]] = Counter()
    for _, record in dead:
        headers = dict(record.headers)
        where = (
            int(headers["__streams.errors.partition"]),
            int(headers["__streams.errors.offset"]),
        )
        seen[where] += 1
        assert record.value == expected_poison[where]
        assert record.key == b"k"
        assert headers["__streams.errors.exception"] == b"builtins.ValueError"
    assert [where for where, n in seen.items() if n > 1] == [], "dead-letter records doubled"
    assert set(seen) == set(expected_poison), "dead-letter records lost"
    numbers = Counter(LONGS.deserialize(record.value) for _, record in read_all(log, "parsed"))
    expected_numbers = {
        int(value)
        for partition in range(PARTITIONS)
        for value in input_values(partition)
        if not value.startswith(b"poison")
    }
    assert [n for n, count in numbers.items() if count > 1] == [], "outputs doubled"
    assert set(numbers) == expected_numbers


@pytest.mark.slow
def test_each_poison_record_reaches_the_dead_letter_topic_once_through_sigkills_on_sqlite(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.db"
    log = SqliteLog(path)
    try:
        run_through_kills(log, f"sqlite:///{path}", tmp_path, "")
        check_exactly_once(log)
    finally:
        log.close()


@pytest.mark.slow
def test_each_poison_record_reaches_the_dead_letter_topic_once_through_sigkills_on_kafka(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    from eddyline_runtime.log.kafka import KafkaLog

    prefix = f"dlq-{uuid.uuid4().hex[:8]}."
    log = KafkaLog.open(f"kafka://{kafka_bootstrap}", {}, topic_prefix=prefix)
    try:
        run_through_kills(log, f"kafka://{kafka_bootstrap}", tmp_path, prefix)
        check_exactly_once(log)
    finally:
        log.close()
