"""The Kafka log: eddyline's topics in a Kafka cluster, through confluent-kafka (librdkafka).

Pods on a cluster cannot share the embedded SQLite log; in production the
input, output, repartition and changelog topics live in Kafka. This adapter
speaks the :class:`~eddyline_runtime.log.port.Log` port over librdkafka, and
is the only module that imports ``confluent_kafka``.

How the port maps onto Kafka:

* **Reading** (``fetch``, ``fetch_changes``): one ``read_committed`` consumer
  per thread with *manual* assignment (the assignor decides who reads what,
  never a consumer group's rebalance). A partition is assigned the first time
  it is read and stays assigned, so librdkafka keeps prefetching it; a fetch
  at the offset the previous one ended at serves what arrived, a fetch
  anywhere else seeks. When nothing is buffered the fetch asks the leader for
  the last stable offset (one ``ListOffsets`` round trip), then waits for the
  records below it or for the consumer's position to pass it (transaction
  markers and aborted records take offsets but are never delivered). The
  end offset a fetch reports is the last stable offset, or the requested
  offset when only markers and aborted records lie before it: KIP-695's lag
  (:class:`~eddyline_runtime.log.port.LagTracker`) then reads 0, as Kafka's
  consumer position would make it, instead of waiting on a marker forever.
* **Transactions**: one transactional producer per task, transactional id
  ``<application.id>-<task>``; ``init_transactions`` fences every older
  producer of the id. Records go to librdkafka as they are sent; input
  offsets are kept and handed to ``send_offsets_to_transaction`` at commit
  with the group's metadata, then ``commit_transaction``. Delivery reports
  give each record's offset, which commit returns.
* **Errors** become the port's typed errors: fencing, and transactions the
  broker aborted or that got no answer, are all
  :class:`~eddyline_runtime.log.errors.ProducerFencedError` (the stream thread
  drops the task uncommitted, keeps its stores, and rejoins: under KIP-892 no
  state is wiped, restore reads only the changelog tail); refused operations
  name the missing ACL; an unreachable cluster names the bootstrap tried.
* **Topics** are created with the admin client (changelogs compacted, the
  replication factor and ``min.insync.replicas`` from the settings); an
  existing topic is checked for its partition count and cleanup policy.
* **Epochs**: librdkafka does not expose the producer epoch, except in its
  statistics (``eos.producer_epoch``), so a transactional producer emits
  statistics every second and ``epoch`` waits for the first report.

librdkafka's mock cluster (``test.mock.num.brokers``, :class:`MockCluster`)
is faithful for produce, fetch and watermarks only: never use it as evidence
for exactly-once (see ARCHITECTURE.md).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.cimpl import NewTopic

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.log.errors import (
    BrokerUnreachableError,
    InvalidTopicError,
    LogAuthorizationError,
    LogError,
    OffsetOutOfRangeError,
    ProducerFencedError,
    TopicConflictError,
    TransactionAbortedError,
    TransactionStateError,
    TransactionTimeoutError,
    UnknownTopicError,
)
from eddyline_runtime.log.kafka_settings import KafkaLogSettings, kafka_log_settings
from eddyline_runtime.log.port import (
    ChangeBatch,
    CommittedTransaction,
    FetchResult,
    Log,
    OffsetsInSendOrder,
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
# How long a fetch waits for records the last stable offset says are there.
_FETCH_WAIT_S = 30.0
# One consume() while waiting: short, so a fetch returns as soon as data lands.
_POLL_S = 0.005
# Messages taken from librdkafka's queue per consume() call.
_CONSUME_BATCH = 10_000
# The statistics interval of transactional producers: the only place librdkafka
# reports the producer epoch; each report is a small JSON document.
_EPOCH_STATS_INTERVAL_MS = 1_000
# Idle producers are polled this often by their thread's fetches, so statistics
# reports do not pile up in librdkafka's queue while a task has no input.
_SERVE_PRODUCERS_S = 1.0
# Records buffered for one partition before it is paused: the memory bound for
# partitions read rarely (a changelog after its restore) or slower than they fill.
_BUFFER_PAUSE = 20_000
# A partition not read for this long is unassigned, so librdkafka stops
# fetching it (a restored changelog, a task handed over).
_IDLE_UNASSIGN_S = 60.0
# Client defaults the log settings may override (librdkafka's names).
_READER_TUNING = {
    # Bounds how late data is seen after a seek or on an idle partition.
    "fetch.wait.max.ms": 100,
    # librdkafka's own prefetch queue, on top of the per-partition buffers.
    "queued.max.messages.kbytes": 32_768,
}
_PRODUCER_TUNING = {"linger.ms": 5}
# Internal topics (__consumer_offsets, __transaction_state) are not the app's.
_INTERNAL_PREFIX = "__"

_FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
_UNREACHABLE_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.BROKER_NOT_AVAILABLE,
    }
)
_AUTHENTICATION_CODES = frozenset(
    {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL}
)


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
        self._prefix = topic_prefix
        self._clients = clients or KafkaClients()
        self._timeout = request_timeout_s
        self._transaction_timeout = transaction_timeout_s
        self._lock = threading.Lock()
        self._local = threading.local()
        self._last_client_error: str | None = None
        self._admin_client: AdminClient | None = None
        self._group_consumers: dict[str, Consumer] = {}
        self._threads: list[threading.local] = []
        # Real topic name -> partition count, and -> compacted, as last seen.
        self._partition_counts: dict[str, int] = {}
        self._compacted: dict[str, bool] = {}
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
            "error_cb": self._on_client_error,
            **overrides,
        }

    def _new_client(self, kind: str, config: Mapping[str, Any]) -> Any:
        try:
            return getattr(self._clients, kind)(config)
        except KafkaException as exc:
            error = _kafka_error(exc)
            # librdkafka names the property it rejects; values are never echoed.
            raise ConfigError(
                "spec.log.secretName",
                "(hidden)",
                "librdkafka client properties (docs/kafka.md lists the usual ones)",
                hint=error.str() if error is not None else str(exc),
            ) from None

    def _on_client_error(self, error: KafkaError) -> None:
        self._last_client_error = error.str()
        logger.warning("Kafka client error: %s", error.str())

    def _admin(self) -> AdminClient:
        if self._admin_client is None:
            with self._lock:
                if self._admin_client is None:
                    self._admin_client = self._new_client("admin", self.client_config())
        assert self._admin_client is not None
        return self._admin_client

    def _thread_state(self) -> threading.local:
        state = self._local
        if not getattr(state, "ready", False):
            state.reader = None
            state.producer = None
            state.transactional = weakref.WeakSet()
            state.served_at = time.monotonic()
            state.ready = True
            with self._lock:
                self._threads.append(state)
        return state

    def _reader(self) -> _PartitionReader:
        state = self._thread_state()
        if state.reader is None:
            consumer = self._new_client(
                "consumer",
                self.client_config(
                    _READER_TUNING,
                    **{
                        # Required by librdkafka; this consumer never joins or commits.
                        "group.id": "eddyline-reader",
                        "isolation.level": "read_committed",
                        "enable.auto.commit": False,
                        "enable.auto.offset.store": False,
                        "enable.partition.eof": False,
                        "auto.offset.reset": "error",
                        "allow.auto.create.topics": False,
                    },
                ),
            )
            # Watermark queries go over their own connection: a broker answers one
            # connection's requests in order, so behind the reader's long-polling
            # fetch they would wait up to fetch.wait.max.ms.
            offsets = self._new_client(
                "consumer",
                self.client_config(
                    **{
                        "group.id": "eddyline-reader",
                        "isolation.level": "read_committed",
                        "enable.auto.commit": False,
                        "allow.auto.create.topics": False,
                    }
                ),
            )
            state.reader = _PartitionReader(self, consumer, offsets)
        reader: _PartitionReader = state.reader
        if time.monotonic() - state.served_at > _SERVE_PRODUCERS_S:
            state.served_at = time.monotonic()
            for producer in list(state.transactional):
                producer.serve()
        return reader

    def _plain_producer(self) -> Producer:
        state = self._thread_state()
        if state.producer is None:
            state.producer = self._new_client(
                "producer",
                self.client_config(
                    _PRODUCER_TUNING,
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
                    consumer = self._new_client(
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
        """The consumer group metadata ``send_offsets_to_transaction`` needs."""
        return self._group_consumer(group).consumer_group_metadata()

    # -- names -----------------------------------------------------------------------

    def real_topic(self, topic: str) -> str:
        return self._prefix + topic

    def port_topic(self, real: str) -> str:
        return real[len(self._prefix) :]

    def _visible(self, real: str) -> bool:
        return real.startswith(self._prefix) and not real.startswith(_INTERNAL_PREFIX)

    def known_topics(self) -> list[str]:
        return sorted(self.port_topic(real) for real in self._partition_counts)

    # -- metadata and topics -----------------------------------------------------------

    def _refresh_metadata(self) -> dict[str, int]:
        try:
            metadata = self._admin().list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise self.error(exc, action="listing topics", acl="DESCRIBE on the topics") from None
        counts = {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None and self._visible(name)
        }
        self._partition_counts = counts
        return counts

    def check_partition(self, tp: TopicPartition) -> str:
        """The partition's real topic name, after checking the partition exists."""
        real = self.real_topic(tp.topic)
        count = self._partition_counts.get(real)
        if count is None or tp.partition >= count:
            count = self._refresh_metadata().get(real)
        if count is None:
            raise UnknownTopicError(f'topic "{tp.topic}"', self.known_topics())
        if not 0 <= tp.partition < count:
            raise UnknownTopicError(
                f"partition {tp} (topic has {count} partitions)", self.known_topics()
            )
        return real

    def _cleanup_compacted(self, reals: Sequence[str]) -> dict[str, bool]:
        """Whether each topic's cleanup.policy includes compact (one DescribeConfigs)."""
        missing = [real for real in reals if real not in self._compacted]
        if missing:
            resources = [ConfigResource("topic", real) for real in missing]
            try:
                futures = self._admin().describe_configs(resources, request_timeout=self._timeout)
                for resource, future in futures.items():
                    entry = future.result().get("cleanup.policy")
                    policy = entry.value if entry is not None and entry.value else "delete"
                    self._compacted[resource.name] = "compact" in policy.split(",")
            except KafkaException as exc:
                raise self.error(
                    exc,
                    action=f"reading the configuration of {', '.join(missing)}",
                    acl="DESCRIBE_CONFIGS on the topics",
                ) from None
        return {real: self._compacted[real] for real in reals}

    def topics(self) -> Mapping[str, TopicSpec]:
        counts = self._refresh_metadata()
        compacted = self._cleanup_compacted(sorted(counts))
        return {
            self.port_topic(real): TopicSpec(self.port_topic(real), count, compacted[real])
            for real, count in counts.items()
        }

    def _existing(self, real: str) -> TopicSpec | None:
        count = self._refresh_metadata().get(real)
        if count is None:
            return None
        compacted = self._cleanup_compacted([real])[real]
        return TopicSpec(self.port_topic(real), count, compacted)

    def create_topic(self, name: str, partitions: int, *, compacted: bool = False) -> TopicSpec:
        if partitions < 1:
            raise InvalidTopicError(name, f"needs at least 1 partition, got {partitions}")
        real = self.real_topic(name)
        requested = TopicSpec(name, partitions, compacted)
        existing = self._existing(real)
        if existing is None:
            config = {"cleanup.policy": "compact" if compacted else "delete"}
            if self.settings.min_insync_replicas is not None:
                config["min.insync.replicas"] = str(self.settings.min_insync_replicas)
            topic = NewTopic(
                real,
                num_partitions=partitions,
                replication_factor=self.settings.replication_factor,
                config=config,
            )
            futures = self._admin().create_topics(
                [topic], request_timeout=self._timeout, operation_timeout=self._timeout
            )
            try:
                futures[real].result()
            except KafkaException as exc:
                error = _kafka_error(exc)
                if error is None or error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise self.error(
                        exc,
                        action=f'creating topic "{name}"',
                        acl=f'CREATE on topic "{real}" (or on the cluster)',
                    ) from None
                existing = self._existing(real)  # someone else created it meanwhile
            else:
                self._compacted[real] = compacted
                self._await_topic(real, partitions)
                return requested
        if existing is None or existing == requested:
            return requested
        raise TopicConflictError(
            name, _describe(existing), _describe(requested), _conflict_fix(real, requested)
        )

    def _await_topic(self, real: str, partitions: int) -> None:
        """Topic creation propagates to the brokers' metadata asynchronously."""
        deadline = time.monotonic() + self._timeout
        while self._refresh_metadata().get(real) != partitions:
            if time.monotonic() > deadline:
                raise BrokerUnreachableError(
                    self.settings.bootstrap, self._timeout, f'topic "{real}" never appeared'
                )
            time.sleep(0.05)

    # -- records -----------------------------------------------------------------------

    def produce(self, tp: TopicPartition, records: Sequence[Record]) -> list[int]:
        real = self.check_partition(tp)
        producer = self._plain_producer()
        deliveries = _Deliveries()
        action, acl = f"producing to {tp}", f'WRITE on topic "{real}"'
        try:
            for record in records:
                _produce(producer, real, tp.partition, record, deliveries)
        except KafkaException as exc:
            self._thread_state().producer = None  # a refused producer may stay refused
            raise self.error(exc, action=action, acl=acl) from None
        remaining = producer.flush(self._timeout)
        if remaining:
            raise BrokerUnreachableError(
                self.settings.bootstrap, self._timeout, self._last_client_error
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
                _headers(h) if (h := m.headers()) else (),
                m.offset(),  # type: ignore[arg-type]
            )
            for m in messages
        ]
        return FetchResult(records, end)

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
        return ChangeBatch(entries, _offset(messages[-1]))

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
        try:
            found = self._group_consumer(group).committed(wanted, timeout=self._timeout)
        except KafkaException as exc:
            raise self.error(
                exc, action=f'reading the offsets of group "{group}"', group=group
            ) from None
        result: dict[TopicPartition, int] = {}
        for tp, kafka_tp in zip(partitions, found, strict=True):
            if kafka_tp.error is not None:
                raise self.error(
                    kafka_tp.error, action=f'reading the offsets of group "{group}"', group=group
                )
            if kafka_tp.offset >= 0:
                result[tp] = kafka_tp.offset
        return result

    def commit_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        if not offsets:
            return
        kafka_offsets = [
            KafkaPartition(self.check_partition(tp), tp.partition, offset)
            for tp, offset in offsets.items()
        ]
        try:
            committed = self._group_consumer(group).commit(
                offsets=kafka_offsets, asynchronous=False
            )
        except KafkaException as exc:
            raise self.error(
                exc, action=f'committing offsets of group "{group}"', group=group
            ) from None
        for kafka_tp in committed or []:
            if kafka_tp.error is not None:
                raise self.error(
                    kafka_tp.error, action=f'committing offsets of group "{group}"', group=group
                )

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
        for state in threads:
            if state.reader is not None:
                state.reader.close()
                state.reader = None
            if state.producer is not None:
                state.producer.flush(self._timeout)
                state.producer = None
            state.ready = False
        for consumer in groups.values():
            consumer.close()
        self._admin_client = None

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
        error = problem if isinstance(problem, KafkaError) else _kafka_error(problem)
        if error is None:
            return LogError(f"{action} failed: {problem}")
        code = error.code()
        if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            return LogAuthorizationError(action, acl or "DESCRIBE on the topic")
        if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
            return LogAuthorizationError(action, f'READ on group "{group or "?"}"')
        if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            return LogAuthorizationError(
                action, f'WRITE on transactional id "{transactional_id or "?"}"'
            )
        if code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
            return LogAuthorizationError(
                action, acl or "IDEMPOTENT_WRITE on the cluster (and CREATE to create topics)"
            )
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            return UnknownTopicError(f"a topic of {action}", self.known_topics())
        if code in _FENCED_CODES and transactional_id is not None:
            return ProducerFencedError(transactional_id, -1)
        if code in _AUTHENTICATION_CODES:
            return BrokerUnreachableError(
                self.settings.bootstrap,
                self._timeout,
                f"{error.str()}; check the SASL/TLS settings of spec.log.secretName",
            )
        if code in _UNREACHABLE_CODES:
            return BrokerUnreachableError(
                self.settings.bootstrap, self._timeout, self._last_client_error or error.str()
            )
        if code == KafkaError.INVALID_REPLICATION_FACTOR:
            return LogError(
                f"{action} failed: {error.str()}; set replication.factor in the log settings "
                "to at most the number of brokers"
            )
        return LogError(f"{action} failed: {error.name()}: {error.str()}")


