"""``make run`` (``eddyline demo wordcount``) in a terminal, in a pipe, and with
``--no-progress``: a live progress line only in the first.

One replica and a few thousand lines: about two seconds a run. The demo's failover and
its checks are tests/e2e/test_wordcount_demo.py's; here only its output is at stake.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from tests.support.ports import free_port_range

REPOSITORY = Path(__file__).resolve().parents[2]
ERASE = "\r\x1b[K"


def demo(tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "eddyline_runtime.cli",
        "demo",
        "wordcount",
        "--lines",
        "2000",
        "--replicas",
        "1",
        "--state-dir",
        str(tmp_path / "demo"),
        "--base-port",
        str(free_port_range(1)),
        *extra,
    ]


def run_on_a_terminal(command: list[str], errors_file: Path) -> str:
    leader, follower = pty.openpty()
    # stderr to a file, not a pipe: nothing reads a pipe while the pty is drained.
    with (
        errors_file.open("wb") as errors,
        subprocess.Popen(command, cwd=REPOSITORY, stdout=follower, stderr=errors) as process,
    ):
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the demo and its replica closed the pty
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        returncode = process.wait(timeout=120)
    assert returncode == 0, errors_file.read_text(errors="replace")
    return b"".join(chunks).decode().replace("\r\n", "\n")  # the pty's line discipline


def test_on_a_terminal_the_demo_draws_progress_and_clears_it(tmp_path: Path) -> None:
    shown = run_on_a_terminal(demo(tmp_path), tmp_path / "stderr")
    # Drawn at the first look, with the total: the replica takes a second to start, so
    # the work is never all done before it.
    assert re.search(r"\r\x1b\[Kprocessing: [\d,]+ of [\d,]+ records \(\d+%\)", shown), shown
    # The result line replaces the progress line on its row, erased first.
    assert f"{ERASE}processed and committed " in shown
    assert "every count equal to the input's" in shown


def test_in_a_pipe_the_demo_prints_no_progress(tmp_path: Path) -> None:
    result = subprocess.run(
        demo(tmp_path),
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stdout
    assert "processing:" not in result.stdout
    assert "processed and committed " in result.stdout  # the result line stays


def test_no_progress_silences_the_line_on_a_terminal(tmp_path: Path) -> None:
    shown = run_on_a_terminal(demo(tmp_path, "--no-progress"), tmp_path / "stderr")
    assert "\r" not in shown
    assert "processed and committed " in shown
