"""The stores a DSL operator reaches, as typed interfaces: each kind defined once.

A processor asks its context for a store by name (``context.get_state_store``);
what comes back is the engine's store (record cache, changelog, transactional
RocksDB store), which this package may not import (an import contract holds
it). The operators therefore see it through these interfaces, as Kafka
Streams' operators see ``KeyValueStore``, ``TimestampedKeyValueStore``,
``WindowStore`` and ``SessionStore``:

* :class:`KeyValueStore`: bytes keys to bytes values, with ordered scans over a
  :class:`~eddyline_runtime.key_ranges.KeyRange`;
* :class:`TimestampedKeyValueStore`: a key-value store whose values carry the
  timestamp of their update (:mod:`eddyline_runtime.value_and_timestamp`);
* :class:`WindowStore`: (key, window start) to value, with retention;
* :class:`SessionStore`: (key, session start, session end) to value, with retention;
* :class:`VersionedKeyValueStore`: every version of a key with the time it became
  valid, with a history retention (KIP-889).

Each store with a record cache in front of it forwards what the cache flushes
to the one listener ``set_flush_listener`` registers (answering False when
there is no cache: the operator then forwards each update itself). The
listener of a window or session store receives the entry's key and window,
already decoded from the store's byte layout.

:func:`key_value_store`, :func:`window_store`, :func:`session_store` and
:func:`versioned_store` fetch a
store of the expected kind, or raise naming the store and what it is instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.processing.topology import Change, ProcessorContext, TopologyError
from eddyline_runtime.value_and_timestamp import split_timestamped, timestamped_value

# Receives each update a key-value store's cache flushes: the key and Change(new, old).
ChangeListener = Callable[[bytes, Change], None]
# A window store's: the key, the window start and the change.
WindowChangeListener = Callable[[bytes, int, Change], None]
# A session store's: the key, the session start and end, and the change.
SessionChangeListener = Callable[[bytes, int, int, Change], None]


class KeyValueStore(Protocol):
    """A key-value store as an operator sees it; reads see the task's own writes."""

    name: str

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> bytes | None:
        """Delete ``key``; returns the value it had (None: none)."""
        ...

    def scan(self, key_range: KeyRange) -> Iterator[tuple[bytes, bytes]]:
        """The entries in ``key_range``, in byte order of their keys."""
        ...

    def set_flush_listener(self, listener: ChangeListener) -> bool:
        """Forward what the record cache flushes to ``listener``; False: no cache."""
        ...


class TimestampedKeyValueStore:
    """A key-value store whose values carry their update's timestamp (Kafka's
    ``TimestampedKeyValueStore``): a view over a :class:`KeyValueStore`, writing
    the one value-and-timestamp format."""

    __slots__ = ("_inner", "name")

    def __init__(self, inner: KeyValueStore) -> None:
        self._inner = inner
        self.name = inner.name

    def get(self, key: bytes) -> tuple[int, bytes] | None:
        """(timestamp, value) of ``key``; None if it has none."""
        stored = self._inner.get(key)
        return None if stored is None else split_timestamped(stored)

    def put(self, key: bytes, value: bytes, timestamp: int) -> None:
        self._inner.put(key, timestamped_value(timestamp, value))

    def delete(self, key: bytes) -> None:
        self._inner.delete(key)


