"""Damage to the embedded log that costs counts, as a user meets it: `eddyline run` and
`eddyline state ...` as real processes on a real SQLite log and real RocksDB stores.

The rule under test (docs/state.md, "Changelog loss waits for your decision"): a count
already published is never followed by a lower one for the same word unless the user said
so. A store whose changelog lost records it applied stops its task with exit code 1 and a
message naming the store, the task, where the copy is kept and the two ways out; the
copy waits in the quarantine until ``eddyline state republish`` (nothing is lost) or
``eddyline state accept-loss`` (the changelog's state wins) decides.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.restore.replay import restore
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import InMemoryStore, RocksDBStore, store_directory
from eddyline_runtime.state.state_directory import quarantine_directory, read_quarantine_note

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wordcount"
APP = "wordcount"
INPUT, OUTPUT, STORE = "text-lines", "word-counts", "word-counts"
CHANGELOG = f"{APP}-{STORE}-changelog"
PARTITIONS = 2
COUNTING = TaskId(1, 0)  # the counting sub-topology's task of partition 0
LONGS = serde_for("long")
ENVIRONMENT = {name: value for name, value in os.environ.items() if not name.startswith("EDDYLINE")}


def eddyline(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eddyline_runtime.cli", *args],
        cwd=cwd,
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write_manifest(directory: Path, state_dir: Path) -> Path:
    shutil.copy(EXAMPLE / "wordcount.py", directory / "wordcount.py")
    document = yaml.safe_load((EXAMPLE / "streamapp.yaml").read_text(encoding="utf-8"))
    document["spec"]["log"]["url"] = f"sqlite:///{directory / 'log.db'}"
    document["spec"]["config"]["state.dir"] = str(state_dir)
    manifest = directory / f"streamapp-{state_dir.name}.yaml"
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    return manifest


def run_app(manifest: Path) -> subprocess.CompletedProcess[str]:
    return eddyline("run", str(manifest), "--until-caught-up", cwd=manifest.parent)


def produce(log_path: Path, lines: list[str]) -> None:
    log = SqliteLog(log_path)
    try:
        if INPUT not in log.topics():
            log.create_topic(INPUT, PARTITIONS)
        for partition in range(PARTITIONS):
            mine = lines[partition::PARTITIONS]
            log.produce(
                TopicPartition(INPUT, partition),
                [Record(None, line.encode(), i) for i, line in enumerate(mine)],
            )
    finally:
        log.close()


def published(log_path: Path) -> dict[str, list[int]]:
    """Every count the app published, per word, in the order it published them."""
    log = SqliteLog(log_path, read_only=True)
    try:
        found: dict[str, list[int]] = {}
        for partition in range(log.topics()[OUTPUT].partitions):
            for record in log.fetch(TopicPartition(OUTPUT, partition), 0, 10**9).records:
                assert record.key is not None and record.value is not None
                found.setdefault(record.key.decode(), []).append(LONGS.deserialize(record.value))
        return found
    finally:
        log.close()


def backwards(counts: dict[str, list[int]]) -> dict[str, list[int]]:
    """The words whose published counts went down at some point."""
    return {
        word: seq
        for word, seq in counts.items()
        if any(later < earlier for earlier, later in itertools.pairwise(seq))
    }


def store_counts(state_dir: Path, task: TaskId = COUNTING) -> dict[str, int]:
    with RocksDBStore(STORE, store_directory(state_dir, task, STORE)) as store:
        return {k.decode(): LONGS.deserialize(v) for k, v in store.all()}


def changelog_counts(log_path: Path, partition: int = 0) -> dict[str, int]:
    log = SqliteLog(log_path, read_only=True)
    try:
        rebuilt = InMemoryStore(STORE)
        restore(rebuilt, log, TopicPartition(CHANGELOG, partition))
        return {k.decode(): LONGS.deserialize(v) for k, v in rebuilt.all()}
    finally:
        log.close()


def true_counts(lines: list[str], state_dir: Path) -> dict[str, int]:
    """What the counting task of partition 0 must hold: every word it owns, counted once."""
    every = Counter(word for line in lines for word in line.split())
    return {word: every[word] for word in store_counts(state_dir)}


def committed_offset(state_dir: Path) -> int:
    with RocksDBStore(STORE, store_directory(state_dir, COUNTING, STORE)) as store:
        offset = store.committed_offset(TopicPartition(CHANGELOG, 0))
    assert offset is not None
    return offset


def held_entries(state_dir: Path) -> list[Path]:
    folder = quarantine_directory(state_dir)
    if not folder.is_dir():
        return []
    return sorted(
        entry
        for entry in folder.iterdir()
        if (read_quarantine_note(entry) or {}).get("decision") == "pending"
    )


LINES = [f"w{i % 23} w{i % 7} common" for i in range(600)]
MORE = [f"w{i % 23} later" for i in range(200)]


@pytest.fixture
def counted(tmp_path: Path) -> tuple[Path, Path]:
    """The word count run once over LINES; returns (manifest, state.dir)."""
    state_dir = tmp_path / "state"
    manifest = write_manifest(tmp_path, state_dir)
    produce(tmp_path / "log.db", LINES)
    first = run_app(manifest)
    assert first.returncode == 0, first.stderr
    return manifest, state_dir


def truncate_changelog(log_path: Path, to_offset: int) -> None:
    """What an unclean leader election, or a person with a tool, does to the changelog."""
    log = SqliteLog(log_path)
    try:
        log.truncate(TopicPartition(CHANGELOG, 0), to_offset)
    finally:
        log.close()


def stopped_by_the_loss(state_dir: Path, manifest: Path) -> Path:
    """Truncate the changelog below the store, add input, run: the task must stop, loudly,
    publishing nothing lower; returns the copy kept for the user's decision."""
    log_path = manifest.parent / "log.db"
    before = store_counts(state_dir)
    truncate_changelog(log_path, committed_offset(state_dir) - 10)
    produce(log_path, MORE)
    stopped = run_app(manifest)
    assert stopped.returncode == 1, (stopped.stdout, stopped.stderr)
    assert backwards(published(log_path)) == {}
    [entry] = held_entries(state_dir)
    message = stopped.stderr
    for part in (f'"{STORE}"', f"task {COUNTING}", str(entry), "eddyline state republish"):
        assert part in message, (part, message)
    assert "eddyline state accept-loss" in message
    with RocksDBStore(STORE, entry) as kept:  # the copy, whole
        assert {k.decode(): LONGS.deserialize(v) for k, v in kept.all()} == before
    # Starting again without a decision changes nothing: still stopped, nothing rebuilt.
    again = run_app(manifest)
    assert again.returncode == 1 and str(entry) in again.stderr
    assert held_entries(state_dir) == [entry]
    listed = eddyline("state", "quarantined", str(state_dir), cwd=manifest.parent)
    assert str(entry) in listed.stdout and "waiting for your decision" in listed.stdout
    return entry


