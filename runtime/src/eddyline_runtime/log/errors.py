"""Errors of the log port.

EddylineError (eddyline_runtime.errors)
└── LogError
    ├── UnknownTopicError          a topic or partition that does not exist
    ├── InvalidTopicError          create_topic with a shape no topic can have
    ├── TopicConflictError         create_topic with a different shape than the existing one
    ├── OffsetOutOfRangeError      fetch below the log start or beyond the end
    ├── ProducerFencedError        a newer producer owns this transactional id: drop the task
    │   │                          uncommitted, keep its store, rejoin (KIP-892: nothing wiped)
    │   ├── TransactionAbortedError  the broker aborted the transaction (e.g. it outlived
    │   │                            transaction.timeout.ms); handled like fencing
    │   └── TransactionTimeoutError  commit or abort got no answer in time; its outcome is
    │                                settled when the task's next producer starts
    ├── TransactionStateError      send/commit without begin, begin twice
    ├── RecordRefusedError         the broker refused a record as it is (too large, an
    │                              invalid timestamp): sending it again cannot succeed
    ├── LogAuthorizationError      the broker refused an operation: names the missing ACL
    ├── BrokerUnreachableError     no broker answered: names the bootstrap servers tried
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
    def __init__(
        self,
        name: str,
        existing: str,
        requested: str,
        fix: str = "use another name or delete the topic",
    ) -> None:
        super().__init__(f'topic "{name}" exists as {existing}, not {requested}; {fix}')


class OffsetOutOfRangeError(LogError):
    def __init__(self, partition: object, offset: int, beginning: int, end: int) -> None:
        self.beginning = beginning
        self.end = end
        super().__init__(
            f"offset {offset} is out of range for {partition} (valid: {beginning}..{end}); "
            "fetch from the beginning or the end offset"
        )


class ProducerFencedError(LogError):
    """``cause``: what the log client reported (on Kafka, librdkafka's error name, code and
    text, and the call that met it), so that a fencing nobody expected says why."""

    def __init__(
        self,
        transactional_id: str,
        epoch: int,
        current: int | None = None,
        *,
        cause: str | None = None,
    ) -> None:
        self.transactional_id = transactional_id
        self.cause = cause
        mine = f" (epoch {epoch})" if epoch >= 0 else ""
        theirs = f" (epoch {current})" if current is not None and current >= 0 else ""
        reported = f" [{cause}]" if cause else ""
        super().__init__(
            f'producer for transactional id "{transactional_id}"{mine} was fenced by '
            f"a newer one{theirs}; this instance is a zombie: stop it, its "
            f"transaction was not applied{reported}"
        )


class RecordRefusedError(LogError):
    """The log refused a record as it is: too large for the topic (Kafka's
    ``RecordTooLargeException``, the broker's ``MESSAGE_TOO_LARGE``), a batch too large,
    an invalid record or timestamp. Unlike a fencing or an aborted transaction, sending
    it again cannot succeed, so the task stops (Kafka's ``DefaultProductionExceptionHandler``
    fails on it too) instead of starting over from its last commit and meeting the
    record again. Under exactly-once the transaction was aborted: nothing of it written."""

    def __init__(self, action: str, cause: str, hint: str) -> None:
        self.action = action
        super().__init__(f"the log refused a record ({action}): {cause}; {hint}")


class TransactionAbortedError(ProducerFencedError):
    """The broker aborted the open transaction; nothing of it was written."""

    def __init__(self, transactional_id: str, reason: str) -> None:
        self.transactional_id = transactional_id
        LogError.__init__(
            self,
            f'the broker aborted the transaction of "{transactional_id}" ({reason}); nothing of '
            "it was written: the task restarts from its last commit (its stores keep their "
            "last commit and restore only the changelog tail); if this repeats, raise "
            "transaction.timeout.ms in the log settings or commit more often",
        )


class TransactionTimeoutError(ProducerFencedError):
    """A commit or abort got no answer in time: its outcome is not known yet."""

    def __init__(self, transactional_id: str, action: str, seconds: float, bootstrap: str) -> None:
        self.transactional_id = transactional_id
        LogError.__init__(
            self,
            f'{action} of the transaction of "{transactional_id}" got no answer from the '
            f"brokers ({bootstrap}) within {seconds:g} s; the task is dropped and restarts "
            "from its last commit: its next producer settles the transaction (stores keep "
            "their last commit). Check the brokers' health and the network path",
        )


class TransactionStateError(LogError):
    pass


class LogAuthorizationError(LogError):
    """The broker refused an operation; the message names the ACL that is missing."""

    def __init__(self, action: str, acl: str) -> None:
        self.acl = acl
        super().__init__(
            f"{action} was refused by the broker: the principal of the log settings "
            f"(spec.log.secretName) lacks the ACL {acl}; grant it (Strimzi: add it to the "
            "KafkaUser's spec.authorization.acls)"
        )


class BrokerUnreachableError(LogError):
    """No broker answered; names the bootstrap servers and the client's last complaint."""

    def __init__(self, bootstrap: str, seconds: float, last_error: str | None = None) -> None:
        self.bootstrap = bootstrap
        seen = f" (the client's last error: {last_error})" if last_error else ""
        super().__init__(
            f"no Kafka broker answered within {seconds:g} s; bootstrap servers tried: "
            f"{bootstrap}{seen}; check spec.log.url, that the brokers run and are reachable "
            "from here, and security.protocol / SASL settings in the log Secret"
        )


class UnsupportedLogUrlError(LogError):
    def __init__(self, url: str) -> None:
        super().__init__(
            f"log URL {url!r} is not supported; use sqlite:///path/to/log.db (the embedded log) "
            "or kafka://host:port[,host:port...]"
        )
