"""Versioned key-value stores (KIP-889): every value a key held, each with its validity interval.

A :class:`VersionedKeyValueStore` answers "what was ``key``'s value at time ``t``?"
(``get(key, as_of)``) as well as "what is it now?" (``get(key)``). Stream-table joins
against a versioned table (KIP-914) and queries by timestamp (KIP-960/968) read it.

Like the window and session stores it owns no data: it writes raw keys in the layout
below through a *backing* key-value store, in practice a
:class:`~eddyline_runtime.state.RocksDBStore` (directly, or through the engine's record
cache and changelog layers). So everything KIP-892 gives the key-value store holds
unchanged: the owner reads its own uncommitted writes, other threads read through
:meth:`VersionedKeyValueStore.reader` at ``READ_COMMITTED`` or ``READ_UNCOMMITTED``,
uncommitted writes count against the budget, and a crash loses the open transaction,
never committed data.

Layout (one backing store; the first byte says which part a raw key belongs to)::

    00 "observed"                      -> observed stream time (8 bytes, signed)
    01 key                             -> valid_from (8) | tag (1) | value      the latest version
    02 len(key) (4) | key | valid_to (8) -> valid_from (8) | tag (1) | value    older versions

``tag`` is 1 for a value and 0 for a tombstone: a tombstone is a version like any other
(Kafka: "a null value is a tombstone version"), so an out-of-order put into a deleted
interval knows where that interval ends. History keys end in ``valid_to`` (big-endian),
as Kafka's segments are keyed: the version valid at ``t`` is the first history entry of
the key with ``valid_to > t``, one seek. The key is length-prefixed so one key's history
never interleaves with another key that extends it.

Semantics, as Kafka's ``RocksDBVersionedStore`` (KIP-889; the grace period is the
history retention, as there):

* ``put(key, value, t)`` with ``t < observed - history_retention`` is dropped and
  answers :data:`PUT_RETURN_CODE_NOT_PUT`; a put that becomes the latest version
  answers :data:`PUT_RETURN_CODE_VALID_TO_UNDEFINED`; an out-of-order put answers the
  ``valid_to`` of the version it inserted (where the next version starts).
* A put at the timestamp of an existing version replaces that version's value.
* ``get(key)`` is the latest version, whatever its age; ``get(key, as_of)`` with
  ``as_of < observed - history_retention`` is None (the history may be gone).
* ``delete(key, t)`` is a tombstone put at ``t``; it answers the version valid at ``t``
  before the delete.

Expiry: a history version with ``valid_to <= observed - history_retention`` can never be
read again. Each put of a key deletes that key's unreachable versions (the deletes go
through the transaction and the changelog like any write, so replicas drop the same
entries); reads hide them for keys not written since. Kafka drops whole segments
instead; a store-wide sweep is not needed for correctness and is left for later.

Changelog: the changelog layer above the backing store logs these raw keys, so a
restored or standby copy is byte-for-byte the active one (no replay of user puts
through this class). Unlike Kafka's versioned changelog (user key -> value, one record
per put, which compaction would cut to the latest version per key, and so needs
``min.compaction.lag.ms`` = history retention + 1 day), a compacted raw-key changelog
is correct at any lag: each raw key's last record *is* that entry's state. So the topic
is created like any key-value changelog (compacted); :func:`changelog_min_compaction_lag_ms`
gives Kafka's value for when the log port learns to set topic configs beyond
retention, so the topic looks as it would on Kafka Streams.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Final

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.errors import InvalidArgumentError
from eddyline_runtime.key_ranges import KeyRange, prefix_successor
from eddyline_runtime.state.errors import StateStoreError
from eddyline_runtime.state.store import (
    KeyValueBytesStore,
    ReadableBytes,
    StoreReader,
    check_key,
)
from eddyline_runtime.state.window_layout import DEFAULT_CHANGELOG_ADDITIONAL_RETENTION_MS

logger = logging.getLogger(__name__)

# Kafka's VersionedKeyValueStore return codes for put().
PUT_RETURN_CODE_VALID_TO_UNDEFINED: Final = -1
PUT_RETURN_CODE_NOT_PUT: Final = -(1 << 63)

_I64: Final = struct.Struct(">q")
_U64: Final = struct.Struct(">Q")
_U32: Final = struct.Struct(">I")
_MAX_TIMESTAMP: Final = (1 << 63) - 1
# Kafka's ConsumerRecord.NO_TIMESTAMP: the observed stream time of a store never written.
_NO_TIME: Final = -1

_OBSERVED_KEY: Final = b"\x00observed"
_LATEST: Final = b"\x01"
_HISTORY: Final = b"\x02"
_TOMBSTONE: Final = 0
_VALUE: Final = 1


@dataclass(frozen=True, slots=True)
class VersionedRecord:
    """One version of a key (Kafka's ``VersionedRecord``): its value, the time it became
    valid, and the time the next version replaced it (None while it is the latest)."""

    value: bytes
    timestamp: int
    valid_to: int | None = None


def changelog_min_compaction_lag_ms(
    history_retention_ms: int,
    additional_retention_ms: int = DEFAULT_CHANGELOG_ADDITIONAL_RETENTION_MS,
) -> int:
    """``min.compaction.lag.ms`` of a versioned store's changelog topic, as Kafka Streams
    sets it (history retention + ``windowstore.changelog.additional.retention.ms``)."""
    return history_retention_ms + additional_retention_ms


def check_history_retention(store: str, history_retention_ms: object) -> int:
    """The history retention in ms, or an error naming the store and the way out."""
    if type(history_retention_ms) is not int or history_retention_ms < 0:
        raise InvalidArgumentError(
            f'versioned state store "{store}": history retention {history_retention_ms!r} '
            "is not a number of milliseconds >= 0; give how long old versions stay "
            "queryable, e.g. 3_600_000 for an hour"
        )
    return history_retention_ms


def _check_time(store: str, what: str, timestamp: object) -> int:
    if type(timestamp) is not int or not 0 <= timestamp <= _MAX_TIMESTAMP:
        raise InvalidArgumentError(
            f'versioned state store "{store}": {what} {timestamp!r} is not a timestamp in '
            "milliseconds >= 0; a versioned store keeps versions by record time (give the "
            "record a timestamp, or drop it before the table)"
        )
    return timestamp


def _latest_key(key: bytes) -> bytes:
    return _LATEST + key


def _history_prefix(key: bytes) -> bytes:
    return _HISTORY + _U32.pack(len(key)) + key


def _history_key(key: bytes, valid_to: int) -> bytes:
    return _history_prefix(key) + _U64.pack(valid_to)


def _encode(valid_from: int, value: bytes | None) -> bytes:
    if value is None:
        return _U64.pack(valid_from) + bytes((_TOMBSTONE,))
    return _U64.pack(valid_from) + bytes((_VALUE,)) + value


def _decode(store: str, raw_value: bytes) -> tuple[int, bytes | None]:
    if len(raw_value) < 9 or raw_value[8] not in (_TOMBSTONE, _VALUE):
        raise StateStoreError(
            store,
            f'state store "{store}" holds a value that is not a versioned store entry: the '
            "store was written as another kind of store. Give the versioned table its own "
            "store name (or reset the application's state)",
        )
    valid_from = _U64.unpack_from(raw_value)[0]
    return valid_from, (raw_value[9:] if raw_value[8] == _VALUE else None)


def _read_observed(readable: ReadableBytes) -> int:
    raw = readable.get(_OBSERVED_KEY)
    return _NO_TIME if raw is None else int(_I64.unpack(raw)[0])


class _VersionedReads:
    """Reads shared by the owner and other threads' readers."""

    name: str
    history_retention_ms: int
    _readable: ReadableBytes

    def _observed(self) -> int:
        raise NotImplementedError

    def _cutoff(self) -> int:
        """The oldest time reads still answer for (Kafka: observed - history retention)."""
        return self._observed() - self.history_retention_ms

    @property
    def observed_stream_time(self) -> int:
        """The largest timestamp put so far (recovered at reopen); -1 before any."""
        return self._observed()

    def get(self, key: bytes, as_of: int | None = None) -> VersionedRecord | None:
        """The latest version of ``key`` (``as_of`` None), or the version valid at ``as_of``.

        None when there is no such version, it is a tombstone, or ``as_of`` is older
        than ``observed stream time - history retention`` (Kafka's ``get(key, asOf)``).
        """
        check_key(self.name, "get", key)
        latest = self._latest(key)
        if as_of is None:
            if latest is None or latest[1] is None:
                return None
            return VersionedRecord(latest[1], latest[0])
        _check_time(self.name, "as-of timestamp", as_of)
        if as_of < self._cutoff():
            logger.debug(
                'versioned state store "%s": get as of %d ms is older than the history '
                "retention (observed stream time %d ms, retention %d ms): no answer",
                self.name,
                as_of,
                self._observed(),
                self.history_retention_ms,
            )
            return None
        if latest is not None and latest[0] <= as_of:
            return None if latest[1] is None else VersionedRecord(latest[1], latest[0])
        found = self._version_after(key, as_of)
        if found is None:
            return None
        valid_to, valid_from, value = found
        if valid_from > as_of or value is None:
            return None
        return VersionedRecord(value, valid_from, valid_to)

    def versions(
        self,
        key: bytes,
        from_time: int = 0,
        to_time: int = _MAX_TIMESTAMP,
        *,
        ascending: bool = False,
    ) -> list[VersionedRecord]:
        """The versions of ``key`` valid at some time in [from_time, to_time] (both
        inclusive), tombstones left out: Kafka's ``MultiVersionedKeyQuery`` (KIP-968),
        newest first unless ``ascending``. Versions no longer valid at ``observed -
        history retention`` are not answered."""
        check_key(self.name, "versions", key)
        _check_time(self.name, "from time", from_time)
        _check_time(self.name, "to time", to_time)
        if to_time < from_time:
            raise InvalidArgumentError(
                f'versioned state store "{self.name}": from time {from_time} is after to time '
                f"{to_time}; pass from_time <= to_time"
            )
        lower = max(from_time, self._cutoff())
        found: list[VersionedRecord] = []
        if lower > to_time:
            return found
        head = _history_prefix(key)
        span = KeyRange(_history_key(key, lower + 1), prefix_successor(head))
        for raw, raw_value in self._readable.scan(span):
            valid_from, value = _decode(self.name, raw_value)
            if valid_from > to_time:
                break
            if value is not None:
                valid_to = _U64.unpack_from(raw, len(head))[0]
                found.append(VersionedRecord(value, valid_from, valid_to))
        latest = self._latest(key)
        if latest is not None and latest[1] is not None and latest[0] <= to_time:
            found.append(VersionedRecord(latest[1], latest[0]))
        return found if ascending else found[::-1]

    def _latest(self, key: bytes) -> tuple[int, bytes | None] | None:
        raw = self._readable.get(_latest_key(key))
        return None if raw is None else _decode(self.name, raw)

    def _version_after(self, key: bytes, timestamp: int) -> tuple[int, int, bytes | None] | None:
        """The first history version of ``key`` with ``valid_to > timestamp``, as
        (valid_to, valid_from, value); None when there is none."""
        head = _history_prefix(key)
        span = KeyRange(_history_key(key, timestamp + 1), prefix_successor(head))
        first = next(iter(self._readable.scan(span)), None)
        if first is None:
            return None
        raw, raw_value = first
        valid_from, value = _decode(self.name, raw_value)
        return _U64.unpack_from(raw, len(head))[0], valid_from, value


class VersionedKeyValueStore(_VersionedReads):
    """Versions of keys over a transactional key-value store (see the module docstring).

    The owner thread writes and reads; other threads use :meth:`reader`. Committing is
    the backing store's (the engine commits it with the task).
    """

    def __init__(self, backing: KeyValueBytesStore, history_retention_ms: int) -> None:
        self.name = backing.name
        self.history_retention_ms = check_history_retention(backing.name, history_retention_ms)
        self._backing = backing
        self._readable = backing
        self._observed_time: int | None = None
        # Puts dropped for being older than the grace period (Kafka's expired-record sensor).
        self.expired_writes = 0

    def _observed(self) -> int:
        if self._observed_time is None:
            self._observed_time = _read_observed(self._backing)
        return self._observed_time

    def put(self, key: bytes, value: bytes | None, timestamp: int) -> int:
        """Add the version ``value`` (None: a tombstone) of ``key`` valid from ``timestamp``.

        Answers :data:`PUT_RETURN_CODE_VALID_TO_UNDEFINED` when it is now the latest
        version, the ``valid_to`` of the inserted version when it went into the history,
        and :data:`PUT_RETURN_CODE_NOT_PUT` when ``timestamp`` is older than ``observed
        stream time - history retention`` (then nothing is written).
        """
        check_key(self.name, "put", key)
        if value is not None and type(value) is not bytes:
            raise TypeError(
                f'versioned state store "{self.name}": put takes a bytes value or None (a '
                f"tombstone), got {type(value).__name__}; serialize it first"
            )
        _check_time(self.name, "timestamp", timestamp)
        observed = self._observed()
        if timestamp < observed - self.history_retention_ms:
            self.expired_writes += 1
            logger.debug(
                'versioned state store "%s": dropping a put at %d ms, older than the grace '
                "period (observed stream time %d ms, history retention %d ms)",
                self.name,
                timestamp,
                observed,
                self.history_retention_ms,
            )
            return PUT_RETURN_CODE_NOT_PUT
        answer = self._insert(key, value, timestamp)
        if timestamp > observed:
            self._observed_time = timestamp
            self._backing.put(_OBSERVED_KEY, _I64.pack(timestamp))
        self._expire(key)
        return answer

    def delete(self, key: bytes, timestamp: int) -> VersionedRecord | None:
        """A tombstone at ``timestamp``; answers the version valid at ``timestamp`` before
        it (Kafka's ``delete(key, timestamp)``), None if none or the put was dropped."""
        check_key(self.name, "delete", key)
        _check_time(self.name, "timestamp", timestamp)
        before = self.get(key, timestamp)
        if self.put(key, None, timestamp) == PUT_RETURN_CODE_NOT_PUT:
            return None
        return before

    def _insert(self, key: bytes, value: bytes | None, timestamp: int) -> int:
        latest = self._latest(key)
        if latest is None or timestamp >= latest[0]:
            if latest is not None and timestamp > latest[0]:
                # The old latest version becomes history, valid until this one starts.
                self._backing.put(_history_key(key, timestamp), _encode(*latest))
            self._backing.put(_latest_key(key), _encode(timestamp, value))
            return PUT_RETURN_CODE_VALID_TO_UNDEFINED
        # Out of order: the version holding ``timestamp`` is split, or the new version
        # fills the time before the oldest one known.
        found = self._version_after(key, timestamp)
        if found is None:
            # No history after it: the new version lasts until the latest one starts.
            self._backing.put(_history_key(key, latest[0]), _encode(timestamp, value))
            return latest[0]
        valid_to, valid_from, old_value = found
        if valid_from > timestamp:
            self._backing.put(_history_key(key, valid_from), _encode(timestamp, value))
            return valid_from
        if valid_from < timestamp:
            self._backing.put(_history_key(key, timestamp), _encode(valid_from, old_value))
        self._backing.put(_history_key(key, valid_to), _encode(timestamp, value))
        return valid_to

    def _expire(self, key: bytes) -> None:
        """Delete ``key``'s history versions no read can reach any more."""
        cutoff = self._cutoff()
        if cutoff <= 0:
            return
        head = _history_prefix(key)
        # valid_to <= cutoff: never valid at or after the oldest time reads answer for.
        span = KeyRange(head, _history_key(key, cutoff + 1))
        # Collect first: deleting while a scan of the same store is open would change it.
        for raw in [raw for raw, _ in self._backing.scan(span)]:
            self._backing.delete(raw)

    def reader(self, isolation: IsolationLevel | str | None = None) -> VersionedStoreReader:
        """A view for other threads at ``isolation`` (None: the backing store's default)."""
        return VersionedStoreReader(self._backing.reader(isolation), self.history_retention_ms)


class VersionedStoreReader(_VersionedReads):
    """A versioned store as another thread (an interactive query), or a standby's copy,
    reads it: the observed stream time comes from the data at this isolation level."""

    def __init__(self, inner: StoreReader, history_retention_ms: int) -> None:
        self.name = inner.name
        self.history_retention_ms = check_history_retention(inner.name, history_retention_ms)
        self.isolation = inner.isolation
        self._readable = inner

    def _observed(self) -> int:
        return _read_observed(self._readable)
