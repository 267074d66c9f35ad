"""The Kafka log: eddyline's topics in a Kafka cluster, through confluent-kafka (librdkafka).

Pods on a cluster cannot share the embedded SQLite log; in production the
input, output, repartition and changelog topics live in Kafka. This package
speaks the :class:`~eddyline_runtime.log.port.Log` port over librdkafka, and
is the only one that imports ``confluent_kafka``. Its modules, by job:

* ``log`` (here): :class:`KafkaLog`, the port, composed of the parts below
  around one connection; each thread's reader and producers.
* ``connection``: what the parts share: settings, timeouts, topic names, every
  client kind's librdkafka configuration and factory, the error mapping.
* ``reader``: the ``read_committed`` reader and how fetches meet transaction
  markers (KIP-695's lag).
* ``producer``: plain produce calls, and each task's transactional producer
  (fencing, commit, epochs).
* ``admin``: topics (metadata, creation, cleanup policies).
* ``groups``: consumer groups' offsets.
* ``errors``: librdkafka's errors as the port's typed errors; refused
  operations name the missing ACL, an unreachable cluster the bootstrap tried.

The parts import the connection, never this module: a part takes the
connection and the few parts it needs.

librdkafka's mock cluster (``test.mock.num.brokers``) is faithful for
produce, fetch and watermarks only: never use it as evidence for
exactly-once. The contract suite runs against a real broker
(``tests/support/kafka/``).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Unpack

from confluent_kafka import TopicPartition as KafkaPartition

from eddyline_runtime.log.errors import TransactionTimeoutError
from eddyline_runtime.log.kafka.admin import KafkaTopics
from eddyline_runtime.log.kafka.connection import ConnectionOptions, KafkaConnection
from eddyline_runtime.log.kafka.groups import KafkaGroups
from eddyline_runtime.log.kafka.producer import KafkaTransactionalProducer, PlainProducer
from eddyline_runtime.log.kafka.reader import (
    DataEnds,
    PartitionReader,
    message_headers,
    message_offset,
)
from eddyline_runtime.log.kafka_settings import KafkaLogSettings, kafka_log_settings
from eddyline_runtime.log.port import (
    ChangeBatch,
    CommittedTransaction,
    FetchedColumns,
    FetchResult,
    Log,
    Record,
    StartedProducers,
    TopicSpec,
    TransactionalProducer,
)
from eddyline_runtime.log.record_size import RecordSizeLimit
from eddyline_runtime.partitions import TopicPartition

# Idle producers are polled this often by their thread's fetches, so statistics
# reports do not pile up in librdkafka's queue while a task has no input.
_SERVE_PRODUCERS_S = 1.0
# At most this many init_transactions round trips in flight for one thread's new tasks
# (a thread holds a few tasks; more would only queue at the transaction coordinators).
_CONCURRENT_STARTS = 16
# At most this many of one thread's task commits in flight at once (the same reasoning).
_CONCURRENT_COMMITS = 16
# How many transaction timeouts the stream thread waits for its tasks' concurrent commits:
# a commit makes at most five calls bounded by transaction.timeout.ms (flush,
# send_offsets_to_transaction, commit_transaction retried up to that deadline, and the abort
# after a failure), so waiting longer than six means a call ignored its timeout.
_COMMIT_WAIT_TRANSACTION_TIMEOUTS = 6


class _ThreadClients:
    """One thread's reader, plain producer and transactional producers."""

    def __init__(self, connection: KafkaConnection) -> None:
        self.reader: PartitionReader | None = None
        self.producer = PlainProducer(connection)
        self.transactional: weakref.WeakSet[KafkaTransactionalProducer] = weakref.WeakSet()
        # Runs the thread's task commits concurrently (commit_transactions); made on first use.
        self.committers: ThreadPoolExecutor | None = None
        self.served_at = time.monotonic()
        self.ready = True


