"""Failover benchmark: SIGKILL the active copy of a big store, time the standby taking over.

Run it with ``make bench-failover`` (the project's ``.venv``; nothing else is
needed), or ``.venv/bin/python -m tests.bench.bench_failover`` from the repository's
root. It is a script, not a test: it measures and reports, and never fails on a
number (``tests/integration/test_failover.py`` asserts the behaviour). The group is
started and watched by ``tests/support/replica_group.py``, as the tests do.

Each case runs on a fresh group: ``examples/wordcount`` as three local
replicas (``LocalGroup``: one process each, ``exactly_once_v2``,
``commit.interval.ms`` 100, one standby per stateful task, the replicas' logs
at INFO) on a fresh SQLite log under the system's temporary directory. The
input holds ``--words`` distinct words (default 400,000), each once, in
lines of ten over four partitions, so each of the four ``word-counts`` store
partitions holds about 100,000 keys and its changelog as many records. Once
the group has processed and committed everything, the target task's active
copy answers fresh and its standby has replayed the changelog to the end,
one member is SIGKILLed. Which one: the case picks the first (member, stateful
task) for which the assignor the group publishes with (``assign()``, same
inputs) gives the task

* ``promoted``: to the member holding its standby (in a fresh group: the
  member running two of the four stateful tasks);
* ``promoted_under_load``: the same, with ``LOAD_WORDS_PER_S`` new distinct
  words a second produced from ``LOAD_WARMUP_SECONDS`` before the kill until
  the promoted task is processing again, so the active copy is committing
  (and the standby trailing it) when it dies;
* ``moved``: to a member without its state (in a fresh group: kill a member
  running one stateful task; its standby holder already runs two, and the
  assignor keeps balance and the survivors' tasks first). What a tail-only
  promotion saves shows here: this member restores the whole changelog.

Timed from just before the SIGKILL with ``time.monotonic()``, in one loop that
also polls the supervisor (which republishes the assignment and restarts the
victim after its 1 s back-off) every 20 ms:

* ``stale_answer_s``: to the first successful query, through the
  ``QueryRouter``, of a word of the target partition (``acceptable_lag`` 0:
  the router falls back to a standby, with ``allow_stale``, that has applied
  the whole changelog; unbounded, it may pick the empty standby a
  reassignment just created, see ``test_failover.py``);
* ``fresh_answer_s``: to the first fresh (non-stale) answer of the new active
  copy: the task is restored and running there;
* ``processing_s``: to the promoted task processing again, detected by its
  output: right after the kill, ``NEW_LINES`` lines holding only the target
  word go to input partitions whose splitting task (sub-topology 0) is not
  on the victim; the time is when the output topic shows the word's count
  raised by all of them (the new active copy's first transaction with that
  input, committed; the repartition hop included);
* ``replayed_records``: what the new active copy's restore of the task
  replayed, from its replica log (``task 1_<p> restored store word-counts: N
  records ... in S s``), against the store's size (distinct keys in the
  changelog partition), the changelog's end and the standby's lag just before
  the kill (``/v1/lags``; the standby keeps replaying until it is promoted,
  so what the promotion replays may be less).

After the victim is back and everything is processed, every word's last
published count is checked against the input and each word's counts must
strictly rise (exactly once). The last line printed is one JSON object
(``promoted`` numbers, with ``moved_*`` beside them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from eddyline_runtime.assignor import assign
from eddyline_runtime.local_group import LocalGroup
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.partitions import TaskId, TopicPartition, partition_for_key
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.support.replica_group import (
    CHANGELOG,
    COUNTING_SUBTOPOLOGY,
    LONGS,
    OUTPUT,
    PARTITIONS,
    STORE,
    STRINGS,
    distinct_keys,
    get_json,
    log_sizes,
    output_history,
    restore_lines,
    start_replica_group,
    wait_caught_up,
    wait_ready,
    wait_standby_current,
)
from tests.support.replica_group import produce_lines as produce

WORDS_PER_LINE: Final = 10
NEW_LINES: Final = 100
# The "under load" case: new distinct words per second, produced from before the kill
# (after LOAD_WARMUP_SECONDS of it) until the promoted task is processing again.
LOAD_WORDS_PER_S: Final = 10_000
LOAD_WARMUP_SECONDS: Final = 2.0
LOAD_TICK_SECONDS: Final = 0.05
# (case, whether the assignor gives the task to its standby holder, under load)
CASES: Final = (
    ("promoted", True, False),
    ("promoted_under_load", True, True),
    ("moved", False, False),
)
POLL_SECONDS: Final = 0.02
WAIT_SECONDS: Final = 600.0


def latest_counts(log: SqliteLog) -> tuple[dict[str, int], int]:
    """The last published count per word, and how many words' counts ever failed to rise."""
    history = output_history(log)
    not_rising = sum(
        1 for counts in history.values() for a, b in itertools.pairwise(counts) if b <= a
    )
    return {word: counts[-1] for word, counts in history.items()}, not_rising


