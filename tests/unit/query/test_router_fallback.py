"""The router's choice of copies (query/client.py), against scripted hosts.

Each host answers from a table (status, JSON body) per path, as the query
servers would mid-rebalance: the routing decisions are the subject here, the
servers' answers are covered by tests/integration/query/.
"""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.query.client import QueryFailedError, QueryResult, QueryRouter

STORE = "counts"
KEY_PATH = f"/v1/stores/{STORE}/keys/apple"
METADATA_PATH = f"/v1/stores/{STORE}/metadata/apple"
UNREACHABLE: tuple[int, dict[str, Any]] = (0, {"error": "unreachable (refused)"})


class ScriptedRouter(QueryRouter):
    """A router whose hosts answer from ``answers[host][path]``; others are unreachable."""

    def __init__(self, bootstrap: list[str], answers: dict[str, Any], **options: Any) -> None:
        super().__init__(bootstrap, **options)
        self.answers = answers
        self.asked: list[tuple[str, str, dict[str, str]]] = []

    def _get(
        self, host: str, path: str, query: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        self.asked.append((host, path, dict(query or {})))
        answer = self.answers.get(host, {}).get(path, UNREACHABLE)
        status, body = answer(query or {}) if callable(answer) else answer
        return int(status), dict(body)


def metadata(active: str | None, standbys: list[str], members: list[str]) -> Any:
    return (
        200,
        {
            "active_host": active,
            "standby_hosts": standbys,
            "partition": 2,
            "member_hosts": members,
        },
    )


def layout(member: str, address: str, copies: dict[int, tuple[str, int]]) -> Any:
    return (
        200,
        {
            "member": member,
            "address": address,
            "stores": {
                STORE: {str(p): {"role": role, "lag": lag} for p, (role, lag) in copies.items()}
            },
        },
    )


def value(found: bool, role: str, lag: int, count: int = 7) -> Any:
    def answer(query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if query.get("allow_stale") != "true" and (role != "active" or lag):
            return 503, {"error": "stale copy"}
        body = {"found": found, "value": count if found else None, "role": role}
        return 200, {**body, "stale": lag > 0 or role != "active", "lag": lag, "partition": 2}

    return answer


NOT_HOSTED = (421, {"error": "this instance does not host partition 2"})


def test_the_previous_owner_answers_while_the_new_active_has_not_opened_the_partition() -> None:
    # b is active now but has not opened partition 2 (421); the named standby c does not
    # hold it yet; a, the previous owner, still has its copy open and is not named.
    router = ScriptedRouter(
        ["b:1"],
        {
            "a:1": {
                "/v1/layout": layout("0", "a:1", {2: ("active", 0)}),
                KEY_PATH: value(True, "active", 3),
            },
            "b:1": {
                METADATA_PATH: metadata("b:1", ["c:1"], ["a:1", "b:1", "c:1"]),
                "/v1/layout": layout("1", "b:1", {}),
                KEY_PATH: NOT_HOSTED,
            },
            "c:1": {"/v1/layout": layout("2", "c:1", {})},
        },
    )
    result = router.get(STORE, "apple")
    assert result == QueryResult(True, 7, "a:1", "active", True, 3, 2)
    assert ("a:1", KEY_PATH, {"allow_stale": "true"}) in router.asked
    # A fresh query goes to the assigned active only and says why it failed.
    router.asked.clear()
    with pytest.raises(QueryFailedError) as refused:
        router.get(STORE, "apple", allow_stale=False)
    assert refused.value.attempts == ["active b:1: 421 this instance does not host partition 2"]
    assert "allow stale answers" in str(refused.value)
    assert {host for host, path, _ in router.asked if path == KEY_PATH} == {"b:1"}


def test_copies_are_tried_freshest_first_and_a_copy_restoring_from_empty_comes_last() -> None:
    # The active a is restoring from empty (lag 900: no key yet), c is a warm-up 4 behind
    # and d a standby 2 behind: d, then c, and a only if neither answers.
    members = ["a:1", "c:1", "d:1"]
    answers: dict[str, Any] = {
        "a:1": {
            METADATA_PATH: metadata("a:1", ["d:1"], members),
            "/v1/layout": layout("0", "a:1", {2: ("restoring", 900)}),
            KEY_PATH: value(False, "active", 900),
        },
        "c:1": {
            "/v1/layout": layout("2", "c:1", {2: ("standby", 4)}),
            KEY_PATH: value(True, "standby", 4, count=5),
        },
        "d:1": {
            "/v1/layout": layout("3", "d:1", {2: ("standby", 2)}),
            KEY_PATH: value(True, "standby", 2, count=6),
        },
    }
    router = ScriptedRouter(["a:1"], answers)
    assert router.get(STORE, "apple") == QueryResult(True, 6, "d:1", "standby", True, 2, 2)
    answers["d:1"] = {}  # d went away: the warm-up is next
    assert router.get(STORE, "apple").host == "c:1"
    answers["c:1"] = {}  # only the empty copy is left: its "not found" is the answer
    assert router.get(STORE, "apple") == QueryResult(False, None, "a:1", "active", True, 900, 2)


def test_a_lagging_copy_without_the_key_does_not_hide_a_copy_that_has_it() -> None:
    members = ["a:1", "b:1", "c:1"]
    router = ScriptedRouter(
        ["a:1"],
        {
            "a:1": {METADATA_PATH: metadata("a:1", [], members)},  # the active is gone
            "b:1": {
                "/v1/layout": layout("1", "b:1", {2: ("standby", 10)}),
                KEY_PATH: value(False, "standby", 10),
            },
            "c:1": {
                "/v1/layout": layout("2", "c:1", {2: ("restoring", 50)}),
                KEY_PATH: value(True, "active", 50),
            },
        },
    )
    result = router.get(STORE, "apple")
    assert (result.found, result.host, result.lag) == (True, "c:1", 50)


def test_the_acceptable_lag_and_copies_without_data_are_respected() -> None:
    router = ScriptedRouter(
        ["a:1"],
        {
            "a:1": {METADATA_PATH: metadata("a:1", ["b:1"], ["a:1", "b:1", "c:1"])},
            "b:1": {"/v1/layout": layout("1", "b:1", {2: ("standby", 20)})},
            "c:1": {"/v1/layout": layout("2", "c:1", {2: ("restorePending", 0)})},
        },
        acceptable_lag=10,
    )
    with pytest.raises(QueryFailedError) as refused:
        router.get(STORE, "apple")
    assert refused.value.attempts == [
        "active a:1: unreachable (refused)",
        "standby b:1: lag 20 exceeds the acceptable 10",
        "restorePending copy on c:1: holds no data yet (restorePending)",
    ]
    # Only the fresh query to the active host: no copy was within the bounds.
    assert [query for _, path, query in router.asked if path == KEY_PATH] == [{}]


def test_a_member_seen_once_is_asked_after_it_leaves_the_assignment_until_it_stops_answering() -> (
    None
):
    answers: dict[str, Any] = {
        "s:1": {METADATA_PATH: metadata("n:1", [], ["n:1", "old:1"])},
        "n:1": {"/v1/layout": layout("1", "n:1", {}), KEY_PATH: NOT_HOSTED},
        "old:1": {
            "/v1/layout": layout("9", "old:1", {2: ("active", 1)}),
            KEY_PATH: value(True, "active", 1),
        },
    }
    router = ScriptedRouter(["s:1"], answers)
    assert router.get(STORE, "apple").host == "old:1"
    # The next generation no longer lists the leaving member, which still has its copy.
    answers["s:1"][METADATA_PATH] = metadata("n:1", [], ["n:1"])
    assert router.get(STORE, "apple").host == "old:1"
    # Once it stops answering, it is forgotten.
    answers["old:1"] = {}
    with pytest.raises(QueryFailedError):
        router.get(STORE, "apple")
    router.asked.clear()
    with pytest.raises(QueryFailedError):
        router.get(STORE, "apple")
    assert "old:1" not in {host for host, _, _ in router.asked}


def test_one_member_reached_twice_is_one_copy() -> None:
    # The query Service and the pod's own address reach the same member: one copy, asked
    # at the address it reports.
    router = ScriptedRouter(
        ["svc:1", "p:1"],
        {
            "svc:1": {
                METADATA_PATH: metadata(None, [], []),
                "/v1/layout": layout("7", "p:1", {2: ("standby", 0)}),
            },
            "p:1": {
                "/v1/layout": layout("7", "p:1", {2: ("standby", 0)}),
                KEY_PATH: value(True, "standby", 0),
            },
        },
    )
    assert router.get(STORE, "apple").host == "p:1"
    assert [h for h, path, _ in router.asked if path == KEY_PATH] == ["p:1"]
