"""KafkaLog against a fake of confluent-kafka: admin paths, transaction bookkeeping,
fencing and error mapping (what librdkafka's mock cluster cannot show).

These check what the adapter asks of librdkafka and how it reads librdkafka's
errors, not Kafka's semantics: the contract suite does that against a broker.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.log import (
    BrokerUnreachableError,
    LogAuthorizationError,
    LogError,
    ProducerFencedError,
    Record,
    TopicConflictError,
    TopicSpec,
    TransactionAbortedError,
    TransactionStateError,
    TransactionTimeoutError,
    UnknownTopicError,
)
from eddyline_runtime.partitions import TopicPartition
from tests.support.kafka.fake_clients import FakeBroker, fake_log, kafka_error

OUT = TopicPartition("out", 0)
OUT_1 = TopicPartition("out", 1)
IN = TopicPartition("in", 0)


@pytest.fixture
def broker() -> FakeBroker:
    broker = FakeBroker()
    broker.topics["in"] = (2, {"cleanup.policy": "delete"})
    broker.topics["out"] = (2, {"cleanup.policy": "delete"})
    broker.topics["__consumer_offsets"] = (50, {"cleanup.policy": "compact"})
    return broker


def rec(value: bytes) -> Record:
    return Record(b"k", value, 1_000)


# Topics through the admin client


def test_create_topic_asks_for_compaction_replication_and_min_insync_from_the_settings(
    broker: FakeBroker,
) -> None:
    log = fake_log(broker, {"replication.factor": "3", "min.insync.replicas": "2"})
    assert log.create_topic("app-counts-changelog", 4, compacted=True) == TopicSpec(
        "app-counts-changelog", 4, compacted=True
    )
    (topic,) = broker.called("create_topics")
    assert (topic.topic, topic.num_partitions, topic.replication_factor) == (
        "app-counts-changelog",
        4,
        3,
    )
    assert topic.config == {"cleanup.policy": "compact", "min.insync.replicas": "2"}


def test_create_topic_leaves_replication_to_the_broker_by_default(broker: FakeBroker) -> None:
    fake_log(broker).create_topic("events", 1)
    (topic,) = broker.called("create_topics")
    assert topic.replication_factor == -1
    assert topic.config == {"cleanup.policy": "delete"}


def test_an_identical_existing_topic_is_accepted_without_creating_it(broker: FakeBroker) -> None:
    assert fake_log(broker).create_topic("in", 2) == TopicSpec("in", 2)
    assert broker.called("create_topics") == []


@pytest.mark.parametrize(
    ("partitions", "compacted", "fix"),
    [(3, False, "3 partitions"), (2, True, "cleanup.policy=compact")],
)
def test_an_existing_topic_of_another_shape_names_the_topic_and_the_fix(
    broker: FakeBroker, partitions: int, compacted: bool, fix: str
) -> None:
    with pytest.raises(TopicConflictError) as raised:
        fake_log(broker).create_topic("in", partitions, compacted=compacted)
    message = str(raised.value)
    assert '"in"' in message
    assert fix in message
    assert "kafka-topics.sh --delete --topic in" in message
    assert broker.called("create_topics") == []


def test_a_topic_created_meanwhile_by_someone_else_is_checked_like_an_existing_one(
    broker: FakeBroker,
) -> None:
    log = fake_log(broker)
    check = broker.check

    def created_by_another_instance(method: str, argument: object = None) -> None:
        if method == "create_topics":
            broker.topics["late"] = (1, {"cleanup.policy": "compact"})
            raise kafka_error(KafkaError.TOPIC_ALREADY_EXISTS)
        check(method, argument)

    broker.check = created_by_another_instance  # type: ignore[method-assign]
    assert log.create_topic("late", 1, compacted=True) == TopicSpec("late", 1, compacted=True)


def test_a_topic_created_meanwhile_that_metadata_lists_late_is_awaited_then_listed(
    broker: FakeBroker,
) -> None:
    log = fake_log(broker)
    broker.created_elsewhere("late", 4, unlisted_for=3)
    assert log.create_topic("late", 4) == TopicSpec("late", 4)
    # Without waiting, the caller's next listing lacked it (resolve_topics' layout did).
    assert log.topics()["late"] == TopicSpec("late", 4)


def test_a_topic_created_meanwhile_in_another_shape_is_a_conflict_though_listed_late(
    broker: FakeBroker,
) -> None:
    broker.created_elsewhere("late", 3, unlisted_for=3)
    with pytest.raises(TopicConflictError, match=r'"late".*3 partitions'):
        fake_log(broker).create_topic("late", 4)


def test_a_topic_created_meanwhile_that_never_shows_names_the_topic(
    broker: FakeBroker,
) -> None:
    broker.created_elsewhere("late", 4, unlisted_for=1_000_000)
    log = fake_log(broker, request_timeout_s=0.2)
    with pytest.raises(BrokerUnreachableError, match='topic "late" never appeared'):
        log.create_topic("late", 4)


def test_topics_lists_partition_counts_and_cleanup_policy_without_internal_topics(
    broker: FakeBroker,
) -> None:
    broker.topics["counts-changelog"] = (2, {"cleanup.policy": "compact,delete"})
    assert dict(fake_log(broker).topics()) == {
        "in": TopicSpec("in", 2),
        "out": TopicSpec("out", 2),
        "counts-changelog": TopicSpec("counts-changelog", 2, compacted=True),
    }


def test_a_topic_prefix_hides_other_topics_and_prefixes_created_ones(broker: FakeBroker) -> None:
    log = fake_log(broker, topic_prefix="run-7.")
    log.create_topic("in", 1)
    assert broker.called("create_topics")[0].topic == "run-7.in"
    assert dict(log.topics()) == {"in": TopicSpec("in", 1)}


def test_producing_to_an_unknown_partition_names_the_existing_topics(broker: FakeBroker) -> None:
    log = fake_log(broker)
    with pytest.raises(UnknownTopicError, match=r"out-2 \(topic has 2 partitions\).*in, out"):
        log.produce(TopicPartition("out", 2), [rec(b"a")])
    assert broker.called("produce") == []


# Transaction bookkeeping


def test_a_transaction_sends_records_then_offsets_with_group_metadata_then_commits(
    broker: FakeBroker,
) -> None:
    log = fake_log(broker)
    producer = log.transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"a"))
    producer.send_batch(OUT_1, [rec(b"b"), rec(b"c")])
    producer.send(OUT, rec(b"d"))
    producer.send_offsets("app", {IN: 5})
    producer.send_offsets("app", {IN: 7})
    committed = producer.commit()
    methods = [name for name, _ in broker.calls if name not in ("list_topics", "produce")]
    assert methods == [
        "new producer",
        "init_transactions",
        "begin_transaction",
        "flush",
        "send_offsets_to_transaction",
        "commit_transaction",
    ]
    assert broker.called("send_offsets_to_transaction") == [("metadata of app", [("in", 0, 7)])]
    assert list(committed.offsets) == [(OUT, 0), (OUT_1, 0), (OUT_1, 1), (OUT, 1)]
    assert dict(committed.last_offsets) == {OUT: 1, OUT_1: 1}


def test_each_task_producer_gets_its_transactional_id_and_reports_offsets_per_transaction(
    broker: FakeBroker,
) -> None:
    log = fake_log(broker)
    producer = log.transactional_producer("app-1_3")
    assert broker.called("init_transactions") == ["app-1_3"]
    for value in (b"first", b"second"):
        producer.begin()
        producer.send(OUT, rec(value))
        last = producer.commit().last_offsets[OUT]
    assert last == 1
    config = next(c for c in broker.configs if "transactional.id" in c)
    assert config["transactional.id"] == "app-1_3"
    assert config["bootstrap.servers"] == "broker-0:9092,broker-1:9092"


def test_transaction_state_is_checked_before_librdkafka_is_asked(broker: FakeBroker) -> None:
    producer = fake_log(broker).transactional_producer("app-0_0")
    with pytest.raises(TransactionStateError, match="begin"):
        producer.send(OUT, rec(b"a"))
    with pytest.raises(TransactionStateError):
        producer.commit()
    producer.begin()
    with pytest.raises(TransactionStateError, match="already open"):
        producer.begin()
    assert broker.called("begin_transaction") == [None]


def test_abort_drops_the_offsets_and_the_next_transaction_starts_clean(broker: FakeBroker) -> None:
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    producer.send_offsets("app", {IN: 9})
    producer.abort()
    producer.begin()
    producer.commit()
    assert broker.called("abort_transaction") == [None]
    assert broker.called("send_offsets_to_transaction") == []


def test_abort_delivers_the_queued_records_before_aborting(broker: FakeBroker) -> None:
    """librdkafka#4849: an abort racing the registration of the transaction's partitions
    is refused as fatal; delivering first registers them (seen on a loaded broker)."""
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"dropped"))
    producer.abort()
    order = [name for name, _ in broker.calls if name in ("flush", "abort_transaction")]
    assert order == ["flush", "abort_transaction"]


# Fencing and failed transactions


@pytest.mark.parametrize("code", [KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH])
def test_a_fenced_commit_raises_producer_fenced_and_the_producer_stays_fenced(
    broker: FakeBroker, code: int
) -> None:
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"zombie"))
    broker.fail("commit_transaction", kafka_error(code, fatal=True))
    with pytest.raises(ProducerFencedError) as raised:
        producer.commit()
    assert raised.value.transactional_id == "app-0_0"
    with pytest.raises(ProducerFencedError):
        producer.begin()
    assert broker.called("begin_transaction") == [None]
    assert broker.called("abort_transaction") == []


def test_fencing_found_while_sending_offsets_is_fencing_too(broker: FakeBroker) -> None:
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    producer.send_offsets("app", {IN: 1})
    broker.fail("send_offsets_to_transaction", kafka_error(KafkaError._FENCED, fatal=True))
    with pytest.raises(ProducerFencedError):
        producer.commit()
    assert broker.called("commit_transaction") == []


def test_a_fatal_error_flush_lost_to_a_system_error_is_fencing(broker: FakeBroker) -> None:
    """confluent-kafka reported a fencing found while flushing as a SystemError with no
    cause (CI, zombie test): the error callback's fatal error is what it meant."""
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"zombie"))
    broker.fatal_in_flush = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    with pytest.raises(ProducerFencedError):
        producer.commit()
    with pytest.raises(ProducerFencedError):
        producer.begin()
    assert broker.called("commit_transaction") == []


