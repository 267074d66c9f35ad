"""A fake of the confluent-kafka clients, at the boundary KafkaLog crosses (KafkaClients).

It keeps just enough broker state (topics, per-partition offsets, group
offsets, who called what) to check what the adapter asks librdkafka to do,
and lets a test script the errors librdkafka would raise. It says nothing
about Kafka's semantics: the log contract suite never runs against it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaPartition

from eddyline_runtime.log.kafka import KafkaClients, KafkaLog
from eddyline_runtime.log.kafka_settings import kafka_log_settings


def kafka_error(code: int, *, fatal: bool = False, retriable: bool = False, abort: bool = False):
    return KafkaException(
        KafkaError(code, "scripted", fatal=fatal, retriable=retriable, txn_requires_abort=abort)
    )


@dataclass
class FakeBroker:
    topics: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    group_offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    # method name -> errors to raise on its next calls, in order
    failures: dict[str, list[KafkaException]] = field(default_factory=dict)
    configs: list[dict[str, Any]] = field(default_factory=list)
    # errors the next delivery reports carry, one per message
    delivery_errors: list[KafkaError] = field(default_factory=list)
    # a fatal error the next flush reports as confluent-kafka sometimes does: through
    # the error callback, then a SystemError with no cause
    fatal_in_flush: KafkaError | None = None
    # the next flush fails as confluent-kafka also did (CI, zombie test): a SystemError with
    # no cause, the error callback never called, librdkafka in whatever state it is
    lost_in_flush: bool = False
    # the producer's fatal state (a fencing): every produce() is then refused with _FATAL
    # ("Local: Fatal error", not flagged fatal) as librdkafka does, and the error callback
    # reports this error, at once or (``fatal_queued``) on the next poll
    fatal_on_produce: KafkaError | None = None
    fatal_queued: bool = False
    # topic -> metadata requests that do not list it yet: a topic another client created
    # a moment ago, which the controller knows but this broker's metadata does not
    unlisted: dict[str, int] = field(default_factory=dict)
    # topic -> (partitions, config, unlisted_for): see created_elsewhere
    _races: dict[str, tuple[int, dict[str, str], int]] = field(default_factory=dict)

    def fail(self, method: str, *errors: KafkaException) -> None:
        self.failures.setdefault(method, []).extend(errors)

    def check(self, method: str, argument: Any = None) -> None:
        self.calls.append((method, argument))
        pending = self.failures.get(method)
        if pending:
            raise pending.pop(0)

    def created_elsewhere(
        self, name: str, partitions: int, policy: str = "delete", *, unlisted_for: int
    ) -> None:
        """Our creation of ``name`` will lose a race: another client creates it first (with
        ``partitions`` and cleanup ``policy``), and the metadata lists it only after
        ``unlisted_for`` more requests (a real KRaft broker does so for a moment)."""
        self._races[name] = (partitions, {"cleanup.policy": policy}, unlisted_for)

    def called(self, method: str) -> list[Any]:
        return [argument for name, argument in self.calls if name == method]


class _Future:
    def __init__(self, result: Any = None, error: KafkaException | None = None) -> None:
        self._result, self._error = result, error

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._result


@dataclass
class _Entry:
    value: str


@dataclass
class _TopicMetadata:
    partitions: dict[int, object]
    error: object = None


@dataclass
class _Metadata:
    topics: dict[str, _TopicMetadata]


class FakeMessage:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None


class FakeAdmin:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker

    def list_topics(self, timeout: float = -1) -> _Metadata:
        self.broker.check("list_topics")
        unlisted = self.broker.unlisted
        hidden = {name for name, requests in unlisted.items() if requests > 0}
        for name in hidden:
            unlisted[name] -= 1
        return _Metadata(
            {
                name: _TopicMetadata(dict.fromkeys(range(count)))
                for name, (count, _) in self.broker.topics.items()
                if name not in hidden
            }
        )

    def create_topics(self, topics: list[Any], **_: Any) -> dict[str, _Future]:
        futures = {}
        for topic in topics:
            try:
                self.broker.check("create_topics", topic)
            except KafkaException as exc:
                futures[topic.topic] = _Future(error=exc)
                continue
            race = self.broker._races.pop(topic.topic, None)
            if race is not None:
                partitions, config, unlisted_for = race
                self.broker.topics[topic.topic] = (partitions, config)
                self.broker.unlisted[topic.topic] = unlisted_for
                futures[topic.topic] = _Future(error=kafka_error(KafkaError.TOPIC_ALREADY_EXISTS))
                continue
            self.broker.topics[topic.topic] = (topic.num_partitions, dict(topic.config))
            futures[topic.topic] = _Future()
        return futures

    def describe_configs(self, resources: list[Any], **_: Any) -> dict[Any, _Future]:
        self.broker.check("describe_configs", [r.name for r in resources])
        return {
            resource: _Future(
                {key: _Entry(value) for key, value in self.broker.topics[resource.name][1].items()}
            )
            for resource in resources
        }

    def incremental_alter_configs(self, resources: list[Any], **_: Any) -> dict[Any, _Future]:
        """SET operations only (what the adapter sends): the topic's configs updated."""
        self.broker.check("incremental_alter_configs", [r.name for r in resources])
        for resource in resources:
            configs = self.broker.topics[resource.name][1]
            for entry in resource.incremental_configs:
                configs[entry.name] = entry.value
        return {resource: _Future() for resource in resources}


