"""The client router (KIP-535) and ``eddyline query`` against a group of instances.

Three instances run a word count in one process (own state directory, own
SqliteLog object on the shared log file, own query server), under one
assignment with a standby for every stateful task. The router must answer
from the active copy while it is up, fall back to the freshest standby within
the acceptable lag when it is not, and otherwise fail saying what each host
answered.

To make a standby deterministically behind, its instance reads the log
through :class:`PausableLog`, which can hold back the changelog records a
standby would replay (and only those: restoration still reads them).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeAlias

import pytest

from eddyline_runtime.query.client import QueryFailedError, QueryResult, QueryRouter
from eddyline_runtime.query.layout import topology_hash
from tests.support.http_client import http_get
from tests.support.logs import PausableLog
from tests.support.ports import free_port
from tests.support.query_cluster import (
    PARTITIONS,
    STORE,
    partition_of,
    produce_lines,
    reassigned,
    running_cluster,
)
from tests.support.query_cluster import Cluster as HarnessCluster
from tests.support.waiting import wait_for
from tests.support.word_count import word_count

REPO = Path(__file__).resolve().parents[3]


def http_json(address: str, path: str, **query: str) -> tuple[int, Any]:
    response = http_get(address, path, **query)
    return response.status, response.json()


# The harness's group, each member reading the log through a PausableLog.
Cluster: TypeAlias = HarnessCluster[PausableLog]

VOCABULARY = ["apple", "banana", "cherry", "date", "elder", "fig", "grape", "hazel", "and/or"]
LINES = [" ".join(word for j, word in enumerate(VOCABULARY) if (i + j) % 3 != 0) for i in range(18)]
EXPECTED = Counter(" ".join(LINES).split())


def a_word_in(partition: int) -> str:
    words = sorted(word for word in EXPECTED if partition_of(word) == partition)
    assert words, f"no word of the vocabulary lands in partition {partition}"
    return words[0]


@pytest.fixture(scope="module")
def steady(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A group nobody stops: for the tests that only read."""
    yield from running_cluster(tmp_path_factory.mktemp("router-steady"), LINES, PausableLog)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A group of the test's own, which it may stop members of."""
    yield from running_cluster(tmp_path, LINES, PausableLog)


# ---------------------------------------------------------------------------------------
# While every member is up
# ---------------------------------------------------------------------------------------


def test_the_router_answers_from_the_active_host_whoever_it_asks_first(steady: Cluster) -> None:
    for bootstrap in steady.nodes:
        router = QueryRouter([bootstrap.address])
        for word, count in EXPECTED.items():
            partition = partition_of(word)
            assert router.get(STORE, word) == QueryResult(
                found=True,
                value=count,
                host=steady.active_node(partition).address,
                role="active",
                stale=False,
                lag=0,
                partition=partition,
            )


def test_the_router_reports_a_missing_key_as_not_found(steady: Cluster) -> None:
    result = QueryRouter([steady.nodes[0].address]).get(STORE, "no-such-word")
    assert (result.found, result.value, result.role) == (False, None, "active")


def test_the_router_passes_the_isolation_level(steady: Cluster) -> None:
    word = a_word_in(0)
    router = QueryRouter([steady.nodes[1].address])
    assert router.get(STORE, word, isolation="READ_UNCOMMITTED").value == EXPECTED[word]
    assert router.get(STORE, word, isolation="read_committed").value == EXPECTED[word]


def test_the_router_metadata_matches_the_assignment(steady: Cluster) -> None:
    word = a_word_in(2)
    assert QueryRouter([steady.nodes[0].address]).metadata(STORE, word) == {
        "active_host": steady.active_node(2).address,
        "standby_hosts": [steady.standby_node(2).address],
        "partition": 2,
        "member_hosts": sorted(node.address for node in steady.nodes),
    }


def test_the_router_skips_unreachable_bootstrap_hosts(steady: Cluster) -> None:
    dead = f"127.0.0.1:{free_port()}"
    router = QueryRouter([dead, steady.nodes[2].address], timeout=1)
    word = a_word_in(1)
    assert router.get(STORE, word).value == EXPECTED[word]


