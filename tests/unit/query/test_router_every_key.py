"""The router's queries over every key (``fetch_all_windows``, ``fetch_all_sessions``),
against scripted hosts: each partition is read from one host only, a host whose cursor a
move refused (410) is read again from the start, a partition that moved to a host asked
before it got there is still found, and ``max_staleness_ms`` reaches every host."""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.query.client import QueryFailedError, WindowedEntry
from tests.unit.query.test_router_fallback import ScriptedRouter

STORE = "windows"
PATH = f"/v1/stores/{STORE}/windows"
LAYOUT = (200, {"store_owners": {STORE: 1}, "tasks": ["0_0", "1_0", "1_1", "1_2"]})


def entry(key: str) -> dict[str, Any]:
    return {"key": key, "start": 0, "end": 10, "value": 1}


def serving(data: dict[int, list[str]], moves: list[dict[int, list[str]]] | None = None) -> Any:
    """A member's every-key window pages, one entry a page, over the partitions it serves
    (``data``, less those excluded). ``moves``: what it serves after each 410 it answers
    (a later page whose cursor names a partition it no longer serves)."""
    state = {"data": data}

    def answer(query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        excluded = {int(p) for p in query.get("exclude_partitions", "").split(",") if p}
        held = {p: keys for p, keys in state["data"].items() if p not in excluded}
        cursor = query.get("cursor")
        if cursor is not None:
            named, _, index = cursor.partition("~")
            partitions = [int(p) for p in named.split(".")]
            if not set(partitions) <= set(held):
                if moves:
                    state["data"] = moves.pop(0)
                return 410, {"error": "start the query again without a cursor"}
            start = int(index)
        else:
            partitions, start = sorted(held), 0
        keys = sorted(k for p in partitions for k in held[p])
        more = start + 1 < len(keys)
        body = {
            "partitions": partitions,
            "skipped_partitions": [],
            "entries": [entry(k) for k in keys[start : start + 1]],
            "next_cursor": f"{'.'.join(map(str, partitions))}~{start + 1}" if more else None,
        }
        return 200, body

    return answer


def keys(entries: list[WindowedEntry]) -> list[str]:
    return [e.key for e in entries]


def test_each_partition_is_read_from_one_host_and_the_bound_reaches_every_host() -> None:
    # With a bound, a holds partition 1's standby within it as well as its active 0; b
    # holds 1 and 2: told to leave out what a read, it serves 2 only.
    router = ScriptedRouter(
        ["a:1", "b:1"],
        {
            "a:1": {"/v1/layout": LAYOUT, PATH: serving({0: ["a0"], 1: ["b1"]})},
            "b:1": {PATH: serving({1: ["b1"], 2: ["c2", "d2"]})},
        },
    )
    assert keys(router.fetch_all_windows(STORE, max_staleness_ms=500)) == ["a0", "b1", "c2", "d2"]
    asked = [(host, query) for host, path, query in router.asked if path == PATH]
    assert all(query["max_staleness_ms"] == "500" for _, query in asked)
    assert [q.get("exclude_partitions") for h, q in asked if h == "b:1"] == ["0,1", "0,1"]


def test_a_host_whose_cursor_a_move_refused_is_read_again_from_the_start() -> None:
    # a's partition 1 moves to b between a's first and second page: a's pages are started
    # again (its first page's entries are not kept twice) and b serves 1 and 2.
    router = ScriptedRouter(
        ["a:1", "b:1"],
        {
            "a:1": {
                "/v1/layout": LAYOUT,
                PATH: serving({0: ["a0"], 1: ["b1"]}, moves=[{0: ["a0"]}]),
            },
            "b:1": {PATH: serving({1: ["b1"], 2: ["c2"]})},
        },
    )
    assert keys(router.fetch_all_windows(STORE)) == ["a0", "b1", "c2"]


def test_a_partition_that_moved_to_a_host_already_asked_is_asked_for_again() -> None:
    # b has given partition 1 away before it was asked; a, asked first, got it after: a
    # second round asks a for what is missing.
    answers: dict[str, Any] = {
        "a:1": {"/v1/layout": LAYOUT, PATH: serving({0: ["a0"]})},
        "b:1": {PATH: serving({2: ["c2"]})},
    }
    router = ScriptedRouter(["a:1", "b:1"], answers)
    original = router._get

    def moving(host: str, path: str, query: dict[str, str] | None = None) -> Any:
        result = original(host, path, query)
        if host == "b:1" and path == PATH:
            answers["a:1"][PATH] = serving({0: ["a0"], 1: ["b1"]})
        return result

    router._get = moving  # type: ignore[method-assign]
    assert sorted(keys(router.fetch_all_windows(STORE))) == ["a0", "b1", "c2"]


def test_a_partition_no_host_answers_fails_naming_it() -> None:
    router = ScriptedRouter(
        ["a:1", "b:1"],
        {
            "a:1": {"/v1/layout": LAYOUT, PATH: serving({0: ["a0"]})},
            "b:1": {PATH: serving({2: ["c2"]})},
        },
    )
    with pytest.raises(QueryFailedError, match=r"partitions \[1\] answered nowhere"):
        router.fetch_all_windows(STORE, max_staleness_ms=10)


def test_a_one_key_page_whose_copy_went_away_is_continued_by_another_copy() -> None:
    # a served the first page of apple's windows, then its copy moved to b: the cursor
    # (a key position) is routed again and b's copy continues after it.
    key_path = f"/v1/stores/{STORE}/windows/apple"
    metadata_path = f"/v1/stores/{STORE}/metadata/apple"
    answers: dict[str, Any] = {}

    def page(start: int, more: bool) -> dict[str, Any]:
        return {
            "entries": [{"key": "apple", "start": start, "end": start + 10, "value": start}],
            "next_cursor": f"~{start}" if more else None,
            "role": "active",
            "stale": False,
            "lag": 0,
            "partition": 0,
        }

    def on_a(query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if "cursor" in query:
            return 421, {"error": "this instance does not host partition 0"}
        answers["a:1"][metadata_path] = (200, {"active_host": "b:1", "partition": 0})
        return 200, page(0, more=True)

    def on_b(query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        assert query["cursor"] == "~0"
        return 200, page(10, more=False)

    answers["a:1"] = {metadata_path: (200, {"active_host": "a:1", "partition": 0}), key_path: on_a}
    answers["b:1"] = {key_path: on_b}
    router = ScriptedRouter(["a:1"], answers)
    result = router.fetch_windows(STORE, "apple")
    assert [e.start for e in result.entries] == [0, 10]
    assert result.host == "b:1"
