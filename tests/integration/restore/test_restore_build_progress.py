"""``eddyline restore build`` as a user runs it in a terminal: a live progress line.

A real process with its stdout on a pseudo-terminal, a small embedded-log changelog
and Spark in ``local[2]`` (about 20 s, most of it the JVM starting). What the line
says phase by phase is tested without Spark (tests/unit/test_progress.py and
tests/unit/restore/test_build_progress.py); this test proves the wiring: the command
draws the line on a terminal and clears it before its summary.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eddyline_runtime.log import SqliteLog
from eddyline_runtime.partitions import changelog_topic
from eddyline_runtime.spec import load_manifest
from tests.integration.restore.restore_changelogs import produce_changelog

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "wordcount"
STORE = "word-counts"
PARTITIONS, PER_PARTITION = 2, 3_000
# EDDYLINE_<NAME> variables override manifests: the run here sees none.
ENVIRONMENT = {name: value for name, value in os.environ.items() if not name.startswith("EDDYLINE")}


def test_restore_build_draws_progress_on_a_terminal_and_clears_it(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE / "wordcount.py", tmp_path / "wordcount.py")
    document = yaml.safe_load((EXAMPLE / "streamapp.yaml").read_text(encoding="utf-8"))
    document["spec"]["log"]["url"] = f"sqlite:///{tmp_path / 'log.db'}"
    document["spec"]["config"]["state.dir"] = str(tmp_path / "state")
    manifest = tmp_path / "streamapp.yaml"
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    application = load_manifest(manifest).streams_config().application_id
    log = SqliteLog(tmp_path / "log.db")
    try:
        produce_changelog(
            log, changelog_topic(application, STORE), PARTITIONS, PER_PARTITION, keys=200
        )
    finally:
        log.close()

    leader, follower = pty.openpty()
    command = [sys.executable, "-m", "eddyline_runtime.cli", "restore", "build"]
    command += ["--manifest", str(manifest), "--store", STORE, "--output", str(tmp_path / "out")]
    command += ["--master", "local[2]", "--split-records", "1000"]
    # stderr to a file, not a pipe: nothing reads a pipe while the pty is drained, and a
    # full one would stop the build.
    with (
        (tmp_path / "stderr").open("wb") as errors,
        subprocess.Popen(
            command, stdout=follower, stderr=errors, env=ENVIRONMENT, cwd=tmp_path
        ) as process,
    ):
        os.close(follower)
        shown = _read_until_closed(leader)
        returncode = process.wait(timeout=120)
    stderr = (tmp_path / "stderr").read_text(errors="replace")
    assert returncode == 0, stderr
    text = shown.decode().replace("\r\n", "\n")  # the pty turns \n into \r\n
    offsets = PARTITIONS * PER_PARTITION
    # The first draw: the build's offsets as the total, before Spark has run a task.
    assert f"\r\x1b[Kstarting: 0 of {offsets:,} offsets (0%)" in text
    # Cleared before the summary: the summary lines start on a clean row.
    drawn, _, summary = text.rpartition("\r\x1b[K")
    assert drawn
    assert summary.startswith("partition 0: ")
    assert json.loads(summary.strip().splitlines()[-1])["partitions"] == PARTITIONS
    # Spark's own console bar ([Stage 1:====>  (2 + 2) / 6]) stays off: one renderer.
    assert "[Stage " not in text + stderr


def _read_until_closed(leader: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: every writer of the pty is gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return b"".join(chunks)