@pytest.mark.parametrize("queued", [False, True], ids=["reported", "callback-queued"])
@pytest.mark.parametrize("how", ["send", "send_columns"])
def test_a_fencing_met_while_sending_is_fencing_not_a_plain_log_error(
    broker: FakeBroker, queued: bool, how: str
) -> None:
    """librdkafka refuses produce() after a fencing with _FATAL ("Local: Fatal error", not
    flagged fatal); the fencing itself only comes through the error callback (maybe still
    queued then). A real broker did this (issue 38): the stream thread, told a plain
    LogError, failed and its pod exited instead of handing the task over."""
    producer = fake_log(broker).transactional_producer("app-0_1")
    producer.begin()
    broker.fatal_on_produce = KafkaError(
        KafkaError._FENCED, "This instance has been fenced by a newer instance", fatal=True
    )
    broker.fatal_queued = queued
    with pytest.raises(ProducerFencedError) as raised:
        if how == "send":
            producer.send(OUT, rec(b"zombie"))
        else:
            producer.send_columns(OUT, [b"k"], [b"zombie"], [1_000])
    message = str(raised.value)
    assert "fenced by a newer one" in message
    assert "_FENCED" in message and f"sending to {OUT}" in message, message
    with pytest.raises(ProducerFencedError):  # unusable from now on
        producer.begin()
    producer.close()  # a fenced producer is not asked to abort
    assert broker.called("abort_transaction") == []


