"""What happens to a record that cannot be processed: Kafka's exception handlers.

Three settings choose a handler each (Kafka's names since 4.0, KIP-1033):
``deserialization.exception.handler`` (a record's key or value does not
deserialize), ``processing.exception.handler`` (a processor raised on it, or a
punctuator raised: see :class:`ErrorHandlerContext`) and
``production.exception.handler`` (an output does not serialize). A handler is
a function ``(context, exception) -> Response``: :func:`log_and_continue`,
:func:`log_and_fail`, or the user's own, named as ``module:function``.

A :class:`Response` says whether the task resumes (the record is skipped and
counted as dropped) or fails (the task stops; nothing after its last commit
is written, and processing resumes there on restart), and which dead-letter
records to write (KIP-1034). With ``errors.dead.letter.queue.topic.name`` set,
the built-ins return one, made by :func:`dead_letter_records`: the input
record's original key and value bytes with the ``__streams.errors.*``
headers. They go out with the task's outputs: under exactly-once in the same
transaction as the input offset that skips the record.

Unlike Kafka Streams, dead-letter records of a *failing* response are not
written: the task writes nothing after its last commit, so a crash loop on
one record does not fill the dead-letter topic with copies of it.
"""

from __future__ import annotations

import enum
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from eddyline_runtime.config import LOG_AND_CONTINUE, LOG_AND_FAIL, ExceptionHandlerKind
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.processing.topology import Headers, PunctuationType
from eddyline_runtime.references import (
    Reference,
    ReferenceFailure,
    ReferenceLoadError,
    load_reference,
)

logger = logging.getLogger(__name__)

# KIP-1034's header names (Kafka's ExceptionHandlerUtils).
HEADER_EXCEPTION = "__streams.errors.exception"
HEADER_MESSAGE = "__streams.errors.message"
HEADER_STACKTRACE = "__streams.errors.stacktrace"
HEADER_TOPIC = "__streams.errors.topic"
HEADER_PARTITION = "__streams.errors.partition"
HEADER_OFFSET = "__streams.errors.offset"


