"""Stores a rebuild set aside: where they go, and how long the state directory keeps them."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from eddyline_runtime.partitions import TaskId
from eddyline_runtime.state import RocksDBStore
from eddyline_runtime.state.state_directory import (
    DECISION_LOSS_ACCEPTED,
    DECISION_PENDING,
    QUARANTINE_NOTE_NAME,
    STAGING_PREFIX,
    prune_quarantine,
    quarantine_directory,
    quarantine_entry,
    read_quarantine_note,
    record_decision,
    store_directory,
    waiting_for_decision,
    write_quarantine_note,
)


def set_aside(state_dir: Path, name: str, at: float) -> Path:
    entry = quarantine_directory(state_dir) / name
    entry.mkdir(parents=True)
    (entry / QUARANTINE_NOTE_NAME).write_text(json.dumps({"set_aside_at": at}))
    return entry


def test_entries_go_to_the_state_directorys_quarantine_with_unique_names(tmp_path: Path) -> None:
    store_dir = store_directory(tmp_path, TaskId(1, 3), "counts")
    first = quarantine_entry(store_dir, "counts", "GAP")
    assert first.parent == tmp_path / ".quarantine"
    assert first.name.startswith("1_3-counts-") and first.name.endswith("-gap")
    first.mkdir(parents=True)
    write_quarantine_note(first, {"store": "counts"})
    second = quarantine_entry(store_dir, "counts", "GAP")
    assert second != first and second.name == f"{first.name}-2"


def test_prune_keeps_the_newest_within_count_and_age_and_never_relocations_entries(
    tmp_path: Path,
) -> None:
    now = time.time()
    old = set_aside(tmp_path, "old", now - 10 * 86_400)
    newer = [set_aside(tmp_path, f"n{i}", now - i) for i in range(4)]
    relocated = quarantine_directory(tmp_path) / "0_1-counts-relocation-conflict"
    relocated.mkdir()  # relocation's conflicts carry no note: an operator's to judge
    gone = prune_quarantine(tmp_path, max_stores=2, retention_seconds=7 * 86_400)
    assert sorted(gone) == sorted([old, newer[2], newer[3]])
    assert sorted(quarantine_directory(tmp_path).iterdir()) == sorted(
        [newer[0], newer[1], relocated]
    )
    assert prune_quarantine(tmp_path / "missing", max_stores=0, retention_seconds=0) == []


def test_prune_never_deletes_a_copy_waiting_for_the_users_decision(tmp_path: Path) -> None:
    """Until the user republishes it or accepts the loss, it is the only record of the state
    the changelog lost: neither count nor age prunes it; once decided, both do."""
    waiting = quarantine_directory(tmp_path) / "1_0-counts-old-replaced"
    waiting.mkdir(parents=True)
    write_quarantine_note(waiting, {"store": "counts", "decision": DECISION_PENDING})
    note = json.loads((waiting / QUARANTINE_NOTE_NAME).read_text())
    (waiting / QUARANTINE_NOTE_NAME).write_text(
        json.dumps({**note, "set_aside_at": time.time() - 30 * 86_400})
    )
    assert prune_quarantine(tmp_path, max_stores=0, retention_seconds=0) == []
    record_decision(waiting, DECISION_LOSS_ACCEPTED)
    assert prune_quarantine(tmp_path, max_stores=0, retention_seconds=0) == [waiting]


def test_set_aside_writes_the_note_before_the_copy_moves(tmp_path: Path) -> None:
    """A crash between the two leaves the store in place with its note (judged again at the
    next start), never a copy in the quarantine without one (that would be pruned or
    ignored, and the decision it waits for forgotten)."""
    directory = store_directory(tmp_path, TaskId(1, 0), "counts")
    with RocksDBStore("counts", directory) as store:
        store.put(b"k", b"v")
        store.commit({})
    store = RocksDBStore("counts", directory)
    entry = store.set_aside("replaced", {"store": "counts", "decision": DECISION_PENDING})
    assert entry is not None and not directory.exists()
    assert waiting_for_decision(read_quarantine_note(entry))
    with RocksDBStore("counts", entry) as kept:
        assert kept.get(b"k") == b"v"


def test_opening_a_store_clears_what_an_interrupted_ingest_left_but_not_a_live_one(
    tmp_path: Path,
) -> None:
    target = store_directory(tmp_path, TaskId(0, 0), "counts")
    target.parent.mkdir(parents=True)
    dead = target.parent / f"{STAGING_PREFIX}counts-999999999-abcd"  # no such process
    (dead / "sub").mkdir(parents=True)
    dead.with_name(dead.name + ".files").mkdir()
    other_store = target.parent / f"{STAGING_PREFIX}other-999999999-abcd"
    other_store.mkdir()
    with subprocess.Popen(["sleep", "30"]) as builder:  # another process's build, running
        live = target.parent / f"{STAGING_PREFIX}counts-{builder.pid}-beef"
        live.mkdir()
        try:
            RocksDBStore("counts", target).close()
        finally:
            builder.kill()
    assert sorted(p.name for p in target.parent.iterdir()) == sorted(
        ["counts", live.name, other_store.name]
    )
