"""Queries bounded by position (KIP-796's ``PositionBound``) on a real instance.

A copy that has not reached the bound answers "not yet" (409 with the
position it reached) instead of older data; the router raises a typed error
when no copy has, and answers as soon as one has.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryRouter
from eddyline_runtime.query.position import (
    PositionNotReachedError,
    format_position_bound,
    position_from_json,
)
from eddyline_runtime.query.server import QueryServer
from tests.support.http_client import http_get
from tests.support.ports import free_port
from tests.support.word_count import INPUT, STORE, produce_lines, streams_config, word_count


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[StreamsInstance, SqliteLog, str]]:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(INPUT, 1)
    address = f"127.0.0.1:{free_port()}"
    config = streams_config(
        tmp_path / "state", **{"application.server": address, "num.standby.replicas": 0}
    )
    instance = StreamsInstance(word_count(), config, log)
    instance.start()
    server = QueryServer(instance, "127.0.0.1", int(address.rpartition(":")[2]))
    server.start()
    try:
        yield instance, log, address
    finally:
        server.stop()
        instance.close(30)
        log.close()


def reached(instance: StreamsInstance) -> dict[TopicPartition, int]:
    [copy] = instance.local_store_partitions(STORE)
    return dict(copy.open_reader(None).position())


def test_a_copy_below_the_bound_says_not_yet_and_answers_once_it_reaches_it(
    served: tuple[StreamsInstance, SqliteLog, str],
) -> None:
    instance, log, address = served
    produce_lines(log, ["a b a"], 1)
    instance.wait_until_caught_up(30)
    now = reached(instance)
    assert now, "the counts store records the position of its input"
    path = f"/v1/stores/{STORE}/keys/a"
    at_now = http_get(address, path, position_bound=format_position_bound(now))
    assert at_now.status == 200 and at_now.json()["value"] == 2

    ahead = {tp: offset + 3 for tp, offset in now.items()}
    not_yet = http_get(address, path, position_bound=format_position_bound(ahead))
    assert not_yet.status == 409, not_yet.text
    assert position_from_json(not_yet.json()["position"]) == now
    assert "Retry-After" in not_yet.headers

    router = QueryRouter([address])
    with pytest.raises(PositionNotReachedError) as refused:
        router.get(STORE, "a", position_bound=ahead)
    assert refused.value.reached == now and refused.value.bound == ahead

    produce_lines(log, ["a c d e f"], 1)  # five more words reach the counts' input
    instance.wait_until_caught_up(30)
    answer = router.get(STORE, "a", position_bound=ahead)
    assert answer.value == 3


def test_a_malformed_bound_is_refused_naming_the_form(
    served: tuple[StreamsInstance, SqliteLog, str],
) -> None:
    _, _, address = served
    bad = http_get(address, f"/v1/stores/{STORE}/keys/a", position_bound="orders-0-41")
    assert bad.status == 400
    assert "TOPIC:PARTITION:OFFSET" in bad.json()["error"]
