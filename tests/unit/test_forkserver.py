"""tests/support/forkserver.py: each start is a process of its own, with the exit a
fresh ``python script.py`` would have (crash tests SIGKILL these and check the code)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.forkserver import ForkServer, ForkServerError
from tests.support.waiting import wait_for

SCRIPT = """
import os
import sys
import time

LOADED_IN = os.getpid()  # the server's pid: the script is imported once, there


def main() -> None:
    mode = sys.argv[1]
    print(f"{mode} {os.getpid()} {LOADED_IN}", file=sys.stderr, flush=True)
    if mode == "sleep":
        time.sleep(60)
    if mode == "fail":
        raise RuntimeError("boom")
    if mode == "exit3":
        sys.exit(3)


if __name__ == "__main__":
    raise AssertionError("the server imports the script; it never runs it as __main__")
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    with ForkServer(script, stderr=tmp_path / "server.stderr") as server:
        yield server


def test_children_exit_as_the_script_would(server: ForkServer, tmp_path: Path) -> None:
    errors = tmp_path / "child.stderr"
    assert server.start(["ok"], stderr=errors).wait(timeout=30) == 0
    assert server.start(["exit3"], stderr=errors).wait(timeout=30) == 3
    assert server.start(["fail"], stderr=errors).wait(timeout=30) == 1
    text = errors.read_text()
    assert "RuntimeError: boom" in text
    pids = {line.split()[1] for line in text.splitlines() if line.startswith(("ok", "exit3"))}
    loaded_in = {line.split()[2] for line in text.splitlines() if line.startswith("ok")}
    assert len(pids) == 2 and not pids & loaded_in, text  # a process each, not the server


def test_a_child_is_a_real_process_a_sigkill_ends(server: ForkServer, tmp_path: Path) -> None:
    errors = tmp_path / "child.stderr"
    child = server.start(["sleep"], stderr=errors)
    wait_for(
        lambda: errors.exists() and "sleep" in errors.read_text(), "the child to start", timeout=30
    )
    assert child.poll() is None
    os.kill(child.pid, 0)  # a process the test can signal directly
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    child.kill()  # reaped: a no-op, never a signal to a reused pid


def test_a_wait_can_time_out(server: ForkServer, tmp_path: Path) -> None:
    child = server.start(["sleep"], stderr=tmp_path / "child.stderr")
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    child.kill()
    assert child.wait(timeout=30) == -signal.SIGKILL


def test_a_script_that_does_not_import_is_reported(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("raise ImportError('no such thing')\n")
    with (
        ForkServer(script, stderr=tmp_path / "server.stderr") as server,
        pytest.raises(ForkServerError, match="no such thing"),
    ):
        server.start([], stderr=tmp_path / "child.stderr")
