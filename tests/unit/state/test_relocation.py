"""KIP-816: stores follow their sub-topology when the topology renumbers it.

Real RocksDB stores on tmp_path, committed with changelog offsets, closed,
relocated, and reopened where the new topology puts them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from eddyline_runtime.engine.topics import store_homes
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing import StoreSpec, Topology
from eddyline_runtime.processing.topology import Processor
from eddyline_runtime.state import KeyRange, RocksDBStore
from eddyline_runtime.state.offset_checkpoint import CHECKPOINT_FILE_NAME, read_offsets
from eddyline_runtime.state.relocation import (
    MisplacedStateError,
    RelocationReport,
    StateInUseError,
    StoreLeftAlone,
    StoreMove,
)
from eddyline_runtime.state.relocation import relocate_state as relocate_homes
from eddyline_runtime.state.state_directory import QUARANTINE_DIR_NAME
from tests.support.word_count import word_count

PARTITIONS = 4


def relocate_state(
    state_dir: Path, topology: Topology, *, automatic: bool = True
) -> RelocationReport:
    """Relocate for ``topology``, as an instance does at start."""
    return relocate_homes(state_dir, store_homes(topology), automatic=automatic)


def changelog(store: str, partition: int) -> TopicPartition:
    return TopicPartition(f"app-{store}-changelog", partition)


def word_count_after_a_new_first_sub_topology() -> Topology:
    """The same word count behind a new stateless sub-topology: "counts" is in 2 now."""
    return word_count(new_first_sub_topology=True)


class Remember(Processor):
    def process(self, key: object, value: object) -> None:
        pass


def two_stores(
    *, first: str | None = None, persistent: bool = True, logged: bool = True
) -> Topology:
    """Store "a" in one sub-topology and "b" in the next, behind ``first`` if given."""
    topology = Topology()
    if first is not None:
        topology.add_source(first, [first])
        topology.add_sink(f"{first}-out", f"{first}-out", first)
    for store in ("a", "b"):
        topology.add_source(f"{store}-in", [f"{store}-topic"])
        topology.add_processor(f"{store}-proc", Remember, f"{store}-in")
        spec = StoreSpec(store, persistent=persistent, logged=logged)
        topology.add_state_store(spec, f"{store}-proc")
    return topology


def write_store(directory: Path, name: str, partition: int, records: int = 3) -> None:
    """A closed store holding ``records`` entries, committed at changelog offset 40 + records."""
    store = RocksDBStore(name, directory)
    try:
        for i in range(records):
            store.put(f"{name}-{partition}-{i}".encode(), str(i).encode())
        store.commit({changelog(name, partition): 40 + records})
    finally:
        store.close()


def assert_store_intact(directory: Path, name: str, partition: int, records: int = 3) -> None:
    """Everything write_store committed is there: the data and its changelog offset."""
    assert (directory / CHECKPOINT_FILE_NAME).exists()
    assert read_offsets(directory / CHECKPOINT_FILE_NAME) == {
        changelog(name, partition): 40 + records
    }
    store = RocksDBStore(name, directory)
    try:
        assert dict(store.scan(KeyRange())) == {
            f"{name}-{partition}-{i}".encode(): str(i).encode() for i in range(records)
        }
        assert store.committed_offset(changelog(name, partition)) == 40 + records
    finally:
        store.close()


def tree(state_dir: Path) -> set[str]:
    """Every store directory under state.dir, as "<task>/<store>" (quarantine included)."""
    return {
        f"{task.name}/{store.name}"
        for task in state_dir.iterdir()
        if task.is_dir()
        for store in task.iterdir()
        if store.is_dir()
    }


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def old_word_count_state(state_dir: Path) -> Path:
    """What word_count() left: "counts" under 1_0 .. 1_3."""
    assert [sub.stores for sub in word_count().subtopologies()] == [(), ("counts",)]
    for partition in range(PARTITIONS):
        write_store(state_dir / f"1_{partition}" / "counts", "counts", partition)
    return state_dir


def test_a_sub_topology_added_first_moves_every_store_to_its_new_ordinal(
    old_word_count_state: Path,
) -> None:
    state_dir = old_word_count_state
    topology = word_count_after_a_new_first_sub_topology()
    assert [sub.stores for sub in topology.subtopologies()] == [(), (), ("counts",)]

    report = relocate_state(state_dir, topology)

    assert report.moves == tuple(
        StoreMove("counts", state_dir / f"1_{p}" / "counts", state_dir / f"2_{p}" / "counts")
        for p in range(PARTITIONS)
    )
    assert (report.conflicts, report.left_alone, report.in_place) == ((), (), 0)
    # The old task directories held nothing else, so they are gone.
    assert sorted(p.name for p in state_dir.iterdir()) == [f"2_{p}" for p in range(PARTITIONS)]
    for partition in range(PARTITIONS):
        assert_store_intact(state_dir / f"2_{partition}" / "counts", "counts", partition)


def test_stores_shifting_in_a_chain_each_reach_their_own_task(state_dir: Path) -> None:
    # "a" moves 0_p -> 1_p while "b" moves out of 1_p to 2_p: in either order.
    for partition in range(PARTITIONS):
        write_store(state_dir / f"0_{partition}" / "a", "a", partition)
        write_store(state_dir / f"1_{partition}" / "b", "b", partition)

    report = relocate_state(state_dir, two_stores(first="new"))

    assert len(report.moves) == 2 * PARTITIONS and not report.conflicts
    assert tree(state_dir) == {f"1_{p}/a" for p in range(PARTITIONS)} | {
        f"2_{p}/b" for p in range(PARTITIONS)
    }
    for partition in range(PARTITIONS):
        assert_store_intact(state_dir / f"1_{partition}" / "a", "a", partition)
        assert_store_intact(state_dir / f"2_{partition}" / "b", "b", partition)


def test_a_removed_first_sub_topology_moves_every_store_down(state_dir: Path) -> None:
    # The reverse chain: "a" 1_p -> 0_p while "b" 2_p -> 1_p.
    for partition in range(PARTITIONS):
        write_store(state_dir / f"1_{partition}" / "a", "a", partition)
        write_store(state_dir / f"2_{partition}" / "b", "b", partition)

    report = relocate_state(state_dir, two_stores())

    assert len(report.moves) == 2 * PARTITIONS and not report.conflicts
    assert tree(state_dir) == {f"0_{p}/a" for p in range(PARTITIONS)} | {
        f"1_{p}/b" for p in range(PARTITIONS)
    }
    assert_store_intact(state_dir / "0_3" / "a", "a", 3)
    assert_store_intact(state_dir / "1_3" / "b", "b", 3)


def test_stores_swapping_ordinals_trade_places(state_dir: Path) -> None:
    write_store(state_dir / "0_0" / "a", "a", 0)
    write_store(state_dir / "1_0" / "b", "b", 0)
    swapped = Topology()
    for store in ("b", "a"):  # "b" is added first now
        swapped.add_source(f"{store}-in", [f"{store}-topic"])
        swapped.add_processor(f"{store}-proc", Remember, f"{store}-in")
        swapped.add_state_store(StoreSpec(store), f"{store}-proc")

    relocate_state(state_dir, swapped)

    assert tree(state_dir) == {"0_0/b", "1_0/a"}
    assert_store_intact(state_dir / "1_0" / "a", "a", 0)
    assert_store_intact(state_dir / "0_0" / "b", "b", 0)


def test_a_second_run_finds_everything_in_place_and_moves_nothing(
    old_word_count_state: Path,
) -> None:
    topology = word_count_after_a_new_first_sub_topology()
    relocate_state(old_word_count_state, topology)
    before = tree(old_word_count_state)

    again = relocate_state(old_word_count_state, topology)

    assert again == RelocationReport(in_place=PARTITIONS)
    assert tree(old_word_count_state) == before


def test_a_run_killed_between_two_renames_loses_no_store_and_the_next_run_finishes(
    old_word_count_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state_dir = old_word_count_state
    real_rename = os.rename
    renames: list[object] = []

    def rename_then_die(source: str, target: str) -> None:
        if len(renames) == 2:
            raise KeyboardInterrupt("killed")  # what a kill between two renames leaves
        real_rename(source, target)
        renames.append(target)

    monkeypatch.setattr(os, "rename", rename_then_die)
    with pytest.raises(KeyboardInterrupt):
        relocate_state(state_dir, word_count_after_a_new_first_sub_topology())
    monkeypatch.setattr(os, "rename", real_rename)

    # Each store is whole at exactly one of its two places.
    for partition in range(PARTITIONS):
        places = {f"1_{partition}/counts", f"2_{partition}/counts"} & tree(state_dir)
        assert len(places) == 1
    assert tree(state_dir) >= {"2_0/counts", "2_1/counts", "1_2/counts", "1_3/counts"}

    report = relocate_state(state_dir, word_count_after_a_new_first_sub_topology())

    assert [m.source.parent.name for m in report.moves] == ["1_2", "1_3"]
    assert report.in_place == 2
    for partition in range(PARTITIONS):
        assert_store_intact(state_dir / f"2_{partition}" / "counts", "counts", partition)


def test_a_store_of_the_same_name_at_the_target_is_never_overwritten(
    old_word_count_state: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state_dir = old_word_count_state
    # A store already at the new place, e.g. restored there by a start without relocation.
    write_store(state_dir / "2_1" / "counts", "counts", 1, records=7)

    with caplog.at_level(logging.WARNING, logger="eddyline_runtime.state.relocation"):
        report = relocate_state(state_dir, word_count_after_a_new_first_sub_topology())

    [conflict] = report.conflicts
    assert conflict.store == "counts"
    assert conflict.source == state_dir / "1_1" / "counts"
    assert conflict.existing == state_dir / "2_1" / "counts"
    assert conflict.quarantined.parent == state_dir / QUARANTINE_DIR_NAME
    assert conflict.quarantined.name.startswith("1_1-counts-")
    # The existing store is untouched, the misplaced one whole in quarantine.
    assert_store_intact(state_dir / "2_1" / "counts", "counts", 1, records=7)
    assert_store_intact(conflict.quarantined, "counts", 1)
    assert [m.target.parent.name for m in report.moves] == ["2_0", "2_2", "2_3"]
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert str(conflict.source) in warning.getMessage()
    assert str(conflict.existing) in warning.getMessage()
    assert str(conflict.quarantined) in warning.getMessage()

    # Quarantine is outside every task directory: a later run does not see it.
    assert relocate_state(state_dir, word_count_after_a_new_first_sub_topology()) == (
        RelocationReport(in_place=PARTITIONS)
    )


def test_two_misplaced_copies_of_one_store_keep_one_and_quarantine_the_other(
    state_dir: Path,
) -> None:
    write_store(state_dir / "0_0" / "b", "b", 0, records=1)
    write_store(state_dir / "1_0" / "b", "b", 0, records=2)

    report = relocate_state(state_dir, two_stores(first="new"))

    [moved], [conflict] = report.moves, report.conflicts
    assert {moved.source, conflict.source} == {state_dir / "0_0" / "b", state_dir / "1_0" / "b"}
    assert moved.target == conflict.existing == state_dir / "2_0" / "b"
    kept, quarantined = (1, 2) if moved.source.parent.name == "0_0" else (2, 1)
    assert_store_intact(state_dir / "2_0" / "b", "b", 0, records=kept)
    assert_store_intact(conflict.quarantined, "b", 0, records=quarantined)


def test_a_task_directory_split_between_stores_that_move_and_stay_moves_only_the_misplaced(
    old_word_count_state: Path,
) -> None:
    state_dir = old_word_count_state
    write_store(state_dir / "1_0" / "retired", "retired", 0)

    report = relocate_state(state_dir, word_count_after_a_new_first_sub_topology())

    assert len(report.moves) == PARTITIONS
    assert [s.path for s in report.left_alone] == [state_dir / "1_0" / "retired"]
    assert tree(state_dir) == {"1_0/retired"} | {f"2_{p}/counts" for p in range(PARTITIONS)}
    assert_store_intact(state_dir / "2_0" / "counts", "counts", 0)
    assert_store_intact(state_dir / "1_0" / "retired", "retired", 0)


def test_an_empty_directory_at_the_target_holds_no_state_and_is_replaced(
    old_word_count_state: Path,
) -> None:
    (old_word_count_state / "2_0" / "counts").mkdir(parents=True)  # an empty store directory
    (old_word_count_state / "2_1").mkdir()  # an empty task directory

    report = relocate_state(old_word_count_state, word_count_after_a_new_first_sub_topology())

    assert len(report.moves) == PARTITIONS and not report.conflicts
    assert_store_intact(old_word_count_state / "2_0" / "counts", "counts", 0)
    assert_store_intact(old_word_count_state / "2_1" / "counts", "counts", 1)


def test_a_store_directory_without_a_lock_file_moves_too(state_dir: Path) -> None:
    # A store eddyline never opened (copied in by hand, or older than the lock file).
    (state_dir / "1_0" / "counts").mkdir(parents=True)
    (state_dir / "1_0" / "counts" / "CURRENT").write_text("MANIFEST-000001\n")

    report = relocate_state(state_dir, word_count_after_a_new_first_sub_topology())

    assert [str(m) for m in report.moves] == [
        f"{state_dir / '1_0' / 'counts'} -> {state_dir / '2_0' / 'counts'}"
    ]
    assert (state_dir / "2_0" / "counts" / "CURRENT").read_text() == "MANIFEST-000001\n"


def test_with_relocation_off_start_is_refused_naming_every_misplaced_store_and_the_fix(
    old_word_count_state: Path,
) -> None:
    state_dir = old_word_count_state
    before = tree(state_dir)
    write_store(state_dir / "2_3" / "counts", "counts", 3)  # one of them would conflict

    with pytest.raises(MisplacedStateError) as raised:
        relocate_state(state_dir, word_count_after_a_new_first_sub_topology(), automatic=False)

    error = raised.value
    assert isinstance(error, EddylineError)
    assert [m.source.parent.name for m in error.misplaced] == [f"1_{p}" for p in range(PARTITIONS)]
    message = str(error)
    for partition in range(PARTITIONS):
        source, target = state_dir / f"1_{partition}" / "counts", state_dir / f"2_{partition}"
        assert f"{source} -> {target / 'counts'}" in message
    assert "already holds a store of that name" in message
    assert "set automatic.state.relocation: true (the default) to move them" in message
    assert "or move them yourself" in message
    assert tree(state_dir) == before | {"2_3/counts"}


def test_with_relocation_off_a_misplaced_unlogged_store_is_said_to_be_lost(
    state_dir: Path,
) -> None:
    """A store with logging disabled has no changelog to restore from: the refusal says
    that leaving it behind loses its state, where a logged one's says it restores."""
    write_store(state_dir / "0_0" / "a", "a", 0)

    with pytest.raises(MisplacedStateError) as raised:
        relocate_state(state_dir, two_stores(first="new", logged=False), automatic=False)
    assert 'store "a"' in str(raised.value)
    assert "logging disabled: it has no changelog" in str(raised.value)

    with pytest.raises(MisplacedStateError) as logged:
        relocate_state(state_dir, two_stores(first="new"), automatic=False)
    assert "logging disabled" not in str(logged.value)


