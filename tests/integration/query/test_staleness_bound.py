"""Queries bounded by time (``max_staleness_ms``) and what every answer reflects.

Through the real query server on the embedded log: the active copy answers
with staleness 0 and the position its committed data reflects; a standby held
behind its changelog (:class:`PausableLog`) is refused with 409 once it is
staler than the bound and answers within it; a copy held mid-restore answers a
stale query with its position, and is refused by any bound (it cannot tell its
staleness). Staleness only grows while a copy stays behind, so "staler than a
bound" is made certain by choosing the bound below a staleness already seen,
never by sleeping.
"""

from __future__ import annotations

import shutil
import threading
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeAlias

import pytest

from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import ChangeBatch, SqliteLog
from eddyline_runtime.membership import StoreRole
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.query.client import QueryRouter
from eddyline_runtime.query.layout import topology_hash
from eddyline_runtime.query.position import position_from_json
from eddyline_runtime.query.server import QueryServer
from eddyline_runtime.query.staleness import StalenessBoundError
from eddyline_runtime.restore.replay.lag import LagInfo, wall_clock_ms
from eddyline_runtime.state.as_of_marker import AS_OF_FILE_NAME
from tests.support.http_client import http_get
from tests.support.logs import PausableLog
from tests.support.ports import free_port
from tests.support.query_cluster import (
    COUNTS_SUBTOPOLOGY,
    PARTITIONS,
    STORE,
    Node,
    partition_of,
    produce_lines,
    reassigned,
    running_cluster,
)
from tests.support.query_cluster import Cluster as HarnessCluster
from tests.support.waiting import wait_for
from tests.support.word_count import APP, INPUT, streams_config, word_count
from tests.support.word_count import produce_lines as produce_input

Cluster: TypeAlias = HarnessCluster[PausableLog]

VOCABULARY = ["apple", "banana", "cherry", "date", "elder", "fig", "grape", "hazel"]
LINES = [" ".join(word for j, word in enumerate(VOCABULARY) if (i + j) % 3 != 0) for i in range(12)]
EXPECTED = Counter(" ".join(LINES).split())
AN_HOUR_MS = 3_600_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from running_cluster(tmp_path, LINES, PausableLog)


def a_word_in(partition: int) -> str:
    return next(word for word in sorted(EXPECTED) if partition_of(word) == partition)


def key_path(word: str) -> str:
    return f"/v1/stores/{STORE}/keys/{urllib.parse.quote(word, safe='')}"


def http_json(address: str, path: str, **query: str) -> tuple[int, Any]:
    response = http_get(address, path, **query)
    return response.status, response.json()


def committed_position(cluster: Cluster, partition: int) -> dict[TopicPartition, int]:
    """The counting task's committed input offsets, as the position of the last record
    its committed data reflects (KIP-796: the offset, not the next one)."""
    inputs = cluster.layout.input_partitions(TaskId(COUNTS_SUBTOPOLOGY, partition))
    committed = cluster.log.committed_offsets(APP, inputs)
    return {tp: offset - 1 for tp, offset in committed.items()}


