"""The log port and its adapters: where input, output and changelogs live.

``open_log(url)`` opens a log by URL: ``sqlite:///path/to/log.db`` (the
embedded log) or ``kafka://host:port,...`` (a Kafka cluster, see the
``kafka`` package). Everything else speaks the :class:`Log` interface.
"""

from collections.abc import Mapping
from pathlib import Path

from eddyline_runtime.log.errors import (
    BrokerUnreachableError,
    InvalidTopicError,
    LogAuthorizationError,
    LogError,
    OffsetOutOfRangeError,
    ProducerFencedError,
    RecordRefusedError,
    TopicConflictError,
    TransactionAbortedError,
    TransactionStateError,
    TransactionTimeoutError,
    UnknownTopicError,
    UnsupportedLogUrlError,
)
from eddyline_runtime.log.kafka_settings import KAFKA_SCHEME, settings_from_environment
from eddyline_runtime.log.port import (
    ChangeBatch,
    CommittedTransaction,
    FetchedColumns,
    FetchResult,
    LagTracker,
    Log,
    OffsetChanges,
    Record,
    TopicSpec,
    TransactionalProducer,
    read_partition,
)
from eddyline_runtime.log.sqlite_log import SqliteLog

SQLITE_SCHEME = "sqlite:///"


def open_log(
    url: str, settings: Mapping[str, object] | None = None, *, read_only: bool = False
) -> Log:
    """``sqlite:///relative/log.db``, ``sqlite:////absolute/log.db`` or
    ``kafka://host:port[,host:port...]``.

    ``settings`` are the Kafka client settings (librdkafka's names); when not
    given, they are read from the file or mounted Secret that the environment
    variable ``EDDYLINE_LOG_SETTINGS`` names (none when it is unset).

    ``read_only``: for readers that must never take the log's write lock nor
    create anything (Spark restore tasks); every write then raises LogError.
    A Kafka client takes no lock to read, so it only matters to the embedded log.
    """
    if url.startswith(SQLITE_SCHEME) and len(url) > len(SQLITE_SCHEME):
        return SqliteLog(Path(url[len(SQLITE_SCHEME) :]), read_only=read_only)
    if url.startswith(KAFKA_SCHEME):
        # Imported here: confluent-kafka loads librdkafka, which embedded runs never need.
        from eddyline_runtime.log.kafka import KafkaLog

        return KafkaLog.open(url, settings_from_environment() if settings is None else settings)
    raise UnsupportedLogUrlError(url)


__all__ = [
    "BrokerUnreachableError",
    "ChangeBatch",
    "CommittedTransaction",
    "FetchResult",
    "FetchedColumns",
    "InvalidTopicError",
    "LagTracker",
    "Log",
    "LogAuthorizationError",
    "LogError",
    "OffsetChanges",
    "OffsetOutOfRangeError",
    "ProducerFencedError",
    "Record",
    "RecordRefusedError",
    "SqliteLog",
    "TopicConflictError",
    "TopicSpec",
    "TransactionAbortedError",
    "TransactionStateError",
    "TransactionTimeoutError",
    "TransactionalProducer",
    "UnknownTopicError",
    "UnsupportedLogUrlError",
    "open_log",
    "read_partition",
]