def test_a_truncated_changelog_stops_the_task_until_republish_and_then_nothing_is_lost(
    counted: tuple[Path, Path],
) -> None:
    manifest, state_dir = counted
    log_path = manifest.parent / "log.db"
    entry = stopped_by_the_loss(state_dir, manifest)
    # Another pod with an empty state directory (the task moves when the first one
    # stops) holds no copy to judge: the log's hold stops it too, naming where to decide.
    other_state = manifest.parent / "other-pod"
    other = write_manifest(manifest.parent, other_state)
    elsewhere = run_app(other)
    assert elsewhere.returncode == 1, (elsewhere.stdout, elsewhere.stderr)
    assert f"in state directory {state_dir}" in elsewhere.stderr
    assert "eddyline state republish" in elsewhere.stderr
    assert backwards(published(log_path)) == {}

    republished = eddyline(
        "state", "republish", str(entry), "--log", f"sqlite:///{log_path}", cwd=manifest.parent
    )
    assert republished.returncode == 0, republished.stderr
    assert held_entries(state_dir) == []
    # The other pod takes the task: rebuilt from the changelog, with the copy written back.
    resumed = run_app(other)
    assert resumed.returncode == 0, resumed.stderr
    assert store_counts(other_state) == true_counts([*LINES, *MORE], other_state)
    assert backwards(published(log_path)) == {}
    produce(log_path, MORE)  # and back on the first pod, which rebuilds the same way
    again = run_app(manifest)
    assert again.returncode == 0, again.stderr
    assert store_counts(state_dir) == true_counts([*LINES, *MORE, *MORE], state_dir)
    assert backwards(published(log_path)) == {}


def test_a_truncated_changelog_stops_the_task_until_the_loss_is_accepted(
    counted: tuple[Path, Path],
) -> None:
    manifest, state_dir = counted
    log_path = manifest.parent / "log.db"
    entry = stopped_by_the_loss(state_dir, manifest)

    accepted = eddyline(
        "state", "accept-loss", str(entry), "--log", f"sqlite:///{log_path}", cwd=manifest.parent
    )
    assert accepted.returncode == 0, accepted.stderr
    assert "accepted" in accepted.stdout and str(entry) in accepted.stdout
    assert held_entries(state_dir) == []
    assert entry.is_dir()  # the copy stays, for as long as the quarantine keeps copies
    resumed = run_app(manifest)
    assert resumed.returncode == 0, resumed.stderr
    # The changelog's state won: the store is what it says, the lost counts are gone.
    assert store_counts(state_dir) == changelog_counts(log_path)
    assert store_counts(state_dir) != true_counts([*LINES, *MORE], state_dir)


def test_accept_loss_refuses_what_is_not_waiting_for_a_decision(tmp_path: Path) -> None:
    missing = eddyline(
        "state", "accept-loss", str(tmp_path / "nothing"), "--log", "sqlite:///x.db", cwd=tmp_path
    )
    assert missing.returncode == 1
    assert "eddyline state quarantined" in missing.stderr