def test_the_active_copy_answers_with_staleness_0_and_the_position_it_reflects(
    cluster: Cluster,
) -> None:
    partition = 0
    word = a_word_in(partition)
    active, standby, _ = cluster.copies(partition)
    status, body = http_json(active.address, key_path(word), max_staleness_ms="0")
    assert status == 200, body
    assert body["value"] == EXPECTED[word]
    assert (body["role"], body["stale"], body["staleness_ms"]) == ("active", False, 0)
    assert body["as_of_ms"] >= body["committed_at_ms"] > 0
    assert (body["member"], body["host"]) == (active.member.id, active.address)
    assert body["revision"] == topology_hash(word_count().describe())
    # The value is the count at the position the answer reports: every input committed.
    assert position_from_json(body["position"]) == committed_position(cluster, partition)

    # Its data includes the changelog's last record.
    last_record = cluster.log.end_offset(cluster.changelog(partition)) - 1
    assert body["changelog_offset"] == last_record

    # The standby that replayed everything includes the same record, and says how stale it
    # is; its input position is what its store committed as an active copy: none.
    status, body = http_json(standby.address, key_path(word), allow_stale="true")
    assert status == 200, body
    assert (body["role"], body["member"], body["value"]) == (
        "standby",
        standby.member.id,
        EXPECTED[word],
    )
    assert body["changelog_offset"] == last_record
    assert body["position"] == {}
    assert body["committed_at_ms"] is None  # the active's commit times are not replicated
    assert body["staleness_ms"] is not None and body["staleness_ms"] >= 0

    result = QueryRouter([standby.address]).get(STORE, word, max_staleness_ms=AN_HOUR_MS)
    assert (result.host, result.value) == (active.address, EXPECTED[word])
    assert result.reflects.staleness_ms == 0
    assert result.reflects.member == active.member.id
    assert result.reflects.position == committed_position(cluster, partition)
    assert result.reflects.changelog_offset == last_record


@dataclass(frozen=True)
class HeldBehind:
    """A standby held behind its changelog while the active counted ``word`` on."""

    word: str
    partition: int
    active: Node[PausableLog]
    standby: Node[PausableLog]
    other: Node[PausableLog]
    replicated: int  # the last changelog record the standby's data includes
    behind: dict[str, Any]  # its answer once it has fallen behind

    def standby_answer(self) -> dict[str, Any]:
        status, body = http_json(self.standby.address, key_path(self.word), allow_stale="true")
        assert status == 200, body
        return dict(body)


def hold_standby_behind(cluster: Cluster, partition: int) -> HeldBehind:
    word = a_word_in(partition)
    active, standby, other = cluster.copies(partition)
    replicated = cluster.log.end_offset(cluster.changelog(partition)) - 1
    standby.log.standby_replay_paused.set()
    produce_lines(cluster.log, [f"{word} {word}"] * 3)
    wait_for(
        lambda: (
            http_json(active.address, key_path(word))[1].get("value") == EXPECTED[word] + 6
            and cluster.inputs_committed()
        ),
        "the active host counted the new lines",
    )
    changelog_end = cluster.log.end_offset(cluster.changelog(partition))

    def standby_lag() -> LagInfo:
        return standby.instance.all_local_store_partition_lags()[STORE][partition]

    wait_for(
        lambda: standby_lag().end_offset_position == changelog_end,
        "the standby sees the changelog's new end",
    )
    held = HeldBehind(word, partition, active, standby, other, replicated, {})
    wait_for(lambda: held.standby_answer()["staleness_ms"] >= 1, "the standby fell behind")
    behind = held.standby_answer()
    assert behind["value"] == EXPECTED[word]
    assert behind["changelog_offset"] == replicated
    assert behind["lag"] == changelog_end - standby_lag().current_offset_position > 0
    return replace(held, behind=behind)


@pytest.mark.usefixtures("pausable_standby_replay")
def test_a_standby_staler_than_the_bound_is_refused_with_409_and_answers_within_it(
    cluster: Cluster,
) -> None:
    partition = 1
    word = a_word_in(partition)
    standby = cluster.standby_node(partition)
    # A caught-up standby answers a bound it keeps (its replay loop catches up every turn).
    status, body = http_json(standby.address, key_path(word), max_staleness_ms=str(AN_HOUR_MS))
    assert (status, body["role"], body["value"]) == (200, "standby", EXPECTED[word]), body

    held = hold_standby_behind(cluster, partition)
    # Its staleness only grows until it catches up: a bound below what it already was
    # is certainly exceeded now.
    bound = held.behind["staleness_ms"] - 1
    refused = http_get(standby.address, key_path(word), max_staleness_ms=str(bound))
    assert refused.status == 409, refused.text
    assert "Retry-After" in refused.headers
    body = refused.json()
    assert body["max_staleness_ms"] == bound and body["staleness_ms"] > bound
    assert body["as_of_ms"] == held.behind["as_of_ms"]
    assert f"beyond max_staleness_ms={bound}" in body["error"]
    assert "retry later" in body["error"] and "allow_stale=true" in body["error"]
    assert body["active_host"] == held.active.address

    # Within the bound the standby answers, without allow_stale: the bound says what will do.
    status, body = http_json(standby.address, key_path(word), max_staleness_ms=str(AN_HOUR_MS))
    assert status == 200, body
    assert (body["role"], body["stale"], body["value"]) == ("standby", True, EXPECTED[word])
    assert body["as_of_ms"] == held.behind["as_of_ms"] and body["staleness_ms"] > bound

    # Replay resumes: the standby catches up, and its staleness falls back.
    standby.log.standby_replay_paused.clear()
    wait_for(lambda: held.standby_answer()["lag"] == 0, "the standby caught up")
    caught_up = held.standby_answer()
    assert caught_up["value"] == EXPECTED[word] + 6
    assert caught_up["as_of_ms"] > held.behind["as_of_ms"]