def test_a_refused_send_without_a_recorded_fatal_error_is_still_a_fatal_state(
    broker: FakeBroker,
) -> None:
    """_FATAL with no fatal error reported at all: librdkafka still says the producer can no
    longer be used, so the task is dropped and its producer made anew (as for fencing)."""
    producer = fake_log(broker).transactional_producer("app-0_1")
    producer.begin()
    broker.fail(
        "produce",
        KafkaException(KafkaError(KafkaError._FATAL, "Unable to produce message: Fatal error")),
    )
    with pytest.raises(ProducerFencedError, match="_FATAL"):
        producer.send(OUT, rec(b"a"))


def test_a_fencing_flush_lost_without_a_callback_is_found_by_aborting(broker: FakeBroker) -> None:
    """The same SystemError with the error callback never called (CI, zombie test, after
    the test above's mend): librdkafka, in its fatal state, names the fencing to the abort
    the failed transaction needs anyway."""
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"zombie"))
    broker.lost_in_flush = True
    broker.fail("abort_transaction", kafka_error(KafkaError._FENCED, fatal=True))
    with pytest.raises(ProducerFencedError):
        producer.commit()
    assert broker.called("commit_transaction") == []


def test_a_flush_lost_to_a_system_error_without_fencing_aborts_and_says_so(
    broker: FakeBroker,
) -> None:
    """Not fenced: the transaction is aborted (nothing of it committed) and the error is the
    SystemError itself, a failure of the client library the thread reports."""
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"a"))
    broker.lost_in_flush = True
    with pytest.raises(SystemError, match="returned NULL"):
        producer.commit()
    assert broker.called("abort_transaction") == [None]
    assert broker.called("commit_transaction") == []
    producer.begin()  # aborted, not fenced: the next transaction can begin
    producer.commit()


