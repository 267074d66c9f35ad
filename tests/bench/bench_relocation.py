"""Relocation benchmark (KIP-816): how long start-up spends moving renumbered state.

Run it with ``.venv/bin/python tests/bench/bench_relocation.py`` (``--dir
/dev/shm`` to run on tmpfs and see what is the disk's share). It is a script,
not a test: it measures and reports, and never fails on a number.

The issue asks that 10,000 task directories relocate "in well under a
second". The script builds ``--tasks`` task directories ``1_<p>``, each with
one store ``counts`` laid out as a closed store's small files
(``eddyline.lock`` holding a pid, ``.checkpoint``; RocksDB's own files would
ride along unread, as relocation never opens a store), and a topology that
put a new sub-topology first, so every store belongs under ``2_<p>`` now.
Building the trees is not timed. Side by side, in one run:

* ``relocate``: the issue's case. Every store misplaced; each task directory
  holds only stores bound for one task, so it is renamed whole.
* ``relocate_again``: the same state.dir right after, all in place: what every
  later start pays (the scan).
* ``refuse``: ``automatic.state.relocation: false``, building the error that
  lists all of them.
* ``bare_task_renames``: ``os.rename`` of each task directory and nothing
  else: the floor under ``relocate`` (it also puts the tree back for the next run).
* ``relocate_split``: each task directory also holds a store the topology no
  longer has, which stays; so each ``counts`` moves alone, into a target task
  directory that has to be created (a ``mkdir`` per store).

Medians of ``--runs`` runs; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from eddyline_runtime.engine.topics import store_homes
from eddyline_runtime.processing import StreamsBuilder, Topology
from eddyline_runtime.state.relocation import MisplacedStateError, RelocationReport
from eddyline_runtime.state.relocation import relocate_state as relocate_homes

STORE = "counts"
RETIRED = "retired"  # a store the new topology no longer has
STORE_FILES = {"eddyline.lock": "4711", ".checkpoint": "0\n1\napp-counts-changelog 0 41\n"}


def relocate_state(
    state_dir: Path, topology: Topology, *, automatic: bool = True
) -> RelocationReport:
    """Relocate for ``topology``, as an instance does at start."""
    return relocate_homes(state_dir, store_homes(topology), automatic=automatic)


def new_first_word_count() -> Topology:
    """The word count behind a new first sub-topology: "counts" moves from 1 to 2."""
    builder = StreamsBuilder()
    builder.stream("other").to("elsewhere")
    (
        builder.stream("lines", value_serde="string")
        .flat_map_values(str.split)
        .group_by(lambda _, word: word, value_serde="string")
        .count(STORE)
        .to_stream()
        .to("out", key_serde="string", value_serde="long")
    )
    return builder.build()


def build_tree(state_dir: Path, tasks: int, stores: tuple[str, ...]) -> None:
    for partition in range(tasks):
        for name in stores:
            store = state_dir / f"1_{partition}" / name
            store.mkdir(parents=True)
            for file_name, content in STORE_FILES.items():
                (store / file_name).write_text(content)


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to build the trees")
    args = parser.parse_args()
    tasks: int = args.tasks
    topology = new_first_word_count()
    results: dict[str, list[float]] = {
        case: []
        for case in (
            "relocate",
            "relocate_again",
            "refuse",
            "bare_task_renames",
            "relocate_split",
        )
    }

    def relocate(state_dir: Path) -> None:
        report = relocate_state(state_dir, topology)
        assert len(report.moves) == tasks and not report.conflicts, report

    def refuse(state_dir: Path) -> None:
        try:
            relocate_state(state_dir, topology, automatic=False)
        except MisplacedStateError as error:
            assert len(error.misplaced) == tasks
        else:
            raise AssertionError("relocation off did not refuse")

    def tasks_back(state_dir: Path) -> None:
        for partition in range(tasks):
            os.rename(state_dir / f"2_{partition}", state_dir / f"1_{partition}")

    def stores_back(state_dir: Path) -> None:
        for partition in range(tasks):
            target = state_dir / f"2_{partition}"
            os.rename(target / STORE, state_dir / f"1_{partition}" / STORE)
            target.rmdir()

    with tempfile.TemporaryDirectory(prefix="bench-relocation-", dir=args.dir) as tmp:
        whole, split = Path(tmp) / "whole", Path(tmp) / "split"
        build_started = time.perf_counter()
        build_tree(whole, tasks, (STORE,))
        build_tree(split, tasks, (STORE, RETIRED))
        build_seconds = time.perf_counter() - build_started
        for _ in range(args.runs):
            results["refuse"].append(timed(lambda: refuse(whole)))
            results["relocate"].append(timed(lambda: relocate(whole)))
            results["relocate_again"].append(timed(lambda: relocate_state(whole, topology)))
            results["bare_task_renames"].append(timed(lambda: tasks_back(whole)))
            results["relocate_split"].append(timed(lambda: relocate(split)))
            stores_back(split)
        cleanup_started = time.perf_counter()
        shutil.rmtree(tmp)
        cleanup_seconds = time.perf_counter() - cleanup_started
        os.mkdir(tmp)  # for TemporaryDirectory's own cleanup

    medians = {case: statistics.median(times) for case, times in results.items()}
    print(
        f"{tasks} task directories, one store each; median of {args.runs} runs; "
        f"trees built in {build_seconds:.1f} s and deleted in {cleanup_seconds:.1f} s (not "
        "timed below; they show how fast this filesystem creates entries)"
    )
    print(f"{'case':<18} {'seconds':>9} {'us/store':>9}")
    for case, seconds in medians.items():
        print(f"{case:<18} {seconds:>9.4f} {seconds / tasks * 1e6:>9.1f}")
    print(
        json.dumps(
            {
                "task_dirs": tasks,
                "relocate_seconds": round(medians["relocate"], 4),
                "relocate_again_seconds": round(medians["relocate_again"], 4),
                "refuse_seconds": round(medians["refuse"], 4),
                "bare_task_renames_seconds": round(medians["bare_task_renames"], 4),
                "relocate_split_seconds": round(medians["relocate_split"], 4),
                "runs": args.runs,
                "dir": str(args.dir or tempfile.gettempdir()),
                "python": platform.python_version(),
            }
        )
    )


if __name__ == "__main__":
    main()