def test_with_relocation_off_state_already_in_place_starts(old_word_count_state: Path) -> None:
    report = relocate_state(old_word_count_state, word_count(), automatic=False)

    assert report == RelocationReport(in_place=PARTITIONS)


@pytest.mark.parametrize(
    ("topology", "reason"),
    [
        (word_count_after_a_new_first_sub_topology, "the topology has no store of that name"),
        (
            lambda: two_stores(first="new", persistent=False),
            "the topology keeps this store in memory now",
        ),
    ],
    ids=["store-removed", "store-now-in-memory"],
)
def test_a_store_the_topology_has_no_place_for_is_left_alone_and_reported(
    state_dir: Path,
    caplog: pytest.LogCaptureFixture,
    topology: Callable[[], Topology],
    reason: str,
) -> None:
    write_store(state_dir / "0_0" / "a", "a", 0)
    write_store(state_dir / "0_1" / "a", "a", 1)

    with caplog.at_level(logging.WARNING, logger="eddyline_runtime.state.relocation"):
        report = relocate_state(state_dir, topology())

    assert report.moves == ()
    assert report.left_alone == (
        StoreLeftAlone("a", state_dir / "0_0" / "a", reason),
        StoreLeftAlone("a", state_dir / "0_1" / "a", reason),
    )
    assert_store_intact(state_dir / "0_0" / "a", "a", 0)
    # One warning for the store name, not one per task directory.
    [warning] = caplog.records
    assert 'state store "a" found in 2 task directories' in warning.getMessage()
    assert reason in warning.getMessage()


