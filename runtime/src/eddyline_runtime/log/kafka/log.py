"""The Kafka log: eddyline's topics in a Kafka cluster, through confluent-kafka (librdkafka).

Pods on a cluster cannot share the embedded SQLite log; in production the
input, output, repartition and changelog topics live in Kafka. This package
speaks the :class:`~eddyline_runtime.log.port.Log` port over librdkafka, and
is the only one that imports ``confluent_kafka``. Its modules, by job:

* ``log`` (here): :class:`KafkaLog`, the port; the clients it makes (one reader
  and one plain producer per thread, a consumer per group for group offsets);
  plain produce, fetch, offsets.
* ``reader``: the ``read_committed`` reader and how fetches meet transaction
  markers (KIP-695's lag).
* ``producer``: each task's transactional producer (fencing, commit, epochs).
* ``admin``: topics (metadata, creation, cleanup policies).
* ``errors``: librdkafka's errors as the port's typed errors; refused
  operations name the missing ACL, an unreachable cluster the bootstrap tried.

librdkafka's mock cluster (``test.mock.num.brokers``) is faithful for
produce, fetch and watermarks only: never use it as evidence for
exactly-once. The contract suite runs against a real broker
(``tests/support/kafka/``).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.log.errors import BrokerUnreachableError, LogError
from eddyline_runtime.log.kafka.admin import KafkaTopics
from eddyline_runtime.log.kafka.errors import coordinator_moving, kafka_error, log_error
from eddyline_runtime.log.kafka.producer import (
    PRODUCER_TUNING,
    Deliveries,
    KafkaTransactionalProducer,
    produce_record,
)
from eddyline_runtime.log.kafka.reader import (
    OFFSETS_CONFIG,
    READER_CONFIG,
    READER_TUNING,
    PartitionReader,
    message_headers,
    message_offset,
)
from eddyline_runtime.log.kafka_settings import KafkaLogSettings, kafka_log_settings
from eddyline_runtime.log.port import (
    ChangeBatch,
    FetchedColumns,
    FetchResult,
    Log,
    Record,
    TopicSpec,
    TransactionalProducer,
)
from eddyline_runtime.partitions import TopicPartition

logger = logging.getLogger(__name__)

# Metadata, admin, watermark and group-offset calls: long enough for a leader
# election or a broker restart, short enough that a wrong address fails.
_REQUEST_TIMEOUT_S = 30.0
# init/commit/abort of a transaction: the broker's transaction.timeout.ms
# default (60 s) bounds how long an answer can take.
_TRANSACTION_TIMEOUT_S = 60.0
# Idle producers are polled this often by their thread's fetches, so statistics
# reports do not pile up in librdkafka's queue while a task has no input.
_SERVE_PRODUCERS_S = 1.0


class _ThreadClients:
    """One thread's reader, plain producer and transactional producers."""

    def __init__(self) -> None:
        self.reader: PartitionReader | None = None
        self.producer: Producer | None = None
        self.transactional: weakref.WeakSet[KafkaTransactionalProducer] = weakref.WeakSet()
        self.served_at = time.monotonic()
        self.ready = True


class KafkaClients:
    """Makes the librdkafka clients; the boundary tests replace with a fake."""

    def producer(self, config: Mapping[str, Any]) -> Producer:
        return Producer(dict(config))

    def consumer(self, config: Mapping[str, Any]) -> Consumer:
        return Consumer(dict(config))

    def admin(self, config: Mapping[str, Any]) -> AdminClient:
        return AdminClient(dict(config))


