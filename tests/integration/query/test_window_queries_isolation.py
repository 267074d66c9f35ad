"""Window key-range queries over HTTP read at the isolation level asked for.

A Processor API processor writes windows into a RocksDB window store and, on the
value "hold", waits after its write, before the task commits: a ``READ_COMMITTED``
query (forward or backward, one key or a key range) must not see that window, a
``READ_UNCOMMITTED`` one must.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Processor, StoreSpec, Topology
from eddyline_runtime.processing.operators.stores import window_store
from eddyline_runtime.query.server import QueryServer
from tests.support.http_client import http_get
from tests.support.query_cluster import DEADLINE_SECONDS
from tests.support.waiting import wait_for
from tests.support.word_count import streams_config

STORE = "windows"
WINDOW_MS = 1_000
HOLDING = threading.Event()
RELEASE = threading.Event()


class WindowThenWait(Processor):
    """Puts each value in its key's window of the record's time; "hold" waits after."""

    def process(self, key: Any, value: Any) -> None:
        timestamp = self.context.timestamp
        window_store(self.context, STORE).put(
            key.encode(), timestamp - timestamp % WINDOW_MS, value.encode()
        )
        if value == "hold":
            HOLDING.set()
            RELEASE.wait(DEADLINE_SECONDS)


def topology() -> Topology:
    built = Topology()
    built.add_source("in", ["events"], key_serde="string", value_serde="string")
    built.add_processor("put", WindowThenWait, "in")
    spec = StoreSpec(
        STORE,
        key_serde="string",
        value_serde="string",
        window_retention_ms=60_000,
        window_size_ms=WINDOW_MS,
    )
    built.add_state_store(spec, "put")
    return built


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, SqliteLog]]:
    RELEASE.clear()
    HOLDING.clear()
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("events", 1)
    instance = StreamsInstance(topology(), streams_config(tmp_path / "state"), log)
    server = QueryServer(instance, "127.0.0.1", 0)
    try:
        instance.start()
        address = str(server.start())
        wait_for(lambda: bool(instance.check() and instance.ready()), "the task runs")
        yield address, log
    finally:
        RELEASE.set()
        server.stop()
        instance.close(30)
        log.close()


def test_an_uncommitted_window_is_seen_only_under_read_uncommitted(
    served: tuple[str, SqliteLog],
) -> None:
    address, log = served
    tp = TopicPartition("events", 0)

    def windows(isolation: str, **query: str) -> list[tuple[str, int, int, str]]:
        response = http_get(address, f"/v1/stores/{STORE}/windows", isolation=isolation, **query)
        assert response.status == 200, response.text
        body = response.json()
        assert body["isolation"] == isolation
        return [(e["key"], e["start"], e["end"], e["value"]) for e in body["entries"]]

    log.produce(tp, [Record(b"a", b"one", 500), Record(b"b", b"two", 1_500)])
    committed = [("a", 0, 1_000, "one"), ("b", 1_000, 2_000, "two")]
    wait_for(lambda: windows("READ_COMMITTED") == committed, "the first windows are committed")
    log.produce(tp, [Record(b"a", b"hold", 2_500)])
    assert HOLDING.wait(DEADLINE_SECONDS)
    # The processor wrote a's window at 2000; the task has not committed it.
    assert windows("READ_COMMITTED", key_from="a", key_to="b") == committed
    assert windows("READ_COMMITTED", key_to="a", backward="true") == [("a", 0, 1_000, "one")]
    assert windows("READ_COMMITTED", key="a", backward="true") == [("a", 0, 1_000, "one")]
    uncommitted = [("a", 0, 1_000, "one"), ("a", 2_000, 3_000, "hold"), ("b", 1_000, 2_000, "two")]
    assert windows("READ_UNCOMMITTED", key_from="a", key_to="b") == uncommitted
    assert windows("READ_UNCOMMITTED", backward="true") == uncommitted[::-1]
    assert windows("READ_UNCOMMITTED", key="a", backward="true") == [
        ("a", 2_000, 3_000, "hold"),
        ("a", 0, 1_000, "one"),
    ]
    RELEASE.set()
    wait_for(lambda: windows("READ_COMMITTED") == uncommitted, "the held window is committed")
