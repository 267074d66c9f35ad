"""A member frozen mid-transaction while its tasks move, then thawed (issue 32).

Member ``a`` (a process of its own) runs every task of the word count on a real broker,
committing every 2 s while input keeps arriving, so a transaction of its is open almost
always. It is frozen with SIGSTOP right after it processed more input, the membership then
moves every task to member ``b`` (as a supervisor drops a member that stopped answering),
``b`` takes them over and counts new input, and only then is ``a`` thawed (SIGCONT), its
stream thread resuming in the middle of the transaction it had open.

What must hold: ``b``'s producers fenced ``a``'s ids before ``b`` read anything, so the
coordinator aborted ``a``'s open transaction and ``a`` can commit nothing more for those
tasks: every committed count is published once, the final counts equal the input, and ``a``
reports its tasks dropped uncommitted (fenced), never a commit of them after the thaw.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.topics import resolve_topics
from eddyline_runtime.log import Record
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.membership import Membership, StoreRole
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import KeyRange
from tests.support.crash_runs import REPO, committed_records
from tests.support.waiting import wait_for
from tests.support.word_count import APP, INPUT, OUTPUT, STORE, streams_config, word_count

PARTITIONS = 2
LINES = ["a b a", "b a c", "d e f g"]
INPUT_PAUSE_S = 0.1
LONGS = serde_for("long")
STRINGS = serde_for("string")
FREEZE_AT = 3  # the commit with records member a freezes in
MEMBERS = (Member("a", address="127.0.0.1:1"), Member("b", address="127.0.0.1:2"))


class Input:
    """Lines a few times a second, counted as they are produced."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self.produced: Counter[str] = Counter()
        self.lines = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        log = KafkaLog.open(self.url, {}, topic_prefix=self.prefix)
        try:
            while not self._stop.wait(INPUT_PAUSE_S):
                for index, line in enumerate(LINES):
                    log.produce(
                        TopicPartition(INPUT, index % PARTITIONS), [Record(None, line.encode(), 1)]
                    )
                    with self._lock:
                        self.produced.update(line.split())
                        self.lines += 1
        finally:
            log.close()

    def stop(self) -> Counter[str]:
        self._stop.set()
        self._thread.join(60)
        return Counter(self.produced)


def frozen(pid: int) -> bool:
    """The process is stopped (state ``T`` in /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def events(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def active_counts(instance: StreamsInstance) -> Counter[str]:
    found: Counter[str] = Counter()
    for local in instance.local_store_partitions(STORE):
        if local.role is StoreRole.ACTIVE:
            for key, value in local.open_reader(None).scan(KeyRange()):
                found[key.decode()] = LONGS.deserialize(value)
    return found


def assignments(admin: KafkaLog) -> tuple[frozenset[TaskId], Assignment, Assignment]:
    """Every task; ``a`` running them all with ``b``'s standbys; then the reverse."""
    layout = resolve_topics(word_count(), APP, admin)
    tasks, stateful = frozenset(layout.tasks()), frozenset(layout.stateful_tasks())
    first = Assignment(
        active={"a": tasks, "b": frozenset()},
        standby={"a": frozenset(), "b": stateful},
        members=MEMBERS,
    )
    moved = Assignment(
        active={"a": frozenset(), "b": tasks},
        standby={"a": stateful, "b": frozenset()},
        members=MEMBERS,
    )
    return tasks, first, moved


def assert_each_count_published_once(counts: dict[str, list[int]], produced: Counter[str]) -> None:
    assert {word: values[-1] for word, values in counts.items()} == dict(produced)
    repeated = {w: v for w, v in counts.items() if len(v) != len(set(v))}
    assert not repeated, f"counts published twice: {repeated}"
    assert all(v == sorted(v) for v in counts.values()), counts


def published(log: KafkaLog) -> dict[str, list[int]]:
    """Every committed count of the output topic, per word, in order."""
    counts: dict[str, list[int]] = {}
    for record in committed_records(log, OUTPUT, log.topics()[OUTPUT].partitions):
        assert record.key is not None and record.value is not None
        word = STRINGS.deserialize(record.key)
        counts.setdefault(word, []).append(LONGS.deserialize(record.value))
    return counts


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_member_frozen_mid_transaction_and_thawed_after_its_tasks_moved_commits_nothing(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    url = f"kafka://{kafka_bootstrap}"
    prefix = f"zombie-{uuid.uuid4().hex[:8]}."
    admin = KafkaLog.open(url, {}, topic_prefix=prefix)
    admin.create_topic(INPUT, PARTITIONS)
    tasks, first, moved = assignments(admin)
    membership = tmp_path / "membership.json"
    Membership(1, first).write(membership)
    a_events = tmp_path / "a-events.jsonl"
    stderr = (tmp_path / "a.stderr").open("wb")
    env = {key: value for key, value in os.environ.items() if not key.startswith("EDDYLINE_")}
    a = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.log.zombie_member_worker", kafka_bootstrap,
         prefix, str(tmp_path / "state-a"), str(membership), str(a_events), str(FREEZE_AT)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
    )  # fmt: skip
    b_log = KafkaLog.open(url, {}, topic_prefix=prefix)
    b = StreamsInstance(
        word_count(),
        streams_config(tmp_path / "state-b", **{"commit.interval.ms": 100}),
        b_log,
        instance_id="b",
        member=MEMBERS[1],
        assignment=first,
    )
    b.start()
    source = Input(url, prefix)
    try:
        # It stops itself just before its third commit with records: inside the commit,
        # its transactions open and holding that input's output (see the worker).
        wait_for(lambda: frozen(a.pid), "member a frozen mid-transaction", 120)
        frozen_lines = source.lines
        Membership(2, moved).write(membership)
        b.apply_assignment(moved)
        wait_for(lambda: b.check() is not None and b.ready(), "b runs the moved tasks", 120)
        wait_for(lambda: source.lines > frozen_lines + 30, "more input while a is frozen", 30)
        os.kill(a.pid, signal.SIGCONT)
        wait_for(
            lambda: any(e.get("migrated") for e in events(a_events)),
            "a told it was fenced out of its tasks",
            60,
        )
        time.sleep(1)  # more input, a thawed and running beside b
        produced = source.stop()
        wait_for(
            lambda: b.caught_up() and active_counts(b) == produced, "b counted every line", 120
        )
        seen = events(a_events)
        freezing = next(e for e in seen if e["event"] == "freezing")
        after_thaw = [e for e in seen if e["event"] == "commit"][FREEZE_AT - 1 :]
        # The commit it was frozen in: every task with a transaction open in it (those with
        # output since the last commit) fenced, the processed input not committed; the
        # others are fenced at their next transaction, and nothing commits after the thaw.
        assert after_thaw[0]["transactions"] == 0, after_thaw
        assert after_thaw[0]["records"] > 0, after_thaw  # type: ignore[operator]
        migrated = after_thaw[0]["migrated"]
        assert len(migrated) == freezing["producers"], (freezing, after_thaw)  # type: ignore[arg-type]
        assert set(migrated) <= {str(t) for t in tasks}, after_thaw  # type: ignore[arg-type]
        assert all(e["transactions"] == 0 for e in after_thaw), after_thaw
        assert_each_count_published_once(published(admin), produced)
    finally:
        source.stop()
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
            a.wait()
        stderr.close()
        b.close(30)
        b_log.close()
        admin.close()