@pytest.mark.usefixtures("pausable_standby_replay")
def test_every_key_reads_skip_a_copy_staler_than_the_bound_and_serve_it_within_one(
    cluster: Cluster,
) -> None:
    held = hold_standby_behind(cluster, 2)
    bound = held.behind["staleness_ms"] - 1
    every_key = f"/v1/stores/{STORE}/all"
    status, body = http_json(held.standby.address, every_key, max_staleness_ms=str(bound))
    assert status == 200 and held.partition in body["skipped_partitions"], body
    status, body = http_json(held.standby.address, every_key, max_staleness_ms=str(AN_HOUR_MS))
    assert status == 200 and held.partition in body["partitions"], body
    [copy] = [c for c in body["copies"] if c["partition"] == held.partition]
    assert copy["role"] == "standby" and copy["staleness_ms"] > bound
    assert copy["changelog_offset"] == held.replicated
    assert body["member"] == held.standby.member.id


@pytest.mark.usefixtures("pausable_standby_replay")
def test_the_router_answers_from_a_copy_within_the_bound_or_says_how_stale_the_freshest_is(
    cluster: Cluster,
) -> None:
    held = hold_standby_behind(cluster, 0)
    bound = held.behind["staleness_ms"] - 1
    # With the active gone, the standby held behind is the only copy left.
    held.active.stop()
    router = QueryRouter([held.other.address], timeout=1)
    with pytest.raises(StalenessBoundError) as none_within:
        router.get(STORE, held.word, max_staleness_ms=bound)
    assert none_within.value.least_staleness_ms is not None
    assert none_within.value.least_staleness_ms > bound
    assert "raise the bound" in str(none_within.value)
    result = router.get(STORE, held.word, max_staleness_ms=AN_HOUR_MS)
    assert (result.host, result.role) == (held.standby.address, "standby")
    assert result.value == EXPECTED[held.word]
    assert result.reflects.as_of_ms == held.behind["as_of_ms"]
    assert result.reflects.changelog_offset == held.replicated
    assert result.reflects.member == held.standby.member.id