def test_the_router_fails_naming_each_bootstrap_host_when_none_answers() -> None:
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    with pytest.raises(QueryFailedError) as failure:
        QueryRouter(dead, timeout=1).get(STORE, "apple")
    assert len(failure.value.attempts) == 2
    for host, attempt in zip(dead, failure.value.attempts, strict=True):
        assert attempt.startswith(f"{host}: unreachable")


def test_an_unknown_store_fails_after_the_first_host_with_the_stores_named(
    steady: Cluster,
) -> None:
    with pytest.raises(QueryFailedError) as failure:
        QueryRouter([n.address for n in steady.nodes]).get("nope", "apple")
    (attempt,) = failure.value.attempts  # a 404: asking the other hosts would not help
    assert attempt.startswith(f"{steady.nodes[0].address}: 404")
    assert STORE in attempt


# What an answer reflects, as the command prints it (docs/queries.md).
REFLECTS = (
    *("member", "revision", "position", "changelog_offset"),
    *("committed_at_ms", "as_of_ms", "staleness_ms"),
)


def test_eddyline_query_prints_one_json_line(steady: Cluster) -> None:
    word = "and/or"
    partition = partition_of(word)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "eddyline_runtime.cli",
            "query",
            "--bootstrap",
            f"127.0.0.1:{free_port()},{steady.other_node(partition).address}",
            STORE,
            word,
            "--max-staleness-ms",
            "60000",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    answer = json.loads(lines[0])
    reflects = {name: answer.pop(name) for name in REFLECTS}
    active = steady.active_node(partition)
    assert (reflects["member"], reflects["staleness_ms"]) == (active.member.id, 0)
    assert reflects["revision"] == topology_hash(word_count().describe())
    assert reflects["position"] and reflects["changelog_offset"] >= 0
    assert reflects["as_of_ms"] >= reflects["committed_at_ms"] > 0
    assert answer == {
        "key": word,
        "found": True,
        "value": EXPECTED[word],
        "host": steady.active_node(partition).address,
        "role": "active",
        "stale": False,
        "lag": 0,
        "partition": partition,
    }


def test_eddyline_query_fails_with_exit_code_1_and_the_reason(steady: Cluster) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "eddyline_runtime.cli",
            "query",
            "--bootstrap",
            steady.nodes[0].address,
            "nope",
            "apple",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("error: ") and "404" in done.stderr
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------------
# When members go away
# ---------------------------------------------------------------------------------------


def test_when_its_only_bootstrap_host_goes_the_router_asks_the_members_it_learned_of(
    cluster: Cluster,
) -> None:
    """The bootstrap is often the query Service, which may have no Ready pod for a moment
    (every pod restarting or restoring): the members an earlier answer named still serve,
    and the router asks them for the key's metadata instead of failing."""
    partition = 0
    active, _standby, other = cluster.copies(partition)
    router = QueryRouter([other.address], timeout=1)
    word = a_word_in(partition)
    assert router.get(STORE, word).value == EXPECTED[word]
    other.stop()
    result = router.get(STORE, word)
    assert (result.value, result.host, result.role) == (EXPECTED[word], active.address, "active")


def test_without_its_active_host_the_router_answers_from_the_standby(cluster: Cluster) -> None:
    partition = 0
    word = a_word_in(partition)
    active, standby, other = cluster.copies(partition)
    active.stop()
    # Ask the dead member first, as a client with a stale host list would.
    router = QueryRouter([active.address, other.address], timeout=1)
    assert router.get(STORE, word) == QueryResult(
        found=True,
        value=EXPECTED[word],
        host=standby.address,
        role="standby",
        stale=True,
        lag=0,
        partition=partition,
    )
    # A caught-up standby is within any acceptable lag >= 0...
    assert QueryRouter([other.address], acceptable_lag=0).get(STORE, word).role == "standby"
    # ...but not within -1: the router refuses and says why for each host.
    with pytest.raises(QueryFailedError) as refused:
        QueryRouter([other.address], acceptable_lag=-1, timeout=1).get(STORE, word)
    assert refused.value.attempts == [
        refused.value.attempts[0],
        f"standby {standby.address}: lag 0 exceeds the acceptable -1",
    ]
    assert refused.value.attempts[0].startswith(f"active {active.address}: unreachable")
    assert "accept staler answers" in str(refused.value)
    # Words of partitions whose active host is alive still come from it.
    for other_partition in range(PARTITIONS):
        if cluster.active_node(other_partition) is not active:
            result = router.get(STORE, a_word_in(other_partition))
            assert result.role == "active"


