"""Failover of a local replica group: kill the active copy of a task, its standby takes over.

``examples/wordcount`` runs as three local replicas (``LocalGroup``: one
process each, ``exactly_once_v2``, one standby per stateful task) on a
SQLite log. Once everything is processed and the standby of one word's
partition has replayed its changelog to the end, the replica holding that
partition's active ``word-counts`` task (``1_<partition>``) is SIGKILLed
and, while the group supervisor (``group.poll()``) republishes the
assignment and restarts the replica after its back-off:

* queries through the ``QueryRouter`` (which falls back to standbys with
  ``allow_stale``) answer the word's count within 2 s of the kill, with the
  count from before the kill, and no gap between answers exceeds 2 s until
  the killed replica is back and all input is processed;
* with more input produced while the promotion runs, and after the killed
  replica's restart, the published counts are exactly the input's, and each
  word's successive counts on the output topic strictly increase (a
  duplicated or replayed commit would repeat one or go back);
* the assignor promotes the member that held the standby, and that member's
  restore of the task replays only the changelog tail its standby had not
  applied at the kill (here: nothing, it had caught up), far less than the
  store holds.

Three members share four stateful tasks (2/1/1). Killing the member with two
of them promotes both standbys. Killing a member with one also promotes its
standby holder: that holder already runs two stateful tasks, so the assignor
swaps one of them to the third member, which holds its standby (both restore
only their tail).

While the promoted copy restores, the router also asks it (with
``allow_stale``), ranked by lag with the standbys, so it never answers from
an empty standby just placed on a third member
(:func:`test_router_prefers_the_freshest_copy_while_promoting`).
"""

from __future__ import annotations

import http.server
import itertools
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.local_group import LocalGroup
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.membership import Membership
from eddyline_runtime.partitions import TaskId, TopicPartition, partition_for_key
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.support.replica_group import (
    CHANGELOG,
    COUNTING_SUBTOPOLOGY,
    PARTITIONS,
    STORE,
    STRINGS,
    all_ready,
    behind,
    distinct_keys,
    log_sizes,
    output_history,
    produce_lines,
    replica_logs,
    restore_lines,
    running_replica_group,
    wait_caught_up,
    wait_standby_current,
)

VOCABULARY = [f"w{i}" for i in range(1_000)]
CUMULATIVE_WEIGHTS = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(VOCABULARY))))
STALE_ANSWER_SECONDS = 2.0
# No bound on how far a stale answer may trail: the router must pick the
# freshest copy by itself (not the empty standby the new assignment just
# created on a third member while the promoted copy restores).
ACCEPTABLE_LAG = None
FAILOVER_SECONDS = 30.0


class NotPromotedError(AssertionError):
    """The killed member's task went to a member other than its standby holder."""


