"""Bounded RocksDB memory: 64 stores writing steadily stay within the container's limit.

A child process learns a 256 MiB memory limit the way a pod does (the
downward API's ``limits.memory`` in ``EDDYLINE_MEMORY_LIMIT_BYTES``) and
writes 256 MiB of incompressible values through 64 stores. Without the
bound the same run peaked at 365 MB of RSS here (an OOM kill in such a
container); with it, what RocksDB reports stays within its share of the
limit and the process's peak RSS within the limit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

WRITER = Path(__file__).with_name("memory_writer.py")
LIMIT = 256 * 1024 * 1024


@pytest.mark.slow
def test_64_stores_writing_stay_within_the_memory_limit(tmp_path: Path) -> None:
    finished = subprocess.run(
        [sys.executable, str(WRITER), str(tmp_path / "stores")],
        env={"EDDYLINE_MEMORY_LIMIT_BYTES": str(LIMIT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    measured = json.loads(finished.stdout.strip().splitlines()[-1])
    print(measured)
    # The default share, rocksdb.memory.limit.share 0.5, of the limit.
    assert measured["budget"] == LIMIT // 2
    assert measured["written"] >= LIMIT  # as much as the whole limit
    assert 0 < measured["most_reported"] <= measured["budget"]
    assert measured["peak_rss"] < LIMIT
