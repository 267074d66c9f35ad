"""Writing: plain produce calls, and each task's transactional producer.

Every producer's librdkafka configuration is ``connection.py``'s; what the
producers do with it is here. A thread's :class:`PlainProducer` serves the
port's ``produce`` (idempotent, no transaction).

One transactional producer per task, transactional id
``<application.id>-<task>``; ``init_transactions`` fences every older producer
of the id. Records go to librdkafka as they are sent; input offsets are kept
and handed to ``send_offsets_to_transaction`` at commit with the group's
metadata, then ``commit_transaction``. Delivery reports give each record's
offset, which commit returns.

Fencing, and transactions the broker aborted or that got no answer, are all
:class:`~eddyline_runtime.log.errors.ProducerFencedError` (the stream thread
drops the task uncommitted, keeps its stores, and rejoins: under KIP-892 no
state is wiped, restore reads only the changelog tail). Wherever it is met: a
fencing found while *sending* makes librdkafka refuse every later ``produce()``
with ``_FATAL`` ("Local: Fatal error", not flagged fatal) and report the fencing
only through the error callback, so a call refused with ``_FATAL`` is read as
the fatal error the producer recorded, as a failed flush is.

librdkafka does not expose the producer epoch, except in its statistics
(``eos.producer_epoch``), so a transactional producer emits statistics every
second and ``epoch`` waits for the first report.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as KafkaPartition

from eddyline_runtime.log.errors import (
    LogAuthorizationError,
    LogError,
    ProducerFencedError,
    TransactionAbortedError,
    TransactionStateError,
    TransactionTimeoutError,
    UnknownTopicError,
)
from eddyline_runtime.log.kafka.admin import KafkaTopics
from eddyline_runtime.log.kafka.connection import EPOCH_STATS_INTERVAL_MS, KafkaConnection
from eddyline_runtime.log.kafka.errors import (
    FENCED_CODES,
    RECORD_REFUSED_CODES,
    describe,
    kafka_error,
    record_refused,
)
from eddyline_runtime.log.kafka.groups import KafkaGroups
from eddyline_runtime.log.kafka.reader import message_offset
from eddyline_runtime.log.port import (
    CommittedTransaction,
    Headers,
    OffsetsInSendOrder,
    Record,
    TransactionalProducer,
    check_columns,
)
from eddyline_runtime.partitions import TopicPartition

logger = logging.getLogger(__name__)


class Deliveries:
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
            self.offsets.append(message_offset(message))


def produce_record(
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


class PlainProducer:
    """One thread's idempotent producer for the port's ``produce``: each call sends its
    records and waits for their delivery reports."""

    def __init__(self, connection: KafkaConnection) -> None:
        self._connection = connection
        self._producer: Producer | None = None

    def produce(self, tp: TopicPartition, real: str, records: Sequence[Record]) -> list[int]:
        """Each record's offset, in order (``real``: the partition's checked topic name)."""
        connection = self._connection
        if self._producer is None:
            self._producer = connection.plain_producer()
        producer = self._producer
        deliveries = Deliveries()
        action, acl = f"producing to {tp}", f'WRITE on topic "{real}"'
        try:
            for record in records:
                produce_record(producer, real, tp.partition, record, deliveries)
        except KafkaException as exc:
            self._producer = None  # a refused producer may stay refused
            raise connection.error(exc, action=action, acl=acl) from None
        remaining = producer.flush(connection.request_timeout_s)
        if remaining:
            raise connection.unreachable(connection.last_client_error)
        if deliveries.error is not None:
            # librdkafka keeps a refused topic (or a fatal error) in the producer's
            # state: the next produce starts a new producer, so a fix takes effect.
            self._producer = None
            raise connection.error(deliveries.error, action=action, acl=acl)
        return deliveries.offsets

    def close(self) -> None:
        """Deliver what is queued (within the request timeout) and drop the client."""
        if self._producer is not None:
            self._producer.flush(self._connection.request_timeout_s)
            self._producer = None


class KafkaTransactionalProducer(TransactionalProducer):
    """A task's transactional producer (see the module docstring): ``topics`` checks the
    partitions it sends to, ``groups`` gives the metadata of the groups it commits."""

    def __init__(
        self,
        connection: KafkaConnection,
        topics: KafkaTopics,
        groups: KafkaGroups,
        transactional_id: str,
    ) -> None:
        self._connection = connection
        self._topics = topics
        self._groups = groups
        self.transactional_id = transactional_id
        self._epoch = -1
        self._fenced: ProducerFencedError | None = None
        self._unusable: LogError | None = None
        self._open = False
        self._order: list[TopicPartition] = []
        self._reports: list[Message] = []  # this transaction's delivered records
        self._delivery_error: KafkaError | None = None
        self._delivery_error_at = ""  # the partition of the first failed delivery
        self._fatal_error: KafkaError | None = None
        self._offsets: dict[str, dict[TopicPartition, int]] = {}
        self._producer = connection.transactional_producer(
            transactional_id,
            on_statistics=self._on_statistics,
            on_delivery=self._on_delivery,
            on_error=self._on_client_error,
        )
        try:
            self._producer.init_transactions(connection.transaction_timeout_s)
        except KafkaException as exc:
            raise self._error(exc, "starting (init_transactions)") from None

    # -- callbacks (served by poll/flush in the owner's thread) -------------------------

    def _on_statistics(self, report: str) -> None:
        eos = json.loads(report).get("eos")
        if eos is not None:
            self._epoch = int(eos.get("producer_epoch", -1))

    def _on_client_error(self, error: KafkaError) -> None:
        if error.fatal():  # kept: confluent-kafka may lose the exception it raises for it
            self._fatal_error = error
        self._connection.report_client_error(error)

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        # Called once per record: only kept here, read at commit (_delivered_offsets).
        if error is None:
            self._reports.append(message)
        elif self._delivery_error is None:
            self._delivery_error = error
            self._delivery_error_at = f"{message.topic()}-{message.partition()}"

    def _delivered_offsets(self) -> dict[TopicPartition, list[int]]:
        """Each partition's offsets from this transaction's delivery reports, ascending."""
        reports = self._reports
        found: dict[tuple[str, int], list[int]] = {}
        keys = zip([m.topic() for m in reports], [m.partition() for m in reports], strict=True)
        for key, offset in zip(keys, [m.offset() for m in reports], strict=True):
            offsets = found.get(key)  # type: ignore[arg-type]
            if offsets is None:
                offsets = found[key] = []  # type: ignore[index]
            offsets.append(offset)  # type: ignore[arg-type]
        port_topic = self._connection.port_topic
        return {
            TopicPartition(port_topic(topic), partition): sorted(offsets)
            for (topic, partition), offsets in found.items()
        }

    def serve(self) -> None:
        """Serve queued callbacks (statistics) of an idle producer.

        Runs inside the thread's fetches: a producer fenced meanwhile must not fail
        them, so its error is kept for the producer's next call instead."""
        if self._fenced is not None or self._unusable is not None:
            return
        try:
            self._poll(0)
        except KafkaException as exc:
            self._error(exc, "serving callbacks")

    def _poll(self, timeout: float) -> int:
        """``poll``, raising librdkafka's fatal error as the KafkaException it is."""
        try:
            return self._producer.poll(timeout)
        except SystemError as exc:
            raise self._callback_failure(exc) from None

    def _flush(self, timeout: float) -> int:
        """``flush`` (the records still queued), raising a fatal error as a KafkaException."""
        try:
            return self._producer.flush(timeout)
        except SystemError as exc:
            failure = self._callback_failure(exc)
            if isinstance(failure, SystemError) and self._open:
                failure = self._abort_lost(failure)
            raise failure from None

    def _abort_lost(self, failure: SystemError) -> KafkaException | SystemError:
        """A flush failed with nothing to say why (no cause, no error callback: seen in CI on
        a fenced zombie): the transaction cannot commit, so abort it. librdkafka, if fatal
        (fenced), refuses the abort with the error the flush lost, which then says what
        happened; otherwise the transaction is aborted, nothing of it committed, and the
        SystemError is a failure of the client library itself."""
        try:
            self._producer.abort_transaction(self._connection.transaction_timeout_s)
        except KafkaException as raised:
            return raised
        self._open = False
        return failure

    def _callback_failure(self, exc: SystemError) -> KafkaException | SystemError:
        """What a SystemError out of poll/flush means. confluent-kafka raises librdkafka's
        fatal error (fencing) from the callback that reports it; when another callback
        runs after it, Python reports a SystemError caused by it, or (seen in CI) one with
        no cause at all ("returned NULL without setting an exception"). The fatal error
        the error callback recorded is then what it means."""
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, KafkaException):
            return cause
        recorded = self._recorded_fatal()
        return exc if recorded is None else KafkaException(recorded)

    def _recorded_fatal(self) -> KafkaError | None:
        """The fatal error librdkafka reported for this producer (the error callback keeps
        it), or None. A call refused because of it does not carry it: ``produce()`` after a
        fencing raises ``_FATAL`` ("Local: Fatal error", ``fatal()`` False), a flush a
        SystemError; the callback may still be queued then (seen in CI: librdkafka logged
        the fencing, the call failed, the callback had not run), so it is served once."""
        if self._fatal_error is None:
            try:
                self._producer.poll(0)
            except KafkaException as raised:
                self._keep_if_fatal(kafka_error(raised))
            except SystemError as again:
                cause = again.__cause__ or again.__context__
                if isinstance(cause, KafkaException):
                    self._keep_if_fatal(kafka_error(cause))
        return self._fatal_error

    def _keep_if_fatal(self, error: KafkaError | None) -> None:
        if error is not None and (error.fatal() or error.code() in FENCED_CODES):
            self._fatal_error = error

    @property
    def epoch(self) -> int:
        """The producer epoch the broker gave this id (from librdkafka's statistics)."""
        deadline = time.monotonic() + 3 * EPOCH_STATS_INTERVAL_MS / 1000
        while self._epoch < 0 and time.monotonic() < deadline:
            try:
                self._poll(0.05)
            except KafkaException:
                break  # fenced meanwhile: the epoch it had is the answer
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
        try:
            self._poll(0)
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise self._error(exc, "beginning a transaction") from None
        self._open = True
        self._order = []
        self._reports = []
        self._delivery_error = None
        self._delivery_error_at = ""
        self._offsets = {}

    def send(self, tp: TopicPartition, record: Record) -> None:
        self._require_open("send")
        real = self._topics.check_partition(tp)
        try:
            produce_record(self._producer, real, tp.partition, record)
        except KafkaException as exc:
            raise self._error(exc, f"sending to {tp}", acl=f'WRITE on topic "{real}"') from None
        self._order.append(tp)

    def send_batch(self, tp: TopicPartition, records: Sequence[Record]) -> None:
        self._require_open("send")
        real = self._topics.check_partition(tp)
        producer = self._producer
        try:
            for record in records:
                produce_record(producer, real, tp.partition, record)
        except KafkaException as exc:
            raise self._error(exc, f"sending to {tp}", acl=f'WRITE on topic "{real}"') from None
        self._order.extend([tp] * len(records))

    def send_columns(
        self,
        tp: TopicPartition,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        headers: Sequence[Headers] | None = None,
    ) -> None:
        """:meth:`send_batch` from columns, without a Record per row: a commit hands over
        every output and changelog record of its interval this way."""
        self._require_open("send")
        check_columns(keys, values, timestamps)
        real = self._topics.check_partition(tp)
        producer, partition = self._producer, tp.partition
        produce = producer.produce
        rows = zip(keys, values, timestamps, headers or [()] * len(keys), strict=True)
        try:
            for key, value, timestamp, row_headers in rows:
                try:
                    produce(
                        real,
                        value,
                        key,
                        partition=partition,
                        timestamp=timestamp,
                        headers=cast(_Headers, list(row_headers)) if row_headers else None,
                    )
                except BufferError:  # the queue is full: produce_record waits for room
                    record = Record(key, value, timestamp, row_headers)
                    produce_record(producer, real, partition, record)
        except KafkaException as exc:
            raise self._error(exc, f"sending to {tp}", acl=f'WRITE on topic "{real}"') from None
        self._order.extend([tp] * len(keys))

    def send_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        self._require_open("send offsets")
        for tp in offsets:
            self._topics.check_partition(tp)
        self._offsets.setdefault(group, {}).update(offsets)

    def commit(self) -> CommittedTransaction:
        self._require_open("commit")
        connection = self._connection
        try:
            if self._flush(connection.transaction_timeout_s):
                raise self._fence(
                    TransactionTimeoutError(
                        self.transactional_id,
                        "Delivering the records",
                        connection.transaction_timeout_s,
                        connection.settings.bootstrap,
                    )
                )
            # A record that failed delivery makes commit_transaction fail with an
            # abortable error; librdkafka then knows the state, so let it report.
            for group, offsets in self._offsets.items():
                positions = [
                    KafkaPartition(connection.real_topic(tp.topic), tp.partition, offset)
                    for tp, offset in offsets.items()
                ]
                try:
                    self._producer.send_offsets_to_transaction(
                        positions,
                        self._groups.metadata(group),
                        connection.transaction_timeout_s,
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
            raise self._connection.error(self._delivery_error, action="a record of the transaction")
        delivered = self._delivered_offsets()
        self._reports = []
        last = {tp: offsets[-1] for tp, offsets in delivered.items()}
        return CommittedTransaction(OffsetsInSendOrder(self._order, delivered), last)

    def abort(self) -> None:
        self._require_open("abort")
        self._open = False
        try:
            # librdkafka#4849: an abort that reaches the coordinator before the transaction's
            # partitions are registered is refused as a fatal INVALID_TXN_STATE (the producer
            # would be lost for a plain abort). Delivering what is queued registers them
            # first; an abort is rare, so waiting for the deliveries costs little.
            self._flush(self._connection.transaction_timeout_s)
            self._retrying("abort_transaction", "Aborting")
        except KafkaException as exc:
            raise self._error(exc, "aborting") from None

    def close(self) -> None:
        if self._open and self._fenced is None:
            try:
                self._producer.abort_transaction(self._connection.request_timeout_s)
            except KafkaException as exc:
                logger.info(
                    "transactional id %s: abort at close failed: %s", self.transactional_id, exc
                )
        self._open = False
        try:
            self._flush(0)
        except KafkaException as exc:  # fenced: nothing of it is to be delivered anyway
            logger.info("transactional id %s: closing: %s", self.transactional_id, exc)

    def abandon(self, action: str, seconds: float) -> ProducerFencedError:
        """A commit made in another thread did not return within ``seconds`` (every call in
        it has a timeout, so this is a backstop, never expected): the producer is given up
        without another librdkafka call (the stuck one may still be inside it), and every
        later call raises the timeout, which its task handles as a fencing."""
        return self._fence(
            TransactionTimeoutError(
                self.transactional_id, action, seconds, self._connection.settings.bootstrap
            )
        )

    # -- errors ------------------------------------------------------------------------------

    def _retrying(self, method: str, action: str) -> None:
        """commit_transaction/abort_transaction, repeated while librdkafka says it may be."""
        deadline = time.monotonic() + self._connection.transaction_timeout_s
        while True:
            try:
                getattr(self._producer, method)(self._connection.transaction_timeout_s)
                return
            except KafkaException as exc:
                error = kafka_error(exc)
                if error is None or not error.retriable() or error.fatal():
                    raise
                if time.monotonic() > deadline:
                    raise self._fence(
                        TransactionTimeoutError(
                            self.transactional_id,
                            action,
                            self._connection.transaction_timeout_s,
                            self._connection.settings.bootstrap,
                        )
                    ) from None

    def _failed(self, exc: KafkaException, action: str, *, group: str | None = None) -> LogError:
        """Map a failed commit. Unless the producer is fenced, the transaction is aborted
        so that the producer can begin the next one."""
        self._open = False
        error = kafka_error(exc)
        mapped = self._error(exc, action, group=group)
        if isinstance(mapped, ProducerFencedError):
            return mapped
        try:
            self._producer.abort_transaction(self._connection.transaction_timeout_s)
        except KafkaException as abort_exc:
            return self._error(abort_exc, "aborting after a failed commit")
        if isinstance(mapped, (LogAuthorizationError, UnknownTopicError)):
            return mapped
        refused = self._delivery_error
        if refused is not None and refused.code() in RECORD_REFUSED_CODES:
            # The transaction failed because the broker refused a record as it is: starting
            # over from the last commit (what an aborted transaction means) would meet the
            # record again, forever. The transaction is aborted; the task stops, naming it.
            return record_refused(
                refused,
                f'sending to {self._delivery_error_at} for transactional id "'
                f'{self.transactional_id}", aborted: nothing of the transaction was written',
            )
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
        error = kafka_error(exc)
        if error is not None and error.code() == KafkaError._FATAL:
            # Refused because the producer is in a fatal state (produce() after a fencing):
            # the fatal error it recorded says why, and decides what this is. Without one,
            # librdkafka still says the producer is unusable: a fatal error of its own.
            recorded = self._recorded_fatal()
            if recorded is not None:
                exc = KafkaException(recorded)
            else:
                exc = KafkaException(KafkaError(KafkaError._FATAL, error.str(), fatal=True))
            error = kafka_error(exc)
        # librdkafka's error travels in the message: several codes (and any fatal error)
        # become this one fencing, and an unexpected one should say which it was.
        cause = describe(error, action) if error is not None else f"{action}: {exc}"
        if error is not None and error.code() in FENCED_CODES:
            return self._fence(ProducerFencedError(self.transactional_id, self._epoch, cause=cause))
        mapped = self._connection.error(
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
            return self._fence(ProducerFencedError(self.transactional_id, self._epoch, cause=cause))
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