class _Deliveries:
    """Delivery reports of one plain produce call: offsets in order, or the first error.

    The idempotent producer keeps one partition's records in order, so the
    reports arrive in send order.
    """

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            if self.error is None:
                self.error = error
        else:
            self.offsets.append(_offset(message))


def _produce(
    producer: Producer,
    topic: str,
    partition: int,
    record: Record,
    on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
) -> None:
    # librdkafka takes (name, value) pairs in order, duplicates included.
    headers = cast(_Headers, list(record.headers)) if record.headers else None
    while True:
        try:
            if on_delivery is None:
                producer.produce(
                    topic,
                    record.value,
                    record.key,
                    partition=partition,
                    timestamp=record.timestamp,
                    headers=headers,
                )
            else:
                producer.produce(
                    topic,
                    record.value,
                    record.key,
                    partition=partition,
                    timestamp=record.timestamp,
                    headers=headers,
                    on_delivery=on_delivery,
                )
            return
        except BufferError:
            # librdkafka's local queue is full: serve delivery reports to make room.
            producer.poll(0.05)


_Headers = list[tuple[str, str | bytes | None]]


def _offset(message: Message) -> int:
    """A delivered or fetched message's offset (never None for those)."""
    return cast(int, message.offset())


def _headers(headers: Any) -> tuple[tuple[str, bytes], ...]:
    """librdkafka gives a header without a value as None; the port has b""."""
    return tuple((name, value or b"") for name, value in headers)