def generate_lines(count: int, seed: int) -> list[str]:
    """Lines of 1..8 words of a Zipf-like vocabulary."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choices(VOCABULARY, cum_weights=CUMULATIVE_WEIGHTS, k=rng.randint(1, 8)))
        for _ in range(count)
    ]


def most_frequent_word_in(partition: int) -> str:
    return next(
        word
        for word in VOCABULARY
        if partition_for_key(STRINGS.serialize(word), PARTITIONS) == partition
    )


# -- one failover, observed -------------------------------------------------------------


@dataclass
class Answer:
    at: float  # seconds after the kill
    found: bool
    value: Any
    host: str
    role: str
    stale: bool
    lag: int


@dataclass
class Failover:
    """What happened around one SIGKILL."""

    word: str
    task: str
    victim: str
    victim_stateful_tasks: int
    standby: str
    standby_address: str
    before: int  # the word's count at the kill
    standby_position: int  # the standby's next changelog offset at the kill
    changelog_end_at_kill: int
    store_keys: int
    answers: list[Answer] = field(default_factory=list)
    failures: list[tuple[float, str]] = field(default_factory=list)
    # (generation, active owner of the task, its standby owners), as published
    assignments: list[tuple[int, str, list[str]]] = field(default_factory=list)
    restores: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    expected: Counter[str] = field(default_factory=Counter)
    history: dict[str, list[int]] = field(default_factory=dict)
    member_at: dict[str, str] = field(default_factory=dict)
    promoted: Answer | None = None  # the first fresh answer from a member other than the victim

    @property
    def tail(self) -> int:
        """Changelog records of the task the standby had not applied at the kill."""
        return self.changelog_end_at_kill - self.standby_position


def run_failover(tmp_path: Path, *, victim_stateful_tasks: int) -> Failover:
    """Kill the member running ``victim_stateful_tasks`` stateful tasks; observe until done."""
    first = generate_lines(3_000, seed=1)
    with running_replica_group(tmp_path, first) as (log, group):
        wait_caught_up(log, group, timeout=45)
        failover = _prepare(log, group, victim_stateful_tasks)
        failover.expected.update(word for line in first for word in line.split())
        assert failover.before == failover.expected[failover.word]
        _kill_and_query(log, group, failover)
        wait_caught_up(log, group, timeout=45)
        failover.history = output_history(log)
        return failover


def _prepare(log: SqliteLog, group: LocalGroup, victim_stateful_tasks: int) -> Failover:
    """Pick the victim and the word; wait for the standby; note the state at the kill."""
    assignment = group.assignment
    assert assignment is not None
    stateful = {
        member_id: sorted(t for t in tasks if t.subtopology == COUNTING_SUBTOPOLOGY)
        for member_id, tasks in assignment.active.items()
    }
    victim = next(m for m, tasks in stateful.items() if len(tasks) == victim_stateful_tasks)
    partition = stateful[victim][0].partition
    word = most_frequent_word_in(partition)
    member_at = {m.address or "": m.id for m in group.members}
    router = QueryRouter(list(member_at))
    metadata = router.metadata(STORE, word)
    assert int(metadata["partition"]) == partition, metadata
    assert member_at[metadata["active_host"]] == victim, metadata
    assert len(metadata["standby_hosts"]) == 1, metadata
    standby_address = metadata["standby_hosts"][0]
    lag = wait_standby_current(log, group, standby_address, partition, timeout=20)
    before = router.get(STORE, word)
    assert (before.role, before.stale) == ("active", False), before
    changelog = TopicPartition(CHANGELOG, partition)
    return Failover(
        word=word,
        task=str(TaskId(COUNTING_SUBTOPOLOGY, partition)),
        victim=victim,
        victim_stateful_tasks=victim_stateful_tasks,
        standby=member_at[standby_address],
        standby_address=standby_address,
        before=int(before.value),
        standby_position=int(lag["current_offset_position"]),
        changelog_end_at_kill=log.end_offset(changelog),
        store_keys=distinct_keys(log, changelog),
        member_at=member_at,
    )


def _kill_and_query(log: SqliteLog, group: LocalGroup, failover: Failover) -> None:
    """SIGKILL the victim, then query the word until a promoted copy answered fresh, the
    victim is back (restarted, tasks rebalanced onto it, ready) and all input is processed.

    More input goes in right after the first answer, so the promoted task has
    work waiting (and the answers may then grow).
    """
    router = QueryRouter(list(failover.member_at), acceptable_lag=ACCEPTABLE_LAG)
    task = TaskId.parse(failover.task)
    since = log_sizes(group)
    more = [*generate_lines(1_000, seed=2), *[failover.word] * 50]
    killed_at = time.monotonic()
    group.kill(failover.victim)
    deadline = killed_at + FAILOVER_SECONDS
    while True:
        group.poll()
        membership = Membership.read(group.membership_file)
        if membership is not None and (
            not failover.assignments or failover.assignments[-1][0] != membership.generation
        ):
            failover.assignments.append(
                (
                    membership.generation,
                    membership.assignment.active_owner(task),
                    membership.assignment.standby_owners(task),
                )
            )
        try:
            result = router.get(STORE, failover.word)
        except QueryFailedError as error:
            failover.failures.append((time.monotonic() - killed_at, str(error)))
        else:
            at = time.monotonic() - killed_at
            failover.answers.append(
                Answer(
                    at,
                    result.found,
                    result.value,
                    result.host,
                    result.role,
                    result.stale,
                    result.lag,
                )
            )
            if len(failover.answers) == 1:
                produce_lines(log, more)
                failover.expected.update(word for line in more for word in line.split())
            promoted = failover.member_at[result.host] != failover.victim
            if result.role == "active" and not result.stale and promoted and not failover.promoted:
                failover.promoted = failover.answers[-1]
        if (
            failover.promoted is not None
            and failover.victim in group.alive()
            and all_ready(group)
            and not behind(log)
        ):
            break
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the failover did not complete in {FAILOVER_SECONDS} s: alive {group.alive()}, "
                f"behind {behind(log)}, {failover}\n{replica_logs(group)}"
            )
        time.sleep(0.02)
    for line in restore_lines(group, since, failover.task):
        failover.restores.setdefault(line["member"], []).append(line)


# -- the checks ---------------------------------------------------------------------------


def check_stale_answers(failover: Failover) -> None:
    """Answered by the standby within 2 s, with the count at the kill; then never a gap
    over 2 s, through the promotion and the victim's restart, until all input is processed.

    The standby holder answers first: as a standby (stale) while the others
    still name the dead member, or already as the promoted active copy.
    """
    answers = failover.answers
    assert answers, failover.failures
    first = answers[0]
    assert first.at <= STALE_ANSWER_SECONDS, (first, failover.failures[:5])
    assert first.host == failover.standby_address, (first, failover.standby_address)
    assert first.value == failover.before, (first, failover.before)
    times = [0.0, *(answer.at for answer in answers)]
    longest_gap = max(later - earlier for earlier, later in itertools.pairwise(times))
    assert longest_gap <= STALE_ANSWER_SECONDS, (longest_gap, answers, failover.failures)
    for answer in answers:
        # Never behind the count at the kill, never beyond what the input explains.
        assert answer.found and failover.before <= answer.value, (answer, answers)
        assert answer.value <= failover.expected[failover.word], (answer, answers)


def check_exactly_once(failover: Failover) -> None:
    """The last published count per word is the input's; each word's counts strictly rise."""
    history = failover.history
    assert {word: counts[-1] for word, counts in history.items()} == dict(failover.expected)
    for word, counts in history.items():
        assert all(a < b for a, b in itertools.pairwise(counts)), (word, counts)


def check_promotion(failover: Failover) -> None:
    """The standby holder took the task over and restored only its tail."""
    owners = [
        owner
        for generation, owner, _ in failover.assignments
        if owner != failover.victim and generation > 1
    ]
    assert owners, failover.assignments
    assert failover.promoted is not None
    fresh_from = failover.member_at[failover.promoted.host]
    if owners[0] != failover.standby or fresh_from != failover.standby:
        raise NotPromotedError(
            f"task {failover.task} of the killed member {failover.victim} went to member "
            f"{owners[0]} (first fresh answer from {fresh_from}), not to its standby holder "
            f"{failover.standby}; published (generation, active, standbys): "
            f"{failover.assignments}; restores after the kill: {failover.restores}; store "
            f"{failover.store_keys} keys, changelog {failover.changelog_end_at_kill} records"
        )
    assert failover.standby in failover.restores, failover.restores
    promotion = failover.restores[failover.standby][0]
    assert promotion["changelog"] == f"{CHANGELOG}-{int(failover.task.split('_')[1])}"
    assert promotion["first"] == failover.standby_position, (promotion, failover)
    assert promotion["records"] <= failover.tail, (promotion, failover.tail)
    assert failover.store_keys >= 100, failover.store_keys
    assert promotion["records"] <= failover.store_keys // 100, (promotion, failover.store_keys)


# -- the tests ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "victim_stateful_tasks",
    [
        pytest.param(2, id="victim-runs-two-stateful-tasks"),
        pytest.param(1, id="victim-runs-one-stateful-task"),
    ],
)
def test_killed_active_fails_over_to_its_standby(
    tmp_path: Path, victim_stateful_tasks: int
) -> None:
    failover = run_failover(tmp_path, victim_stateful_tasks=victim_stateful_tasks)
    first, promoted = failover.answers[0], failover.promoted
    assert promoted is not None
    print(
        f"\nkilled replica {failover.victim} (active {failover.task}, word "
        f'"{failover.word}" = {failover.before}): first answer after {first.at:.3f} s '
        f"({first.role} on {failover.member_at[first.host]}); fresh from "
        f"{failover.member_at[promoted.host]} after {promoted.at:.3f} s; "
        f"{len(failover.answers)} answers, {len(failover.failures)} failed queries until "
        f"{failover.answers[-1].at:.3f} s; assignments {failover.assignments}; restores "
        f"{failover.restores}; tail {failover.tail}, store {failover.store_keys} keys, "
        f"changelog {failover.changelog_end_at_kill} records"
    )
    check_stale_answers(failover)
    check_exactly_once(failover)
    check_promotion(failover)


# -- the router during a promotion (stub hosts, no processes) -----------------------------


class _StubHost(http.server.ThreadingHTTPServer):
    """Answers fixed JSON per request path (query string included)."""

    def __init__(self) -> None:
        self.responses: dict[str, tuple[int, dict[str, Any]]] = {}
        super().__init__(("127.0.0.1", 0), _StubHandler)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _StubHandler(http.server.BaseHTTPRequestHandler):
    server: _StubHost

    def do_GET(self) -> None:
        status, body = self.server.responses.get(self.path, (404, {"error": "no such path"}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_router_prefers_the_freshest_copy_while_promoting() -> None:
    """The moment after a failover's reassignment, as the replicas' servers answer it.

    The standby holder was promoted and restores its (empty) tail: without
    ``allow_stale`` it answers 503, with it the count, and ``/v1/layout`` says
    it restores with lag 0. The new assignment put the task's standby on a member that never
    had it: lag = the whole changelog, so the key is not there yet. KIP-535's
    ``includeStaleStores`` covers the restoring active copy too; the freshest
    copy (lag 0) should answer, not "not found".
    """
    promoted, fresh_standby = _StubHost(), _StubHost()
    key_path = f"/v1/stores/{STORE}/keys/w3"
    promoted.responses = {
        f"/v1/stores/{STORE}/metadata/w3": (
            200,
            {
                "active_host": promoted.address,
                "standby_hosts": [fresh_standby.address],
                "partition": 0,
            },
        ),
        key_path: (503, {"error": "partition 0 is still restoring here (lag 0)", "lag": 0}),
        f"{key_path}?allow_stale=true": (
            200,
            {
                "found": True,
                "value": 424,
                "role": "active",
                "stale": True,
                "lag": 0,
                "partition": 0,
            },
        ),
        "/v1/layout": (
            200,
            {
                "member": "0",
                "address": promoted.address,
                "stores": {STORE: {"0": {"role": "restoring", "lag": 0}}},
            },
        ),
    }
    fresh_standby.responses = {
        f"{key_path}?allow_stale=true": (
            200,
            {
                "found": False,
                "value": None,
                "role": "standby",
                "stale": True,
                "lag": 516,
                "partition": 0,
            },
        ),
        "/v1/layout": (
            200,
            {
                "member": "1",
                "address": fresh_standby.address,
                "stores": {STORE: {"0": {"role": "standby", "lag": 516}}},
            },
        ),
    }
    threads = [
        threading.Thread(target=host.serve_forever, args=(0.01,), daemon=True)
        for host in (promoted, fresh_standby)
    ]
    for thread in threads:
        thread.start()
    try:
        result = QueryRouter([promoted.address]).get(STORE, "w3")
    finally:
        for host in (promoted, fresh_standby):
            host.shutdown()
            host.server_close()
    assert (result.found, result.value, result.host) == (True, 424, promoted.address), result