def test_an_abortable_commit_error_aborts_and_is_handled_like_fencing(broker: FakeBroker) -> None:
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"a"))
    broker.fail("commit_transaction", kafka_error(KafkaError.INVALID_TXN_STATE, abort=True))
    with pytest.raises(TransactionAbortedError, match="restarts from its last commit"):
        producer.commit()
    assert broker.called("abort_transaction") == [None]
    # The stream thread catches ProducerFencedError: drop the task, keep its stores.
    assert issubclass(TransactionAbortedError, ProducerFencedError)
    producer.begin()  # an aborted (not fenced) producer goes on
    producer.commit()


def test_a_failed_delivery_lets_librdkafka_fail_the_commit_then_aborts(
    broker: FakeBroker,
) -> None:
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    producer.send(OUT, rec(b"a"))
    broker.delivery_errors.append(KafkaError(KafkaError._MSG_TIMED_OUT))
    broker.fail("commit_transaction", kafka_error(KafkaError._MSG_TIMED_OUT, abort=True))
    with pytest.raises(TransactionAbortedError):
        producer.commit()
    assert broker.called("abort_transaction") == [None]


def test_an_unexpected_commit_error_aborts_so_the_next_transaction_can_begin(
    broker: FakeBroker,
) -> None:
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    broker.fail("commit_transaction", kafka_error(KafkaError._INVALID_ARG))
    with pytest.raises(LogError, match="_INVALID_ARG"):
        producer.commit()
    assert broker.called("abort_transaction") == [None]
    producer.begin()
    producer.commit()


def test_a_fatal_error_while_aborting_fences_the_producer(broker: FakeBroker) -> None:
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    broker.fail("abort_transaction", kafka_error(KafkaError._FENCED, fatal=True))
    with pytest.raises(ProducerFencedError):
        producer.abort()
    with pytest.raises(ProducerFencedError):
        producer.begin()