def test_with_neither_copy_up_the_router_fails_listing_each_host(cluster: Cluster) -> None:
    partition = 1
    word = a_word_in(partition)
    active, standby, other = cluster.copies(partition)
    active.stop()
    standby.stop()
    with pytest.raises(QueryFailedError) as failure:
        QueryRouter([other.address], timeout=1).get(STORE, word)
    attempts = failure.value.attempts
    assert len(attempts) == 3, attempts
    assert attempts[0].startswith(f"active {active.address}: unreachable")
    assert attempts[1].startswith(f"standby {standby.address}: unreachable")
    # The one member still up was asked too, and holds no copy.
    assert (
        attempts[2]
        == f"none of the 1 members that answered (2 asked) holds partition {partition} of the store"
    )
    assert f'key "{word}" of store "{STORE}"' in str(failure.value)


def test_a_closed_instance_whose_server_still_runs_sends_the_router_to_the_standby(
    cluster: Cluster,
) -> None:
    partition = 2
    word = a_word_in(partition)
    active, standby = cluster.active_node(partition), cluster.standby_node(partition)
    # The server keeps answering (a member's stops only after its final commits): its
    # stores are closed, so a read is 503 with Retry-After, not 421 naming itself as active.
    active.instance.close(30)
    status, body = http_json(active.address, f"/v1/stores/{STORE}/keys/{word}")
    assert status == 503, body
    assert "shutting down" in body["error"]
    result = QueryRouter([active.address]).get(STORE, word)
    assert (result.host, result.role, result.value) == (standby.address, "standby", EXPECTED[word])


@pytest.mark.usefixtures("pausable_standby_replay")
def test_a_standby_behind_by_more_than_the_acceptable_lag_is_refused(cluster: Cluster) -> None:
    partition = 0
    word = a_word_in(partition)
    active, standby, other = cluster.copies(partition)
    changelog = cluster.changelog(partition)
    replicated_up_to = cluster.log.end_offset(changelog)
    # The standby stops replaying; the active keeps counting.
    standby.log.standby_replay_paused.set()
    produce_lines(cluster.log, [f"{word} {word}"] * 6)
    wait_for(
        lambda: (
            cluster.inputs_committed()
            and http_json(active.address, f"/v1/stores/{STORE}/keys/{word}")[1].get("value")
            == EXPECTED[word] + 12
        ),
        "the active host counted the new lines",
    )
    end = cluster.log.end_offset(changelog)
    assert end > replicated_up_to
    lag = end - replicated_up_to

    def standby_lag() -> dict[str, int]:
        status, body = http_json(standby.address, "/v1/lags")
        assert status == 200
        return dict(body[STORE][str(partition)])

    # The standby sees the changelog's new end, and reports how far behind it is.
    wait_for(lambda: standby_lag()["end_offset_position"] == end, "the standby sees the new end")
    assert standby_lag() == {
        "current_offset_position": replicated_up_to,
        "end_offset_position": end,
        "offset_lag": lag,
    }
    status, body = http_json(standby.address, f"/v1/stores/{STORE}/keys/{word}", allow_stale="true")
    assert (status, body["value"], body["lag"], body["stale"]) == (200, EXPECTED[word], lag, True)

    active.stop()
    with pytest.raises(QueryFailedError) as refused:
        QueryRouter([other.address], acceptable_lag=lag - 1, timeout=1).get(STORE, word)
    assert f"standby {standby.address}: lag {lag} exceeds the acceptable {lag - 1}" in (
        refused.value.attempts
    )
    for acceptable in (lag, None):
        result = QueryRouter([other.address], acceptable_lag=acceptable, timeout=1).get(STORE, word)
        # The stale count from before the pause, and how stale it is.
        assert result == QueryResult(
            found=True,
            value=EXPECTED[word],
            host=standby.address,
            role="standby",
            stale=True,
            lag=lag,
            partition=partition,
        )
    # Replay resumes: the standby catches up, and the router returns the new count.
    standby.log.standby_replay_paused.clear()
    wait_for(lambda: standby_lag()["offset_lag"] == 0, "the standby caught up")
    result = QueryRouter([other.address], acceptable_lag=0, timeout=1).get(STORE, word)
    assert (result.value, result.lag, result.role) == (EXPECTED[word] + 12, 0, "standby")


