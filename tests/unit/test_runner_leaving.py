"""A cluster member's SIGTERM: it leaves only after its tasks were handed over (or its time
is up); a member without a hand-over closes at once, as a local run does."""

from __future__ import annotations

import io
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.cluster_membership import (
    TERMINATION_GRACE_ENV,
    ClusterMembershipError,
    hand_over_seconds,
)
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.task_release import probe_layout
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.membership import NOTHING_ASSIGNED, Membership
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.runner import HandOver, run_member
from eddyline_runtime.spec import StreamApp, parse_manifest
from tests.support.ports import free_port
from tests.support.waiting import wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ME = "0"


class Published:
    """A membership authority the test drives: what ``current()`` returns."""

    poll_seconds = 0.02

    def __init__(self) -> None:
        self.latest: Membership | None = None

    def start(self, member_id: str) -> Membership:
        return NOTHING_ASSIGNED

    def current(self) -> Membership | None:
        return self.latest

    def stop(self) -> None:
        pass


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[StreamApp, SqliteLog]]:
    manifest = EXAMPLES / "wordcount" / "streamapp.yaml"
    document = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    document["spec"]["log"]["url"] = f"sqlite:///{tmp_path / 'log.db'}"
    document["spec"]["config"]["state.dir"] = str(tmp_path / "state")
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("text-lines", 2)
    try:
        yield parse_manifest(document, source=str(manifest)), log
    finally:
        log.close()


def configured(app: StreamApp, settings: dict[str, str]) -> StreamApp:
    return app.with_config({**app.spec.config, **settings}, source="test")


def member_run(
    app: tuple[StreamApp, SqliteLog],
    source: Published,
    hand_over: HandOver | None,
    script: threading.Thread,
    started: list[StreamsInstance],
) -> tuple[float, str]:
    """Run the member on this (the main) thread while ``script`` drives it; returns how
    long after SIGTERM it closed, and what it printed."""
    out = io.StringIO()
    stopped_at: list[float] = []

    def on_started(instance: StreamsInstance) -> None:
        started.append(instance)
        script.start()

    run_member(
        app[0],
        app[1],
        source,
        search_path=[EXAMPLES / "wordcount"],
        instance_id=ME,
        out=out,
        on_started=on_started,
        hand_over=hand_over,
        timeout=60,
    )
    stopped_at.append(time.monotonic())
    script.join(10)
    return stopped_at[0], out.getvalue()


def everything_on(instance: StreamsInstance, member_ids: list[str], owner: str) -> Assignment:
    assert instance.layout is not None
    tasks = instance.layout.tasks()
    return Assignment(
        active={owner: frozenset(tasks), **{m: frozenset() for m in member_ids if m != owner}},
        standby={},
        members=tuple(Member(m) for m in member_ids),
    )


def test_a_leaving_member_processes_until_its_tasks_are_handed_over(
    app: tuple[StreamApp, SqliteLog],
) -> None:
    source = Published()
    started: list[StreamsInstance] = []
    seen: dict[str, float | bool] = {}

    def script() -> None:
        instance = started[0]
        source.latest = Membership(1, everything_on(instance, [ME, "1"], ME))
        wait_for(lambda: instance.handed_over() is False, "the member to hold its tasks", 30)
        seen["signalled"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: instance.leaving, "the member to be leaving", 30)
        time.sleep(0.5)
        # Still running its tasks: nobody has taken them over yet.
        seen["running_while_leaving"] = instance.state.name == "RUNNING"
        seen["handed"] = time.monotonic()
        handed = everything_on(instance, [ME, "1"], "1")
        source.latest = Membership(2, replace(handed, leaving=frozenset({ME})))

    thread = threading.Thread(target=script, daemon=True)
    stopped, out = member_run(app, source, HandOver(30.0), thread, started)

    assert seen["running_while_leaving"] is True
    assert stopped >= float(seen["handed"])
    assert stopped - float(seen["signalled"]) < 30, "it left on the hand-over, not the deadline"
    assert "leaving: handing tasks over" in out
    assert "tasks handed over after" in out
    assert started[0].state.name == "NOT_RUNNING"