@pytest.mark.parametrize(
    ("code", "name"),
    [(KafkaError._FENCED, "_FENCED"), (KafkaError.INVALID_TXN_STATE, "INVALID_TXN_STATE")],
)
def test_a_fencing_met_while_aborting_keeps_librdkafkas_error_in_its_message(
    broker: FakeBroker, code: int, name: str
) -> None:
    """Several codes, and any fatal error, become one ProducerFencedError: its message keeps
    which one librdkafka reported, and in which call, so an unexpected fencing says why."""
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    broker.fail("abort_transaction", kafka_error(code, fatal=True))
    with pytest.raises(ProducerFencedError) as raised:
        producer.abort()
    message = str(raised.value)
    assert f"aborting: librdkafka {name} (code {code}, fatal): scripted" in message
    assert raised.value.cause is not None and name in raised.value.cause
    with pytest.raises(ProducerFencedError, match=name):
        producer.begin()


def test_a_retriable_commit_error_is_retried(broker: FakeBroker) -> None:
    producer = fake_log(broker).transactional_producer("app-0_0")
    producer.begin()
    broker.fail("commit_transaction", kafka_error(KafkaError._TIMED_OUT, retriable=True))
    producer.commit()
    assert broker.called("commit_transaction") == [None, None]


def test_a_commit_that_keeps_timing_out_raises_transaction_timeout_naming_the_brokers(
    broker: FakeBroker,
) -> None:
    producer = fake_log(broker, transaction_timeout_s=0.0).transactional_producer("app-0_0")
    producer.begin()
    broker.fail(
        "commit_transaction",
        *[kafka_error(KafkaError._TIMED_OUT, retriable=True) for _ in range(3)],
    )
    with pytest.raises(TransactionTimeoutError, match=r"broker-0:9092,broker-1:9092"):
        producer.commit()
    assert isinstance(TransactionTimeoutError("t", "x", 1, "b"), ProducerFencedError)


# Error mapping


@pytest.mark.parametrize(
    ("method", "code", "acl"),
    [
        ("produce", KafkaError.TOPIC_AUTHORIZATION_FAILED, 'WRITE on topic "out"'),
        (
            "init_transactions",
            KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            'WRITE on transactional id "app-0_0"',
        ),
        (
            "send_offsets_to_transaction",
            KafkaError.GROUP_AUTHORIZATION_FAILED,
            'READ on group "app"',
        ),
        ("init_transactions", KafkaError.CLUSTER_AUTHORIZATION_FAILED, "IDEMPOTENT_WRITE"),
    ],
)
def test_a_refused_operation_names_the_missing_acl(
    broker: FakeBroker, method: str, code: int, acl: str
) -> None:
    log = fake_log(broker)
    broker.fail(method, kafka_error(code))
    with pytest.raises(LogAuthorizationError) as raised:
        producer = log.transactional_producer("app-0_0")
        producer.begin()
        producer.send(OUT, rec(b"a"))
        producer.send_offsets("app", {IN: 1})
        producer.commit()
    assert acl in str(raised.value)
    assert "spec.log.secretName" in str(raised.value)