# ---------------------------------------------------------------------------------------
# While a task moves (a new generation that not every member has acted on yet)
# ---------------------------------------------------------------------------------------


def key_path(word: str) -> str:
    return f"/v1/stores/{STORE}/keys/{urllib.parse.quote(word, safe='')}"


def holds(address: str, partition: int) -> bool:
    status, body = http_json(address, "/v1/layout")
    return status == 200 and str(partition) in body["stores"].get(STORE, {})


def test_the_previous_owner_answers_stale_queries_until_the_new_active_opens_its_copy(
    cluster: Cluster,
) -> None:
    partition = 1
    word = a_word_in(partition)
    old, standby, new = cluster.copies(partition)
    moved = reassigned(cluster.assignment, partition, active=new.member.id, standbys=[])
    # The standby's member acts on the new generation: it drops its copy.
    standby.instance.apply_assignment(moved)
    wait_for(lambda: not holds(standby.address, partition), "the standby dropped its copy")
    # The previous owner has heard of it but its stream thread has not closed the task yet
    # (what apply_assignment does first, without handing the threads their share), and
    # the new owner has not heard of it: it does not host the partition (421).
    old.instance.assignment = moved
    assert http_json(new.address, key_path(word))[0] == 421
    # The previous owner's copy is no longer fresh, but answers stale queries.
    status, body = http_json(old.address, key_path(word))
    assert status == 503 and "moving to another member" in body["error"], body
    assert body["active_host"] == new.address
    router = QueryRouter([standby.address], timeout=1)
    assert router.metadata(STORE, word)["active_host"] == new.address
    assert router.get(STORE, word) == QueryResult(
        found=True,
        value=EXPECTED[word],
        host=old.address,
        role="active",
        stale=True,
        lag=0,
        partition=partition,
    )
    # A fresh query goes to the assigned active only, and says why it got no answer.
    with pytest.raises(QueryFailedError) as refused:
        router.get(STORE, word, allow_stale=False)
    (attempt,) = refused.value.attempts
    assert attempt.startswith(f"active {new.address}: 421 ")
    assert "allow stale answers" in str(refused.value)


@pytest.mark.usefixtures("pausable_standby_replay")
def test_a_copy_restoring_from_empty_is_not_preferred_over_a_caught_up_one(
    cluster: Cluster,
) -> None:
    partition = 0
    word = a_word_in(partition)
    active, standby, other = cluster.copies(partition)
    active.stop()
    # The next generation moves the standby to a member that starts it from empty and
    # (its replay held back) stays there; the old standby's member has not acted on it
    # yet and still holds its caught-up copy, which the metadata no longer names.
    moved = reassigned(
        cluster.assignment, partition, active=active.member.id, standbys=[other.member.id]
    )
    other.log.standby_replay_paused.set()
    other.instance.apply_assignment(moved)
    end = cluster.log.end_offset(cluster.changelog(partition))

    def empty_copy_lag() -> int | None:
        status, body = http_json(other.address, "/v1/lags")
        held = body.get(STORE, {}).get(str(partition)) if status == 200 else None
        return None if held is None else int(held["offset_lag"])

    wait_for(lambda: empty_copy_lag() == end, "the new standby sees the changelog's end")
    # Asked directly, the empty copy answers that the word is not there...
    status, body = http_json(other.address, key_path(word), allow_stale="true")
    assert (status, body["found"], body["lag"]) == (200, False, end), body
    # ...so the router asks the freshest copy first.
    router = QueryRouter([other.address], timeout=1)
    assert router.metadata(STORE, word)["standby_hosts"] == [other.address]
    assert router.get(STORE, word) == QueryResult(
        found=True,
        value=EXPECTED[word],
        host=standby.address,
        role="standby",
        stale=True,
        lag=0,
        partition=partition,
    )
