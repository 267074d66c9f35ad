"""A task's answer to a record it cannot process: the handlers, the counts, the failure.

:class:`RecordFailures` holds the three handlers a config chose (see
:mod:`~eddyline_runtime.processing.exception_handlers`) and asks the right
one about a failed record. A resuming response drops the record (counted by
reason, beside Kafka's untagged ``dropped-records-total``) and hands back the
dead-letter records to write with the task's outputs; a failing one, or a
handler that itself raises or answers something else, ends the task with
:class:`TaskProcessingError`, which names the record in one line.

A store's own failure (an :class:`EddylineError`, RocksDB's ``Corruption``)
is never the record's: it is not handed to a handler (see :func:`is_fatal`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from eddyline_runtime.config import ExceptionHandlerKind, StreamsConfig
from eddyline_runtime.errors import EddylineError, record_failure_line
from eddyline_runtime.metrics import Sensor
from eddyline_runtime.processing.exception_handlers import (
    DeadLetterRecord,
    ErrorHandlerContext,
    ExceptionHandler,
    Response,
    Result,
    exception_handler,
    log_and_fail,
)
from eddyline_runtime.processing.topology import PunctuationType
from eddyline_runtime.serde import SerdeError

# Why a record was dropped (the ``reason`` tag of dropped-records-by-reason-total):
# a DSL operator dropped it (late, null key), or a handler resumed after a failure.
DROPPED_BY_PROCESSOR: Final = "processor"
DROP_REASONS: Final = (
    DROPPED_BY_PROCESSOR,
    *(f"{kind.value}-error" for kind in ExceptionHandlerKind),
)


class TaskProcessingError(EddylineError):
    """A record failed and the task stops; names the record so it can be found."""

    def __init__(
        self,
        task: str,
        topic: str | None,
        partition: int,
        offset: int,
        cause: BaseException,
        *,
        kind: ExceptionHandlerKind | None = None,
        node: str | None = None,
    ) -> None:
        self.task, self.topic, self.partition, self.offset = task, topic, partition, offset
        self.cause, self.kind, self.node = cause, kind, node
        detail = ""
        if kind is not None:
            detail = f' ({kind.value} error in "{node}")' if node else f" ({kind.value} error)"
        handler = "" if kind is None else f" (or set {kind.setting} to skip such records)"
        where = (
            record_failure_line(task, topic, partition, offset)
            if topic is not None
            # A record a punctuator forwarded has no input record to name.
            else f"task {task} failed processing a record a punctuator forwarded"
        )
        # Short enough for the operator's Degraded condition, which keeps the last
        # CRASH_MESSAGE_CHARS (400) of a termination message: the record must survive.
        super().__init__(
            f"{where}: {type(cause).__name__}: {_one_line(cause)}{detail}. Nothing after "
            f"the last commit was written; fix the topology or the record{handler} and restart"
        )


class PunctuationError(EddylineError):
    """A punctuator raised and the task stops (its processing handler said fail, or there
    was none to ask); names the processor and what drove the punctuation."""

    def __init__(
        self,
        task: str,
        node: str | None,
        punctuation_type: PunctuationType,
        cause: BaseException,
        *,
        kind: ExceptionHandlerKind | None = None,
    ) -> None:
        self.task, self.node, self.punctuation_type = task, node, punctuation_type
        self.cause, self.kind = cause, kind
        handler = "" if kind is None else f" (or set {kind.setting} to skip such failures)"
        super().__init__(
            f'task {task}: the {punctuation_type.value} punctuator of processor "{node}" '
            f"failed: {type(cause).__name__}: {_one_line(cause)}. Nothing after the last "
            f"commit was written; fix the punctuator{handler} and restart: processing "
            "resumes at the last commit"
        )


# The most of an exception's message the one line keeps (the DLQ headers keep it all).
_CAUSE_CHARS = 120


def _one_line(cause: BaseException) -> str:
    text = " ".join(str(cause).split())
    return text if len(text) <= _CAUSE_CHARS else text[: _CAUSE_CHARS - 3] + "..."


def is_fatal(exception: BaseException) -> bool:
    """Whether a failure is the runtime's or a store's rather than the record's: those
    end the task as they are and never reach a handler. A serde's error is the record's."""
    if isinstance(exception, SerdeError):
        return False
    return isinstance(exception, EddylineError) or str(exception).startswith("Corruption")


class RecordFailures:
    """One task's handlers, what they dropped and what they sent to a dead-letter topic."""

    def __init__(
        self,
        handlers: Mapping[ExceptionHandlerKind, ExceptionHandler] | None = None,
        *,
        dead_letter_queue_topic: str | None = None,
    ) -> None:
        """Default: log-and-fail for every kind, no dead-letter topic (Kafka's defaults)."""
        self._handlers = {kind: log_and_fail for kind in ExceptionHandlerKind}
        self._handlers.update(handlers or {})
        self.dead_letter_queue_topic = dead_letter_queue_topic
        # Logical topic -> the log's name, which failed records are reported by.
        self.topic_names: dict[str, str] = {}
        self.dropped_by_reason = dict.fromkeys(DROP_REASONS, 0)
        self.dead_letter_records = 0
        self.dead_letter_sensor = Sensor()

    @classmethod
    def from_config(cls, config: StreamsConfig) -> RecordFailures:
        """The handlers ``config`` names; a user's module is imported here, once per task."""
        return cls(
            {
                kind: exception_handler(kind, config.exception_handler(kind))
                for kind in ExceptionHandlerKind
            },
            dead_letter_queue_topic=config.errors_dead_letter_queue_topic_name,
        )

    @staticmethod
    def _failed(context: ErrorHandlerContext, cause: BaseException) -> EddylineError:
        """The error the task stops with for ``context``: its record, or its punctuator."""
        if context.punctuation_type is not None:
            return PunctuationError(
                context.task_id,
                context.processor_node_id,
                context.punctuation_type,
                cause,
                kind=context.kind,
            )
        return TaskProcessingError(
            context.task_id,
            context.topic,
            context.partition,
            context.offset,
            cause,
            kind=context.kind,
            node=context.processor_node_id,
        )

    def handle(
        self, context: ErrorHandlerContext, exception: Exception
    ) -> tuple[DeadLetterRecord, ...]:
        """Ask the handler for ``context.kind``; returns the dead-letter records of a
        resuming answer, raises :class:`TaskProcessingError` (:class:`PunctuationError`
        for a punctuator) for a failing one."""
        handler = self._handlers[context.kind]
        try:
            response = handler(context, exception)
        except Exception as handler_error:
            raise self._failed(
                context,
                RuntimeError(
                    f"the {context.kind.setting} raised {type(handler_error).__name__}: "
                    f"{handler_error}, handling {type(exception).__name__}: {exception}"
                ),
            ) from handler_error
        if not isinstance(response, Response):
            raise self._failed(
                context,
                TypeError(
                    f"the {context.kind.setting} returned {type(response).__name__}, not a "
                    f"Response (Response.resume() or Response.fail()), for {exception!r}"
                ),
            ) from exception
        if response.result is not Result.RESUME:
            raise self._failed(
                context,
                exception,
            ) from exception
        self.dropped_by_reason[f"{context.kind.value}-error"] += 1
        return response.dead_letter_queue_records

    @staticmethod
    def dead_letter_too_large(context: ErrorHandlerContext, error: BaseException) -> EddylineError:
        """The error the task stops with when a dead-letter record for ``context`` is
        larger than the dead-letter topic takes: no handler setting is named, as none
        would help (``error`` names the topic's limit, the way out)."""
        if context.punctuation_type is not None:
            return PunctuationError(
                context.task_id, context.processor_node_id, context.punctuation_type, error
            )
        return TaskProcessingError(
            context.task_id, context.topic, context.partition, context.offset, error
        )

    def dropped_by_processor(self) -> None:
        self.dropped_by_reason[DROPPED_BY_PROCESSOR] += 1

    def sent_to_dead_letter_queue(self, records: int) -> None:
        self.dead_letter_records += records
        self.dead_letter_sensor.record(records)