def test_a_leaving_members_layout_answers_until_its_final_commits_are_made(
    app: tuple[StreamApp, SqliteLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's new owner asks the old one's /v1/layout until it no longer names the task,
    and takes a member it cannot reach for one gone for good (engine/task_release.py). So
    the query server stops only after close() made the final commits: asked right after
    them, the member answers, naming no task (issue 38: it stopped first, and a new owner
    promoted its copy before the last commit was readable)."""
    address = f"127.0.0.1:{free_port()}"
    app = (configured(app[0], {"application.server": address}), app[1])
    after_close: list[frozenset[TaskId] | None] = []
    close = StreamsInstance.close

    def close_then_ask(instance: StreamsInstance, timeout: float | None = None) -> None:
        close(instance, timeout)
        after_close.append(probe_layout(address, 5.0))

    monkeypatch.setattr(StreamsInstance, "close", close_then_ask)
    source = Published()
    started: list[StreamsInstance] = []

    def script() -> None:
        instance = started[0]
        source.latest = Membership(1, everything_on(instance, [ME, "1"], ME))
        wait_for(lambda: probe_layout(address, 5.0), "the member to report its tasks", 30)
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: instance.leaving, "the member to be leaving", 30)
        handed = everything_on(instance, [ME, "1"], "1")
        source.latest = Membership(2, replace(handed, leaving=frozenset({ME})))

    thread = threading.Thread(target=script, daemon=True)
    _, out = member_run(app, source, HandOver(30.0), thread, started)
    assert "tasks handed over after" in out
    assert after_close == [frozenset()], "unreachable before its final commits were made"


def test_a_hand_over_that_does_not_come_ends_when_the_grace_period_is_nearly_up(
    app: tuple[StreamApp, SqliteLog],
) -> None:
    source = Published()
    started: list[StreamsInstance] = []
    signalled: list[float] = []

    def script() -> None:
        instance = started[0]
        source.latest = Membership(1, everything_on(instance, [ME, "1"], ME))
        wait_for(lambda: instance.handed_over() is False, "the member to hold its tasks", 30)
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=script, daemon=True)
    stopped, out = member_run(app, source, HandOver(1.0), thread, started)

    assert stopped - signalled[0] >= 1.0
    assert "hand-over not done after" in out


def test_every_member_leaving_or_the_membership_gone_ends_the_hand_over_at_once(
    app: tuple[StreamApp, SqliteLog],
) -> None:
    source = Published()
    started: list[StreamsInstance] = []
    gone = threading.Event()

    def script() -> None:
        instance = started[0]
        source.latest = Membership(1, everything_on(instance, [ME], ME))
        wait_for(lambda: instance.handed_over() is False, "the member to hold its tasks", 30)
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: instance.leaving, "the member to be leaving", 30)
        gone.set()

    thread = threading.Thread(target=script, daemon=True)
    _, out = member_run(app, source, HandOver(30.0, gone.is_set), thread, started)
    assert "the membership is gone" in out

    alone = everything_on(started[0], [ME], ME)
    assert not alone.handed_over(ME)
    assert replace(alone, leaving=frozenset({ME})).handed_over(ME)


def test_without_a_hand_over_sigterm_closes_at_once(app: tuple[StreamApp, SqliteLog]) -> None:
    source = Published()
    started: list[StreamsInstance] = []

    def script() -> None:
        instance = started[0]
        source.latest = Membership(1, everything_on(instance, [ME], ME))
        wait_for(lambda: instance.handed_over() is False, "the member to hold its tasks", 30)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=script, daemon=True)
    _, out = member_run(app, source, None, thread, started)
    assert "leaving" not in out
    assert not started[0].leaving


def test_the_hand_over_leaves_a_margin_of_the_grace_period_for_the_final_commit() -> None:
    assert hand_over_seconds({TERMINATION_GRACE_ENV: "60"}) == 45.0
    assert hand_over_seconds({TERMINATION_GRACE_ENV: "10"}) == 5.0
    assert hand_over_seconds({TERMINATION_GRACE_ENV: "3"}) == 0.0
    assert hand_over_seconds({}) == 22.5  # Kubernetes' default grace period, 30 s
    with pytest.raises(ClusterMembershipError, match=TERMINATION_GRACE_ENV):
        hand_over_seconds({TERMINATION_GRACE_ENV: "a minute"})


# Waits as short as the wait loop allows, so most of the child's time is spent inside the
# wait itself: where a handler that takes the wait's lock (threading.Event) deadlocked.
_SIGNAL_ROUNDS = 400
_CHILD = f"""
import os, resource
from eddyline_runtime.runner import _stop_signals
# As a pod: more descriptors open than select() takes (its stores' files, its sockets).
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 2048), hard), hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
for round in range({_SIGNAL_ROUNDS}):
    with _stop_signals() as signalled:
        print("waiting", round, flush=True)
        while not signalled(0.0005):
            pass
    print("stopped", round, flush=True)
"""


def test_a_sigterm_landing_anywhere_in_the_wait_loop_ends_it() -> None:
    """The main loop's wait for SIGTERM, SIGTERMed hundreds of times at random moments, with
    over 1,024 descriptors open: each signal ends the wait at once. (The wait on a
    ``threading.Event`` set by the handler hung about once in 100: the handler blocked on
    the lock its own thread held inside ``Event.wait()``, and a deleted pod was SIGKILLed
    at the end of its grace period without beginning its hand-over. A ``select()`` on the
    pipe refused the descriptor past 1,024.)"""
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root / "runtime" / "src")},
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in child.stdout or []:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    randoms = random.Random(7)
    try:
        for round_ in range(_SIGNAL_ROUNDS):
            assert lines.get(timeout=30) == f"waiting {round_}\n"
            time.sleep(randoms.uniform(0, 0.01))
            child.send_signal(signal.SIGTERM)
            try:
                said = lines.get(timeout=10)
            except queue.Empty:
                pytest.fail(f"round {round_}: the wait did not end within 10 s of SIGTERM")
            assert said == f"stopped {round_}\n"
        assert child.wait(30) == 0
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