class KafkaLog(Log):
    """A :class:`Log` on a Kafka cluster; safe across threads (a consumer per thread).

    ``options`` are the connection's (:class:`KafkaConnection`: a topic prefix,
    the clients, the timeouts).
    """

    def __init__(self, settings: KafkaLogSettings, **options: Unpack[ConnectionOptions]) -> None:
        self.connection = KafkaConnection(settings, **options)
        self.topic_admin = KafkaTopics(self.connection)
        self._groups = KafkaGroups(self.connection)
        self._data_ends = DataEnds()
        self._lock = threading.Lock()
        self._local = threading.local()
        # Each thread's clients, for close(): a threading.local shows each thread only
        # its own attributes, so close() keeps the objects the locals point to.
        self._threads: list[_ThreadClients] = []
        self._closed = False

    @classmethod
    def open(
        cls,
        url: str,
        settings: Mapping[str, object] | None = None,
        **options: Unpack[ConnectionOptions],
    ) -> KafkaLog:
        """``kafka://host:port,...`` with client settings (librdkafka names; see kafka_settings)."""
        return cls(kafka_log_settings(url, settings or {}), **options)

    @property
    def settings(self) -> KafkaLogSettings:
        return self.connection.settings

    @property
    def topic_prefix(self) -> str:
        return self.connection.topic_prefix

    @property
    def url(self) -> str:
        return f"kafka://{self.settings.bootstrap}"

    def real_topic(self, topic: str) -> str:
        """The cluster's name of the port's ``topic`` (under the prefix)."""
        return self.connection.real_topic(topic)

    # -- each thread's clients ---------------------------------------------------------

    def _thread_state(self) -> _ThreadClients:
        state: _ThreadClients | None = getattr(self._local, "clients", None)
        if state is None or not state.ready:
            state = self._local.clients = _ThreadClients(self.connection)
            with self._lock:
                self._threads.append(state)
        return state

    def _reader(self) -> PartitionReader:
        state = self._thread_state()
        if state.reader is None:
            state.reader = PartitionReader(self.connection, self._data_ends)
        reader: PartitionReader = state.reader
        if time.monotonic() - state.served_at > _SERVE_PRODUCERS_S:
            state.served_at = time.monotonic()
            for producer in list(state.transactional):
                producer.serve()
        return reader

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

    def record_size_limit(self, topic: str) -> RecordSizeLimit | None:
        return self.topic_admin.record_size_limit(topic)

    # -- records -----------------------------------------------------------------------

    def produce(self, tp: TopicPartition, records: Sequence[Record]) -> list[int]:
        real = self.check_partition(tp)
        return self._thread_state().producer.produce(tp, real, records)

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

    def offset_for_timestamp(self, tp: TopicPartition, timestamp_ms: int) -> int:
        """The broker's answer from its time index (ListOffsets by timestamp)."""
        found = self._reader().offset_for_timestamp(tp, self.check_partition(tp), timestamp_ms)
        return self.end_offset(tp) if found is None else found

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
        return self._data_ends.end(real, tp.partition, stable)

    def undecided(self, tp: TopicPartition) -> bool:
        """Records of ``tp`` wait for their transaction's markers: the last stable offset is
        below the high watermark. Read in that order (stable first), so a transaction that
        is decided between the two reads still counts as undecided, never the reverse."""
        real = self.check_partition(tp)
        reader = self._reader()
        stable = reader.bounds(tp, real)[1]
        return stable < reader.high_watermark(tp, real)

    def partition_epoch(self, tp: TopicPartition) -> str:
        """The topic's id (KIP-516): it changes when the topic is deleted and created again.

        A partition truncated below offsets handed out before (an unclean leader
        election, KIP-320's diverged log) is not seen here; records deleted from the
        start (DeleteRecords) move ``beginning_offset``, which the replay rule reads."""
        return self.topic_admin.topic_id(tp)

    # -- group offsets ---------------------------------------------------------------------

    def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        if not partitions:
            return {}
        wanted = [KafkaPartition(self.check_partition(tp), tp.partition) for tp in partitions]
        found = self._groups.committed(group, wanted)
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
        self._groups.commit(group, kafka_offsets)

    # -- transactions ----------------------------------------------------------------------

    def transactional_producer(self, transactional_id: str) -> TransactionalProducer:
        producer = KafkaTransactionalProducer(
            self.connection, self.topic_admin, self._groups, transactional_id
        )
        self._thread_state().transactional.add(producer)
        return producer

    def transactional_producers(self, transactional_ids: Sequence[str]) -> StartedProducers:
        """Each id's producer, their ``init_transactions`` round trips made concurrently.

        Each producer is built and initialised in a thread of its own (librdkafka's calls
        release the GIL), so a thread's new tasks wait about one round trip, not one each.
        A producer is handed out only after its own ``init_transactions`` returned: its
        id's older producer is fenced and its open transaction aborted. A failed start
        is mapped as the serial start maps it and kept for that id (StartedProducers.take).
        The producers belong to the calling thread, as transactional_producer's do."""
        ids = list(transactional_ids)
        if len(ids) <= 1:
            return super().transactional_producers(ids)

        def start(transactional_id: str) -> KafkaTransactionalProducer | Exception:
            try:
                return KafkaTransactionalProducer(
                    self.connection, self.topic_admin, self._groups, transactional_id
                )
            except Exception as exc:  # raised by take(), for this id alone
                return exc

        workers = min(len(ids), _CONCURRENT_STARTS)
        with ThreadPoolExecutor(workers, thread_name_prefix="eddyline-init-transactions") as pool:
            results = list(pool.map(start, ids))
        owned = self._thread_state().transactional
        for result in results:
            if isinstance(result, KafkaTransactionalProducer):
                owned.add(result)
        return StartedProducers(dict(zip(ids, results, strict=True)))

    def commit_transactions(
        self, producers: Sequence[TransactionalProducer]
    ) -> list[CommittedTransaction | Exception]:
        """Each producer's commit (flush, ``send_offsets_to_transaction``,
        ``commit_transaction``) in a worker thread of its own, all at once (docs/kafka.md,
        "Committing a thread's tasks together"): librdkafka's calls release the GIL, so a
        thread's tasks wait about one task's round trips, not one set each. Each producer
        makes its calls in the serial order and is fenced per transactional id, so running
        them together changes when the calls are made, not what any of them may commit.

        Every call has a timeout; a worker still running after all of them could have
        expired gets a TransactionTimeoutError for its producer (abandoned, as a fencing),
        so a stuck call can never hold the stream thread."""
        if len(producers) <= 1:
            return super().commit_transactions(producers)
        state = self._thread_state()
        if state.committers is None:
            state.committers = ThreadPoolExecutor(
                _CONCURRENT_COMMITS, thread_name_prefix="eddyline-commit"
            )
        futures = [state.committers.submit(producer.commit) for producer in producers]
        bound_s = _COMMIT_WAIT_TRANSACTION_TIMEOUTS * self.connection.transaction_timeout_s
        wait(futures, timeout=bound_s)
        outcomes: list[CommittedTransaction | Exception] = []
        for producer, future in zip(producers, futures, strict=True):
            if not future.done():
                future.cancel()  # not started yet (more tasks than workers): never will be
                action = "Committing (still running)"
                outcomes.append(
                    producer.abandon(action, bound_s)
                    if isinstance(producer, KafkaTransactionalProducer)
                    else TransactionTimeoutError(
                        producer.transactional_id, action, bound_s, self.settings.bootstrap
                    )
                )
                continue
            try:
                outcomes.append(future.result())
            except Exception as exc:  # that producer's outcome alone; the caller decides
                outcomes.append(exc)
        return outcomes

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            threads, self._threads = self._threads, []
        for state in threads:
            if state.reader is not None:
                state.reader.close()
                state.reader = None
            state.producer.close()
            if state.committers is not None:
                # Not waited for: a worker stuck past its bound must not hold close().
                state.committers.shutdown(wait=False)
                state.committers = None
            state.ready = False
        self._groups.close()
        self.topic_admin.close()
