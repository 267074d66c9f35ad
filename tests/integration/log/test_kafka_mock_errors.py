"""Broker errors injected into librdkafka's mock cluster reach the adapter as typed errors.

The errors travel the real protocol and the real client (injected with
``rd_kafka_mock_push_request_errors`` through ctypes), so these check the
adapter against what librdkafka actually reports: codes, and the fatal,
retriable and abortable flags the fake at the boundary can only assume.
The mock's transactions are not Kafka's; here they only carry the errors.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError

from eddyline_runtime.log import (
    BrokerUnreachableError,
    LogAuthorizationError,
    ProducerFencedError,
    Record,
    RecordRefusedError,
    TransactionAbortedError,
)
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.partitions import TopicPartition
from tests.support.kafka.mock_cluster import (
    ADD_OFFSETS_TO_TXN,
    END_TXN,
    FETCH,
    INIT_PRODUCER_ID,
    PRODUCE,
    MockCluster,
    MockControl,
)

_topics = itertools.count()


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[MockCluster, MockControl]]:
    cluster = MockCluster()
    yield cluster, MockControl(cluster)
    cluster.close()


@pytest.fixture
def control(cluster: tuple[MockCluster, MockControl]) -> MockControl:
    return cluster[1]


@pytest.fixture
def tp(control: MockControl) -> TopicPartition:
    name = f"errors-{next(_topics)}"
    control.create_topic(name, 2)
    return TopicPartition(name, 1)


@pytest.fixture
def log(cluster: tuple[MockCluster, MockControl]) -> Iterator[KafkaLog]:
    log = KafkaLog.open(cluster[0].url, {}, request_timeout_s=10.0, transaction_timeout_s=10.0)
    yield log
    log.close()


def rec(value: bytes = b"v") -> Record:
    return Record(b"k", value, 1_000)


def test_a_refused_produce_names_the_write_acl(
    log: KafkaLog, control: MockControl, tp: TopicPartition
) -> None:
    control.fail_next(PRODUCE, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(LogAuthorizationError, match=f'WRITE on topic "{tp.topic}"'):
        log.produce(tp, [rec()])
    assert log.produce(tp, [rec()]) == [0]  # nothing was written before


def test_a_refused_fetch_names_the_read_acl(
    log: KafkaLog, control: MockControl, tp: TopicPartition
) -> None:
    log.produce(tp, [rec()])
    control.fail_next(FETCH, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(LogAuthorizationError, match=f'READ on topic "{tp.topic}"'):
        log.fetch(tp, 0)


def test_a_commit_the_coordinator_fences_raises_producer_fenced_for_good(
    log: KafkaLog, control: MockControl, tp: TopicPartition
) -> None:
    producer = log.transactional_producer(f"{tp.topic}-0_0")
    producer.begin()
    producer.send(tp, rec())
    control.fail_next(END_TXN, KafkaError.PRODUCER_FENCED)
    with pytest.raises(ProducerFencedError):
        producer.commit()
    with pytest.raises(ProducerFencedError):
        producer.begin()


def test_a_coordinator_busy_with_the_previous_transaction_is_waited_for(
    log: KafkaLog, control: MockControl, tp: TopicPartition
) -> None:
    producer = log.transactional_producer(f"{tp.topic}-0_0")
    producer.begin()
    producer.send(tp, rec())
    control.fail_next(
        END_TXN, KafkaError.CONCURRENT_TRANSACTIONS, KafkaError.COORDINATOR_LOAD_IN_PROGRESS
    )
    assert producer.commit().last_offsets == {tp: 0}


def test_a_record_the_broker_refuses_aborts_the_transaction_and_stops_the_task(
    log: KafkaLog, control: MockControl, tp: TopicPartition
) -> None:
    """Issue 33: a record too large for the topic (the broker's MESSAGE_TOO_LARGE, Kafka's
    RecordTooLargeException) is refused as it is; the task starting over from its last
    commit, as for an aborted transaction, would meet it again forever. So it is a
    RecordRefusedError (not a fencing): the transaction is aborted, the task stops naming
    the partition and the topic setting."""
    producer = log.transactional_producer(f"{tp.topic}-0_0")
    producer.begin()
    control.fail_next(PRODUCE, KafkaError.MSG_SIZE_TOO_LARGE)
    producer.send(tp, rec())
    with pytest.raises(RecordRefusedError) as raised:
        producer.commit()
    assert not isinstance(raised.value, ProducerFencedError)
    message = str(raised.value)
    assert f"sending to {tp.topic}-{tp.partition}" in message
    assert "MSG_SIZE_TOO_LARGE" in message and "max.message.bytes" in message
    assert "nothing of the transaction was written" in message
    producer.close()
    # A restarted task's producer (once the record is fixed) writes from the last commit.
    successor = log.transactional_producer(f"{tp.topic}-0_0")
    successor.begin()
    successor.send(tp, rec(b"next"))
    assert list(successor.commit().last_offsets) == [tp]


def test_another_failed_record_aborts_the_transaction_and_the_task_starts_over(
    log: KafkaLog, control: MockControl, tp: TopicPartition
) -> None:
    producer = log.transactional_producer(f"{tp.topic}-0_0")
    producer.begin()
    control.fail_next(PRODUCE, KafkaError.INVALID_REQUIRED_ACKS)
    producer.send(tp, rec())
    with pytest.raises(TransactionAbortedError) as raised:
        producer.commit()
    # The stream thread drops the task (as for fencing) and its next producer goes on.
    assert isinstance(raised.value, ProducerFencedError)
    producer.close()
    successor = log.transactional_producer(f"{tp.topic}-0_0")
    successor.begin()
    successor.send(tp, rec(b"next"))
    assert list(successor.commit().last_offsets) == [tp]


def test_a_record_the_broker_refuses_outside_a_transaction_names_the_partition(
    log: KafkaLog, control: MockControl, tp: TopicPartition
) -> None:
    """At-least-once appends outputs with the plain producer: the same error, at once."""
    control.fail_next(PRODUCE, KafkaError.MSG_SIZE_TOO_LARGE)
    with pytest.raises(RecordRefusedError, match=f"producing to {tp}"):
        log.produce(tp, [rec()])


def test_offsets_refused_for_the_group_name_the_group_acl_and_abort(
    log: KafkaLog, control: MockControl, tp: TopicPartition
) -> None:
    producer = log.transactional_producer(f"{tp.topic}-0_0")
    producer.begin()
    producer.send(tp, rec())
    producer.send_offsets("word-count", {tp: 1})
    control.fail_next(ADD_OFFSETS_TO_TXN, KafkaError.GROUP_AUTHORIZATION_FAILED)
    with pytest.raises(LogAuthorizationError, match='READ on group "word-count"'):
        producer.commit()
    producer.begin()  # the failed transaction was aborted
    producer.commit()


def test_a_refused_transactional_id_names_its_acl(
    log: KafkaLog, control: MockControl, tp: TopicPartition
) -> None:
    control.fail_next(INIT_PRODUCER_ID, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    with pytest.raises(LogAuthorizationError, match=f'WRITE on transactional id "{tp.topic}-0_0"'):
        log.transactional_producer(f"{tp.topic}-0_0")


def test_an_unreachable_cluster_names_the_bootstrap_servers_tried() -> None:
    log = KafkaLog.open("kafka://127.0.0.1:1,localhost:2", {}, request_timeout_s=1.0)
    try:
        with pytest.raises(BrokerUnreachableError, match=r"127\.0\.0\.1:1,localhost:2") as raised:
            log.end_offset(TopicPartition("anything", 0))
        assert "within 1 s" in str(raised.value)
    finally:
        log.close()