@pytest.mark.usefixtures("pausable_standby_replay")
def test_a_standby_promoted_to_active_keeps_its_staleness_while_it_restores_the_tail(
    cluster: Cluster,
) -> None:
    # The active goes away while its standby is behind: the standby's member takes the task
    # on the same open store and restores the tail. Until it is done, its copy is as current
    # as the standby last saw it (as_of_ms), so a query with a bound it keeps is answered;
    # the copy used to forget that at the promotion and refuse every bound (e2e: a pod
    # SIGKILLed, its standby promoted, and no copy of the partition knowing its staleness).
    held = hold_standby_behind(cluster, 0)
    standby, gone = held.standby, held.active
    # Its only standby becomes the active: no standby of it is left.
    promoted = reassigned(cluster.assignment, held.partition, active=standby.member.id, standbys=[])
    standby.log.restoration_released.clear()
    try:
        gone.stop()
        for node in (standby, held.other):
            node.instance.apply_assignment(promoted)
        wait_for(standby.log.restoration_waiting.is_set, "the promoted standby restores")
        [copy] = [
            local
            for local in standby.instance.local_store_partitions(STORE)
            if local.task.partition == held.partition
        ]
        assert copy.role is StoreRole.ACTIVE and not copy.running
        status, body = http_json(
            standby.address, key_path(held.word), max_staleness_ms=str(AN_HOUR_MS)
        )
        assert status == 200, body
        assert (body["role"], body["value"]) == ("active", EXPECTED[held.word])
        assert body["as_of_ms"] == held.behind["as_of_ms"]
        result = QueryRouter([held.other.address], timeout=1).get(
            STORE, held.word, max_staleness_ms=AN_HOUR_MS
        )
        assert (result.host, result.value) == (standby.address, EXPECTED[held.word])
    finally:
        standby.log.restoration_released.set()
    wait_for(
        lambda: (
            http_json(standby.address, key_path(held.word))[1].get("value")
            == EXPECTED[held.word] + 6
        ),
        "the promoted copy restored the tail and counts",
    )


@pytest.mark.usefixtures("pausable_standby_replay")
def test_a_task_moved_away_stays_served_here_as_a_standby_while_new_tasks_restore(
    cluster: Cluster,
) -> None:
    # One assignment moves partition p's task from X to its standby's member (X keeps a
    # standby of it) and gives X a task it holds no copy of, whose restore is held. X must
    # serve p from its standby while it restores: its copy was closed and opened only after
    # every new active task had restored, so p's new owner (restoring the tail) was the only
    # copy left and knew no staleness.
    partition = 1
    mover, taker, _ = cluster.copies(partition)
    fresh = next(q for q in range(PARTITIONS) if cluster.other_node(q) is mover)
    moved_here = reassigned(
        cluster.assignment, partition, active=taker.member.id, standbys=[mover.member.id]
    )
    fresh_standby = cluster.copies(fresh)[1]
    assignment = reassigned(
        moved_here, fresh, active=mover.member.id, standbys=[fresh_standby.member.id]
    )
    mover.log.restoration_released.clear()
    try:
        for node in cluster.nodes:
            node.instance.apply_assignment(assignment)
        wait_for(mover.log.restoration_waiting.is_set, f"member {mover.member.id} restores")
        held = {
            (local.partition, local.role) for local in mover.instance.local_store_partitions(STORE)
        }
        assert (partition, StoreRole.STANDBY) in held, held
        word = a_word_in(partition)
        status, body = http_json(mover.address, key_path(word), max_staleness_ms=str(AN_HOUR_MS))
        assert status == 200, body
        assert (body["role"], body["value"]) == ("standby", EXPECTED[word])
    finally:
        mover.log.restoration_released.set()
    wait_for(
        lambda: (
            http_json(mover.address, key_path(a_word_in(fresh)))[1].get("value")
            == EXPECTED[a_word_in(fresh)]
        ),
        "the gained task restored and answers",
    )


def test_a_bad_max_staleness_is_400_naming_the_form(cluster: Cluster) -> None:
    word = a_word_in(0)
    active = cluster.active_node(0)
    for bad in ("-1", "soon", "1.5"):
        status, body = http_json(active.address, key_path(word), max_staleness_ms=bad)
        assert status == 400, body
        assert "whole number of milliseconds" in body["error"]


# ---------------------------------------------------------------------------------------
# A copy held mid-restore
# ---------------------------------------------------------------------------------------