class WindowStore(Protocol):
    """A window store as a processor sees it (``context.get_state_store(name)``).

    Keys and values are bytes (serialized by the processor); a window is named
    by its start. Reads see the task's own uncommitted writes.
    """

    name: str

    def fetch(self, key: bytes, window_start: int) -> bytes | None:
        """The value of ``key``'s window at ``window_start``; None if none or expired."""
        ...

    def fetch_range(self, key: bytes, time_from: int, time_to: int) -> Iterator[tuple[int, bytes]]:
        """``key``'s windows with ``time_from <= start <= time_to``, as (start, value)."""
        ...

    def fetch_all(self, time_from: int, time_to: int) -> Iterator[tuple[bytes, int, bytes]]:
        """Every key's windows with ``time_from <= start <= time_to``, as (key, start, value)."""
        ...

    def backward_fetch_range(
        self, key: bytes, time_from: int, time_to: int
    ) -> Iterator[tuple[int, bytes]]:
        """:meth:`fetch_range` newest first (Kafka's ``backwardFetch(key, timeFrom, timeTo)``)."""
        ...

    def backward_fetch_all(
        self, time_from: int, time_to: int
    ) -> Iterator[tuple[bytes, int, bytes]]:
        """:meth:`fetch_all` in exactly reversed order (Kafka's ``backwardFetchAll``)."""
        ...

    def all(self) -> Iterator[tuple[bytes, int, bytes]]:
        """Every live window of every key (Kafka's ``all()``)."""
        ...

    def backward_all(self) -> Iterator[tuple[bytes, int, bytes]]:
        """:meth:`all` in exactly reversed order (Kafka's ``backwardAll()``)."""
        ...

    def fetch_key_range(
        self, key_from: bytes | None, key_to: bytes | None, time_from: int, time_to: int
    ) -> Iterator[tuple[bytes, int, bytes]]:
        """Windows of keys ``key_from <= key <= key_to`` (None: open) starting in
        ``time_from..time_to``, as (key, start, value), by key then start across segments
        (Kafka's ``fetch(keyFrom, keyTo, timeFrom, timeTo)``)."""
        ...

    def backward_fetch_key_range(
        self, key_from: bytes | None, key_to: bytes | None, time_from: int, time_to: int
    ) -> Iterator[tuple[bytes, int, bytes]]:
        """:meth:`fetch_key_range` in exactly reversed order (Kafka's ``backwardFetch``)."""
        ...

    def put(self, key: bytes, window_start: int, value: bytes | None) -> bool:
        """Write (None: delete) ``key``'s window; False when its segment had expired
        and it was not (a live segment takes it, even past what reads show)."""
        ...

    @property
    def observed_stream_time(self) -> int:
        """The newest window start written (recovered at reopen); -1 before any."""
        ...

    def set_flush_listener(self, listener: WindowChangeListener, *, deletes: bool = True) -> bool:
        """Forward what the record cache flushes to ``listener`` (without ``deletes``:
        writes only, as the cache's deletes of expired segments are no results);
        False: no cache."""
        ...


class SessionStore(Protocol):
    """A session store as a processor sees it (``context.get_state_store(name)``)."""

    name: str

    def find_sessions(
        self, key: bytes, earliest_session_end: int, latest_session_start: int
    ) -> Iterator[tuple[bytes, int, int, bytes]]:
        """``key``'s sessions ending at or after ``earliest_session_end`` and starting at
        or before ``latest_session_start``, as (key, start, end, value)."""
        ...

    def backward_find_sessions(
        self, key: bytes, earliest_session_end: int, latest_session_start: int
    ) -> Iterator[tuple[bytes, int, int, bytes]]:
        """:meth:`find_sessions` in exactly reversed order (Kafka's ``backwardFindSessions``)."""
        ...

    def fetch(self, key: bytes) -> Iterator[tuple[bytes, int, int, bytes]]:
        """Every live session of ``key`` (Kafka's ``fetch(key)``)."""
        ...

    def backward_fetch(self, key: bytes) -> Iterator[tuple[bytes, int, int, bytes]]:
        """:meth:`fetch` in exactly reversed order (Kafka's ``backwardFetch(key)``)."""
        ...

    def find_key_range_sessions(
        self,
        key_from: bytes | None,
        key_to: bytes | None,
        earliest_session_end: int,
        latest_session_start: int,
    ) -> Iterator[tuple[bytes, int, int, bytes]]:
        """Sessions of keys ``key_from <= key <= key_to`` (None: open) so bounded, by key,
        end, start across segments (Kafka's ``findSessions(keyFrom, keyTo, ...)``)."""
        ...

    def backward_find_key_range_sessions(
        self,
        key_from: bytes | None,
        key_to: bytes | None,
        earliest_session_end: int,
        latest_session_start: int,
    ) -> Iterator[tuple[bytes, int, int, bytes]]:
        """:meth:`find_key_range_sessions` in exactly reversed order."""
        ...

    def put(self, key: bytes, start: int, end: int, value: bytes | None) -> bool:
        """Write (None: remove) ``key``'s session; False when the segment of its end
        had expired and it was not (a live segment takes it, even past what reads show)."""
        ...

    def remove(self, key: bytes, start: int, end: int) -> None:
        """Remove ``key``'s session [start, end]."""
        ...

    @property
    def observed_stream_time(self) -> int:
        """The newest session end written (recovered at reopen); -1 before any."""
        ...

    def set_flush_listener(self, listener: SessionChangeListener) -> bool:
        """Forward what the record cache flushes to ``listener``; False: no cache."""
        ...


