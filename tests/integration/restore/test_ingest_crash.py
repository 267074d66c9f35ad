"""A crash during ingest leaves the store missing or complete, never a mix.

A process building a store from SST files is SIGKILLed at instants spread
over its run; after each kill the store is either absent (the next task
replays or ingests again) or whole: every key and the committed offset.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state import KeyRange, RocksDBStore
from eddyline_runtime.state.sst_files import (
    SortedFileWriter,
    build_store_from_sst_files,
    store_exists,
)

pytestmark = pytest.mark.slow

STORE = "counts"
CHANGELOG = TopicPartition("app-counts-changelog", 0)
OFFSET = 1_234_567
FILES, KEYS_PER_FILE = 4, 40_000
WORKER = Path(__file__).with_name("ingest_worker.py")


def write_files(directory: Path) -> list[tuple[str, str, int]]:
    listed = []
    for number in range(FILES):
        writer = SortedFileWriter(directory / f"{number}.sst", store=STORE)
        keys = [f"{number}:{i:08d}".encode() for i in range(KEYS_PER_FILE)]
        writer.add(keys, [b"v" * 100] * KEYS_PER_FILE)
        finished = writer.finish()
        assert finished is not None
        listed.append((str(finished.path), finished.sha256, finished.entries))
    return listed


def run_worker(plan: Path, kill_after: float | None) -> float | None:
    """Run one ingest; SIGKILL it ``kill_after`` seconds after it starts.

    The seconds it took when it finished, else None.
    """
    with subprocess.Popen(
        [sys.executable, str(WORKER), str(plan)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as worker:
        assert worker.stdout is not None and worker.stdin is not None
        assert worker.stdout.readline().strip() == "ready"
        started = time.monotonic()
        worker.stdin.write("go\n")
        worker.stdin.flush()
        if kill_after is not None:
            time.sleep(kill_after)
            worker.kill()
        finished = worker.stdout.readline().strip() == "done"
        took = time.monotonic() - started
        worker.wait()
    return took if finished else None


def test_a_killed_ingest_leaves_the_store_missing_or_whole(tmp_path: Path) -> None:
    listed = write_files(tmp_path)
    target = tmp_path / "state" / "0_0" / STORE
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "store": STORE,
                "target": str(target),
                "topic": CHANGELOG.topic,
                "offset": OFFSET,
                "files": listed,
            }
        )
    )
    duration = run_worker(plan, None)
    assert duration is not None
    outcomes = {"missing": 0, "whole": 0}
    for step in range(10):
        shutil.rmtree(target.parent, ignore_errors=True)
        run_worker(plan, duration * step / 9)
        if store_exists(target):
            with RocksDBStore(STORE, target) as store:
                assert store.committed_offset(CHANGELOG) == OFFSET
                assert sum(1 for _ in store.scan(KeyRange.closed(None, None))) == (
                    FILES * KEYS_PER_FILE
                )
            outcomes["whole"] += 1
        else:
            assert not target.exists()  # no half-built store under the store's name
            outcomes["missing"] += 1
            if step % 2:
                # The next ingest clears what the killed one left and builds the store.
                build_store_from_sst_files(
                    STORE, target, [(Path(p), s, n) for p, s, n in listed], {CHANGELOG: OFFSET}
                )
            else:
                # Or the store is opened empty (a replay rebuilds it): the open clears them
                # (a staging copy is a whole store's size: it must not stay behind).
                RocksDBStore(STORE, target).close()
            assert [p.name for p in target.parent.iterdir()] == [STORE]
    assert outcomes["missing"] >= 1  # the early kills did land inside the ingest
    # Sources are never consumed: every run read the same files.
    assert all(Path(path).exists() for path, _, _ in listed)
