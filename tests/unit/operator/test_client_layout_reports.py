"""The operator reads each pod's ``/v1/layout`` (``client.fetch_reports``): a real
instance's report, with every copy's ``as_of_ms`` and ``staleness_ms`` (fields the query
router uses), parses, and the operator's view of the layout is what it was before them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_operator.client import fetch_reports
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.membership import StoreRole
from eddyline_runtime.query.server import QueryServer
from tests.support.http_client import http_get
from tests.support.word_count import INPUT, STORE, produce_lines, streams_config, word_count

# A bound for a broken run on a loaded machine, not an expectation.
TIMEOUT = 60


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[StreamsInstance, int]]:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(INPUT, 2)
    instance = StreamsInstance(
        word_count(), streams_config(tmp_path / "state", **{"num.standby.replicas": 0}), log
    )
    instance.start()
    server = QueryServer(instance)
    address = server.start()
    try:
        produce_lines(log, ["apple banana", "cherry apple"], 2)
        instance.wait_until_caught_up(TIMEOUT)
        yield instance, address.port
    finally:
        server.stop()
        instance.close(TIMEOUT)
        log.close()


def test_the_operator_parses_a_layout_that_reports_each_copy_s_staleness(
    served: tuple[StreamsInstance, int],
) -> None:
    instance, port = served
    raw = http_get(f"127.0.0.1:{port}", "/v1/layout").json()
    sent = raw["stores"][STORE]
    assert set(sent) == {"0", "1"}
    for copy in sent.values():
        # The running active copies: their data is the tasks' committed state now.
        assert copy["role"] == "active" and copy["staleness_ms"] == 0
        assert isinstance(copy["as_of_ms"], int) and copy["as_of_ms"] > 0
    pod = {"metadata": {"name": "app-0"}, "status": {"podIP": "127.0.0.1"}}
    reports = fetch_reports([pod], port)
    report = reports["app-0"]
    assert report.member == instance.member.id
    copies = report.stores[STORE]
    assert {p: c.role for p, c in copies.items()} == {0: StoreRole.ACTIVE, 1: StoreRole.ACTIVE}
    assert [c.staleness_ms for c in copies.values()] == [0, 0]
    # Read again, a moment later: at or after the first read's.
    for partition, copy in copies.items():
        assert copy.as_of_ms is not None and copy.as_of_ms >= sent[str(partition)]["as_of_ms"]
