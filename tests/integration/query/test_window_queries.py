"""Interactive queries of window and session stores, over HTTP and through the router.

One instance (two partitions, both active here) counts clicks per key in
10-second tumbling windows and in sessions with a 1-minute gap; its query
server answers a key's windows in a time range, every key's windows, a key's
sessions and every key's sessions, with the isolation level and pagination of
the key-value queries, and refuses to read a store as the wrong kind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition, partition_for_key
from eddyline_runtime.processing import SessionWindows, StreamsBuilder, TimeWindows, Topology
from eddyline_runtime.query.client import QueryRouter, WindowedEntry
from eddyline_runtime.query.layout import topology_hash
from eddyline_runtime.query.position import position_from_json
from eddyline_runtime.query.server import QueryServer
from tests.support.http_client import http_get
from tests.support.ports import free_port
from tests.support.word_count import streams_config

PARTITIONS = 2
WINDOWS, SESSIONS = "clicks-per-10s", "click-sessions"
# (user, timestamp): u1 in windows 0 and 10 000 and two sessions; u2 once; u3 twice.
CLICKS = [("u1", 1_000), ("u1", 2_000), ("u1", 12_000), ("u2", 5_000), ("u3", 3_000),
          ("u3", 9_000), ("u1", 200_000)]  # fmt: skip


def topology() -> Topology:
    builder = StreamsBuilder()
    grouped = builder.stream("clicks", key_serde="string", value_serde="string").group_by_key()
    grouped.windowed_by(TimeWindows.of_size_with_grace(10_000, 1_000_000)).count(WINDOWS)
    grouped.windowed_by(SessionWindows.of_inactivity_gap_with_grace(60_000, 1_000_000)).count(
        SESSIONS
    )
    return builder.build()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp_path: Path = tmp_path_factory.mktemp("window-queries")
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("clicks", PARTITIONS)
    for user, timestamp in CLICKS:
        partition = partition_for_key(user.encode(), PARTITIONS)
        log.produce(TopicPartition("clicks", partition), [Record(user.encode(), b"c", timestamp)])
    address = f"127.0.0.1:{free_port()}"
    config = streams_config(
        tmp_path / "state", **{"application.server": address, "num.standby.replicas": 0}
    )
    instance = StreamsInstance(topology(), config, log)
    instance.start()
    server = QueryServer(instance, "127.0.0.1", int(address.rpartition(":")[2]))
    server.start()
    try:
        instance.wait_until_caught_up(30)
        yield address
    finally:
        server.stop()
        instance.close(30)
        log.close()


def get(address: str, path: str, **query: str) -> tuple[int, Any]:
    response = http_get(address, path, **query)
    return response.status, response.json()


def test_a_keys_windows_in_a_time_range(served: str) -> None:
    status, body = get(served, f"/v1/stores/{WINDOWS}/windows/u1", **{"from": "0", "to": "10000"})
    assert status == 200, body
    assert body["entries"] == [
        {"key": "u1", "start": 0, "end": 10_000, "value": 2},
        {"key": "u1", "start": 10_000, "end": 20_000, "value": 1},
    ]
    assert (body["role"], body["stale"], body["next_cursor"]) == ("active", False, None)
    assert body["isolation"] == "READ_COMMITTED"
    _, later = get(served, f"/v1/stores/{WINDOWS}/windows/u1", **{"from": "10001"})
    assert [e["start"] for e in later["entries"]] == [200_000]
    _, uncommitted = get(served, f"/v1/stores/{WINDOWS}/windows/u2", isolation="READ_UNCOMMITTED")
    assert uncommitted["isolation"] == "READ_UNCOMMITTED"
    assert uncommitted["entries"] == [{"key": "u2", "start": 0, "end": 10_000, "value": 1}]


def test_all_keys_windows_page_by_page(served: str) -> None:
    expected = {("u1", 0, 2), ("u1", 10_000, 1), ("u1", 200_000, 1), ("u2", 0, 1), ("u3", 0, 2)}
    _, whole = get(served, f"/v1/stores/{WINDOWS}/windows")
    assert {(e["key"], e["start"], e["value"]) for e in whole["entries"]} == expected
    assert sorted(whole["partitions"]) == [0, 1] and whole["next_cursor"] is None
    paged: list[Any] = []
    query: dict[str, str] = {"limit": "2"}
    while True:
        status, page = get(served, f"/v1/stores/{WINDOWS}/windows", **query)
        assert status == 200 and len(page["entries"]) <= 2
        paged.extend(page["entries"])
        if page["next_cursor"] is None:
            break
        query["cursor"] = page["next_cursor"]
    assert paged == whole["entries"]
    _, ranged = get(served, f"/v1/stores/{WINDOWS}/windows", **{"from": "5000", "to": "10000"})
    assert [(e["key"], e["start"]) for e in ranged["entries"]] == [("u1", 10_000)]


def test_sessions_of_a_key_and_of_all_keys(served: str) -> None:
    status, body = get(served, f"/v1/stores/{SESSIONS}/sessions/u1")
    assert status == 200, body
    assert body["entries"] == [
        {"key": "u1", "start": 1_000, "end": 12_000, "value": 3},
        {"key": "u1", "start": 200_000, "end": 200_000, "value": 1},
    ]
    _, bounded = get(served, f"/v1/stores/{SESSIONS}/sessions/u1", earliest_end="100000")
    assert [e["start"] for e in bounded["entries"]] == [200_000]
    _, everyone = get(served, f"/v1/stores/{SESSIONS}/sessions", latest_start="10000")
    assert sorted((e["key"], e["start"], e["end"], e["value"]) for e in everyone["entries"]) == [
        ("u1", 1_000, 12_000, 3),
        ("u2", 5_000, 5_000, 1),
        ("u3", 3_000, 9_000, 2),
    ]


def test_wrong_kind_and_bad_bounds_are_refused_with_the_way_out(served: str) -> None:
    status, body = get(served, f"/v1/stores/{SESSIONS}/windows/u1")
    assert status == 400 and "/sessions" in body["error"]
    status, body = get(served, f"/v1/stores/{WINDOWS}/sessions")
    assert status == 400 and "/windows" in body["error"]
    status, body = get(served, f"/v1/stores/{WINDOWS}/windows", **{"from": "soon"})
    assert status == 400 and "from must be a time" in body["error"]
    status, body = get(served, "/v1/stores/nope/windows")
    assert status == 404


def test_the_router_fetches_windows_and_sessions(served: str) -> None:
    router = QueryRouter([served])
    result = router.fetch_windows(WINDOWS, "u1", 0, 10_000)
    assert result.entries == [
        WindowedEntry("u1", 0, 10_000, 2),
        WindowedEntry("u1", 10_000, 20_000, 1),
    ]
    assert result.role == "active" and not result.stale
    sessions = router.fetch_sessions(SESSIONS, "u3", isolation="READ_UNCOMMITTED")
    assert sessions.entries == [WindowedEntry("u3", 3_000, 9_000, 2)]
    everything = router.fetch_all_windows(WINDOWS)
    assert len(everything) == 5
    assert sorted((e.key, e.start) for e in router.fetch_all_sessions(SESSIONS)) == [
        ("u1", 1_000),
        ("u1", 200_000),
        ("u2", 5_000),
        ("u3", 3_000),
    ]


def pages(address: str, path: str, **query: str) -> list[Any]:
    """Every entry of a paginated query, two at a time."""
    entries: list[Any] = []
    paged: dict[str, str] = {**query, "limit": "2"}
    while True:
        status, page = get(address, path, **paged)
        assert status == 200, page
        entries.extend(page["entries"])
        if page["next_cursor"] is None:
            return entries
        paged["cursor"] = page["next_cursor"]


def test_window_key_ranges_are_ordered_by_key_then_start_across_partitions(served: str) -> None:
    path = f"/v1/stores/{WINDOWS}/windows"
    status, body = get(served, path, key_from="u1", key_to="u2")
    assert status == 200, body
    assert [(e["key"], e["start"], e["end"], e["value"]) for e in body["entries"]] == [
        ("u1", 0, 10_000, 2),
        ("u1", 10_000, 20_000, 1),
        ("u1", 200_000, 210_000, 1),
        ("u2", 0, 10_000, 1),
    ]
    assert (body["key_from"], body["key_to"], body["backward"]) == ("u1", "u2", False)
    assert sorted(body["partitions"]) == [0, 1]
    # Every key (no bounds), page by page, forward then backward: exact reverses.
    forward = pages(served, path)
    assert [(e["key"], e["start"]) for e in forward] == [
        ("u1", 0), ("u1", 10_000), ("u1", 200_000), ("u2", 0), ("u3", 0)
    ]  # fmt: skip
    assert pages(served, path, backward="true") == forward[::-1]
    _, open_below = get(served, path, key_to="u1", **{"from": "5000"})
    assert [(e["key"], e["start"]) for e in open_below["entries"]] == [
        ("u1", 10_000),
        ("u1", 200_000),
    ]


def test_one_keys_windows_backward_with_key_as_a_parameter(served: str) -> None:
    status, body = get(
        served, f"/v1/stores/{WINDOWS}/windows", key="u1", backward="true", to="100000"
    )
    assert status == 200, body
    assert [(e["start"], e["end"], e["value"]) for e in body["entries"]] == [
        (10_000, 20_000, 1),
        (0, 10_000, 2),
    ]
    # Routed as /keys is: the copy that answers says what it is.
    assert (body["key"], body["role"], body["stale"]) == ("u1", "active", False)
    _, by_path = get(served, f"/v1/stores/{WINDOWS}/windows/u1", backward="true", to="100000")
    assert by_path["entries"] == body["entries"]


def test_session_key_ranges_and_backward_sessions(served: str) -> None:
    path = f"/v1/stores/{SESSIONS}/sessions"
    _, ranged = get(served, path, key_from="u1", key_to="u3", latest_start="10000")
    assert [(e["key"], e["start"], e["end"]) for e in ranged["entries"]] == [
        ("u1", 1_000, 12_000),
        ("u2", 5_000, 5_000),
        ("u3", 3_000, 9_000),
    ]
    _, backward = get(served, path, key="u1", backward="true")
    assert [(e["start"], e["end"], e["value"]) for e in backward["entries"]] == [
        (200_000, 200_000, 1),
        (1_000, 12_000, 3),
    ]
    forward = pages(served, path)
    assert pages(served, path, backward="1") == forward[::-1]
    assert len(forward) == 4


def test_bad_key_and_direction_parameters_are_named(served: str) -> None:
    path = f"/v1/stores/{WINDOWS}/windows"
    status, body = get(served, path, key="u1", key_from="u0")
    assert status == 400 and "key and key_from/key_to cannot be combined" in body["error"]
    status, body = get(served, f"{path}/u1", key="u1")
    assert status == 400 and "key is given twice" in body["error"]
    status, body = get(served, path, backward="newest-first")
    assert status == 400 and body["error"] == 'backward must be true or false, got "newest-first"'
    status, body = get(served, path, cursor="AA")
    assert status == 400 and "cursor" in body["error"] and "next_cursor" in body["error"]
    status, body = get(served, f"/v1/stores/{SESSIONS}/sessions", earliest_end="-1")
    assert status == 400 and "earliest_end must be a time in milliseconds" in body["error"]


def test_the_router_reads_backward_and_key_ranges(served: str) -> None:
    router = QueryRouter([served])
    backward = router.fetch_windows(WINDOWS, "u1", backward=True)
    assert [e.start for e in backward.entries] == [200_000, 10_000, 0]
    sessions = router.fetch_sessions(SESSIONS, "u1", backward=True)
    assert [e.start for e in sessions.entries] == [200_000, 1_000]
    ranged = router.fetch_all_windows(WINDOWS, key_from="u2", key_to="u3")
    assert [(e.key, e.start) for e in ranged] == [("u2", 0), ("u3", 0)]
    assert router.fetch_all_windows(WINDOWS, key_from="u2", backward=True) == ranged[::-1]
    ranged_sessions = router.fetch_all_sessions(SESSIONS, key_to="u1", backward=True)
    assert [(e.key, e.start) for e in ranged_sessions] == [("u1", 200_000), ("u1", 1_000)]


def test_window_and_session_answers_say_what_they_reflect_as_key_answers_do(served: str) -> None:
    key_answers = [
        get(served, f"/v1/stores/{WINDOWS}/windows/u1", max_staleness_ms="0")[1],
        get(served, f"/v1/stores/{SESSIONS}/sessions/u1", max_staleness_ms="0")[1],
    ]
    every_key = [
        get(served, f"/v1/stores/{WINDOWS}/windows", max_staleness_ms="0")[1],
        get(served, f"/v1/stores/{SESSIONS}/sessions", max_staleness_ms="0")[1],
    ]
    revision = topology_hash(topology().describe())
    copies = [*key_answers, *(c for body in every_key for c in body["copies"])]
    for body in [*key_answers, *every_key]:
        assert (body["member"], body["revision"], body["host"]) == ("0", revision, served), body
    for body in every_key:
        assert sorted(c["partition"] for c in body["copies"]) == sorted(body["partitions"])
    for copy in copies:
        assert (copy["role"], copy["stale"], copy["staleness_ms"]) == ("active", False, 0)
        assert copy["as_of_ms"] >= copy["committed_at_ms"] > 0
        # Every click was processed and committed: the position is each partition's last
        # click (none, for a partition no click went to).
        assert position_from_json(copy["position"]) == POSITIONS[copy["partition"]]
    result = QueryRouter([served]).fetch_sessions(SESSIONS, "u1", max_staleness_ms=0)
    assert result.reflects.staleness_ms == 0 and result.reflects.revision == revision


# The position of each partition's store once every click is processed: its last offset.
POSITIONS = {
    partition: {
        TopicPartition("clicks", partition): offset
        for offset in [
            sum(
                1 for user, _ in CLICKS if partition_for_key(user.encode(), PARTITIONS) == partition
            )
            - 1
        ]
        if offset >= 0
    }
    for partition in range(PARTITIONS)
}
