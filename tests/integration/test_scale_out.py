"""Scaling a replica group out warms before moving (KIP-441; assignor points 9 to 11).

Two word-count replicas hold a store of 20,000 words; lines keep arriving
while the group scales to three (and then back to two). Every assignment the group publishes is
recorded with the lags it was computed from: no task is ever active on the
new replica before its copy there was caught up, and the hand-over restores
only the records written since the warm copy's last replay (the tail of the
hand-over itself, tens of records), not the store a cold move would restore.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.assignor import Assignment
from eddyline_runtime.local_group import LocalGroup
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.partitions import TaskId, TopicPartition
from tests.support.replica_group import (
    CHANGELOG,
    COUNTING_SUBTOPOLOGY,
    PARTITIONS,
    distinct_keys,
    latest_counts,
    log_sizes,
    produce_lines,
    replica_logs,
    restore_lines,
    start_replica_group,
    wait_caught_up,
)
from tests.support.waiting import wait_for

WORDS = 20_000
ACCEPTABLE_LAG = 0
NEW = "2"


@pytest.mark.slow
def test_a_new_replica_takes_tasks_only_once_its_warm_up_caught_up(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(WORDS)]
    lines = [" ".join(words[i : i + 10]) for i in range(0, WORDS, 10)]
    log, group = start_replica_group(
        tmp_path,
        lines,
        replicas=2,
        spare_ports=1,
        extra_config={"acceptable.recovery.lag": ACCEPTABLE_LAG, "max.warmup.replicas": 1},
    )
    trickle_stop = threading.Event()
    trickled: list[str] = []

    def trickle() -> None:
        # A steady input during the scale: the old owners keep processing it.
        writer = SqliteLog(tmp_path / "log.db")
        try:
            index = 0
            while not trickle_stop.wait(0.05):
                line = " ".join(words[(index * 7 + k) % WORDS] for k in range(4))
                produce_lines(writer, [line], partitions=[index % PARTITIONS])
                trickled.append(line)
                index += 1
        finally:
            writer.close()

    producer = threading.Thread(target=trickle, name="trickle")
    try:
        wait_caught_up(log, group, 180, "the two replicas")
        producer.start()
        since = log_sizes(group)
        history = scale_and_record(group, 3)
        trickle_stop.set()
        producer.join()
        wait_caught_up(log, group, 120, "the three replicas")

        check_hand_overs(log, group, history, since)

        # And back in: the leaving replica's tasks go to the two others (its standbys).
        group.scale(2)
        assert sorted(group.alive()) == ["0", "1"]
        assert group.assignment is not None
        assert sorted(group.assignment.active) == ["0", "1"]
        produce_lines(log, ["after scaling in"])
        trickled.append("after scaling in")
        words += ["after", "scaling", "in"]
        wait_caught_up(log, group, 120, "the two replicas again")

        expected: dict[str, int] = dict.fromkeys(words, 0)
        for word in words[:WORDS]:
            expected[word] = 1
        for line in trickled:
            for word in line.split():
                expected[word] += 1
        assert latest_counts(log) == expected
    finally:
        trickle_stop.set()
        if producer.is_alive():
            producer.join()
        group.stop()
        log.close()


def check_hand_overs(
    log: SqliteLog,
    group: LocalGroup,
    history: list[tuple[Assignment, dict[str, dict[TaskId, int]]]],
    since: dict[str, int],
) -> None:
    """Every task the new replica took over was a caught-up warm-up or standby there, and
    its hand-over restored a small tail, not the store."""
    counting = {TaskId(COUNTING_SUBTOPOLOGY, p) for p in range(PARTITIONS)}
    final = history[-1][0]
    taken = final.active[NEW] & counting
    assert taken, f"the new replica runs no counting task: {final}"
    warmed: set[TaskId] = set()
    for (before, _), (after, lags) in itertools.pairwise(history):
        assert after.warmup_count <= 1
        for task in after.active[NEW] & counting:
            if task in before.active.get(NEW, ()):
                continue
            # Handed over: the copy there was a warm-up or standby, caught up.
            had_copy = task in before.warmup.get(NEW, ()) or task in before.standby.get(NEW, ())
            lag = lags.get(NEW, {}).get(task)
            assert had_copy and lag is not None and lag <= ACCEPTABLE_LAG, (
                f"{task} active on the new replica with lag {lag} (copy: {had_copy})"
            )
            warmed.add(task)
    assert warmed == taken
    assert any(a.warmup_count for a, _ in history), "no warm-up ran"

    # What the hand-over restored on the critical path, against the store a cold
    # move would have restored.
    for task in sorted(taken):

        def handed_over(task: TaskId = task) -> list[dict[str, Any]]:
            group.poll()
            lines = restore_lines(group, since, str(task))
            return [r for r in lines if r["member"] == NEW]

        mine = wait_for(handed_over, f"the new replica to start task {task}", 60)
        assert len(mine) == 1, mine
        store_size = distinct_keys(log, TopicPartition(CHANGELOG, task.partition))
        print(
            f"{task}: restored {mine[0]['records']} records at hand-over (store {store_size} keys)"
        )
        # Only what arrived between the warm copy's last replay and the old owner's
        # last commit: a fraction of a second of the trickle, never the store.
        assert mine[0]["records"] <= store_size // 10, (mine[0], store_size)


def scale_and_record(
    group: LocalGroup, replicas: int
) -> list[tuple[Assignment, dict[str, dict[TaskId, int]]]]:
    """Scale, then poll until balance holds; every assignment published on the way, with
    the lags it was computed from."""
    assert group.assignment is not None
    history: list[tuple[Assignment, dict[str, dict[TaskId, int]]]] = [(group.assignment, {})]
    group.scale(replicas)
    deadline = time.monotonic() + 120
    while True:
        group.poll()
        current = group.assignment
        assert current is not None
        if current is not history[-1][0]:
            history.append((current, group.reported_lags))
        if group.balanced and current.active[NEW]:
            return history
        assert time.monotonic() < deadline, f"no balance in 120 s: {current}\n{replica_logs(group)}"
        time.sleep(0.05)