def test_a_misplaced_store_open_in_a_running_process_is_refused_naming_its_pid(
    old_word_count_state: Path,
) -> None:
    state_dir = old_word_count_state
    before = tree(state_dir)
    running = RocksDBStore("counts", state_dir / "1_2" / "counts")  # this process holds it
    try:
        with pytest.raises(StateInUseError) as raised:
            relocate_state(state_dir, word_count_after_a_new_first_sub_topology())
    finally:
        running.close()

    [locked] = raised.value.locked
    assert (locked.store, locked.path, locked.holder_pid) == (
        "counts",
        state_dir / "1_2" / "counts",
        os.getpid(),
    )
    assert f"is locked by pid {os.getpid()}" in str(raised.value)
    assert "Nothing was moved" in str(raised.value)
    assert tree(state_dir) == before
    # Once it is closed, the next start relocates everything.
    assert len(relocate_state(state_dir, word_count_after_a_new_first_sub_topology()).moves) == 4


def test_a_store_open_where_it_belongs_does_not_stop_relocation(
    old_word_count_state: Path,
) -> None:
    running = RocksDBStore("counts", old_word_count_state / "1_0" / "counts")
    try:
        report = relocate_state(old_word_count_state, word_count())
    finally:
        running.close()

    assert report == RelocationReport(in_place=PARTITIONS)