class _PartitionReader:
    """One thread's read_committed consumer: per-partition buffers over librdkafka's queue."""

    def __init__(self, log: KafkaLog, consumer: Consumer, offsets: Consumer) -> None:
        self._log = log
        self._consumer = consumer
        self._offsets = offsets
        self._assigned: set[tuple[str, int]] = set()
        # Where the caller's next fetch is expected to start, per partition.
        self._next: dict[tuple[str, int], int] = {}
        self._buffers: dict[tuple[str, int], deque[Message]] = {}
        self._paused: set[tuple[str, int]] = set()
        self._read_at: dict[tuple[str, int], float] = {}
        self._swept_at = time.monotonic()
        # An error met while draining belongs to its partition's next fetch.
        self._errors: dict[tuple[str, int], LogError] = {}

    def bounds(self, tp: TopicPartition, real: str) -> tuple[int, int]:
        """(log start, last stable offset): one ListOffsets round trip."""
        try:
            low, high = self._offsets.get_watermark_offsets(
                KafkaPartition(real, tp.partition), timeout=self._log._timeout, cached=False
            )
        except KafkaException as exc:
            raise self._log.error(exc, action=f"reading the offsets of {tp}") from None
        return low, high

    def fetch(
        self, tp: TopicPartition, real: str, offset: int, max_records: int
    ) -> tuple[list[Message], int]:
        key = (real, tp.partition)
        now = time.monotonic()
        self._read_at[key] = now
        if now - self._swept_at > _IDLE_UNASSIGN_S / 4:
            self._unassign_idle(now)
        self._raise_pending(key)
        known_end: int | None = None
        if self._next.get(key) != offset:
            beginning, known_end = self.bounds(tp, real)
            if not beginning <= offset <= known_end:
                raise OffsetOutOfRangeError(tp, offset, beginning, known_end)
            self._seek(key, offset)
        self._drain(0)
        self._raise_pending(key)
        taken = self._take(key, max_records)
        if taken:
            return taken, self._end_after(tp, real, _offset(taken[-1]))
        end = known_end if known_end is not None else self.bounds(tp, real)[1]
        if offset >= end:
            return [], end
        # Committed records lie ahead: wait for them, or for the position to pass
        # the last stable offset (only markers and aborted records were left).
        deadline = time.monotonic() + _FETCH_WAIT_S
        kafka_tp = KafkaPartition(real, tp.partition)
        while time.monotonic() < deadline:
            # Checked first: a partition whose tail is a commit marker comes here on
            # every fetch, and should not pay a poll's wait for it.
            (position,) = self._consumer.position([kafka_tp])
            if position.offset >= end:  # a seek resets it to -1001 (invalid)
                self._log.markers_only(real, tp.partition, end, offset)
                return [], offset
            self._drain(_POLL_S)
            self._raise_pending(key)
            taken = self._take(key, max_records)
            if taken:
                return taken, self._end_after(tp, real, _offset(taken[-1]))
        raise BrokerUnreachableError(
            self._log.settings.bootstrap,
            _FETCH_WAIT_S,
            f"{tp} has committed records up to offset {end} but none arrived from offset {offset}",
        )

    def _end_after(self, tp: TopicPartition, real: str, last: int) -> int:
        """The end offset after delivering ``last``: the cached high watermark when it
        says nothing follows (then it is the last stable offset too), else a round trip."""
        _, high = self._consumer.get_watermark_offsets(
            KafkaPartition(real, tp.partition), cached=True
        )
        if high == last + 1:
            return high
        return max(self.bounds(tp, real)[1], last + 1)

    def _raise_pending(self, key: tuple[str, int]) -> None:
        error = self._errors.pop(key, None)
        if error is not None:
            self._next.pop(key, None)  # the next fetch seeks and checks the range again
            raise error

    def _unassign_idle(self, now: float) -> None:
        self._swept_at = now
        idle = [key for key, at in self._read_at.items() if now - at > _IDLE_UNASSIGN_S]
        if idle:
            self._consumer.incremental_unassign([KafkaPartition(*key) for key in idle])
            for key in idle:
                for state in (self._read_at, self._next, self._buffers, self._errors):
                    state.pop(key, None)
                self._assigned.discard(key)
                self._paused.discard(key)

    def _resume(self, key: tuple[str, int]) -> None:
        if key in self._paused:
            self._paused.discard(key)
            self._consumer.resume([KafkaPartition(*key)])

    def _seek(self, key: tuple[str, int], offset: int) -> None:
        kafka_tp = KafkaPartition(key[0], key[1], offset)
        self._buffers.pop(key, None)
        self._resume(key)
        if key in self._assigned:
            try:
                self._consumer.seek(kafka_tp)
            except KafkaException:
                # A partition whose assignment is not active yet cannot seek: reassign.
                self._consumer.incremental_unassign([KafkaPartition(key[0], key[1])])
                self._consumer.incremental_assign([kafka_tp])
        else:
            self._consumer.incremental_assign([kafka_tp])
            self._assigned.add(key)
        self._next[key] = offset

    def _drain(self, timeout: float) -> None:
        messages = self._consumer.consume(_CONSUME_BATCH, timeout)
        if not messages:
            return
        buffers, expected = self._buffers, self._next
        touched: dict[tuple[str, int], deque[Message]] = {}
        # A consume() returns runs of one partition's messages: look the buffer
        # up once per run, not once per message (the fetch hot path).
        run_key: tuple[str | None, int | None] = (None, None)
        buffer: deque[Message] | None = None
        for message in messages:
            if message.error() is not None:
                self._failed(message, cast(KafkaError, message.error()))
                continue
            key = (message.topic(), message.partition())
            if key != run_key:
                run_key = key
                real_key = cast(tuple[str, int], key)
                if real_key not in expected:
                    buffer = None  # unassigned meanwhile
                    continue
                buffer = buffers.get(real_key)
                if buffer is None:
                    buffer = buffers[real_key] = deque()
                touched[real_key] = buffer
            if buffer is not None:
                buffer.append(message)
        for key, filled in touched.items():
            if len(filled) >= _BUFFER_PAUSE and key not in self._paused:
                self._consumer.pause([KafkaPartition(*key)])
                self._paused.add(key)

    def _failed(self, message: Message, error: KafkaError) -> None:
        topic, partition = message.topic(), message.partition()
        if topic is None or partition is None or partition < 0:
            # Client-wide events (a broker connection dropped): librdkafka retries.
            logger.warning("Kafka consumer: %s", error.str())
            return
        key = (topic, partition)
        tp = TopicPartition(self._log.port_topic(topic), partition)
        if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            beginning, end = self.bounds(tp, topic)
            found: LogError = OffsetOutOfRangeError(tp, self._next.get(key, -1), beginning, end)
        else:
            found = self._log.error(error, action=f"fetching {tp}", acl=f'READ on topic "{topic}"')
        self._errors[key] = found

    def _take(self, key: tuple[str, int], max_records: int) -> list[Message]:
        buffer = self._buffers.get(key)
        if not buffer:
            return []
        if len(buffer) <= max_records:
            taken = list(buffer)
            buffer.clear()
        else:
            taken = [buffer.popleft() for _ in range(max_records)]
        if len(buffer) < _BUFFER_PAUSE // 2:
            self._resume(key)
        self._next[key] = _offset(taken[-1]) + 1
        return taken

    def close(self) -> None:
        self._consumer.close()
        self._offsets.close()


