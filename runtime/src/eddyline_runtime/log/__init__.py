"""The log port and its adapters: where input, output and changelogs live.

``open_log(url)`` opens a log by URL; today ``sqlite:///path/to/log.db`` (the
embedded log). Everything else speaks the :class:`Log` interface.
"""

from pathlib import Path

from eddyline_runtime.log.errors import (
    InvalidTopicError,
    LogError,
    OffsetOutOfRangeError,
    ProducerFencedError,
    TopicConflictError,
    TransactionStateError,
    UnknownTopicError,
    UnsupportedLogUrlError,
)
from eddyline_runtime.log.port import (
    ChangeBatch,
    CommittedTransaction,
    FetchResult,
    LagTracker,
    Log,
    Record,
    TopicSpec,
    TransactionalProducer,
    read_partition,
)
from eddyline_runtime.log.sqlite_log import SqliteLog

SQLITE_SCHEME = "sqlite:///"


def open_log(url: str) -> Log:
    """``sqlite:///relative/log.db`` or ``sqlite:////absolute/log.db``."""
    if url.startswith(SQLITE_SCHEME) and len(url) > len(SQLITE_SCHEME):
        return SqliteLog(Path(url[len(SQLITE_SCHEME) :]))
    raise UnsupportedLogUrlError(url)


__all__ = [
    "ChangeBatch",
    "CommittedTransaction",
    "FetchResult",
    "InvalidTopicError",
    "LagTracker",
    "Log",
    "LogError",
    "OffsetOutOfRangeError",
    "ProducerFencedError",
    "Record",
    "SqliteLog",
    "TopicConflictError",
    "TopicSpec",
    "TransactionStateError",
    "TransactionalProducer",
    "UnknownTopicError",
    "UnsupportedLogUrlError",
    "open_log",
    "read_partition",
]
