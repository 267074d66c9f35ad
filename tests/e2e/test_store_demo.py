"""`make run`'s job, run as a user would: the `eddyline demo store` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_store_demo_recovers_every_acknowledged_commit(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "eddyline_runtime.cli",
            "demo",
            "store",
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "committed changelog offset found: 4999 (last acknowledged commit: 4999)" in out
    assert "data is exactly the word counts at offset 4999: yes" in out
    assert "READ_UNCOMMITTED  apple=1000 banana=- zucchini=1" in out
    assert "READ_COMMITTED    apple=1177 banana=1176 zucchini=-" in out
    assert "after commit, READ_COMMITTED sees apple=1000 banana=- zucchini=1" in out
