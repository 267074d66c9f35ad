"""Global tables on a running instance over the embedded log: bootstrap, the global
thread, restarts from the checkpoint, queries, readiness and the shut-down order.

Ported from Kafka Streams' ``GlobalKTableIntegrationTest`` (apache/kafka,
streams/integration-tests: stream-GlobalKTable joins kept current as the table
changes, the global store queryable, a restart restoring it, a topology of only a
global table reaching RUNNING) and ``GlobalThreadShutDownOrderTest`` (the global
store is closed only after the stream threads that read it). The tests are ours.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.cli import main
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.global_thread import GlobalStoreError
from eddyline_runtime.engine.instance import InstanceState, StreamsFailedError, StreamsInstance
from eddyline_runtime.log import Log, Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import StreamsBuilder, Topology
from eddyline_runtime.query.client import QueryRouter
from eddyline_runtime.query.server import QueryServer
from eddyline_runtime.state import RocksDBStore, global_store_directory
from eddyline_runtime.state.offset_checkpoint import CHECKPOINT_FILE_NAME, read_offsets
from tests.support.http_client import http_get
from tests.support.ports import free_port
from tests.support.waiting import wait_for

STREAM, GLOBAL, OUTPUT, STORE = "orders", "currencies", "enriched", "currency-rates"
TIMEOUT = 60


def topology(*, left: bool = False) -> Topology:
    builder = StreamsBuilder()
    orders = builder.stream(STREAM, key_serde="string", value_serde="json")
    rates = builder.global_table(GLOBAL, STORE, key_serde="string", value_serde="string")
    join = orders.left_join if left else orders.join
    join(
        rates,
        lambda _key, order: order["currency"],
        lambda order, rate: f"{order['amount']} {order['currency']} @ {rate}",
    ).to(OUTPUT, key_serde="string", value_serde="string")
    return builder.build()


def config(state_dir: Path, **settings: Any) -> StreamsConfig:
    return StreamsConfig.from_properties(
        {
            "application.id": "global-tables",
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": 50,
            **settings,
        }
    )


def produce_rates(log: Log, rates: dict[str, str | None], partitions: int = 2) -> None:
    for index, (currency, rate) in enumerate(sorted(rates.items())):
        log.produce(
            TopicPartition(GLOBAL, index % partitions),
            [Record(currency.encode(), None if rate is None else rate.encode(), index)],
        )


def produce_orders(log: Log, orders: list[tuple[str, str, int]], start: int = 0) -> None:
    for index, (order_id, currency, amount) in enumerate(orders):
        value = f'{{"currency": "{currency}", "amount": {amount}}}'.encode()
        log.produce(
            TopicPartition(STREAM, index % 3), [Record(order_id.encode(), value, start + index)]
        )


def outputs(log: Log) -> dict[str, str]:
    found: dict[str, str] = {}
    for partition in range(3):
        tp = TopicPartition(OUTPUT, partition)
        for record in log.fetch(tp, log.beginning_offset(tp)).records:
            assert record.key is not None and record.value is not None
            found[record.key.decode()] = record.value.decode()
    return found


def create_topics(log: Log) -> None:
    log.create_topic(STREAM, 3)
    log.create_topic(GLOBAL, 2)
    log.create_topic(OUTPUT, 3)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    opened = SqliteLog(tmp_path / "log.db")
    create_topics(opened)
    try:
        yield opened
    finally:
        opened.close()


def test_stream_global_table_join_follows_table_updates(tmp_path: Path, log: SqliteLog) -> None:
    """GlobalKTableIntegrationTest.shouldKStreamGlobalKTableJoin: the stream joins the
    global table as it is when each record is processed, across partitions of both."""
    produce_rates(log, {"EUR": "1.10", "GBP": "1.27", "JPY": "0.0067"})
    instance = StreamsInstance(topology(), config(tmp_path / "state"), log)
    instance.start()
    try:
        produce_orders(log, [("o1", "EUR", 10), ("o2", "GBP", 20), ("o3", "CHF", 5)])
        instance.wait_until_caught_up(TIMEOUT)
        assert outputs(log) == {"o1": "10 EUR @ 1.10", "o2": "20 GBP @ 1.27"}
        produce_rates(log, {"CHF": "1.13", "EUR": "1.05", "GBP": None})
        instance.wait_until_caught_up(TIMEOUT)
        produce_orders(log, [("o4", "CHF", 7), ("o5", "EUR", 1), ("o6", "GBP", 2)], start=10)
        instance.wait_until_caught_up(TIMEOUT)
        assert outputs(log) == {
            "o1": "10 EUR @ 1.10",
            "o2": "20 GBP @ 1.27",
            "o4": "7 CHF @ 1.13",
            "o5": "1 EUR @ 1.05",
        }
        reader = instance.global_store(STORE)
        assert reader.get(b"CHF") == b"1.13"
        assert reader.get(b"GBP") is None  # the tombstone removed it
    finally:
        instance.close(TIMEOUT)


def test_left_join_keeps_records_without_a_match(tmp_path: Path, log: SqliteLog) -> None:
    """GlobalKTableIntegrationTest.shouldKStreamGlobalKTableLeftJoin."""
    produce_rates(log, {"EUR": "1.10"})
    instance = StreamsInstance(topology(left=True), config(tmp_path / "state"), log)
    instance.start()
    try:
        produce_orders(log, [("o1", "EUR", 10), ("o2", "XXX", 3)])
        instance.wait_until_caught_up(TIMEOUT)
        assert outputs(log) == {"o1": "10 EUR @ 1.10", "o2": "3 XXX @ None"}
    finally:
        instance.close(TIMEOUT)


def test_restart_reads_only_the_tail_after_the_checkpoint(tmp_path: Path, log: SqliteLog) -> None:
    """GlobalKTableIntegrationTest.shouldRestoreGlobalInMemoryKTableOnRestart, with a
    persistent store: the second start resumes after the offsets the store committed
    (kept in the store and in its ``.checkpoint``), not at the topic's start."""
    state = tmp_path / "state"
    produce_rates(log, {f"C{i:03d}": str(i) for i in range(100)})
    first = StreamsInstance(topology(), config(state), log)
    first.start()
    first.wait_until_caught_up(TIMEOUT)
    assert first.global_thread is not None
    assert first.global_thread.records_applied == 100
    first.close(TIMEOUT)
    checkpoint = read_offsets(global_store_directory(state, STORE) / CHECKPOINT_FILE_NAME)
    assert checkpoint == {TopicPartition(GLOBAL, 0): 49, TopicPartition(GLOBAL, 1): 49}

    produce_rates(log, {"NEW": "1", "C000": "changed"})
    second = StreamsInstance(topology(), config(state), log)
    second.start()
    try:
        second.wait_until_caught_up(TIMEOUT)
        assert second.global_thread is not None
        assert second.global_thread.records_applied == 2  # the tail only
        reader = second.global_stores.reader(STORE)
        assert reader.get(b"C099") == b"99"
        assert reader.get(b"C000") == b"changed"
        assert reader.get(b"NEW") == b"1"
    finally:
        second.close(TIMEOUT)