class KafkaTransactionalProducer(TransactionalProducer):
    """A task's transactional producer (see the module docstring)."""

    def __init__(self, log: KafkaLog, transactional_id: str) -> None:
        self._log = log
        self.transactional_id = transactional_id
        self._epoch = -1
        self._fenced: ProducerFencedError | None = None
        self._unusable: LogError | None = None
        self._open = False
        self._order: list[TopicPartition] = []
        self._delivered: dict[tuple[str, int], list[int]] = {}
        self._delivery_error: KafkaError | None = None
        self._offsets: dict[str, dict[TopicPartition, int]] = {}
        self._producer: Producer = log._new_client(
            "producer",
            log.client_config(
                {
                    **_PRODUCER_TUNING,
                    "transaction.timeout.ms": int(log._transaction_timeout * 1000),
                },
                **{
                    "transactional.id": transactional_id,
                    "allow.auto.create.topics": False,
                    "statistics.interval.ms": _EPOCH_STATS_INTERVAL_MS,
                    "stats_cb": self._on_statistics,
                    "on_delivery": self._on_delivery,
                },
            ),
        )
        try:
            self._producer.init_transactions(log._transaction_timeout)
        except KafkaException as exc:
            raise self._error(exc, "starting (init_transactions)") from None

    # -- callbacks (served by poll/flush in the owner's thread) -------------------------

    def _on_statistics(self, report: str) -> None:
        eos = json.loads(report).get("eos")
        if eos is not None:
            self._epoch = int(eos.get("producer_epoch", -1))

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            if self._delivery_error is None:
                self._delivery_error = error
            return
        key = (cast(str, message.topic()), cast(int, message.partition()))
        offsets = self._delivered.get(key)
        if offsets is None:
            offsets = self._delivered[key] = []
        offsets.append(_offset(message))

    def serve(self) -> None:
        """Serve queued callbacks (statistics) of an idle producer."""
        self._producer.poll(0)

    @property
    def epoch(self) -> int:
        """The producer epoch the broker gave this id (from librdkafka's statistics)."""
        deadline = time.monotonic() + 3 * _EPOCH_STATS_INTERVAL_MS / 1000
        while self._epoch < 0 and time.monotonic() < deadline:
            self._producer.poll(0.05)
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch = value

    # -- the transaction -----------------------------------------------------------------

    def begin(self) -> None:
        self._check_usable()
        if self._open:
            raise TransactionStateError(
                f'transactional id "{self.transactional_id}": a transaction is already open; '
                "commit or abort it first"
            )
        self._producer.poll(0)
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise self._error(exc, "beginning a transaction") from None
        self._open = True
        self._order = []
        self._delivered = {}
        self._delivery_error = None
        self._offsets = {}

    def send(self, tp: TopicPartition, record: Record) -> None:
        self._require_open("send")
        real = self._log.check_partition(tp)
        try:
            _produce(self._producer, real, tp.partition, record)
        except KafkaException as exc:
            raise self._error(exc, f"sending to {tp}", acl=f'WRITE on topic "{real}"') from None
        self._order.append(tp)

    def send_batch(self, tp: TopicPartition, records: Sequence[Record]) -> None:
        self._require_open("send")
        real = self._log.check_partition(tp)
        producer = self._producer
        try:
            for record in records:
                _produce(producer, real, tp.partition, record)
        except KafkaException as exc:
            raise self._error(exc, f"sending to {tp}", acl=f'WRITE on topic "{real}"') from None
        self._order.extend([tp] * len(records))

    def send_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        self._require_open("send offsets")
        for tp in offsets:
            self._log.check_partition(tp)
        self._offsets.setdefault(group, {}).update(offsets)

    def commit(self) -> CommittedTransaction:
        self._require_open("commit")
        log = self._log
        try:
            if self._producer.flush(log._transaction_timeout):
                raise self._fence(
                    TransactionTimeoutError(
                        self.transactional_id,
                        "Delivering the records",
                        log._transaction_timeout,
                        log.settings.bootstrap,
                    )
                )
            # A record that failed delivery makes commit_transaction fail with an
            # abortable error; librdkafka then knows the state, so let it report.
            for group, offsets in self._offsets.items():
                positions = [
                    KafkaPartition(log.real_topic(tp.topic), tp.partition, offset)
                    for tp, offset in offsets.items()
                ]
                try:
                    self._producer.send_offsets_to_transaction(
                        positions, log.group_metadata(group), log._transaction_timeout
                    )
                except KafkaException as exc:
                    raise self._failed(exc, "committing", group=group) from None
            self._retrying("commit_transaction", "Committing")
        except KafkaException as exc:
            raise self._failed(exc, "committing") from None
        except ProducerFencedError:
            self._open = False
            raise
        self._open = False
        if self._delivery_error is not None:  # librdkafka committed regardless: never expected
            raise self._log.error(self._delivery_error, action="a record of the transaction")
        delivered = {
            TopicPartition(log.port_topic(topic), partition): sorted(offsets)
            for (topic, partition), offsets in self._delivered.items()
        }
        last = {tp: offsets[-1] for tp, offsets in delivered.items()}
        return CommittedTransaction(OffsetsInSendOrder(self._order, delivered), last)

    def abort(self) -> None:
        self._require_open("abort")
        self._open = False
        try:
            self._retrying("abort_transaction", "Aborting")
        except KafkaException as exc:
            raise self._error(exc, "aborting") from None

    def close(self) -> None:
        if self._open and self._fenced is None:
            try:
                self._producer.abort_transaction(self._log._timeout)
            except KafkaException as exc:
                logger.info(
                    "transactional id %s: abort at close failed: %s", self.transactional_id, exc
                )
        self._open = False
        self._producer.flush(0)

    # -- errors ------------------------------------------------------------------------------

    def _retrying(self, method: str, action: str) -> None:
        """commit_transaction/abort_transaction, repeated while librdkafka says it may be."""
        deadline = time.monotonic() + self._log._transaction_timeout
        while True:
            try:
                getattr(self._producer, method)(self._log._transaction_timeout)
                return
            except KafkaException as exc:
                error = _kafka_error(exc)
                if error is None or not error.retriable() or error.fatal():
                    raise
                if time.monotonic() > deadline:
                    raise self._fence(
                        TransactionTimeoutError(
                            self.transactional_id,
                            action,
                            self._log._transaction_timeout,
                            self._log.settings.bootstrap,
                        )
                    ) from None

    def _failed(self, exc: KafkaException, action: str, *, group: str | None = None) -> LogError:
        """Map a failed commit. Unless the producer is fenced, the transaction is aborted
        so that the producer can begin the next one."""
        self._open = False
        error = _kafka_error(exc)
        mapped = self._error(exc, action, group=group)
        if isinstance(mapped, ProducerFencedError):
            return mapped
        try:
            self._producer.abort_transaction(self._log._transaction_timeout)
        except KafkaException as abort_exc:
            return self._error(abort_exc, "aborting after a failed commit")
        if isinstance(mapped, (LogAuthorizationError, UnknownTopicError)):
            return mapped
        if error is not None and error.txn_requires_abort():
            return TransactionAbortedError(self.transactional_id, error.str())
        return mapped

    def _error(
        self,
        exc: KafkaException,
        action: str,
        *,
        acl: str | None = None,
        group: str | None = None,
    ) -> LogError:
        error = _kafka_error(exc)
        if error is not None and error.code() in _FENCED_CODES:
            return self._fence(ProducerFencedError(self.transactional_id, self._epoch))
        mapped = self._log.error(
            exc,
            action=f'{action} for transactional id "{self.transactional_id}"',
            acl=acl,
            group=group,
            transactional_id=self.transactional_id,
        )
        if error is not None and error.fatal():
            # librdkafka's producer is unusable after a fatal error: so is this one.
            if isinstance(mapped, LogAuthorizationError):
                self._unusable = mapped
                return mapped
            return self._fence(ProducerFencedError(self.transactional_id, self._epoch))
        return mapped

    def _fence(self, error: ProducerFencedError) -> ProducerFencedError:
        """The producer can no longer be used; every later call raises ``error``."""
        self._fenced = error
        self._open = False
        return error

    def _check_usable(self) -> None:
        if self._fenced is not None:
            raise self._fenced
        if self._unusable is not None:
            raise self._unusable

    def _require_open(self, action: str) -> None:
        self._check_usable()
        if not self._open:
            raise TransactionStateError(
                f'transactional id "{self.transactional_id}": cannot {action} without an open '
                "transaction; call begin() first"
            )