class HeldRestoreLog(SqliteLog):
    """A SqliteLog whose changelog fetches (a restore's) wait until ``released`` is set."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.released = threading.Event()
        self.waiting = threading.Event()  # a fetch waits for the release

    def fetch_changes(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> ChangeBatch:
        if not self.released.is_set():
            self.waiting.set()
            self.released.wait(60)
        return super().fetch_changes(tp, offset, max_records)


def run_word_count(log: SqliteLog, state: Path, lines: list[str]) -> dict[TopicPartition, int]:
    """Run an instance on ``state`` over ``lines``; returns its store's committed position."""
    instance = StreamsInstance(
        word_count(), streams_config(state, **{"num.standby.replicas": 0}), log
    )
    instance.start()
    try:
        produce_input(log, lines, 1)
        instance.wait_until_caught_up(30)
        [copy] = instance.local_store_partitions(STORE)
        return dict(copy.open_reader(None).position())
    finally:
        instance.close(30)


def as_of_markers(state: Path) -> list[Path]:
    return list(state.rglob(AS_OF_FILE_NAME))


def test_a_restoring_copy_answers_stale_queries_with_its_position_and_no_bound(
    tmp_path: Path,
) -> None:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(INPUT, 1)
    # The state of a copy from before the last lines: restoring it replays their changes.
    earlier = run_word_count(log, tmp_path / "state", ["a b a"])
    shutil.copytree(tmp_path / "state", tmp_path / "earlier-state")
    # As a copy killed mid-run leaves it: no record of how current it was.
    (marker,) = as_of_markers(tmp_path / "earlier-state")
    marker.unlink()
    run_word_count(log, tmp_path / "state", ["a c"])
    address = f"127.0.0.1:{free_port()}"
    held = HeldRestoreLog(tmp_path / "log.db")
    config = streams_config(
        tmp_path / "earlier-state",
        **{"num.standby.replicas": 0, "application.server": address},
    )
    instance = StreamsInstance(word_count(), config, held)
    server = QueryServer(instance, "127.0.0.1", int(address.rpartition(":")[2]))
    try:
        instance.start()
        server.start()
        wait_for(held.waiting.is_set, "the copy is restoring")
        path = key_path("a")
        status, body = http_json(address, path)
        assert status == 503 and "still restoring" in body["error"], body
        status, body = http_json(address, path, allow_stale="true")
        assert status == 200, body
        assert (body["value"], body["role"], body["stale"]) == (2, "active", True)
        assert body["lag"] > 0
        assert position_from_json(body["position"]) == earlier
        assert (body["committed_at_ms"], body["as_of_ms"], body["staleness_ms"]) == (
            None,
            None,
            None,
        )
        refused = http_get(address, path, max_staleness_ms=str(AN_HOUR_MS))
        assert refused.status == 409, refused.text
        assert refused.json()["staleness_ms"] is None
        assert "does not know its staleness" in refused.json()["error"]
        with pytest.raises(StalenessBoundError) as none_within:
            QueryRouter([address], timeout=1).get(STORE, "a", max_staleness_ms=AN_HOUR_MS)
        assert none_within.value.least_staleness_ms is None

        held.released.set()
        instance.wait_until_caught_up(30)
        status, body = http_json(address, path, max_staleness_ms="0")
        assert (status, body["value"], body["staleness_ms"]) == (200, 3, 0), body
    finally:
        held.released.set()
        server.stop()
        instance.close(30)
        held.close()
        log.close()