def test_a_copy_the_topic_no_longer_fits_is_set_aside_and_rebuilt(
    tmp_path: Path, log: SqliteLog, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint past the topic's end (the topic was recreated smaller): the copy goes
    to the quarantine and the store is rebuilt from the topic, not trusted."""
    state = tmp_path / "state"
    produce_rates(log, {"A": "1", "B": "2", "C": "3", "D": "4"})
    first = StreamsInstance(topology(), config(state), log)
    first.start()
    first.wait_until_caught_up(TIMEOUT)
    first.close(TIMEOUT)
    fresh = SqliteLog(tmp_path / "fresh.db")
    try:
        create_topics(fresh)
        produce_rates(fresh, {"Z": "26"})
        second = StreamsInstance(topology(), config(state), fresh)
        second.start()
        try:
            second.wait_until_caught_up(TIMEOUT)
            reader = second.global_stores.reader(STORE)
            assert reader.get(b"Z") == b"26"
            assert reader.get(b"A") is None  # the old copy's data is not served
            assert len(second.stores_set_aside) == 1
        finally:
            second.close(TIMEOUT)
    finally:
        fresh.close()
    # Its topic is the app's input, not a changelog: republishing the copy is refused.
    [kept] = second.stores_set_aside
    args = ["state", "republish", str(kept), "--log", f"sqlite:///{tmp_path / 'fresh.db'}"]
    assert main(args) == 1
    assert f'is a copy of global store "{STORE}"' in capsys.readouterr().err


def test_only_a_global_table_reaches_running(tmp_path: Path, log: SqliteLog) -> None:
    """GlobalKTableIntegrationTest.shouldGetToRunningWithOnlyGlobalTopology."""
    builder = StreamsBuilder()
    builder.global_table(GLOBAL, STORE, key_serde="string", value_serde="string")
    produce_rates(log, {"EUR": "1.10"})
    instance = StreamsInstance(builder.build(), config(tmp_path / "state"), log)
    instance.start()
    try:
        wait_for(lambda: instance.check() is InstanceState.RUNNING, "running", TIMEOUT)
        assert instance.ready()
        instance.wait_until_caught_up(TIMEOUT)
        assert instance.global_stores.reader(STORE).get(b"EUR") == b"1.10"
    finally:
        instance.close(TIMEOUT)


class _GatedFetches:
    """Holds the global topic's fetches until released: a bootstrap that takes as long as
    the test wants, without sleeping."""

    def __init__(self, log: SqliteLog) -> None:
        self.release = threading.Event()
        self.waiting = threading.Event()
        original = log.fetch_changes

        def fetch_changes(tp: TopicPartition, offset: int, max_records: int = 10_000) -> Any:
            if tp.topic == GLOBAL:
                self.waiting.set()
                self.release.wait(TIMEOUT)
            return original(tp, offset, max_records)

        log.fetch_changes = fetch_changes  # type: ignore[method-assign]


def assert_a_staleness_bound_is_refused(address: str, answer: Any, member: str) -> None:
    """An answer of a global copy says who answered; a global copy does not measure its
    staleness, so a bound on it is refused (409), saying how to query it instead."""
    assert answer["member"] == member and answer["staleness_ms"] is None
    for path in (f"/v1/stores/{STORE}/keys/EUR", f"/v1/stores/{STORE}/all"):
        bounded = http_get(address, path, max_staleness_ms="60000")
        assert bounded.status == 409, bounded.text
        assert "query it without max_staleness_ms" in bounded.json()["error"]


def test_processing_and_readiness_wait_for_the_bootstrap(tmp_path: Path, log: SqliteLog) -> None:
    """No stream record is processed, no global query answered and the instance is not
    ready (the pod's readiness) until the global store has read its topic's end."""
    produce_rates(log, {"EUR": "1.10"})
    produce_orders(log, [("o1", "EUR", 10)])
    gate = _GatedFetches(log)
    address = f"127.0.0.1:{free_port()}"
    instance = StreamsInstance(
        topology(), config(tmp_path / "state", **{"application.server": address}), log
    )
    instance.start()
    server = QueryServer(instance, "127.0.0.1", int(address.rpartition(":")[2]))
    server.start()
    try:
        assert gate.waiting.wait(TIMEOUT)
        assert not instance.ready()
        assert http_get(address, "/readyz").status == 503
        loading = http_get(address, f"/v1/stores/{STORE}/keys/EUR")
        assert loading.status == 503 and "still loading" in loading.json()["error"]
        layout = http_get(address, "/v1/layout").json()
        assert layout["global_stores"][STORE]["bootstrapped"] is False
        assert instance.processed == 0
        with pytest.raises(GlobalStoreError, match="still loading"):
            instance.global_store(STORE)
        with pytest.raises(GlobalStoreError, match="no global store named"):
            instance.global_store("orders")
        assert not any(thread.state.value == "RUNNING" for thread in instance.threads)

        gate.release.set()
        instance.wait_until_caught_up(TIMEOUT)
        wait_for(instance.ready, "ready", TIMEOUT)
        assert outputs(log) == {"o1": "10 EUR @ 1.10"}
        assert http_get(address, "/readyz").status == 200
        answer = http_get(address, f"/v1/stores/{STORE}/keys/EUR")
        assert answer.status == 200, answer.text
        body = answer.json()
        assert body["value"] == "1.10" and body["global"] is True and body["partition"] == -1
        assert_a_staleness_bound_is_refused(address, body, instance.member.id)
        everything = http_get(address, f"/v1/stores/{STORE}/all").json()
        assert everything["entries"] == [["EUR", "1.10"]]
        layout = http_get(address, "/v1/layout").json()
        assert layout["global_stores"][STORE] == {
            "topic": GLOBAL,
            "bootstrapped": True,
            "lag": 0,
        }
        metadata = http_get(address, f"/v1/stores/{STORE}/metadata/EUR").json()
        assert metadata["global"] is True and metadata["active_host"] == address
        listed = http_get(address, "/v1/stores").json()["stores"]
        assert next(s for s in listed if s["name"] == STORE)["global"] is True
        lags = http_get(address, "/v1/lags").json()
        assert set(lags[STORE]) == {"0", "1"}
        routed = QueryRouter([address]).get(STORE, "EUR")
        assert routed.value == "1.10" and routed.host == address
    finally:
        gate.release.set()
        server.stop()
        instance.close(TIMEOUT)


def test_global_store_closes_after_the_stream_threads(tmp_path: Path, log: SqliteLog) -> None:
    """GlobalThreadShutDownOrderTest.shouldFinishGlobalStoreOperationOnShutDown: closing
    while records are joined fails no stream thread (the global store is still open for
    them), and the global store is closed, its lock released, once close returns."""
    produce_rates(log, {"EUR": "1.10"})
    state = tmp_path / "state"
    instance = StreamsInstance(topology(), config(state), log)
    instance.start()
    produce_orders(log, [(f"o{i}", "EUR", i) for i in range(3000)])
    wait_for(lambda: instance.processed > 0, "processing", TIMEOUT)
    instance.close(TIMEOUT)  # raises StreamsFailedError if a thread met a closed store
    assert instance.state is InstanceState.NOT_RUNNING
    assert instance.global_thread is not None and not instance.global_thread.is_alive()
    # The lock is free: the store was closed, not left open by a thread still running.
    reopened = RocksDBStore(STORE, global_store_directory(state, STORE))
    try:
        assert reopened.get(b"EUR") == b"1.10"
    finally:
        reopened.close()


def test_a_missing_global_topic_fails_the_instance_with_its_name(
    tmp_path: Path, log: SqliteLog
) -> None:
    builder = StreamsBuilder()
    builder.global_table("no-such-topic", STORE)
    instance = StreamsInstance(builder.build(), config(tmp_path / "state"), log)
    instance.start()
    with pytest.raises(StreamsFailedError, match='reads topic "no-such-topic", which does not'):
        wait_for(lambda: instance.check() is InstanceState.ERROR, "the failure", TIMEOUT)
    assert not instance.ready()
    with pytest.raises(StreamsFailedError):
        instance.close(TIMEOUT)


def test_a_topic_truncated_under_a_running_copy_fails_it_and_the_restart_rebuilds_it(
    tmp_path: Path, log: SqliteLog
) -> None:
    """The global thread judges each new read by the one replay rule with the topic's
    incarnation: a partition truncated (and grown back past the copy's position) under
    it is never read as a continuation; the instance fails naming the store, and the
    next start sets the copy aside and rebuilds it from the topic."""
    state = tmp_path / "state"
    rates = TopicPartition(GLOBAL, 0)
    log.produce(rates, [Record(f"C{i}".encode(), b"old", i) for i in range(4)])
    instance = StreamsInstance(topology(), config(state), log)
    instance.start()
    instance.wait_until_caught_up(TIMEOUT)
    log.truncate(rates, 1)
    log.produce(rates, [Record(f"N{i}".encode(), b"new", i) for i in range(5)])
    with pytest.raises(StreamsFailedError, match=STORE):
        wait_for(lambda: instance.check() is InstanceState.ERROR, "the failure", TIMEOUT)
    with pytest.raises(StreamsFailedError):
        instance.close(TIMEOUT)

    restarted = StreamsInstance(topology(), config(state), log)
    restarted.start()
    try:
        restarted.wait_until_caught_up(TIMEOUT)
        assert len(restarted.stores_set_aside) == 1
        reader = restarted.global_store(STORE)
        assert reader.get(b"C0") == b"old" and reader.get(b"C3") is None
        assert reader.get(b"N4") == b"new"
    finally:
        restarted.close(TIMEOUT)
