"""`make run`'s job, run as a user would: `eddyline demo wordcount` on three replicas."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.ports import free_port_range

REPOSITORY = Path(__file__).resolve().parents[2]


def test_wordcount_demo_survives_a_killed_replica_exactly_once(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "eddyline_runtime.cli",
            "demo",
            "wordcount",
            "--lines",
            "3000",
            "--state-dir",
            str(tmp_path / "demo"),
            "--base-port",
            str(free_port_range(3)),
        ],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, f"{out}\n{result.stderr}"
    assert "every count equal to the input's" in out
    assert re.search(r"record cache forwards saved +[1-9]", out)
    # The killed replica's key is answered by its standby, then by the promoted copy.
    assert re.search(r'"the" = \d+ from 127\.0\.0\.1:\d+ \(standby, stale=True', out), out
    assert "now the active copy on replica" in out
    restored = re.search(
        r"task 1_\d restored store word-counts: \d+ records .* offsets (\d+)\.\.", out
    )
    # The promoted copy resumed from its standby position, not from the changelog's start.
    assert restored is not None and int(restored.group(1)) > 0, out
    assert "verified after the failover" in out
    assert "stopped the replicas cleanly" in out
