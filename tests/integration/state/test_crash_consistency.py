"""SIGKILL a committing process at random instants; the store must never lie.

After every kill the parent reopens the store and checks the KIP-892
promise: the committed offset it reports matches its data exactly (never
ahead of it, nothing torn, no uncommitted write). A process crash loses no
acknowledged commit: the store reopens at the last acknowledged commit, or at
the one in flight if its batch reached the log before the kill, so the
changelog tail to replay is at most that one commit. Restarting then
continues from that offset, as restoration would.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eddyline_runtime.state import RocksDBStore
from tests.integration.state.crash_writer import CHANGELOG, contents_at

KILLS = 60
MAX_RECORDS = 20_000  # the writer's durability bound: how often it syncs the log
WRITER = Path(__file__).with_name("crash_writer.py")


@pytest.mark.slow
def test_store_offset_matches_data_after_every_sigkill(tmp_path: Path) -> None:
    rng = random.Random(20261122)
    directory = tmp_path / "0_0" / "crash"
    announced: set[int] = set()
    kills_after_commits = 0
    expected_start: int | None = None
    for kill in range(KILLS):
        writer = subprocess.Popen(
            [sys.executable, str(WRITER), str(directory), str(kill), str(MAX_RECORDS)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None
        if rng.random() < 0.1:
            time.sleep(rng.uniform(0, 0.3))  # sometimes while it starts or opens
        else:
            opened = writer.stdout.readline().split()
            assert opened[:1] == ["open"], opened
            assert opened[1] == str(expected_start), "reopened elsewhere than last verified"
            time.sleep(rng.uniform(0, 0.3))
        os.kill(writer.pid, signal.SIGKILL)
        output = writer.communicate()[0].split("\n")
        acknowledged = [int(line.split()[1]) for line in output if line.startswith("committed ")]
        announced.update(int(line.split()[1]) for line in output if line.startswith("committing "))

        with RocksDBStore("crash", directory) as store:
            recovered = store.committed_offset(CHANGELOG)
            assert recovered is None or recovered in announced, (
                f"offset {recovered} never committed"
            )
            assert dict(store.all()) == contents_at(recovered), (
                f"kill {kill}: data does not match committed offset {recovered}"
            )
            floor = acknowledged[-1] if acknowledged else expected_start
            if floor is not None:
                assert recovered is not None and recovered >= floor, (
                    f"kill {kill}: reopened at {recovered}, before acknowledged commit {floor}"
                )
            kills_after_commits += bool(acknowledged)
        expected_start = recovered  # close() made it durable
    # Most kills must land mid-stream, after some commits, or this tests little.
    assert kills_after_commits >= KILLS // 2