# -- background input ---------------------------------------------------------------------


class Load(threading.Thread):
    """Background input: lines of ten new distinct words, ``words_per_s`` of them a second."""

    def __init__(self, log: SqliteLog, words_per_s: int) -> None:
        super().__init__(name="load", daemon=True)
        self.log = log
        self.lines_per_tick = max(round(words_per_s * LOAD_TICK_SECONDS / WORDS_PER_LINE), 1)
        self.words: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        tick = 0
        while not self._stop_event.wait(LOAD_TICK_SECONDS):
            lines = []
            for _ in range(self.lines_per_tick):
                words = [f"load-{len(self.words) + i}" for i in range(WORDS_PER_LINE)]
                self.words.extend(words)
                lines.append(" ".join(words))
            produce(self.log, lines, [tick % PARTITIONS])
            tick += 1

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


# -- one failover ---------------------------------------------------------------------------


@dataclass
class Failover:
    case: str
    word: str  # the queried word, in the task's partition
    victim: str
    task: str
    standby: str  # the member that held the task's standby at the kill
    new_owner: str  # the member whose fresh answer ended the failover
    store_keys: int
    changelog_records: int
    standby_lag_at_kill: int  # changelog records the standby had not applied at the kill
    stale_answer_s: float
    stale_answer_role: str
    fresh_answer_s: float
    processing_s: float
    replayed_records: int
    restore_s: float
    failed_queries: int
    exactly_once: bool = False


@dataclass
class Target:
    """The member to kill, its task and a word of that task's partition, at the kill."""

    victim: str
    task: TaskId
    word: str
    standby: str
    store_keys: int  # before any load
    count: int  # the word's count before the kill
    member_at: dict[str, str]  # address -> member id


def choose_kill(group: LocalGroup, *, to_standby: bool) -> tuple[str, TaskId] | None:
    """A (member, stateful task of it) whose kill, by the assignor the group publishes with,
    gives the task to its standby holder (``to_standby``) or to another member."""
    assignment = group.assignment
    assert assignment is not None
    for victim in sorted(assignment.active):
        present = [m for m in group.members if m.id != victim]
        after = assign(
            group.layout.tasks(),
            present,
            group.num_standby_replicas,
            previous=assignment,
            stateful=group.layout.stateful_tasks(),
        )
        for task in sorted(assignment.active[victim]):
            if task.subtopology != COUNTING_SUBTOPOLOGY:
                continue
            promoted = after.active_owner(task) in assignment.standby_owners(task)
            if promoted == to_standby:
                return victim, task
    return None


def pick_target(log: SqliteLog, group: LocalGroup, victim: str, task: TaskId) -> Target:
    """``victim`` and its ``task``, once the task's active copy answers fresh and its
    standby has applied the whole changelog."""
    assignment = group.assignment
    assert assignment is not None
    word = next(
        f"target-{i}"
        for i in range(64)
        if partition_for_key(STRINGS.serialize(f"target-{i}"), PARTITIONS) == task.partition
    )
    member_at = {m.address or "": m.id for m in group.members}
    router = QueryRouter(list(member_at), acceptable_lag=0)
    started = time.monotonic()
    while True:  # a task that moved back to a restarted member may still be restoring
        group.poll()
        try:
            before = router.get(STORE, word)
        except QueryFailedError:
            before = None
        if before is not None and before.role == "active" and not before.stale:
            break
        if time.monotonic() - started > WAIT_SECONDS:
            raise TimeoutError(f"task {task} never answered fresh: {before}")
        time.sleep(0.1)
    assert member_at[before.host] == victim, (before, assignment)
    (standby,) = assignment.standby_owners(task)
    address = next(a for a, m in member_at.items() if m == standby)
    wait_standby_current(log, group, address, task.partition, WAIT_SECONDS)
    changelog = TopicPartition(CHANGELOG, task.partition)
    return Target(
        victim=victim,
        task=task,
        word=word,
        standby=standby,
        store_keys=distinct_keys(log, changelog),
        count=int(before.value),
        member_at=member_at,
    )


@dataclass
class Timings:
    stale_at: float
    stale_role: str
    fresh_at: float
    new_owner: str
    processing_at: float
    failed_queries: int


