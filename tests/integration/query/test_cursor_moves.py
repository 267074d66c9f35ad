"""A page cursor across a task's move (query/cursor.py): a later page is continued by any
copy of the partitions the cursor names, or refused with 410 saying to start again;
never silently short.

Three word-count members in this process (tests/support/query_cluster.py), each with one
active and one standby copy of the counting store.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.log import SqliteLog
from eddyline_runtime.query.cursor import PageCursor
from tests.integration.query.test_query_router import reassigned
from tests.support.http_client import http_get
from tests.support.query_cluster import STORE, Cluster, partition_of, running_cluster
from tests.support.waiting import wait_for

VOCABULARY = ["apple", "banana", "cherry", "date", "elder", "fig", "grape", "hazel", "kiwi"]
LINES = [" ".join(word for j, word in enumerate(VOCABULARY) if (i + j) % 3 != 0) for i in range(9)]
EXPECTED = Counter(" ".join(LINES).split())
ALL = f"/v1/stores/{STORE}/all"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster[SqliteLog]]:
    yield from running_cluster(tmp_path, LINES, SqliteLog)


def words_in(*partitions: int) -> dict[str, int]:
    return {word: n for word, n in sorted(EXPECTED.items()) if partition_of(word) in partitions}


def page(address: str, **query: str) -> tuple[int, dict[str, Any]]:
    response = http_get(address, ALL, **query)
    return response.status, response.json()


def read_all(address: str, cursor: str | None = None, **query: str) -> dict[str, int]:
    """Every page from ``address``, from ``cursor`` on."""
    entries: dict[str, int] = {}
    while True:
        status, body = page(address, **query, **({"cursor": cursor} if cursor else {}))
        assert status == 200, body
        entries.update({key: value for key, value in body["entries"]})
        cursor = body["next_cursor"]
        if cursor is None:
            return entries


def holds(address: str, partition: int) -> bool:
    response = http_get(address, "/v1/layout")
    return response.status == 200 and str(partition) in response.json()["stores"][STORE]


def test_a_cursor_whose_partition_moved_away_is_refused_with_410_saying_to_start_again(
    cluster: Cluster[SqliteLog],
) -> None:
    node = cluster.nodes[0]
    (active,) = [p for p in range(3) if cluster.active_node(p) is node]
    (standby,) = [p for p in range(3) if cluster.standby_node(p) is node]
    status, first = page(node.address, allow_stale="true", limit="2")
    assert status == 200 and first["partitions"] == sorted([active, standby])
    assert first["next_cursor"] is not None
    # The next generation takes the standby copy away from this member.
    owner = cluster.active_node(standby).member.id
    moved = reassigned(cluster.assignment, standby, active=owner, standbys=[])
    node.instance.apply_assignment(moved)
    wait_for(lambda: not holds(node.address, standby), "the standby copy was dropped")
    # Continuing would leave out the rest of the moved partition: refused, not short.
    status, refused = page(node.address, allow_stale="true", limit="2", cursor=first["next_cursor"])
    assert status == 410, refused
    assert refused["moved_partitions"] == [standby]
    assert "start the query again without a cursor" in refused["error"]
    # Started again, the member's pages are whole for what it serves now.
    assert read_all(node.address, allow_stale="true", limit="2") == words_in(active)


def test_another_copy_of_the_cursor_s_partitions_continues_it(cluster: Cluster[SqliteLog]) -> None:
    # The first page from the active copy of one partition; the rest from its standby's
    # member, which serves its own active partition too but reads only the cursor's.
    partition = next(p for p in range(3) if len(words_in(p)) >= 2)
    active, standby, _ = cluster.copies(partition)
    status, first = page(active.address, limit="1")
    assert status == 200 and first["partitions"] == [partition]
    rest = read_all(standby.address, first["next_cursor"], allow_stale="true", limit="1")
    assert {**dict(first["entries"]), **rest} == words_in(partition)
    status, second = page(
        standby.address, allow_stale="true", limit="1", cursor=first["next_cursor"]
    )
    assert status == 200 and second["partitions"] == [partition]
    assert partition_of(second["entries"][0][0]) == partition
    (own,) = [p for p in range(3) if cluster.active_node(p) is standby]
    assert own in second["skipped_partitions"]


def test_a_cursor_of_another_form_is_400_saying_to_start_again(cluster: Cluster[SqliteLog]) -> None:
    node = cluster.nodes[0]
    one_key = PageCursor(b"apple").text()  # a one-key window query's: names no partitions
    for cursor in ("YXBwbGU", one_key, "0.x~YXBwbGU"):
        status, body = page(node.address, cursor=cursor)
        assert status == 400 and "start the query again without a cursor" in body["error"], body
