"""Several processes share one embedded SQLite log file safely.

Two writers in their own processes append to the same partition at the same
time; the log must hand out every offset exactly once, in commit order, and
keep each writer's records in the order it sent them. And a zombie in another
process, fenced by a newer producer for its transactional id, must fail to
commit and leave no trace. The children are ``log_process_worker.py``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.log import Log, Record, open_log
from tests.integration.log.log_process_worker import (
    COMMITTED_EXIT,
    GROUP,
    INPUT,
    SHARED,
    ZOMBIE_ONLY,
)

WORKER = Path(__file__).with_name("log_process_worker.py")
RECORDS_PER_WRITER = 2_000
TRANSACTION_SIZE = 50
TIMEOUT = 60


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'log.db'}"


@pytest.fixture
def log(url: str) -> Iterator[Log]:
    log = open_log(url)
    log.create_topic(SHARED.topic, 2)
    log.create_topic(INPUT.topic, 1)
    yield log
    log.close()


def start_worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def tell(worker: subprocess.Popen[str], word: str) -> None:
    assert worker.stdin is not None
    worker.stdin.write(word + "\n")
    worker.stdin.flush()


def read_line(worker: subprocess.Popen[str]) -> str:
    assert worker.stdout is not None
    return worker.stdout.readline().strip()


def finish(worker: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = worker.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.communicate()
        raise
    return worker.returncode, out


def test_concurrent_writers_get_every_offset_once_and_keep_their_order(log: Log, url: str) -> None:
    txids = ["writer-a", "writer-b"]
    writers = [
        start_worker("produce", url, txid, str(RECORDS_PER_WRITER), str(TRANSACTION_SIZE))
        for txid in txids
    ]
    try:
        for writer in writers:
            assert read_line(writer) == "ready"
        for writer in writers:  # start both only once both are open
            tell(writer, "go")
        for writer in writers:
            returncode, out = finish(writer)
            assert returncode == 0, out
            assert out.split() == ["done"]
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.communicate()

    records = list(log.fetch(SHARED, 0, max_records=10 * RECORDS_PER_WRITER).records)
    total = len(txids) * RECORDS_PER_WRITER
    assert [r.offset for r in records] == list(range(total))
    assert log.end_offset(SHARED) == total
    for txid in txids:
        mine = [r.value for r in records if r.key == txid.encode()]
        assert mine == [b"%d" % i for i in range(RECORDS_PER_WRITER)], txid
    # Each transaction of 50 lands contiguously: writers interleave only between commits.
    for start in range(0, total, TRANSACTION_SIZE):
        assert len({r.key for r in records[start : start + TRANSACTION_SIZE]}) == 1, start


def test_a_zombie_in_another_process_is_fenced_and_writes_nothing(log: Log, url: str) -> None:
    log.commit_offsets(GROUP, {INPUT: 1})
    zombie = start_worker("zombie", url, "app-0_0")
    try:
        sent = read_line(zombie).split()
        assert sent[:1] == ["sent"], sent
        zombie_epoch = int(sent[1])

        newer = log.transactional_producer("app-0_0")
        assert newer.epoch > zombie_epoch
        newer.begin()
        newer.send(SHARED, Record(b"newer", b"0", 0))
        newer.send_offsets(GROUP, {INPUT: 2})
        newer.commit()

        tell(zombie, "commit")
        returncode, out = finish(zombie)
    finally:
        if zombie.poll() is None:
            zombie.kill()
            zombie.communicate()
    assert returncode != COMMITTED_EXIT, "the zombie committed after being fenced"
    assert (returncode, out.split()) == (0, ["fenced"])

    assert [(r.key, r.value) for r in log.fetch(SHARED, 0).records] == [(b"newer", b"0")]
    assert list(log.fetch(ZOMBIE_ONLY, 0).records) == []
    assert log.committed_offsets(GROUP, [INPUT]) == {INPUT: 2}
