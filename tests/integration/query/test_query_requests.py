"""What a query request may ask for: serdes it may name, and answers paged, never cut short.

A request comes from the network: it must not name code to run (a serde as
``module:attribute`` would be imported and called), a serde that does not fit
the stored bytes is the request's fault (400, not 500), and ``/range`` and
``/all`` answer in pages with a cursor instead of stopping silently.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeAlias

import pytest

from eddyline_runtime.log import SqliteLog
from eddyline_runtime.query.server import DEFAULT_PAGE_ENTRIES, MAX_PAGE_ENTRIES
from tests.support.http_client import http_get
from tests.support.query_cluster import PARTITIONS, STORE, partition_of, started_cluster
from tests.support.query_cluster import Cluster as HarnessCluster

Cluster: TypeAlias = HarnessCluster[SqliteLog]

WORDS = [f"w{i:04d}" for i in range(2_500)]
LINES = [" ".join(WORDS[i : i + 10]) for i in range(0, len(WORDS), 10)] + ["w0001 w0002 w0002"]
EXPECTED = Counter(" ".join(LINES).split())

MARKER_MODULE = """
from pathlib import Path

class Marker:
    def __init__(self):
        Path({path!r}).write_text("constructed")

    def serialize(self, value):
        return value

    def deserialize(self, data):
        return data
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    group = started_cluster(tmp_path_factory.mktemp("query-requests"), LINES, SqliteLog)
    try:
        yield group
    finally:
        group.close()


def held_words(cluster: Cluster, node_index: int) -> list[str]:
    """The words whose partition (active or standby) the node holds, in byte order."""
    node = cluster.nodes[node_index]
    held = {p.partition for p in node.instance.local_store_partitions(STORE)}
    return sorted((w for w in EXPECTED if partition_of(w) in held), key=str.encode)


# -- serdes a request may name ------------------------------------------------------------


@pytest.mark.parametrize("option", ["key_serde", "value_serde"])
def test_a_serde_named_as_module_attribute_is_400_and_never_loaded(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str
) -> None:
    constructed = tmp_path / "constructed"
    (tmp_path / "query_marker_serde.py").write_text(
        MARKER_MODULE.format(path=str(constructed)), encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    node = cluster.active_node(partition_of("w0001"))
    for path in (f"/v1/stores/{STORE}/keys/w0001", f"/v1/stores/{STORE}/all"):
        for named in ("query_marker_serde:Marker", "subprocess:Popen"):
            response = http_get(node.address, path, **{option: named})
            assert response.status == 400, (path, named, response.text)
            error = response.json()["error"]
            assert f'"{option}"' in error and repr(named) in error
            assert "'string', 'long'" in error.replace("'int', ", "")  # the accepted names
    assert not constructed.exists(), "a request made the server construct a class it named"
    assert "query_marker_serde" not in sys.modules


def test_built_in_serdes_and_the_stores_own_are_accepted(cluster: Cluster) -> None:
    node = cluster.active_node(partition_of("w0002"))
    path = f"/v1/stores/{STORE}/keys/w0002"
    assert EXPECTED["w0002"] == 3
    assert http_get(node.address, path).json()["value"] == 3
    assert http_get(node.address, path, value_serde="long").json()["value"] == 3
    raw = http_get(node.address, path, value_serde="bytes")
    assert raw.status == 200 and raw.json()["value"] == "\x00" * 7 + "\x03"


@pytest.mark.parametrize(
    ("route", "query"),
    [
        ("keys/w0002", {"value_serde": "int"}),  # 8 stored bytes are no 4-byte int
        ("keys/w0002", {"value_serde": "json"}),
        ("all", {"value_serde": "string", "allow_stale": "true"}),
        ("all", {"value_serde": "int"}),
        ("range", {"key_serde": "long", "allow_stale": "true"}),  # "w0001" is no 8-byte long
    ],
)
def test_a_serde_that_does_not_fit_the_stored_data_is_400_naming_it(
    cluster: Cluster, route: str, query: dict[str, str]
) -> None:
    node = cluster.active_node(partition_of("w0002"))
    response = http_get(node.address, f"/v1/stores/{STORE}/{route}", **query)
    if query.get("value_serde") == "string":
        # Counts below 128 are valid UTF-8: the request gets what it asked for.
        assert response.status == 200, response.text
        return
    assert response.status == 400, response.text
    error = response.json()["error"]
    option = "key_serde" if "key_serde" in query else "value_serde"
    assert f'store "{STORE}"' in error and option in error and "GET /v1/stores" in error


# -- pages ------------------------------------------------------------------------------


def pages(address: str, route: str, **query: str) -> list[dict[str, Any]]:
    """Every page of a scan, following next_cursor."""
    found: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        extra = {} if cursor is None else {"cursor": cursor}
        response = http_get(address, f"/v1/stores/{STORE}/{route}", **query, **extra)
        assert response.status == 200, response.text
        found.append(response.json())
        cursor = found[-1]["next_cursor"]
        if cursor is None:
            return found
        assert len(found) < 1_000, "the cursor does not advance"


def test_all_without_a_limit_answers_the_default_page_and_says_more_follow(
    cluster: Cluster,
) -> None:
    node = cluster.nodes[0]
    held = held_words(cluster, 0)
    assert len(held) > DEFAULT_PAGE_ENTRIES  # the case that used to be cut short silently
    body = http_get(node.address, f"/v1/stores/{STORE}/all", allow_stale="true").json()
    assert [key for key, _ in body["entries"]] == held[:DEFAULT_PAGE_ENTRIES]
    assert body["next_cursor"] is not None


def test_following_the_cursor_returns_every_entry_once_in_key_order(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    found = pages(node.address, "all", allow_stale="true", limit="300")
    assert all(len(page["entries"]) <= 300 for page in found)
    entries = [entry for page in found for entry in page["entries"]]
    held = held_words(cluster, 0)
    assert [key for key, _ in entries] == held
    assert dict(entries) == {word: EXPECTED[word] for word in held}
    assert len(found) == -(-len(held) // 300)


def test_a_range_pages_within_its_bounds(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    held = held_words(cluster, 1)
    low, high = held[10], held[-10]
    found = pages(
        node.address, "range", allow_stale="true", limit="50", **{"from": low, "to": high}
    )
    keys = [key for page in found for key, _ in page["entries"]]
    assert keys == held[10:-9]


def test_an_exact_last_page_ends_the_scan_without_an_empty_page(cluster: Cluster) -> None:
    node = cluster.nodes[2]
    held = held_words(cluster, 2)
    body = http_get(
        node.address, f"/v1/stores/{STORE}/all", allow_stale="true", limit=str(len(held))
    ).json()
    assert len(body["entries"]) == len(held) and body["next_cursor"] is None


@pytest.mark.parametrize(
    "query",
    [
        {"limit": "0"},
        {"limit": str(MAX_PAGE_ENTRIES + 1)},
        {"limit": "ten"},
        {"cursor": "!!"},
        {"cursor": ""},
    ],
)
def test_a_bad_limit_or_cursor_is_400_naming_it(cluster: Cluster, query: dict[str, str]) -> None:
    response = http_get(cluster.nodes[0].address, f"/v1/stores/{STORE}/all", **query)
    assert response.status == 400, response.text
    (name, value), *_ = query.items()
    assert f'"{value}"' in response.json()["error"] and name in response.json()["error"]


def test_every_partition_is_covered(cluster: Cluster) -> None:
    assert {partition_of(w) for w in WORDS} == set(range(PARTITIONS))