def test_entries_that_are_not_task_directories_are_ignored(
    old_word_count_state: Path,
) -> None:
    state_dir = old_word_count_state
    (state_dir / "notes.txt").write_text("operator notes")
    (state_dir / "2_9").write_text("a file named like a task")
    for name in ("backup", "01_0", "1_x", "_1", "1_", "1_0_0", QUARANTINE_DIR_NAME):
        (state_dir / name / "counts").mkdir(parents=True)
    (state_dir / "1_0" / "stray-file").write_text("not a store")

    report = relocate_state(state_dir, word_count_after_a_new_first_sub_topology())

    assert sorted(m.source.parent.name for m in report.moves) == [
        f"1_{p}" for p in range(PARTITIONS)
    ]
    for name in ("backup", "01_0", "1_x", "_1", "1_", "1_0_0", QUARANTINE_DIR_NAME):
        assert (state_dir / name / "counts").is_dir()
    assert (state_dir / "2_9").read_text() == "a file named like a task"
    # 1_0 still holds the stray file, so it stays.
    assert [p.name for p in (state_dir / "1_0").iterdir()] == ["stray-file"]
    assert not (state_dir / "1_1").exists()


def test_a_state_dir_that_does_not_exist_yet_is_a_first_start(tmp_path: Path) -> None:
    assert relocate_state(tmp_path / "none", word_count()) == RelocationReport()
    assert not (tmp_path / "none").exists()


