"""The runtime end to end on a real SQLite log and RocksDB stores (one process).

Covers what a user relies on between two crashes: the record cache's effect
on outputs (KIP-63), commits triggered by the uncommitted-bytes budget
(KIP-892), restarts that resume where the last run committed, processing
errors that name the record and commit nothing after the last commit, and
where state lives on disk.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsFailedError, StreamsInstance
from eddyline_runtime.engine.stream_thread import CommitReport
from eddyline_runtime.engine.task_manager import RestoreReport
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Processor, StoreSpec, Topology
from eddyline_runtime.serde import serde_for
from tests.support.word_count import word_count

LONGS = serde_for("long")


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    log = SqliteLog(tmp_path / "log.db")
    yield log
    log.close()


def config(tmp_path: Path, **settings: Any) -> StreamsConfig:
    return StreamsConfig.from_properties(
        {
            "application.id": "app",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": "exactly_once_v2",
            **settings,
        }
    )


def produce_lines(log: SqliteLog, lines: list[str], partitions: int = 2) -> None:
    if "lines" not in log.topics():
        log.create_topic("lines", partitions)
    for partition in range(partitions):
        log.produce(
            TopicPartition("lines", partition),
            [Record(None, line.encode(), i) for i, line in enumerate(lines[partition::partitions])],
        )


def read_all(log: SqliteLog, topic: str) -> list[Record]:
    records: list[Record] = []
    for partition in range(log.topics()[topic].partitions):
        tp = TopicPartition(topic, partition)
        records.extend(log.fetch(tp, log.beginning_offset(tp), 1_000_000).records)
    return records


def counts_published(log: SqliteLog) -> dict[str, list[int]]:
    """Every count published per word, in publication order."""
    published: dict[str, list[int]] = {}
    for record in read_all(log, "word-counts"):
        assert record.key is not None and record.value is not None
        published.setdefault(record.key.decode(), []).append(LONGS.deserialize(record.value))
    return published


def run_until_caught_up(instance: StreamsInstance, timeout: float = 60) -> StreamsInstance:
    instance.start()
    try:
        instance.wait_until_caught_up(timeout)
    finally:
        instance.close()
    return instance


LINES = ["a b a", "b a c", "a a a", "c b"]
EXPECTED = Counter(" ".join(LINES).split())


def test_with_the_record_cache_each_word_is_published_once_per_commit(
    tmp_path: Path, log: SqliteLog
) -> None:
    produce_lines(log, LINES)
    reports: list[CommitReport] = []
    run_until_caught_up(
        StreamsInstance(
            word_count(),
            config(tmp_path, **{"commit.interval.ms": 60_000}),
            log,
            on_commit=[reports.append],
        )
    )
    published = counts_published(log)
    # All counting happened between two commits: the cache forwarded each word once.
    assert published == {word: [count] for word, count in EXPECTED.items()}
    assert reports and all(report.reason != "commit.interval.ms elapsed" for report in reports)


def test_without_a_record_cache_every_update_is_published(tmp_path: Path, log: SqliteLog) -> None:
    produce_lines(log, LINES)
    run_until_caught_up(
        StreamsInstance(word_count(), config(tmp_path, **{"statestore.cache.max.bytes": 0}), log)
    )
    published = counts_published(log)
    assert {word: sorted(counts) for word, counts in published.items()} == {
        word: list(range(1, count + 1)) for word, count in EXPECTED.items()
    }


def test_a_restart_resumes_from_the_last_commit_without_restoring(
    tmp_path: Path, log: SqliteLog
) -> None:
    produce_lines(log, LINES)
    run_until_caught_up(StreamsInstance(word_count(), config(tmp_path), log))
    produce_lines(log, ["a z"])
    restores: list[RestoreReport] = []
    run_until_caught_up(
        StreamsInstance(word_count(), config(tmp_path), log, on_restore=[restores.append])
    )
    latest = {word: counts[-1] for word, counts in counts_published(log).items()}
    assert latest == dict(EXPECTED + Counter(["a", "z"]))
    # A clean close committed every store: the restart replayed no changelog record.
    assert restores and all(report.result.records == 0 for report in restores)
    # State lives under state.dir/<task id>/<store name>.
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["1_0", "1_1"]
    assert (tmp_path / "state" / "1_0" / "counts").is_dir()


def test_a_wiped_store_is_rebuilt_from_its_changelog(tmp_path: Path, log: SqliteLog) -> None:
    produce_lines(log, LINES)
    run_until_caught_up(StreamsInstance(word_count(), config(tmp_path), log))
    for task in ("1_0", "1_1"):
        for path in sorted((tmp_path / "state" / task / "counts").iterdir()):
            path.unlink()
    restores: list[RestoreReport] = []
    produce_lines(log, ["b"])
    run_until_caught_up(
        StreamsInstance(word_count(), config(tmp_path), log, on_restore=[restores.append])
    )
    assert sum(report.result.records for report in restores) == len(EXPECTED)
    latest = {word: counts[-1] for word, counts in counts_published(log).items()}
    assert latest == dict(EXPECTED + Counter(["b"]))


def test_the_uncommitted_bytes_budget_triggers_commits(tmp_path: Path, log: SqliteLog) -> None:
    produce_lines(log, [f"w{i} w{i + 1}" for i in range(3_000)])
    reports: list[CommitReport] = []
    settings = {
        "commit.interval.ms": 600_000,
        "statestore.cache.max.bytes": 0,
        "statestore.uncommitted.max.bytes": 20_000,
    }
    run_until_caught_up(
        StreamsInstance(word_count(), config(tmp_path, **settings), log, on_commit=[reports.append])
    )
    budget_commits = [r for r in reports if "share" in r.reason or "next iteration" in r.reason]
    assert budget_commits, [r.reason for r in reports]
    latest = {word: counts[-1] for word, counts in counts_published(log).items()}
    assert latest["w1"] == 2 and latest["w0"] == 1 and len(latest) == 3_001


class FailOn(Processor):
    """Forwards values, and raises on the value "boom"."""

    def process(self, key: Any, value: Any) -> None:
        if value == "boom":
            raise ValueError("cannot handle boom")
        store = self.context.get_state_store("seen")
        store.put(value.encode(), b"1")
        self.context.forward(key, value)


def failing_topology() -> Topology:
    topology = Topology()
    topology.add_source("in", ["events"], value_serde="string")
    topology.add_processor("fail-on-boom", FailOn, "in")
    topology.add_state_store(StoreSpec("seen"), "fail-on-boom")
    topology.add_sink("out", "passed", "fail-on-boom", value_serde="string")
    return topology


def test_a_failing_processor_names_the_record_and_commits_nothing_after_it(
    tmp_path: Path, log: SqliteLog
) -> None:
    log.create_topic("events", 1)
    tp = TopicPartition("events", 0)
    log.produce(tp, [Record(None, b"ok-1", 0), Record(None, b"ok-2", 1)])
    instance = StreamsInstance(failing_topology(), config(tmp_path), log)
    run_until_caught_up(instance)
    log.produce(tp, [Record(None, b"ok-3", 2), Record(None, b"boom", 3)])
    failing = StreamsInstance(failing_topology(), config(tmp_path), log)
    failing.start()
    with pytest.raises(StreamsFailedError, match=r"events-0 at offset 3: ValueError: cannot") as e:
        failing.wait_until_caught_up(30)
    assert "restart" in str(e.value)
    # ok-3 was processed with boom in the same batch: nothing of it was committed.
    assert [r.value for r in read_all(log, "passed")] == [b"ok-1", b"ok-2"]
    assert log.committed_offsets("app", [tp]) == {tp: 2}


def test_a_task_fenced_away_while_still_assigned_is_opened_again(
    tmp_path: Path, log: SqliteLog
) -> None:
    """A member acting on an older membership can fence tasks this member still holds (seen
    on the real control plane, where pods start seconds apart): they must come back, not
    stay with no active member while the assignment lasts."""
    produce_lines(log, LINES)
    instance = StreamsInstance(word_count(), config(tmp_path), log)
    instance.start()
    try:
        instance.wait_until_caught_up(60)
        tasks = [task.id for thread in instance.threads for task in thread.tasks]
        # A zombie takes every task's transactional id, fencing this member's producers.
        zombies = [log.transactional_producer(f"app-{task}") for task in tasks]
        produce_lines(log, LINES)
        deadline = time.monotonic() + 60
        while True:
            latest = {word: counts[-1] for word, counts in counts_published(log).items()}
            if latest == {word: 2 * count for word, count in EXPECTED.items()}:
                break
            assert time.monotonic() < deadline, f"counts stuck at {latest}"
            time.sleep(0.1)
        fenced = sum(thread.migrated for thread in instance.threads)
        assert fenced >= 1
        # What /metrics exports per thread, as a counter the EddylineCommitsFenced alert reads.
        exported = [
            value
            for name, value in instance.metrics.snapshot().items()
            if (name.group, name.name) == ("stream-thread-metrics", "commit-fenced-total")
        ]
        assert exported and sum(exported) == fenced
        assert sorted(task.id for thread in instance.threads for task in thread.tasks) == sorted(
            tasks
        )
    finally:
        instance.close()
    del zombies


@pytest.mark.parametrize("mode", ["pipelined", "concurrent", "serial"])
def test_every_commit_mode_commit_every_tasks_transaction_and_count_exactly(
    tmp_path: Path, log: SqliteLog, mode: str
) -> None:
    """commit.mode changes how a thread's task transactions are written, never what: each
    task with work commits its own transaction in the cycle (the reports count them)."""
    produce_lines(log, LINES)
    reports: list[CommitReport] = []
    run_until_caught_up(
        StreamsInstance(
            word_count(), config(tmp_path, **{"commit.mode": mode}), log, on_commit=[reports.append]
        )
    )
    latest = {word: counts[-1] for word, counts in counts_published(log).items()}
    assert latest == dict(EXPECTED)
    # Two source tasks (one cycle) and then the counting tasks the words went to.
    assert sum(report.transactions for report in reports) >= 3
    assert max(report.transactions for report in reports) >= 2
    assert not any(report.migrated for report in reports)
