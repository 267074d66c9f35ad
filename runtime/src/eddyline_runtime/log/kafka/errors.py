"""librdkafka's errors as the log port's typed errors (``eddyline_runtime.log.errors``).

Every error names what was being done and the way out: a refused operation the
ACL it lacked, an unreachable cluster the bootstrap tried, a replication
factor too large the setting to change.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

from eddyline_runtime.log.errors import (
    BrokerUnreachableError,
    LogAuthorizationError,
    LogError,
    ProducerFencedError,
    RecordRefusedError,
    UnknownTopicError,
)

FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
UNREACHABLE_CODES = frozenset(
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
AUTHENTICATION_CODES = frozenset(
    {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL}
)

# A group's or a transaction's coordinator that is loading its state or moved to
# another broker: the request is to be sent again (to the coordinator found anew).
COORDINATOR_MOVING_CODES = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)


# The broker (or librdkafka, checking its own message.max.bytes first) refused a record as
# it is: sending it again cannot succeed (see RecordRefusedError).
RECORD_REFUSED_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_TIMESTAMP,
    }
)
_TOO_LARGE_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})


def record_refused(error: KafkaError, action: str) -> RecordRefusedError:
    """The port's error for a record the log refused while ``action``, with the way out."""
    code = error.code()
    if code in _TOO_LARGE_CODES:
        hint = (
            "make the record smaller, or raise the topic's max.message.bytes (and, for "
            "records over 1 MB, message.max.bytes in the log settings); records that each "
            "fit are refused together when their batch does not: set batch.size in the log "
            "settings under the topic's max.message.bytes (docs/errors.md)"
        )
    elif code == KafkaError.INVALID_TIMESTAMP:
        hint = (
            "the record's timestamp is outside the topic's message.timestamp.*.max.ms; "
            "fix the timestamps or those topic settings"
        )
    else:
        hint = "check the record against the topic's settings (a compacted topic needs keys)"
    return RecordRefusedError(action, describe(error, "refused"), hint)


def coordinator_moving(error: KafkaError | None) -> bool:
    """Whether ``error`` says the coordinator is loading or moving (worth a retry)."""
    return error is not None and error.code() in COORDINATOR_MOVING_CODES


# A partition whose leadership is moving: the metadata is refreshed and the
# request sent again to the new leader. (_UNKNOWN_PARTITION: librdkafka's metadata
# lacks the partition's leader meanwhile; the adapter checked that it exists.)
LEADER_MOVING_CODES = frozenset(
    {
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.NOT_ENOUGH_REPLICAS,
        # A leader just elected answers ListOffsets with this until its high watermark
        # caught up with the followers' (KIP-207); librdkafka does not flag it retriable.
        # Seen after a preferred-leader election on the three-broker cluster.
        KafkaError.OFFSET_NOT_AVAILABLE,
        # A query sent through the handle of a broker that was just restarted: librdkafka
        # destroys the handle it held for the dead connection and fails what was queued on
        # it ("Broker handle destroyed without termination"); the metadata refresh that
        # follows finds the partition's leader again. Seen on the three-broker cluster
        # while a broker restarted (a reader's watermark query ended its stream thread).
        KafkaError._DESTROY_BROKER,
    }
)


def leader_moving(error: KafkaError | None) -> bool:
    """Whether ``error`` says the partition's leader is moving (worth a retry)."""
    return error is not None and (error.code() in LEADER_MOVING_CODES or error.retriable())


def kafka_error(exc: KafkaException) -> KafkaError | None:
    """The KafkaError a KafkaException carries, if any."""
    first = exc.args[0] if exc.args else None
    return first if isinstance(first, KafkaError) else None


def describe(error: KafkaError, action: str) -> str:
    """librdkafka's own account of ``error``, met while ``action``: its name, code, whether
    it is fatal, and its text (kept in errors that map several codes to one)."""
    fatal = ", fatal" if error.fatal() else ""
    return f"{action}: librdkafka {error.name()} (code {error.code()}{fatal}): {error.str()}"


def log_error(
    problem: KafkaException | KafkaError,
    *,
    action: str,
    bootstrap: str,
    timeout_s: float,
    known_topics: Callable[[], list[str]],
    last_client_error: str | None = None,
    acl: str | None = None,
    group: str | None = None,
    transactional_id: str | None = None,
) -> LogError:
    """The port's error for a librdkafka error met while doing ``action``."""
    error = problem if isinstance(problem, KafkaError) else kafka_error(problem)
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
        return UnknownTopicError(f"a topic of {action}", known_topics())
    if code in FENCED_CODES and transactional_id is not None:
        return ProducerFencedError(transactional_id, -1, cause=describe(error, action))
    if code in AUTHENTICATION_CODES:
        return BrokerUnreachableError(
            bootstrap,
            timeout_s,
            f"{error.str()}; check the SASL/TLS settings of spec.log.secretName",
        )
    if code in UNREACHABLE_CODES:
        return BrokerUnreachableError(bootstrap, timeout_s, last_client_error or error.str())
    if code in RECORD_REFUSED_CODES:
        return record_refused(error, action)
    if code == KafkaError.INVALID_REPLICATION_FACTOR:
        return LogError(
            f"{action} failed: {error.str()}; set replication.factor in the log settings "
            "to at most the number of brokers"
        )
    return LogError(f"{action} failed: {error.name()}: {error.str()}")