def failover(
    log: SqliteLog, group: LocalGroup, case: str, target: Target, load: Load | None
) -> Failover:
    """Kill ``target.victim``; time the answers, the output and the restore (docstring)."""
    assignment = group.assignment
    assert assignment is not None
    # New input only where the splitting task survives, so the wait is the counting task's.
    splitting_elsewhere = sorted(
        {
            t.partition
            for m, tasks in assignment.active.items()
            if m != target.victim
            for t in tasks
            if t.subtopology == 0
        }
    )
    since = log_sizes(group)
    if load is not None:
        load.start()
        time.sleep(LOAD_WARMUP_SECONDS)
    # What the standby has applied, and the changelog's end, just before the kill.
    address = next(a for a, m in target.member_at.items() if m == target.standby)
    lags = get_json(address, "/v1/lags")[1]
    standby_position = int(lags[STORE][str(target.task.partition)]["current_offset_position"])
    changelog_end = log.end_offset(TopicPartition(CHANGELOG, target.task.partition))

    killed_at = time.monotonic()
    group.kill(target.victim)  # SIGKILL
    produce(log, [target.word] * NEW_LINES, splitting_elsewhere)
    timings = measure(log, group, target, killed_at)
    if load is not None:
        load.stop()
    task = str(target.task)
    restores = [r for r in restore_lines(group, since, task) if r["member"] == timings.new_owner]
    restore = restores[0] if restores else {"records": -1, "seconds": -1.0}
    # The supervisor restarts the victim after its back-off; wait for it and the group.
    while target.victim not in group.alive():
        group.poll()
        time.sleep(0.05)
    wait_ready(group, WAIT_SECONDS)
    wait_caught_up(log, group, WAIT_SECONDS, f"after the {case} failover")
    return Failover(
        case=case,
        word=target.word,
        victim=target.victim,
        task=task,
        standby=target.standby,
        new_owner=timings.new_owner,
        store_keys=target.store_keys,
        changelog_records=changelog_end,
        standby_lag_at_kill=changelog_end - standby_position,
        stale_answer_s=round(timings.stale_at - killed_at, 3),
        stale_answer_role=timings.stale_role,
        fresh_answer_s=round(timings.fresh_at - killed_at, 3),
        processing_s=round(timings.processing_at - killed_at, 3),
        replayed_records=int(restore["records"]),
        restore_s=round(float(restore["seconds"]), 3),
        failed_queries=timings.failed_queries,
    )


def measure(log: SqliteLog, group: LocalGroup, target: Target, killed_at: float) -> Timings:
    """Poll the group, query the word and read its output until a fresh answer came from
    a new active copy and the output shows the word's new input counted."""
    router = QueryRouter(list(target.member_at), acceptable_lag=0)
    key, wanted = target.word.encode(), target.count + NEW_LINES
    output_tp = TopicPartition(OUTPUT, partition_for_key(key, log.topics()[OUTPUT].partitions))
    position = log.end_offset(output_tp)
    stale_at = fresh_at = processing_at = None
    stale_role, new_owner, failed = "", "", 0
    while fresh_at is None or processing_at is None:
        group.poll()
        if fresh_at is None:
            try:
                result = router.get(STORE, target.word)
            except QueryFailedError:
                failed += 1
            else:
                now = time.monotonic()
                if stale_at is None:
                    stale_at = now
                    stale_role = f"{result.role} on {target.member_at[result.host]}"
                if result.role == "active" and not result.stale:
                    fresh_at, new_owner = now, target.member_at[result.host]
        if processing_at is None:
            fetched = log.fetch(output_tp, position, 10_000)
            for record in fetched.records:
                if record.key == key and LONGS.deserialize(record.value) >= wanted:
                    processing_at = time.monotonic()
            if fetched.records:
                position = fetched.records[-1].offset + 1
        if time.monotonic() - killed_at > WAIT_SECONDS:
            raise TimeoutError(f"the failover did not complete in {WAIT_SECONDS:.0f} s")
        time.sleep(POLL_SECONDS)
    assert stale_at is not None
    return Timings(stale_at, stale_role, fresh_at, new_owner, processing_at, failed)


