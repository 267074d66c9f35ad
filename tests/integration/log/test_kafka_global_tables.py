"""Global tables on a real Apache Kafka broker (tests/support/kafka/), under exactly-once.

Ported from Kafka Streams' ``GlobalKTableIntegrationTest`` (its
``shouldKStreamGlobalKTableJoin`` and ``shouldRestoreGlobalInMemoryKTableOnRestart``)
and ``GlobalThreadShutDownOrderTest``:
the global topic is read whole by the global thread through the Kafka adapter
(read_committed, topic ids as partition epochs), the stream joins it through the
key mapper, and a restart resumes after the offsets the store committed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.engine.instance import InstanceState, StreamsInstance
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state import RocksDBStore, global_store_directory
from eddyline_runtime.state.offset_checkpoint import CHECKPOINT_FILE_NAME, read_offsets
from tests.integration.processing.test_global_tables import (
    GLOBAL,
    STORE,
    config,
    create_topics,
    outputs,
    produce_orders,
    produce_rates,
    topology,
)
from tests.support.waiting import wait_for

TIMEOUT = 120


@pytest.fixture
def log(kafka_bootstrap: str) -> Iterator[KafkaLog]:
    opened = KafkaLog.open(
        f"kafka://{kafka_bootstrap}", {}, topic_prefix=f"global-{uuid.uuid4().hex[:8]}."
    )
    create_topics(opened)
    yield opened
    opened.close()


def settled_outputs(log: KafkaLog, expected: dict[str, str]) -> dict[str, str]:
    """The join's outputs once they are ``expected`` (commit markers land after a commit
    returns) or the time is up."""
    deadline = time.monotonic() + 30
    while True:
        found = outputs(log)
        if found == expected or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_global_table_join_and_restart_on_a_real_broker(tmp_path: Path, log: KafkaLog) -> None:
    state = tmp_path / "state"
    produce_rates(log, {"EUR": "1.10", "GBP": "1.27"})
    first = StreamsInstance(topology(), config(state), log)
    first.start()
    try:
        produce_orders(log, [("o1", "EUR", 10), ("o2", "GBP", 20), ("o3", "CHF", 5)])
        first.wait_until_caught_up(TIMEOUT)
        produce_rates(log, {"CHF": "1.13", "GBP": None})
        first.wait_until_caught_up(TIMEOUT)
        produce_orders(log, [("o4", "CHF", 7), ("o5", "GBP", 1)], start=10)
        first.wait_until_caught_up(TIMEOUT)
        assert first.global_thread is not None
        assert first.global_thread.records_applied == 4
    finally:
        first.close(TIMEOUT)
    expected = {"o1": "10 EUR @ 1.10", "o2": "20 GBP @ 1.27", "o4": "7 CHF @ 1.13"}
    assert settled_outputs(log, expected) == expected
    checkpoint = read_offsets(global_store_directory(state, STORE) / CHECKPOINT_FILE_NAME)
    # The offset of each partition's last record (two records on each, not transactional).
    assert checkpoint == {TopicPartition(GLOBAL, 0): 1, TopicPartition(GLOBAL, 1): 1}

    produce_rates(log, {"JPY": "0.0067"})
    second = StreamsInstance(topology(), config(state), log)
    second.start()
    try:
        second.wait_until_caught_up(TIMEOUT)
        assert second.global_thread is not None
        assert second.global_thread.records_applied == 1  # the tail, not the whole topic
        reader = second.global_stores.reader(STORE)
        assert reader.get(b"JPY") == b"0.0067"
        assert reader.get(b"EUR") == b"1.10"
        assert reader.get(b"GBP") is None
        lags = second.all_local_store_partition_lags()[STORE]
        assert {p: lag.offset_lag for p, lag in lags.items()} == {0: 0, 1: 0}
        assert second.ready()
    finally:
        second.close(TIMEOUT)


def test_global_store_closes_after_the_stream_threads_on_a_real_broker(
    tmp_path: Path, log: KafkaLog
) -> None:
    """GlobalThreadShutDownOrderTest.shouldFinishGlobalStoreOperationOnShutDown on Kafka:
    closing mid-burst fails no stream thread, and the global store's lock is free after."""
    state = tmp_path / "state"
    produce_rates(log, {"EUR": "1.10"})
    instance = StreamsInstance(topology(), config(state), log)
    instance.start()
    produce_orders(log, [(f"o{i}", "EUR", i) for i in range(2000)])
    wait_for(lambda: instance.processed > 0, "processing", TIMEOUT)
    instance.close(TIMEOUT)  # raises StreamsFailedError if a thread met a closed store
    assert instance.state is InstanceState.NOT_RUNNING
    reopened = RocksDBStore(STORE, global_store_directory(state, STORE))
    try:
        assert reopened.get(b"EUR") == b"1.10"
    finally:
        reopened.close()
