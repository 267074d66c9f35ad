"""Errors of the log port.

EddylineError (eddyline_runtime.errors)
└── LogError
    ├── UnknownTopicError          a topic or partition that does not exist
    ├── InvalidTopicError          create_topic with a shape no topic can have
    ├── TopicConflictError         create_topic with a different shape than the existing one
    ├── OffsetOutOfRangeError      fetch below the log start or beyond the end
    ├── ProducerFencedError        a newer producer owns this transactional id
    ├── TransactionStateError      send/commit without begin, begin twice
    └── UnsupportedLogUrlError     a log URL with a scheme we do not serve
"""

from __future__ import annotations

from collections.abc import Iterable

from eddyline_runtime.errors import EddylineError


class LogError(EddylineError):
    """Base of the log port's errors."""


class UnknownTopicError(LogError):
    def __init__(self, what: str, known: Iterable[str]) -> None:
        names = ", ".join(sorted(known)) or "none"
        super().__init__(f"{what} does not exist (topics: {names}); create it first")


class InvalidTopicError(LogError, ValueError):
    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f'topic "{name}" {problem}')


class TopicConflictError(LogError):
    def __init__(self, name: str, existing: str, requested: str) -> None:
        super().__init__(
            f'topic "{name}" exists as {existing}, not {requested}; use another name or '
            "delete the topic"
        )


class OffsetOutOfRangeError(LogError):
    def __init__(self, partition: object, offset: int, beginning: int, end: int) -> None:
        self.beginning = beginning
        self.end = end
        super().__init__(
            f"offset {offset} is out of range for {partition} (valid: {beginning}..{end}); "
            "fetch from the beginning or the end offset"
        )


class ProducerFencedError(LogError):
    def __init__(self, transactional_id: str, epoch: int, current: int) -> None:
        self.transactional_id = transactional_id
        super().__init__(
            f'producer for transactional id "{transactional_id}" (epoch {epoch}) was fenced by '
            f"a newer one (epoch {current}); this instance is a zombie: stop it, its "
            "transaction was not applied"
        )


class TransactionStateError(LogError):
    pass


class UnsupportedLogUrlError(LogError):
    def __init__(self, url: str) -> None:
        super().__init__(
            f"log URL {url!r} is not supported; use sqlite:///path/to/log.db (the embedded log)"
        )