def test_a_copy_closed_cleanly_knows_its_staleness_while_it_restores_after_a_restart(
    tmp_path: Path,
) -> None:
    # The same copy as above, closed cleanly this time: its store kept the time of its
    # last commit (state/as_of_marker.py), so while it replays what came since it reports
    # that time and answers a bound it keeps, instead of not knowing until it caught up.
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(INPUT, 1)
    before = wall_clock_ms()
    run_word_count(log, tmp_path / "state", ["a b a"])
    closed = wall_clock_ms()
    shutil.copytree(tmp_path / "state", tmp_path / "earlier-state")
    assert len(as_of_markers(tmp_path / "earlier-state")) == 1
    run_word_count(log, tmp_path / "state", ["a c"])
    address = f"127.0.0.1:{free_port()}"
    held = HeldRestoreLog(tmp_path / "log.db")
    config = streams_config(
        tmp_path / "earlier-state",
        **{"num.standby.replicas": 0, "application.server": address},
    )
    instance = StreamsInstance(word_count(), config, held)
    server = QueryServer(instance, "127.0.0.1", int(address.rpartition(":")[2]))
    try:
        instance.start()
        server.start()
        wait_for(held.waiting.is_set, "the copy is restoring")
        # Read once at open: a later crash cannot revive it.
        assert as_of_markers(tmp_path / "earlier-state") == []
        path = key_path("a")
        asked = wall_clock_ms()
        status, body = http_json(address, path, max_staleness_ms=str(AN_HOUR_MS))
        assert status == 200, body
        assert (body["value"], body["role"], body["stale"]) == (2, "active", True)
        assert body["lag"] > 0 and body["committed_at_ms"] is None
        assert before <= body["as_of_ms"] <= closed
        assert body["staleness_ms"] >= asked - closed
        # Its data is older than the second run's commits: a bound below its staleness
        # refuses it, saying how stale it is.
        refused = http_get(address, path, max_staleness_ms=str(body["staleness_ms"] - 1))
        assert refused.status == 409 and refused.json()["staleness_ms"] is not None
        layout = http_json(address, "/v1/layout")[1]["stores"][STORE]["0"]
        assert (layout["role"], layout["as_of_ms"]) == ("restoring", body["as_of_ms"])
        result = QueryRouter([address], timeout=1).get(STORE, "a", max_staleness_ms=AN_HOUR_MS)
        assert (result.value, result.reflects.as_of_ms) == (2, body["as_of_ms"])

        held.released.set()
        instance.wait_until_caught_up(30)
        status, body = http_json(address, path, max_staleness_ms="0")
        assert (status, body["value"], body["staleness_ms"]) == (200, 3, 0), body
    finally:
        held.released.set()
        server.stop()
        instance.close(30)
        held.close()
        log.close()


def test_a_restoring_pod_is_serving_but_not_processing_ready_and_neither_once_closing(
    tmp_path: Path,
) -> None:
    """Readiness split (issue 36): ``/readyz`` (processing: rollouts, the disruption
    budget, the upgrade's Starting step) stays 503 while a copy restores, but
    ``/readyz/serving`` (the query side) is 200 as soon as a copy is open and answers
    stale queries; once the instance closes, neither is."""
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(INPUT, 1)
    run_word_count(log, tmp_path / "state", ["a b a"])
    shutil.copytree(tmp_path / "state", tmp_path / "earlier-state")
    run_word_count(log, tmp_path / "state", ["a c"])
    address = f"127.0.0.1:{free_port()}"
    held = HeldRestoreLog(tmp_path / "log.db")
    config = streams_config(
        tmp_path / "earlier-state",
        **{"num.standby.replicas": 0, "application.server": address},
    )
    instance = StreamsInstance(word_count(), config, held)
    server = QueryServer(instance, "127.0.0.1", int(address.rpartition(":")[2]))
    try:
        server.start()
        assert http_json(address, "/readyz/serving") == (
            503,
            {"serving": False, "processing": False, "state": "CREATED"},
        )
        instance.start()
        wait_for(held.waiting.is_set, "the copy is restoring")
        status, body = http_json(address, "/readyz/serving")
        assert (status, body["serving"], body["processing"]) == (200, True, False), body
        assert http_json(address, "/readyz")[0] == 503
        status, answer = http_json(address, key_path("a"), allow_stale="true")
        assert (status, answer["value"], answer["stale"]) == (200, 2, True), answer

        held.released.set()
        instance.wait_until_caught_up(30)
        wait_for(lambda: http_json(address, "/readyz")[0] == 200, "processing ready", 5)
        status, body = http_json(address, "/readyz/serving")
        assert (status, body["serving"], body["processing"]) == (200, True, True), body

        instance.close(30)
        status, body = http_json(address, "/readyz/serving")
        assert (status, body["serving"]) == (503, False), body
    finally:
        held.released.set()
        server.stop()
        instance.close(30)
        held.close()
        log.close()