class FakeProducer:
    def __init__(self, broker: FakeBroker, config: Mapping[str, Any]) -> None:
        self.broker = broker
        self.config = dict(config)
        self.pending: list[tuple[FakeMessage, Callable[..., None] | None]] = []
        self.transaction: list[FakeMessage] = []
        self.fatal_reported = False

    def init_transactions(self, timeout: float = -1) -> None:
        self.broker.check("init_transactions", self.config["transactional.id"])

    def begin_transaction(self) -> None:
        self.broker.check("begin_transaction")

    def produce(self, topic: str, value: Any, key: Any, *, partition: int, **kwargs: Any) -> None:
        self.broker.check("produce", (topic, partition, value))
        fatal = self.broker.fatal_on_produce
        if fatal is not None:
            if not self.broker.fatal_queued and not self.fatal_reported:
                self.fatal_reported = True
                self.config["error_cb"](fatal)
            raise KafkaException(
                KafkaError(KafkaError._FATAL, "Unable to produce message: Local: Fatal error")
            )
        offset = self.broker.next_offsets.get((topic, partition), 0)
        self.broker.next_offsets[(topic, partition)] = offset + 1
        message = FakeMessage(topic, partition, offset)
        self.pending.append((message, kwargs.get("on_delivery") or self.config.get("on_delivery")))

    def poll(self, timeout: float = 0) -> int:
        fatal = self.broker.fatal_on_produce
        if fatal is not None and not self.fatal_reported:
            self.fatal_reported = True
            self.config["error_cb"](fatal)
        return 0

    def flush(self, timeout: float = -1) -> int:
        self.broker.check("flush")
        fatal, self.broker.fatal_in_flush = self.broker.fatal_in_flush, None
        if fatal is not None:
            self.config["error_cb"](fatal)
            raise SystemError("<method 'flush'> returned NULL without setting an exception")
        if self.broker.lost_in_flush:
            self.broker.lost_in_flush = False
            raise SystemError("<method 'flush'> returned NULL without setting an exception")
        for message, callback in self.pending:
            error = self.broker.delivery_errors.pop(0) if self.broker.delivery_errors else None
            if callback is not None:
                callback(error, message)
        self.pending = []
        return 0

    def send_offsets_to_transaction(
        self, positions: list[Any], metadata: Any, timeout: float
    ) -> None:
        self.broker.check(
            "send_offsets_to_transaction",
            (metadata, [(p.topic, p.partition, p.offset) for p in positions]),
        )

    def commit_transaction(self, timeout: float = -1) -> None:
        self.broker.check("commit_transaction")

    def abort_transaction(self, timeout: float = -1) -> None:
        self.broker.check("abort_transaction")


class FakeConsumer:
    def __init__(self, broker: FakeBroker, config: Mapping[str, Any]) -> None:
        self.broker = broker
        self.config = dict(config)

    def consumer_group_metadata(self) -> str:
        return f"metadata of {self.config['group.id']}"

    def committed(self, partitions: list[KafkaPartition], timeout: float = -1) -> list[Any]:
        self.broker.check("committed", self.config["group.id"])
        group = self.config["group.id"]
        return [
            KafkaPartition(
                p.topic,
                p.partition,
                self.broker.group_offsets.get((group, p.topic, p.partition), -1001),
            )
            for p in partitions
        ]

    def commit(self, offsets: list[KafkaPartition], asynchronous: bool = True) -> list[Any]:
        self.broker.check("commit", self.config["group.id"])
        for p in offsets:
            self.broker.group_offsets[(self.config["group.id"], p.topic, p.partition)] = p.offset
        return offsets

    def get_watermark_offsets(
        self, partition: KafkaPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        self.broker.check("get_watermark_offsets", (partition.topic, partition.partition))
        return 0, self.broker.next_offsets.get((partition.topic, partition.partition), 0)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        self.broker.check("consumer list_topics", topic)

    def close(self) -> None:
        pass


class FakeClients(KafkaClients):
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.producers: list[FakeProducer] = []

    def producer(self, config: Mapping[str, Any]) -> Any:
        self.broker.configs.append(dict(config))
        self.broker.check("new producer", config.get("transactional.id"))
        producer = FakeProducer(self.broker, config)
        self.producers.append(producer)
        return producer

    def consumer(self, config: Mapping[str, Any]) -> Any:
        self.broker.configs.append(dict(config))
        return FakeConsumer(self.broker, config)

    def admin(self, config: Mapping[str, Any]) -> Any:
        self.broker.configs.append(dict(config))
        return FakeAdmin(self.broker)


def fake_log(
    broker: FakeBroker, settings: Mapping[str, object] | None = None, **options: Any
) -> KafkaLog:
    return KafkaLog(
        kafka_log_settings("kafka://broker-0:9092,broker-1:9092", settings or {}),
        clients=FakeClients(broker),
        **options,
    )