# Kafka's VersionedKeyValueStore.PUT_RETURN_CODE_VALID_TO_UNDEFINED: the put is now the
# latest version (the state package's constant of the same name; this package may not
# import it).
PUT_RETURN_CODE_VALID_TO_UNDEFINED = -1


class VersionedRecordLike(Protocol):
    """One version of a key (Kafka's ``VersionedRecord``)."""

    @property
    def value(self) -> bytes: ...

    @property
    def timestamp(self) -> int: ...

    @property
    def valid_to(self) -> int | None: ...


class VersionedKeyValueStore(Protocol):
    """Versions of keys (:class:`eddyline_runtime.state.VersionedKeyValueStore`)."""

    name: str
    history_retention_ms: int

    def get(self, key: bytes, as_of: int | None = None) -> VersionedRecordLike | None:
        """The latest version (``as_of`` None) or the one valid at ``as_of``."""
        ...

    def put(self, key: bytes, value: bytes | None, timestamp: int) -> int:
        """Add a version; Kafka's return codes (-1: it is the latest)."""
        ...

    def versions(
        self, key: bytes, from_time: int = 0, to_time: int = ..., *, ascending: bool = False
    ) -> list[Any]:
        """The versions valid at some time in [from_time, to_time] (KIP-968)."""
        ...


# What tells each kind apart: a method only that kind has (looked up on the type,
# so no property of the store runs).
_KINDS = (
    ("window", "fetch_range"),
    ("session", "find_sessions"),
    ("versioned", "versions"),
    ("key-value", "get"),
)


def _kind_of(store: object) -> str:
    for kind, method in _KINDS:
        if callable(getattr(type(store), method, None)):
            return kind
    return type(store).__name__


def _attached(context: ProcessorContext, name: str, wanted: str) -> Any:
    store = context.get_state_store(name)
    found = _kind_of(store)
    if found != wanted:
        raise TopologyError(
            f'store "{name}" is a {found} store, but this operator needs a {wanted} store: '
            "give each operation its own store name"
        )
    return store


def key_value_store(context: ProcessorContext, name: str) -> KeyValueStore:
    """The key-value store ``name`` attached to the processor of ``context``."""
    store: KeyValueStore = _attached(context, name, "key-value")
    return store


def window_store(context: ProcessorContext, name: str) -> WindowStore:
    """The window store ``name`` attached to the processor of ``context``."""
    store: WindowStore = _attached(context, name, "window")
    return store


def session_store(context: ProcessorContext, name: str) -> SessionStore:
    """The session store ``name`` attached to the processor of ``context``."""
    store: SessionStore = _attached(context, name, "session")
    return store


def versioned_store(context: ProcessorContext, name: str) -> VersionedKeyValueStore:
    """The versioned store ``name`` attached to the processor of ``context``."""
    store: VersionedKeyValueStore = _attached(context, name, "versioned")
    return store


def is_versioned(context: ProcessorContext, name: str) -> bool:
    """Whether store ``name`` (attached to the processor of ``context``) is versioned: a
    table's operators read and write it by record time then."""
    return _kind_of(context.get_state_store(name)) == "versioned"
