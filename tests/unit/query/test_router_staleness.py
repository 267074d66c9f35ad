"""The router under ``max_staleness_ms`` (query/client.py): it asks only the copies the
members' layouts report within the bound, active first, then the least stale.

Scripted hosts as in test_router_fallback.py: the routing decisions are the subject, and
the number of requests a bounded query costs.
"""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.query.staleness import StalenessBoundError
from tests.unit.query.test_router_fallback import (
    KEY_PATH,
    METADATA_PATH,
    STORE,
    ScriptedRouter,
    metadata,
)

BOUND = 1_000
MEMBERS = ["a:1", "b:1", "c:1", "d:1", "e:1"]


def layout(member: str, address: str, copy: dict[str, Any]) -> Any:
    return 200, {"member": member, "address": address, "stores": {STORE: {"2": copy}}}


def reported(role: str, lag: int, staleness: int | None) -> dict[str, Any]:
    """A copy as a runtime that reports staleness writes it (null: cannot tell)."""
    return {"role": role, "lag": lag, "as_of_ms": None, "staleness_ms": staleness}


def bounded_value(role: str, staleness: int | None, count: int = 7) -> Any:
    """A copy's answer to a bounded key query, as the server judges it."""

    def answer(query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        bound = int(query["max_staleness_ms"])
        if staleness is None or staleness > bound:
            return 409, {"max_staleness_ms": bound, "staleness_ms": staleness, "error": "stale"}
        body = {"found": True, "value": count, "role": role, "stale": role != "active"}
        return 200, {**body, "lag": 0, "partition": 2, "staleness_ms": staleness}

    return answer


def cluster(active_staleness: int | None) -> dict[str, Any]:
    """a is the assigned active (a copy moving away: ``active_staleness``); b a standby far
    behind, c restoring (unknown), d a standby within the bound but with more lag than b
    and c, e a standby within the bound and fresher than d."""
    return {
        "a:1": {
            METADATA_PATH: metadata("a:1", ["b:1", "d:1"], MEMBERS),
            "/v1/layout": layout("0", "a:1", reported("active", 0, active_staleness)),
            KEY_PATH: bounded_value("active", active_staleness),
        },
        "b:1": {
            "/v1/layout": layout("1", "b:1", reported("standby", 1, 90_000)),
            KEY_PATH: bounded_value("standby", 90_000),
        },
        "c:1": {
            "/v1/layout": layout("2", "c:1", reported("restoring", 2, None)),
            KEY_PATH: bounded_value("active", None),
        },
        "d:1": {
            "/v1/layout": layout("3", "d:1", reported("standby", 9, 600)),
            KEY_PATH: bounded_value("standby", 600, count=6),
        },
        "e:1": {
            "/v1/layout": layout("4", "e:1", reported("standby", 8, 20)),
            KEY_PATH: bounded_value("standby", 20, count=5),
        },
    }


def key_requests(router: ScriptedRouter) -> list[str]:
    return [host for host, path, _ in router.asked if path == KEY_PATH]


def test_a_bounded_query_asks_only_copies_reported_within_the_bound_least_stale_first() -> None:
    router = ScriptedRouter(["a:1"], cluster(active_staleness=5_000))
    result = router.get(STORE, "apple", max_staleness_ms=BOUND)
    assert (result.host, result.value) == ("e:1", 5)
    # The active (refused), then e: b, c and d are never asked. Without the layouts'
    # staleness the router asked b, c, e in lag order before an answer (4 requests).
    assert key_requests(router) == ["a:1", "e:1"]


def test_a_copy_that_crossed_the_bound_since_its_report_refuses_and_the_next_answers() -> None:
    answers = cluster(active_staleness=5_000)
    answers["e:1"][KEY_PATH] = bounded_value("standby", 2_000)  # staler by now
    router = ScriptedRouter(["a:1"], answers)
    assert router.get(STORE, "apple", max_staleness_ms=BOUND).host == "d:1"
    assert key_requests(router) == ["a:1", "e:1", "d:1"]


def test_the_active_copy_answers_a_bounded_query_in_one_request() -> None:
    router = ScriptedRouter(["a:1"], cluster(active_staleness=0))
    assert router.get(STORE, "apple", max_staleness_ms=BOUND).host == "a:1"
    assert key_requests(router) == ["a:1"]
    assert "/v1/layout" not in {path for _, path, _ in router.asked}


def test_when_no_copy_is_reported_within_the_bound_none_is_asked_again() -> None:
    answers = cluster(active_staleness=5_000)
    for host in ("d:1", "e:1"):
        answers[host]["/v1/layout"] = layout(host, host, reported("standby", 1, 3_000))
    router = ScriptedRouter(["a:1"], answers)
    with pytest.raises(StalenessBoundError) as refused:
        router.get(STORE, "apple", max_staleness_ms=BOUND)
    assert refused.value.least_staleness_ms == 3_000
    assert key_requests(router) == ["a:1"]


def test_copies_of_a_runtime_that_reports_no_staleness_are_still_asked_after_the_others() -> None:
    answers = cluster(active_staleness=5_000)
    # d and e run an older runtime: their layouts say nothing of staleness.
    answers["d:1"]["/v1/layout"] = layout("3", "d:1", {"role": "standby", "lag": 9})
    answers["e:1"]["/v1/layout"] = layout("4", "e:1", {"role": "standby", "lag": 8})
    answers["e:1"][KEY_PATH] = bounded_value("standby", 2_000)
    router = ScriptedRouter(["a:1"], answers)
    assert router.get(STORE, "apple", max_staleness_ms=BOUND).host == "d:1"
    assert key_requests(router) == ["a:1", "e:1", "d:1"]