class KafkaLog(Log):
    """A :class:`Log` on a Kafka cluster; safe across threads (a consumer per thread).

    ``topic_prefix`` puts every topic of this handle under a prefix (topics
    without it are invisible), so runs can share a cluster in isolation;
    group ids and transactional ids are not prefixed.
    """

    def __init__(
        self,
        settings: KafkaLogSettings,
        *,
        topic_prefix: str = "",
        clients: KafkaClients | None = None,
        request_timeout_s: float = _REQUEST_TIMEOUT_S,
        transaction_timeout_s: float = _TRANSACTION_TIMEOUT_S,
    ) -> None:
        self.settings = settings
        self.topic_prefix = topic_prefix
        self._clients = clients or KafkaClients()
        self.request_timeout_s = request_timeout_s
        self.transaction_timeout_s = transaction_timeout_s
        self._lock = threading.Lock()
        self._local = threading.local()
        self._last_client_error: str | None = None
        self.topic_admin = KafkaTopics(self)
        self._group_consumers: dict[str, Consumer] = {}
        self._group_metadata: dict[str, Any] = {}
        # Each thread's clients, for close(): a threading.local shows each thread only
        # its own attributes, so close() keeps the objects the locals point to.
        self._threads: list[_ThreadClients] = []
        # Per partition, a last stable offset seen and where committed data ended
        # below it, when a reader found only transaction markers in between: a
        # read_committed reader at that data end is at the end (see end_offset).
        self._data_ends: dict[tuple[str, int], tuple[int, int]] = {}
        self._closed = False

    @classmethod
    def open(
        cls,
        url: str,
        settings: Mapping[str, object] | None = None,
        **options: Any,
    ) -> KafkaLog:
        """``kafka://host:port,...`` with client settings (librdkafka names; see kafka_settings)."""
        return cls(kafka_log_settings(url, settings or {}), **options)

    @property
    def url(self) -> str:
        return f"kafka://{self.settings.bootstrap}"

    # -- clients ---------------------------------------------------------------------

    def client_config(
        self, defaults: Mapping[str, Any] | None = None, /, **overrides: Any
    ) -> dict[str, Any]:
        """librdkafka configuration: ``defaults`` (tuning the log settings may change),
        the log settings, then ``overrides`` (what the adapter's semantics rest on)."""
        return {
            **(defaults or {}),
            "bootstrap.servers": self.settings.bootstrap,
            **self.settings.client,
            "logger": logger,
            "error_cb": self.report_client_error,
            **overrides,
        }

    def new_client(self, kind: str, config: Mapping[str, Any]) -> Any:
        try:
            return getattr(self._clients, kind)(config)
        except KafkaException as exc:
            error = kafka_error(exc)
            # librdkafka names the property it rejects; values are never echoed.
            raise ConfigError(
                "spec.log.secretName",
                "(hidden)",
                "librdkafka client properties (docs/kafka.md lists the usual ones)",
                hint=error.str() if error is not None else str(exc),
            ) from None

    def report_client_error(self, error: KafkaError) -> None:
        """Every client's error callback: logged, and kept for the next error message."""
        self._last_client_error = error.str()
        logger.warning("Kafka client error: %s", error.str())

    def _thread_state(self) -> _ThreadClients:
        state: _ThreadClients | None = getattr(self._local, "clients", None)
        if state is None or not state.ready:
            state = self._local.clients = _ThreadClients()
            with self._lock:
                self._threads.append(state)
        return state

    def _reader(self) -> PartitionReader:
        state = self._thread_state()
        if state.reader is None:
            consumer = self.new_client(
                "consumer", self.client_config(READER_TUNING, **READER_CONFIG)
            )
            offsets = self.new_client("consumer", self.client_config(**OFFSETS_CONFIG))
            state.reader = PartitionReader(self, consumer, offsets)
        reader: PartitionReader = state.reader
        if time.monotonic() - state.served_at > _SERVE_PRODUCERS_S:
            state.served_at = time.monotonic()
            for producer in list(state.transactional):
                producer.serve()
        return reader

    def _plain_producer(self) -> Producer:
        state = self._thread_state()
        if state.producer is None:
            state.producer = self.new_client(
                "producer",
                self.client_config(
                    PRODUCER_TUNING,
                    **{"enable.idempotence": True, "allow.auto.create.topics": False},
                ),
            )
        producer: Producer = state.producer
        return producer

    def _group_consumer(self, group: str) -> Consumer:
        consumer = self._group_consumers.get(group)
        if consumer is None:
            with self._lock:
                consumer = self._group_consumers.get(group)
                if consumer is None:
                    consumer = self.new_client(
                        "consumer",
                        self.client_config(
                            **{
                                "group.id": group,
                                "enable.auto.commit": False,
                                # committed() must not wait for open transactions: the
                                # runtime starts a task's producer, which settles its
                                # predecessor's transaction, before it reads offsets.
                                "isolation.level": "read_uncommitted",
                                "allow.auto.create.topics": False,
                            }
                        ),
                    )
                    self._group_consumers[group] = consumer
        return consumer

    def group_metadata(self, group: str) -> Any:
        """The consumer group metadata ``send_offsets_to_transaction`` needs.

        Kept per group: the group's consumer never joins it (no member id, no generation),
        so its metadata never changes, and each commit need not ask librdkafka again."""
        metadata = self._group_metadata.get(group)
        if metadata is None:
            metadata = self._group_metadata[group] = self._group_consumer(
                group
            ).consumer_group_metadata()
        return metadata

    # -- names -----------------------------------------------------------------------

    def real_topic(self, topic: str) -> str:
        return self.topic_prefix + topic

    def port_topic(self, real: str) -> str:
        return real[len(self.topic_prefix) :]

    def known_topics(self) -> list[str]:
        return self.topic_admin.known()

    # -- topics (admin.py) -------------------------------------------------------------

    def check_partition(self, tp: TopicPartition) -> str:
        """The partition's real topic name, after checking the partition exists."""
        return self.topic_admin.check_partition(tp)

    def topics(self) -> Mapping[str, TopicSpec]:
        return self.topic_admin.topics()

    def create_topic(self, name: str, partitions: int, *, compacted: bool = False) -> TopicSpec:
        return self.topic_admin.create(name, partitions, compacted=compacted)

    def set_topic_retention(self, topic: str, retention_ms: int | None) -> None:
        """``retention.ms`` and ``cleanup.policy`` on the topic (admin.py), applied by
        the broker itself: :meth:`enforce_retention` stays the port's no-op."""
        self.topic_admin.set_retention(topic, retention_ms)

    def topic_retention(self, topic: str) -> int | None:
        return self.topic_admin.retention(topic)

    # -- records -----------------------------------------------------------------------

    def produce(self, tp: TopicPartition, records: Sequence[Record]) -> list[int]:
        real = self.check_partition(tp)
        producer = self._plain_producer()
        deliveries = Deliveries()
        action, acl = f"producing to {tp}", f'WRITE on topic "{real}"'
        try:
            for record in records:
                produce_record(producer, real, tp.partition, record, deliveries)
        except KafkaException as exc:
            self._thread_state().producer = None  # a refused producer may stay refused
            raise self.error(exc, action=action, acl=acl) from None
        remaining = producer.flush(self.request_timeout_s)
        if remaining:
            raise BrokerUnreachableError(
                self.settings.bootstrap, self.request_timeout_s, self._last_client_error
            )
        if deliveries.error is not None:
            # librdkafka keeps a refused topic (or a fatal error) in the producer's
            # state: the next produce starts a new producer, so a fix takes effect.
            self._thread_state().producer = None
            raise self.error(deliveries.error, action=action, acl=acl)
        return deliveries.offsets

    def fetch(self, tp: TopicPartition, offset: int, max_records: int = 10_000) -> FetchResult:
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        real = self.check_partition(tp)
        messages, end = self._reader().fetch(tp, real, offset, max_records)
        # Inlined _record(): this runs once per record fetched.
        records = [
            Record(
                m.key(),
                m.value(),
                m.timestamp()[1],
                message_headers(h) if (h := m.headers()) else (),
                m.offset(),  # type: ignore[arg-type]
            )
            for m in messages
        ]
        return FetchResult(records, end)

    def fetch_columns(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> FetchedColumns:
        """The processing loop's fetch: columns straight from librdkafka's messages, no
        Record per message (the stream thread reads a million of them per catch-up)."""
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        real = self.check_partition(tp)
        messages, end = self._reader().fetch(tp, real, offset, max_records)
        headers = [m.headers() for m in messages]
        return FetchedColumns(
            [m.offset() for m in messages],  # type: ignore[misc]
            [m.key() for m in messages],
            [m.value() for m in messages],
            [m.timestamp()[1] for m in messages],
            end,
            [message_headers(h) if h else () for h in headers] if any(headers) else None,
        )

    def fetch_changes(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> ChangeBatch:
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        real = self.check_partition(tp)
        messages, _ = self._reader().fetch(tp, real, offset, max_records)
        if not messages:
            return ChangeBatch([], -1)
        entries = [(key, m.value()) for m in messages if (key := m.key()) is not None]
        return ChangeBatch(entries, message_offset(messages[-1]))

    def beginning_offset(self, tp: TopicPartition) -> int:
        return self._reader().bounds(tp, self.check_partition(tp))[0]

    def end_offset(self, tp: TopicPartition) -> int:
        """Where committed data ends: the last stable offset, less trailing markers.

        Every transaction ends in a commit marker that takes an offset but is
        never delivered, so a reader that consumed every committed record sits
        one or more offsets below the last stable offset. When a fetch found
        only markers up to that offset, the offset it fetched from is the end
        (the same end a fetch reports): positions and end offsets then agree,
        as they do on the embedded log, and a caught-up task or standby says so.
        """
        real = self.check_partition(tp)
        stable = self._reader().bounds(tp, real)[1]
        seen = self._data_ends.get((real, tp.partition))
        return seen[1] if seen is not None and seen[0] == stable else stable

    def partition_epoch(self, tp: TopicPartition) -> str:
        """The topic's id (KIP-516): it changes when the topic is deleted and created again.

        A partition truncated below offsets handed out before (an unclean leader
        election, KIP-320's diverged log) is not seen here; records deleted from the
        start (DeleteRecords) move ``beginning_offset``, which the replay rule reads."""
        return self.topic_admin.topic_id(tp)

    def markers_only(self, real: str, partition: int, stable: int, data_end: int) -> None:
        """A reader found only transaction markers between ``data_end`` and ``stable``."""
        self._data_ends[(real, partition)] = (stable, data_end)

    # -- group offsets ---------------------------------------------------------------------

    def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        if not partitions:
            return {}
        wanted = [KafkaPartition(self.check_partition(tp), tp.partition) for tp in partitions]
        consumer = self._group_consumer(group)
        found = self._group_request(
            group,
            f'reading the offsets of group "{group}"',
            lambda: consumer.committed(wanted, timeout=self.request_timeout_s),
        )
        return {
            tp: kafka_tp.offset
            for tp, kafka_tp in zip(partitions, found, strict=True)
            if kafka_tp.offset >= 0
        }

    def commit_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        if not offsets:
            return
        kafka_offsets = [
            KafkaPartition(self.check_partition(tp), tp.partition, offset)
            for tp, offset in offsets.items()
        ]
        consumer = self._group_consumer(group)
        self._group_request(
            group,
            f'committing offsets of group "{group}"',
            lambda: consumer.commit(offsets=kafka_offsets, asynchronous=False) or [],
        )

    def _group_request(
        self, group: str, action: str, request: Callable[[], list[KafkaPartition]]
    ) -> list[KafkaPartition]:
        """A request to the group's coordinator, repeated while the coordinator is
        loading or moving (a new cluster, a broker restart, a leader change) and
        librdkafka did not retry it itself, for at most the request timeout."""
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            problem: KafkaException | KafkaError | None = None
            try:
                partitions = request()
            except KafkaException as exc:
                problem = exc
            else:
                problem = next((tp.error for tp in partitions if tp.error is not None), None)
                if problem is None:
                    return partitions
            error = problem if isinstance(problem, KafkaError) else kafka_error(problem)
            if not coordinator_moving(error) or time.monotonic() > deadline:
                raise self.error(problem, action=action, group=group) from None
            time.sleep(0.1)

    # -- transactions ----------------------------------------------------------------------

    def transactional_producer(self, transactional_id: str) -> TransactionalProducer:
        producer = KafkaTransactionalProducer(self, transactional_id)
        self._thread_state().transactional.add(producer)
        return producer

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            threads, self._threads = self._threads, []
            groups, self._group_consumers = self._group_consumers, {}
            self._group_metadata = {}
        for state in threads:
            if state.reader is not None:
                state.reader.close()
                state.reader = None
            if state.producer is not None:
                state.producer.flush(self.request_timeout_s)
                state.producer = None
            state.ready = False
        for consumer in groups.values():
            consumer.close()
        self.topic_admin.close()

    # -- errors ----------------------------------------------------------------------------

    def error(
        self,
        problem: KafkaException | KafkaError,
        *,
        action: str,
        acl: str | None = None,
        group: str | None = None,
        transactional_id: str | None = None,
    ) -> LogError:
        """The port's error for a librdkafka error met while doing ``action``."""
        return log_error(
            problem,
            action=action,
            bootstrap=self.settings.bootstrap,
            timeout_s=self.request_timeout_s,
            known_topics=self.known_topics,
            last_client_error=self._last_client_error,
            acl=acl,
            group=group,
            transactional_id=transactional_id,
        )