class Result(enum.StrEnum):
    """Kafka's ``Response.Result``: go on with the next record, or stop the task."""

    RESUME = "resume"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """A record a handler asks to write (KIP-1034): raw bytes, to an existing topic."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp: int | None = None  # None: the failed record's timestamp


@dataclass(frozen=True, slots=True)
class Response:
    """What a handler decided (Kafka's ``Response``, KIP-1034)."""

    result: Result
    dead_letter_queue_records: tuple[DeadLetterRecord, ...] = ()

    @classmethod
    def resume(cls, records: tuple[DeadLetterRecord, ...] = ()) -> Response:
        return cls(Result.RESUME, tuple(records))

    @classmethod
    def fail(cls, records: tuple[DeadLetterRecord, ...] = ()) -> Response:
        return cls(Result.FAIL, tuple(records))


@dataclass(frozen=True, slots=True)
class ErrorHandlerContext:
    """The failed record, as Kafka's ``ErrorHandlerContext`` describes it.

    ``topic``/``partition``/``offset``: the input record being processed (its
    physical topic); ``source_raw_key``/``source_raw_value``: its bytes as
    read; ``key``/``value``: what the failing step was given (None for a
    deserialization failure); ``processor_node_id``: the failing node (a sink
    for a production failure; None for a deserialization failure).

    A punctuator that raised (KIP-1033 hands it to the processing handler too)
    has no input record: ``punctuation_type`` says what drove it,
    ``processor_node_id`` names its processor, ``timestamp`` is the
    punctuation's time, ``topic`` is None, ``partition`` and ``offset`` -1, and
    the raw bytes, key and value None (Kafka's context for a punctuation).
    """

    kind: ExceptionHandlerKind
    task_id: str
    topic: str | None
    partition: int
    offset: int
    timestamp: int
    headers: Headers
    processor_node_id: str | None
    source_raw_key: bytes | None
    source_raw_value: bytes | None
    key: object = None
    value: object = None
    dead_letter_queue_topic: str | None = None
    punctuation_type: PunctuationType | None = None

    def describe(self) -> str:
        """The record in one line: where it was read, what failed on it."""
        if self.punctuation_type is not None:
            return (
                f"task {self.task_id}: {self.kind.value} error in the "
                f'{self.punctuation_type.value} punctuator of "{self.processor_node_id}"'
            )
        node = f' in "{self.processor_node_id}"' if self.processor_node_id else ""
        if self.topic is None:
            return f"task {self.task_id}: {self.kind.value} error{node} on a punctuator's record"
        where = f"{self.topic}-{self.partition} at offset {self.offset}"
        return f"task {self.task_id}: {self.kind.value} error{node} on the record of {where}"


ExceptionHandler = Callable[[ErrorHandlerContext, Exception], Response]


class HandlerLoadError(EddylineError):
    """A ``module:function`` handler that cannot be imported, or that is not callable."""


def dead_letter_records(
    context: ErrorHandlerContext, exception: BaseException
) -> tuple[DeadLetterRecord, ...]:
    """The record for the dead-letter topic, when one is set (else none): the input
    record's original key and value bytes, with KIP-1034's headers. None for a failure
    without an input record (a punctuator, or what it forwarded): there are no bytes to
    set aside, and processing again would not meet them."""
    topic = context.dead_letter_queue_topic
    if topic is None or context.topic is None:
        return ()
    cause = type(exception)
    headers: Headers = (
        *context.headers,
        (HEADER_EXCEPTION, f"{cause.__module__}.{cause.__qualname__}".encode()),
        (HEADER_MESSAGE, str(exception).encode()),
        (HEADER_STACKTRACE, "".join(traceback.format_exception(exception)).encode()),
        (HEADER_TOPIC, (context.topic or "").encode()),
        (HEADER_PARTITION, str(context.partition).encode()),
        (HEADER_OFFSET, str(context.offset).encode()),
    )
    return (
        DeadLetterRecord(
            topic, context.source_raw_key, context.source_raw_value, headers, context.timestamp
        ),
    )


def log_and_continue(context: ErrorHandlerContext, exception: Exception) -> Response:
    """Kafka's ``LogAndContinue...Handler``: log the record, skip it, go on."""
    logger.warning(
        "%s: %s: %s; skipped (%s=%s)",
        context.describe(),
        type(exception).__name__,
        exception,
        context.kind.setting,
        LOG_AND_CONTINUE,
    )
    return Response.resume(dead_letter_records(context, exception))


def log_and_fail(context: ErrorHandlerContext, exception: Exception) -> Response:
    """Kafka's ``LogAndFail...Handler`` (and ``DefaultProductionExceptionHandler``): stop."""
    logger.error(
        "%s: %s: %s; the task stops (%s=%s)",
        context.describe(),
        type(exception).__name__,
        exception,
        context.kind.setting,
        LOG_AND_FAIL,
    )
    return Response.fail(dead_letter_records(context, exception))


_BUILT_IN: dict[str, ExceptionHandler] = {
    LOG_AND_CONTINUE: log_and_continue,
    LOG_AND_FAIL: log_and_fail,
}


def exception_handler(kind: ExceptionHandlerKind, reference: str) -> ExceptionHandler:
    """The handler a setting names (canonical, as ``config.parse_exception_handler``
    leaves it): a built-in, or the user's ``module:function`` imported now."""
    built_in = _BUILT_IN.get(reference)
    if built_in is not None:
        return built_in
    way_out = "install it in the image or fix the reference"
    try:
        function = load_reference(reference)
    except ReferenceLoadError as exc:
        if exc.failure is not ReferenceFailure.NO_ATTRIBUTE:
            raise HandlerLoadError(
                f'{kind.setting} "{reference}": {exc.detail}; {way_out}'
            ) from exc
        function = None
    if not callable(function):
        parsed = Reference.parse(reference)
        assert parsed is not None  # load_reference refused a malformed one
        raise HandlerLoadError(
            f'{kind.setting} "{reference}": module "{parsed.module}" has no function '
            f'"{parsed.attribute}"; a handler is a function (context, exception) -> Response'
        )
    handler: ExceptionHandler = function
    return handler
