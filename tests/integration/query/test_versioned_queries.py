"""Queries by timestamp of a versioned table (KIP-960) over HTTP, on a running instance.

One instance materializes a table of prices as a versioned store (history retention
10 s) and joins orders against it as of each order's time (KIP-914). Its query server
answers a key's latest version, the version valid at ``as_of``, None before the first
version or past the history retention, and refuses range queries and ``as_of`` on a
store that is not versioned. The orders' join output shows the engine path (not only
the test driver's) reads the table as of each record's time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition, changelog_topic
from eddyline_runtime.processing import Materialized, StreamsBuilder, Topology
from eddyline_runtime.query.server import QueryServer
from eddyline_runtime.restore.replay import restore
from eddyline_runtime.state import RocksDBStore, VersionedKeyValueStore, VersionedRecord
from tests.support.http_client import http_get
from tests.support.ports import free_port
from tests.support.word_count import APP, streams_config

STORE, PLAIN = "prices", "order-counts"
HISTORY = 10_000
# (item, price, timestamp): apple changes twice (one update out of order); pear's only
# price comes after stream time reached 30 000, older than the 10 s history retention:
# dropped (not stored), as Kafka's versioned store drops a put older than its grace.
PRICES = [("apple", "1.00", 1_000), ("apple", "1.50", 30_000), ("apple", "1.20", 20_000),
          ("pear", "0.80", 5_000)]  # fmt: skip
ORDERS = [("apple", "o1", 25_000), ("apple", "o2", 35_000), ("apple", "o-old", 2_000)]


def topology() -> Topology:
    builder = StreamsBuilder()
    prices = builder.table(
        "prices", Materialized.as_versioned(STORE, HISTORY), key_serde="string",
        value_serde="string",
    )  # fmt: skip
    orders = builder.stream("orders", key_serde="string", value_serde="string")
    orders.left_join(prices, lambda order, price: f"{order}@{price}").to(
        "priced", key_serde="string", value_serde="string"
    )
    orders.group_by_key().count(PLAIN)
    return builder.build()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, SqliteLog]]:
    tmp_path: Path = tmp_path_factory.mktemp("versioned-queries")
    log = SqliteLog(tmp_path / "log.db")
    for topic in ("prices", "orders"):
        log.create_topic(topic, 1)
    # The prices first (a stream-table join reads the table as it stands: the orders
    # come after every price in stream time order anyway, and are produced afterwards).
    log.produce(
        TopicPartition("prices", 0), [Record(k.encode(), v.encode(), t) for k, v, t in PRICES]
    )
    address = f"127.0.0.1:{free_port()}"
    config = streams_config(
        tmp_path / "state",
        **{"application.server": address, "num.standby.replicas": 0, "max.task.idle.ms": -1},
    )
    instance = StreamsInstance(topology(), config, log)
    instance.start()
    server = QueryServer(instance, "127.0.0.1", int(address.rpartition(":")[2]))
    server.start()
    try:
        instance.wait_until_caught_up(30)
        log.produce(
            TopicPartition("orders", 0),
            [Record(k.encode(), v.encode(), t) for k, v, t in ORDERS],
        )
        instance.wait_until_caught_up(30)
        yield address, log
    finally:
        server.stop()
        instance.close(30)
        log.close()


def get(address: str, path: str, **query: str) -> tuple[int, Any]:
    response = http_get(address, path, **query)
    return response.status, response.json()


def test_latest_and_as_of_versions_over_http(served: tuple[str, SqliteLog]) -> None:
    address, _ = served
    status, body = get(address, f"/v1/stores/{STORE}/keys/apple")
    assert status == 200, body
    assert (body["found"], body["value"], body["timestamp"], body["valid_to"]) == (
        True, "1.50", 30_000, None,
    )  # fmt: skip
    _, body = get(address, f"/v1/stores/{STORE}/keys/apple", as_of="25000")
    assert (body["value"], body["timestamp"], body["valid_to"]) == ("1.20", 20_000, 30_000)
    # Older than observed stream time (30 000) - history retention (10 000): no answer.
    _, body = get(address, f"/v1/stores/{STORE}/keys/apple", as_of="19999")
    assert body["found"] is False
    _, body = get(address, f"/v1/stores/{STORE}/keys/pear")
    assert body["found"] is False  # its only put was older than the history retention


def test_a_keys_versions_between_times_over_http(served: tuple[str, SqliteLog]) -> None:
    # KIP-968's MultiVersionedKeyQuery: versions valid at some time in [from, to].
    address, _ = served
    status, body = get(address, f"/v1/stores/{STORE}/versions/apple")
    assert status == 200, body
    # The 1.00 version ended at 20 000 = observed - retention: no read reaches it.
    assert body["versions"] == [
        {"value": "1.50", "timestamp": 30_000, "valid_to": None},
        {"value": "1.20", "timestamp": 20_000, "valid_to": 30_000},
    ]
    assert body["role"] == "active"
    _, body = get(address, f"/v1/stores/{STORE}/versions/apple", **{"from": "20000", "to": "29999"})
    assert [v["value"] for v in body["versions"]] == ["1.20"]
    _, body = get(address, f"/v1/stores/{STORE}/versions/apple", ascending="true")
    assert [v["value"] for v in body["versions"]] == ["1.20", "1.50"]
    status, body = get(address, f"/v1/stores/{STORE}/versions/apple", **{"from": "9", "to": "1"})
    assert status == 400 and "from=9 is after to=1" in body["error"]
    status, body = get(address, f"/v1/stores/{PLAIN}/versions/apple")
    assert status == 400 and "/versions applies to a table" in body["error"]


def test_the_store_list_says_which_store_is_versioned(served: tuple[str, SqliteLog]) -> None:
    address, _ = served
    _, body = get(address, "/v1/stores")
    by_name = {entry["name"]: entry for entry in body["stores"]}
    assert by_name[STORE]["versioned_history_ms"] == HISTORY
    assert "versioned_history_ms" not in by_name[PLAIN]


def test_the_join_read_the_table_as_of_each_order(served: tuple[str, SqliteLog]) -> None:
    _, log = served
    joined = [(r.key, r.value) for r in log.fetch(TopicPartition("priced", 0), 0, 100).records]
    assert joined == [(b"apple", b"o1@1.20"), (b"apple", b"o2@1.50"), (b"apple", b"o-old@None")]


def test_what_a_versioned_store_does_not_answer_is_refused(served: tuple[str, SqliteLog]) -> None:
    address, _ = served
    status, body = get(address, f"/v1/stores/{STORE}/all")
    assert status == 400
    assert "is a versioned store: range and all queries of it are not served" in body["error"]
    status, body = get(address, f"/v1/stores/{STORE}/keys/apple", as_of="soon")
    assert status == 400 and "as_of='soon'" in body["error"]
    status, body = get(address, f"/v1/stores/{PLAIN}/keys/apple", as_of="1")
    assert status == 400 and f'store "{PLAIN}" is not a versioned store' in body["error"]


def test_the_engines_changelog_rebuilds_the_versions(
    served: tuple[str, SqliteLog], tmp_path: Path
) -> None:
    # What a standby or a restore replays: the running instance's own changelog topic
    # (written by the engine's changelog layer, under its transactions).
    _, log = served
    changelog = TopicPartition(changelog_topic(APP, STORE), 0)
    with RocksDBStore(STORE, tmp_path / STORE) as replica:
        restore(replica, log, changelog)
        rebuilt = VersionedKeyValueStore(replica, HISTORY)
        assert rebuilt.observed_stream_time == 30_000
        assert rebuilt.versions(b"apple") == [
            VersionedRecord(b"1.50", 30_000),
            VersionedRecord(b"1.20", 20_000, 30_000),
        ]
        assert rebuilt.get(b"pear") is None