def test_creating_a_topic_without_the_acl_names_create(broker: FakeBroker) -> None:
    broker.fail("create_topics", kafka_error(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(LogAuthorizationError, match='CREATE on topic "app-repartition"'):
        fake_log(broker).create_topic("app-repartition", 2)


def test_group_offsets_without_the_acl_name_the_group(broker: FakeBroker) -> None:
    broker.fail("commit", kafka_error(KafkaError.GROUP_AUTHORIZATION_FAILED))
    with pytest.raises(LogAuthorizationError, match='READ on group "word-count"'):
        fake_log(broker).commit_offsets("word-count", {IN: 3})


def test_an_unreachable_cluster_names_the_bootstrap_servers_tried(broker: FakeBroker) -> None:
    broker.fail("list_topics", kafka_error(KafkaError._TRANSPORT))
    with pytest.raises(BrokerUnreachableError, match="broker-0:9092,broker-1:9092"):
        fake_log(broker).topics()


def test_failed_authentication_points_at_the_log_secret(broker: FakeBroker) -> None:
    broker.fail("list_topics", kafka_error(KafkaError._AUTHENTICATION))
    with pytest.raises(BrokerUnreachableError, match=r"spec\.log\.secretName"):
        fake_log(broker, {"sasl.password": "hunter2"}).topics()


def test_a_rejected_client_setting_is_a_config_error_that_never_shows_values(
    broker: FakeBroker,
) -> None:
    broker.fail("new producer", kafka_error(KafkaError._INVALID_ARG))
    log = fake_log(broker, {"sasl.password": "hunter2"})
    with pytest.raises(ConfigError) as raised:
        log.transactional_producer("app-0_0")
    assert "hunter2" not in str(raised.value)


def test_group_offsets_round_trip_through_the_group_consumer(broker: FakeBroker) -> None:
    log = fake_log(broker)
    assert log.committed_offsets("app", [IN]) == {}
    log.commit_offsets("app", {IN: 4})
    assert log.committed_offsets("app", [IN, TopicPartition("in", 1)]) == {IN: 4}
    group_config = next(c for c in broker.configs if c.get("group.id") == "app")
    assert group_config["isolation.level"] == "read_uncommitted"


def test_group_offsets_are_asked_again_while_the_coordinator_loads_or_moves(
    broker: FakeBroker,
) -> None:
    """A new cluster, a broker restart or a leader change moves the group coordinator;
    the request is repeated instead of failing the stream thread."""
    log = fake_log(broker)
    broker.fail(
        "commit",
        kafka_error(KafkaError.COORDINATOR_LOAD_IN_PROGRESS),
        kafka_error(KafkaError.NOT_COORDINATOR),
    )
    log.commit_offsets("app", {IN: 4})
    broker.fail("committed", kafka_error(KafkaError.COORDINATOR_NOT_AVAILABLE))
    assert log.committed_offsets("app", [IN]) == {IN: 4}
    assert len(broker.called("committed")) == 2


def test_a_coordinator_that_never_comes_back_fails_after_the_request_timeout(
    broker: FakeBroker,
) -> None:
    log = fake_log(broker, request_timeout_s=0.3)
    broker.fail("committed", *[kafka_error(KafkaError.NOT_COORDINATOR)] * 100)
    with pytest.raises(LogError, match='reading the offsets of group "app"'):
        log.committed_offsets("app", [IN])
    assert 2 <= len(broker.called("committed")) < 100


@pytest.mark.parametrize(
    "code",
    [KafkaError._DESTROY_BROKER, KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError._TIMED_OUT],
    ids=["broker-handle-destroyed", "not-leader", "timed-out"],
)
def test_a_watermark_query_met_by_a_restarting_broker_is_asked_again(
    broker: FakeBroker, code: int
) -> None:
    # A restarted broker's handle is destroyed under a queued query (3-broker cluster, a
    # broker restart ended a stream thread with _DESTROY_BROKER): like a moving leader,
    # ask the metadata again and repeat the query within the request timeout.
    broker.next_offsets[("words", 0)] = 42
    log = fake_log(broker)
    broker.fail("get_watermark_offsets", kafka_error(code))
    assert log._reader().bounds(TopicPartition("words", 0), "words") == (0, 42)
    assert len(broker.called("get_watermark_offsets")) == 2
    assert broker.called("consumer list_topics") == ["words"]


def test_a_watermark_query_refused_for_good_names_the_partition(broker: FakeBroker) -> None:
    log = fake_log(broker)
    broker.fail("get_watermark_offsets", kafka_error(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(LogError, match="reading the offsets of words-0"):
        log._reader().bounds(TopicPartition("words", 0), "words")
