"""Final results (``emit_final``) SIGKILLed at random instants under exactly-once.

The worker (``final_results_worker.py``) counts clicks per key and 1-second
tumbling window with final results only; its suppression buffer is a
changelogged transactional store. The parent kills it with SIGKILL three
times, each time soon after the log shows committed final results, restarts
it on the same state, and lets the last run finish. A run to be killed never
ends on its own, and until its kill the parent keeps appending clicks
(:class:`ClickFeed`), so every kill lands in a run still at work, however fast
the machine. Every window that closed
must then be in the committed output exactly once, with its full count: a kill
neither loses a final result (the buffer is restored) nor repeats one (an
eviction is committed with the output it produced). Before the third run the
state directory is deleted as well (a lost disk): the window store and the
buffer are then restored from their changelogs.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from tests.support.waiting import wait_for

WORKER = Path(__file__).with_name("final_results_worker.py")
SIZE_MS, GRACE_MS = 1_000, 200
PARTITIONS = 2
RECORDS = 40_000


def clicks(
    rng: random.Random, start: int = 0, count: int = RECORDS
) -> dict[int, list[tuple[str, int]]]:
    """Per partition: (key, timestamp) of records ``start``..``start + count - 1``, one
    record per ms, 1% up to 150 ms out of order (within grace: none is dropped)."""
    per_partition: dict[int, list[tuple[str, int]]] = {p: [] for p in range(PARTITIONS)}
    for i in range(start, start + count):
        partition = i % PARTITIONS
        timestamp = i // PARTITIONS
        if rng.random() < 0.01:
            timestamp = max(0, timestamp - rng.randrange(1, 150))
        key = f"k{rng.randrange(50) * PARTITIONS + partition}"
        per_partition[partition].append((key, timestamp))
    return per_partition


def produce_clicks(log: SqliteLog, per_partition: dict[int, list[tuple[str, int]]]) -> None:
    for partition, records in per_partition.items():
        log.produce(
            TopicPartition("clicks", partition),
            [Record(key.encode(), b"c", timestamp) for key, timestamp in records],
        )


# Records the feed keeps ahead of the committed offsets: a quarter of the first input,
# topped up every poll; a worker would need to process them all between two polls to idle.
AHEAD = RECORDS // 4
FEED_CHUNK = 2_000


class ClickFeed:
    """The clicks: the first RECORDS, and more appended while the parent waits for a kill,
    so that fewer than AHEAD records never wait uncommitted; a fixed input let a fast run
    finish it before its kill. Appended records continue the first ones' clock and come
    from their own seeded generator."""

    def __init__(self, log: SqliteLog, per_partition: dict[int, list[tuple[str, int]]]) -> None:
        self.log = log
        self.per_partition = per_partition  # every record written so far
        self.records = sum(len(records) for records in per_partition.values())
        self._rng = random.Random("24-fed")

    def keep_ahead(self) -> None:
        tps = [TopicPartition("clicks", p) for p in range(PARTITIONS)]
        committed = sum(self.log.committed_offsets("finals", tps).values())
        while self.records - committed < AHEAD:
            more = clicks(self._rng, self.records, FEED_CHUNK)
            produce_clicks(self.log, more)
            for partition, records in more.items():
                self.per_partition[partition].extend(records)
            self.records += FEED_CHUNK


def expected_finals(per_partition: dict[int, list[tuple[str, int]]]) -> dict[str, str]:
    """Every window closed by its task's final stream time, with its full count."""
    finals: dict[str, str] = {}
    for records in per_partition.values():
        stream_time = max(t for _, t in records)
        counts = Counter((key, t - t % SIZE_MS) for key, t in records)
        for (key, start), count in counts.items():
            if start + SIZE_MS + GRACE_MS <= stream_time:
                finals[f"[{key}@{start}/{start + SIZE_MS}]"] = str(count)
    return finals


def committed_finals(log: SqliteLog) -> list[tuple[str, str]]:
    found = []
    for partition in range(PARTITIONS):
        tp = TopicPartition("finals", partition)
        if "finals" not in log.topics():
            return []
        for record in log.fetch(tp, log.beginning_offset(tp), 1_000_000).records:
            assert record.key is not None and record.value is not None
            found.append((record.key.decode(), record.value.decode()))
    return found


@pytest.mark.slow
def test_final_results_survive_sigkills_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(24)
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("clicks", PARTITIONS)
    per_partition = clicks(rng)
    produce_clicks(log, per_partition)
    feed = ClickFeed(log, per_partition)
    stderr = (tmp_path / "worker.stderr").open("ab")
    seen_at_kill = []
    try:
        for run in range(4):
            if run == 2:
                shutil.rmtree(tmp_path / "state")
            until = "caught-up" if run == 3 else "killed"
            worker = subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    str(tmp_path / "log.db"),
                    str(tmp_path / "state"),
                    until,
                ],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
            try:
                if run == 3:
                    assert worker.wait(timeout=120) == 0, (tmp_path / "worker.stderr").read_text()
                    break
                before = len(committed_finals(log))

                def new_finals(before: int = before) -> bool:
                    feed.keep_ahead()
                    return len(committed_finals(log)) > before

                wait_for(new_finals, f"run {run}: new committed final results", timeout=60)
                # Kill at a random instant shortly after a commit with final results.
                deadline = time.monotonic() + rng.uniform(0.0, 0.1)
                while (left := deadline - time.monotonic()) > 0:
                    feed.keep_ahead()
                    time.sleep(min(left, 0.02))
                assert worker.poll() is None, (
                    f"run {run} failed: {(tmp_path / 'worker.stderr').read_text()[-3000:]}"
                )
                worker.send_signal(signal.SIGKILL)
                assert worker.wait(timeout=30) == -signal.SIGKILL
                seen_at_kill.append(len(committed_finals(log)))
            finally:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
    finally:
        stderr.close()
    finals = committed_finals(log)
    log.close()
    expected = expected_finals(feed.per_partition)
    repeated = [key for key, n in Counter(key for key, _ in finals).items() if n > 1]
    assert repeated == [], f"final results repeated: {repeated[:10]}"
    assert dict(finals) == expected
    # The kills landed while results were coming out, not before or after all of them.
    assert seen_at_kill[0] > 0 and seen_at_kill[-1] < len(expected)