def test_a_restored_log_backup_with_no_copy_ahead_is_caught(tmp_path: Path) -> None:
    """log.db put back from a backup; the first pod starts on an empty state directory, so
    no copy is ahead when the log regrows; the other pod's copies saw the lost history and
    must not be adopted (they were: counts published 29 -> 42 -> 28)."""
    log_path, backup = tmp_path / "log.db", tmp_path / "backup.db"
    pod1_state = tmp_path / "pod1"
    pod1 = write_manifest(tmp_path, pod1_state)
    produce(log_path, LINES)
    assert run_app(pod1).returncode == 0
    with sqlite3.connect(log_path) as live, sqlite3.connect(backup) as copy:
        live.backup(copy)  # the backup
    produce(log_path, MORE)  # history the backup never saw, applied by pod 1's copies
    assert run_app(pod1).returncode == 0
    seen = committed_offset(pod1_state)
    with sqlite3.connect(backup) as copy, sqlite3.connect(log_path) as live:
        copy.backup(live)  # the log goes back in time

    # Pod 0 starts first, on an empty state directory: nothing is ahead of the log.
    pod0_state = tmp_path / "pod0"
    pod0 = write_manifest(tmp_path, pod0_state)
    # Many new words: each count is a changelog record, so the changelog regrows past ``seen``.
    produce(log_path, [f"w{i % 23} r{i}" for i in range(900)])
    first = run_app(pod0)
    assert first.returncode == 0, first.stderr
    log = SqliteLog(log_path, read_only=True)
    try:
        assert log.end_offset(TopicPartition(CHANGELOG, 0)) > seen + 1  # no copy is ahead
    finally:
        log.close()
    shutil.rmtree(pod0_state)  # the task moves to pod 1, which comes back

    # Pod 1 comes back: each of its copies saw history the log lost, and each stops its
    # task in turn (the first one found stops the instance) until the loss is accepted.
    decided: list[Path] = []
    for _ in range(PARTITIONS + 1):
        stopped = run_app(pod1)
        if stopped.returncode == 0:
            break
        assert backwards(published(log_path)) == {}
        [entry] = held_entries(pod1_state)
        assert str(entry) in stopped.stderr and "eddyline state accept-loss" in stopped.stderr
        accepted = eddyline(
            "state", "accept-loss", str(entry), "--log", f"sqlite:///{log_path}", cwd=tmp_path
        )
        assert accepted.returncode == 0, accepted.stderr
        decided.append(entry)
    assert stopped.returncode == 0, stopped.stderr
    assert len(decided) == PARTITIONS  # every copy of the lost history was caught
    for partition in range(PARTITIONS):  # rebuilt, not adopted
        task = TaskId(COUNTING.subtopology, partition)
        assert store_counts(pod1_state, task) == changelog_counts(log_path, partition)


def changelog_epoch_and_progress(log_path: Path) -> tuple[str | None, int]:
    """The changelog's epoch (partition 0) and the input offsets committed, read-only."""
    log = SqliteLog(log_path, read_only=True)
    try:
        changelog = TopicPartition(CHANGELOG, 0)
        epoch = log.partition_epoch(changelog) if CHANGELOG in log.topics() else None
        inputs = [TopicPartition(INPUT, p) for p in range(PARTITIONS)]
        return epoch, sum(log.committed_offsets(APP, inputs).values())
    finally:
        log.close()


def kill_when(manifest: Path, ready: Callable[[], bool]) -> None:
    """Start `eddyline run` and SIGKILL it as soon as ``ready()`` (polled) holds."""
    process = subprocess.Popen(
        [sys.executable, "-m", "eddyline_runtime.cli", "run", str(manifest)],
        cwd=manifest.parent,
        env=ENVIRONMENT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready():
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "the run never got there"
            time.sleep(0.02)
    finally:
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate(timeout=30)
    assert "error:" not in stderr, stderr


def test_kills_between_a_new_epoch_and_commits_never_stop_a_task_or_lose_a_count(
    tmp_path: Path,
) -> None:
    """SIGKILL right after a task started its changelog epoch (before its store committed
    it), then right after input commits: every restart resumes, nothing held or lost."""
    state_dir = tmp_path / "state"
    manifest = write_manifest(tmp_path, state_dir)
    log_path = tmp_path / "log.db"
    lines: list[str] = []
    for _ in range(3):  # the first kill may come before the changelog's first epoch
        # New input each round: on a quiet machine a run consumes a round's input in well
        # under a second, and the kill after input commits needs input left to commit.
        batch = [
            f"w{i % 31} w{i % 11} w{i % 5} n{i % 997}"
            for i in range(len(lines), len(lines) + 20_000)
        ]
        produce(log_path, batch)
        lines += batch
        epoch, progress = changelog_epoch_and_progress(log_path)
        # Killed between stamping and committing: the new epoch is in the log, the store
        # has not committed it (it commits only with its first processed records).
        kill_when(manifest, lambda e=epoch: changelog_epoch_and_progress(log_path)[0] != e)
        # Killed after input commits (log transaction, then store commit).
        kill_when(manifest, lambda p=progress: changelog_epoch_and_progress(log_path)[1] > p)
    final = run_app(manifest)
    assert final.returncode == 0, final.stderr
    assert held_entries(state_dir) == []
    assert not quarantine_directory(state_dir).exists()
    assert store_counts(state_dir) == true_counts(lines, state_dir)
    assert backwards(published(log_path)) == {}