def test_a_store_under_a_partition_the_topology_does_not_have_is_left_alone(
    old_word_count_state: Path,
) -> None:
    state_dir = old_word_count_state
    write_store(state_dir / "9_9" / "counts", "counts", 9)  # a stray copy, not ours to place
    topology = word_count_after_a_new_first_sub_topology()
    tasks = frozenset(TaskId(sub.id, p) for sub in topology.subtopologies() for p in range(4))
    report = relocate_homes(state_dir, replace(store_homes(topology), tasks=tasks))
    assert len(report.moves) == PARTITIONS  # 1_p -> 2_p as ever
    assert [(s.store, s.path) for s in report.left_alone] == [
        ("counts", state_dir / "9_9" / "counts")
    ]
    assert "2_9 does not exist" in report.left_alone[0].reason
    assert not (state_dir / "2_9").exists()
    assert_store_intact(state_dir / "9_9" / "counts", "counts", 9)


def test_a_store_being_wiped_is_not_a_store_to_move(old_word_count_state: Path) -> None:
    state_dir = old_word_count_state
    trash = state_dir / "1_0" / ".counts.wiping"
    trash.mkdir()
    report = relocate_state(state_dir, word_count_after_a_new_first_sub_topology())
    assert len(report.moves) == PARTITIONS and report.left_alone == ()
    assert trash.exists()  # it kept its task directory in place; the store moved out alone