class MockCluster:
    """librdkafka's built-in mock cluster, on local ports, for wiring tests and benchmarks.

    Faithful for produce, fetch, watermarks and group offsets; not for
    exactly-once (a read_committed consumer sees aborted records, a fenced
    producer can still commit) and its admin calls time out. Topics are
    created on first mention, with 4 partitions.
    """

    def __init__(self, brokers: int = 1) -> None:
        self._owner = Producer({"test.mock.num.brokers": brokers, "logger": logger})
        metadata = self._owner.list_topics(timeout=_REQUEST_TIMEOUT_S)
        self.bootstrap = ",".join(
            f"{broker.host}:{broker.port}" for broker in metadata.brokers.values()
        )

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def create_topic(self, name: str) -> None:
        self._owner.list_topics(topic=name, timeout=_REQUEST_TIMEOUT_S)

    def topic_names(self) -> set[str]:
        return set(self._owner.list_topics(timeout=_REQUEST_TIMEOUT_S).topics)

    def close(self) -> None:
        self._owner.flush(0)


def _kafka_error(exc: KafkaException) -> KafkaError | None:
    first = exc.args[0] if exc.args else None
    return first if isinstance(first, KafkaError) else None


def _describe(spec: TopicSpec) -> str:
    kind = "compacted" if spec.compacted else "not compacted"
    return f"{spec.partitions} partitions, {kind}"


def _conflict_fix(real: str, requested: TopicSpec) -> str:
    policy = "compact" if requested.compacted else "delete"
    return (
        f"eddyline never alters an existing topic: delete it (kafka-topics.sh --delete "
        f"--topic {real}) so eddyline creates it, or make it {requested.partitions} "
        f"partitions with cleanup.policy={policy} (Strimzi: the KafkaTopic's spec.partitions "
        "and spec.config)"
    )