# -- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=400_000, help="distinct words, each once")
    parser.add_argument("--keep", action="store_true", help="keep the directories (logs) after")
    args = parser.parse_args()
    print(
        f"machine: nproc={os.cpu_count()}, {platform.machine()}, python "
        f"{platform.python_version()}; {args.words:,} distinct words",
        flush=True,
    )
    results: list[Failover] = []
    for case, to_standby, load in CASES:
        result = run_case(case, to_standby=to_standby, load=load, words=args.words, keep=args.keep)
        if result is not None:
            results.append(result)
    report(results)
    summary: dict[str, Any] = {}
    by_case = {result.case: result for result in results}
    for case, prefix in (("promoted", ""), ("promoted_under_load", "load_"), ("moved", "moved_")):
        result = by_case.get(case)
        summary.update(
            {
                f"{prefix}store_keys": result and result.store_keys,
                f"{prefix}changelog_records": result and result.changelog_records,
                f"{prefix}kill_to_stale_answer_s": result and result.stale_answer_s,
                f"{prefix}kill_to_fresh_answer_s": result and result.fresh_answer_s,
                f"{prefix}kill_to_processing_s": result and result.processing_s,
                f"{prefix}replayed_records": result and result.replayed_records,
                f"{prefix}standby_lag_at_kill": result and result.standby_lag_at_kill,
                f"{prefix}to_standby_holder": result and result.new_owner == result.standby,
            }
        )
    summary["exactly_once"] = all(result.exactly_once for result in results)
    print(json.dumps(summary))


def run_case(case: str, *, to_standby: bool, load: bool, words: int, keep: bool) -> Failover | None:
    """A fresh group on a fresh log: load, kill once, restart, check exactly-once."""
    directory = Path(tempfile.mkdtemp(prefix=f"eddyline-bench-failover-{case}-"))
    vocabulary = [f"word-{i:07d}" for i in range(words)]
    random.Random(42).shuffle(vocabulary)
    lines = [
        " ".join(vocabulary[i : i + WORDS_PER_LINE])
        for i in range(0, len(vocabulary), WORDS_PER_LINE)
    ]
    targets = [f"target-{i}" for i in range(64)]
    lines += targets  # every partition's target word has a count before the kill
    expected = dict.fromkeys([*vocabulary, *targets], 1)
    log, group = start_replica_group(directory, lines)
    try:
        seconds = wait_caught_up(log, group, WAIT_SECONDS, "initial load")
        wait_ready(group, WAIT_SECONDS)
        print(f"{case}: loaded {len(lines):,} lines into 3 replicas in {seconds:.1f} s", flush=True)
        kill = choose_kill(group, to_standby=to_standby)
        if kill is None:
            print(f"{case}: no member's kill does that in this assignment", flush=True)
            return None
        background = Load(log, LOAD_WORDS_PER_S) if load else None
        result = failover(log, group, case, pick_target(log, group, *kill), background)
        expected[result.word] += NEW_LINES
        if background is not None:
            expected.update(dict.fromkeys(background.words, 1))
        latest, not_rising = latest_counts(log)
        result.exactly_once = latest == expected and not_rising == 0
        print(json.dumps(asdict(result)), flush=True)
        if not result.exactly_once:
            differ = sum(
                1 for w in expected.keys() | latest.keys() if latest.get(w) != expected.get(w)
            )
            print(
                f"{case}: NOT exactly once: {differ} words' last counts differ from the input, "
                f"{not_rising} published counts did not rise; logs in {directory}",
                flush=True,
            )
            keep = True
        return result
    finally:
        codes = group.stop()
        log.close()
        if any(code != 0 for code in codes.values()):
            print(f"{case}: replicas stopped with {codes}", flush=True)
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)


def report(results: list[Failover]) -> None:
    rows: list[tuple[str, Callable[[Failover], str]]] = [
        ("killed member -> new active owner", lambda r: f"{r.victim} -> {r.new_owner}"),
        ("task; standby held by", lambda r: f"{r.task}; {r.standby}"),
        ("store keys / changelog records", lambda r: f"{r.store_keys:,} / {r.changelog_records:,}"),
        (
            "kill -> first stale answer (s)",
            lambda r: f"{r.stale_answer_s:.3f} ({r.stale_answer_role})",
        ),
        ("kill -> fresh answer, new active (s)", lambda r: f"{r.fresh_answer_s:.3f}"),
        ("kill -> task processing again (s)", lambda r: f"{r.processing_s:.3f}"),
        (
            "records replayed (standby lag at kill)",
            lambda r: f"{r.replayed_records:,} (lag {r.standby_lag_at_kill:,})",
        ),
        ("restore time (s)", lambda r: f"{r.restore_s:.3f}"),
        ("failed queries during failover", lambda r: f"{r.failed_queries}"),
        ("exactly once after the failover", lambda r: "yes" if r.exactly_once else "NO"),
    ]
    print()
    print(f"{'':<40}" + "".join(f"{r.case:>28}" for r in results))
    for label, cell in rows:
        print(f"{label:<40}" + "".join(f"{cell(r):>28}" for r in results))
    print(flush=True)


if __name__ == "__main__":
    main()
