"""Window and session stores: time-segmented views over a transactional key-value store.

A :class:`SegmentedWindowStore` (key, window start -> value) or :class:`SegmentedSessionStore`
(key, session start, session end -> value) owns no data: it writes and reads
raw keys in the layout of :mod:`~eddyline_runtime.state.window_layout` through
a *backing* key-value store, in practice a :class:`~eddyline_runtime.state.RocksDBStore`
(directly, or through the engine's record cache and changelog layers). So
everything KIP-892 gives the key-value store holds here unchanged, with no
second engine to keep in step:

* the owner reads its own uncommitted writes; other threads read through
  :meth:`SegmentedWindowStore.reader` at ``READ_COMMITTED`` or ``READ_UNCOMMITTED``;
* uncommitted writes count against the uncommitted-bytes budget;
* the backing store's ``commit`` writes data and changelog offsets in one batch,
  and a crash (close without commit) loses the open transaction, never
  committed data: nothing is wiped;
* changelog, restoration, standbys and Spark SST builds see plain raw keys.

Retention (Kafka Streams' segmented stores, ``AbstractRocksDBSegmentedBytesStore``
and ``Segments``): the *observed stream time* of a store is the largest
segment-time written (window start, session end). Two rules follow from it, as
in Kafka:

* reads never return an entry older than ``observed - retention + 1`` (every
  read starts at ``max(from, observed - retention + 1)``);
* a segment is *live* while it is at or after the segment of ``observed -
  retention``. A write into a live segment is kept, even when reads already
  hide its time (a session aggregation writes a session that closes only a gap
  after its end); a write into an older segment is skipped (and counted in
  :attr:`SegmentedWindowStore.expired_writes`), and older segments are dropped
  whole, by deleting their key range through the backing store. The deletes go through
the open transaction and the changelog like any write, so standbys and
restored stores drop the same entries and stay byte-for-byte equal to the
active store. After a reopen, the observed stream time is recovered from the
newest segment (its largest timestamp), so expired entries stay hidden.

The segment interval is part of the layout: reopen a store with the retention
it was written with (a changed retention needs a new store name, or a reset of
the application's state). The store checks the segments it finds at first use
and refuses ones that do not fit its interval rather than miss their entries.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterator

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.key_ranges import KeyRange, prefix_successor
from eddyline_runtime.state.errors import StateStoreError
from eddyline_runtime.state.store import (
    KeyValue,
    KeyValueBytesStore,
    ReadableBytes,
    StoreReader,
    check_key,
)
from eddyline_runtime.state.window_layout import (
    SEGMENT_PREFIX_SIZE,
    SESSION_SUFFIX_SIZE,
    WINDOW_SUFFIX_SIZE,
    Retention,
    check_timestamp,
    decode_session_key,
    decode_window_key,
    segment_of_raw,
    segment_prefix,
    session_end_of_raw,
    session_key,
    session_key_matches,
    timestamp_bytes,
    window_key,
    window_key_matches,
    window_start_of_raw,
)

logger = logging.getLogger(__name__)

_MAX_TIME = (1 << 63) - 1
_NO_TIME = -1

# (key, window start, value)
WindowedEntry = tuple[bytes, int, bytes]
# (key, session start, session end, value)
SessionEntry = tuple[bytes, int, int, bytes]
# The order key-range reads merge segments in: (key, time, tiebreak), Kafka's
# (key, window start) for windows, (key, session end, session start) for sessions.
_Order = tuple[bytes, int, int]


def _discover_segments(readable: ReadableBytes, retention: Retention) -> list[int]:
    """The segments present, oldest first: one seek per segment, never a scan of one."""
    found: list[int] = []
    lower: bytes | None = None
    while True:
        first = next(iter(readable.scan(KeyRange(lower, None))), None)
        if first is None:
            return found
        raw = first[0]
        if len(raw) < SEGMENT_PREFIX_SIZE:
            raise StateStoreError(
                readable.name,
                f'state store "{readable.name}" holds the key {raw!r}, which is not a window '
                "or session store key: the store was written as a key-value store. Give the "
                "windowed operation its own store name",
            )
        segment = segment_of_raw(raw)
        if segment % retention.segment_interval_ms:
            raise _changed_interval(readable.name, segment, retention)
        found.append(segment)
        lower = prefix_successor(segment_prefix(segment))
        if lower is None:
            return found


def _changed_interval(store: str, segment: int, retention: Retention) -> StateStoreError:
    return StateStoreError(
        store,
        f'state store "{store}" holds a segment starting at {segment} ms that does not fit '
        f"its segment interval of {retention.segment_interval_ms} ms (retention "
        f"{retention.retention_ms} ms): the store was written with another retention. Keep "
        "the earlier window size, grace and retention, or give the operation a new store "
        "name (or reset the application's state) to start the store over",
    )


class _SegmentedReads:
    """Reads shared by the owner's view and other threads' readers."""

    name: str
    retention: Retention
    _readable: ReadableBytes

    def _observed(self) -> int:
        raise NotImplementedError

    def _segments(self) -> list[int]:
        raise NotImplementedError

    def _min_live(self) -> int:
        observed = self._observed()
        return 0 if observed == _NO_TIME else max(0, self.retention.min_live(observed))

    def _live_segments(self, earliest: int, latest: int) -> list[int]:
        """Segments that may hold segment-times in [earliest, latest]."""
        interval = self.retention.segment_interval_ms
        return [s for s in self._segments() if s <= latest and s + interval > earliest]


class _WindowReads(_SegmentedReads):
    def fetch(self, key: bytes, window_start: int) -> bytes | None:
        """The value of ``key``'s window starting at ``window_start``; None if none or expired."""
        check_key(self.name, "fetch", key)
        check_timestamp(self.name, "window start", window_start)
        if window_start < self._min_live():
            return None
        return self._readable.get(
            window_key(self.retention.segment_of(window_start), key, window_start)
        )

    def fetch_range(self, key: bytes, time_from: int, time_to: int) -> Iterator[tuple[int, bytes]]:
        """``key``'s windows with ``time_from <= start <= time_to`` (both inclusive, as
        Kafka's ``fetch(key, timeFrom, timeTo)``), oldest first, as (start, value)."""
        check_key(self.name, "fetch", key)
        check_timestamp(self.name, "time_from", time_from)
        check_timestamp(self.name, "time_to", time_to)
        lower = max(time_from, self._min_live())
        if lower > time_to:
            return iter(())
        return self._fetch_range(key, lower, time_to, self._live_segments(lower, time_to))

    def _fetch_range(
        self, key: bytes, lower: int, upper: int, segments: list[int]
    ) -> Iterator[tuple[int, bytes]]:
        for segment in segments:
            head = segment_prefix(segment) + key
            span = KeyRange(head + timestamp_bytes(lower), head + timestamp_bytes(upper + 1))
            for raw, value in self._readable.scan(span):
                if window_key_matches(raw, key):
                    yield window_start_of_raw(raw), value

    def fetch_all(self, time_from: int, time_to: int) -> Iterator[WindowedEntry]:
        """Every key's windows with ``time_from <= start <= time_to``, segment by segment,
        in key order inside a segment, as (key, start, value)."""
        check_timestamp(self.name, "time_from", time_from)
        check_timestamp(self.name, "time_to", time_to)
        lower = max(time_from, self._min_live())
        if lower > time_to:
            return iter(())
        return self._entries(lower, time_to, self._live_segments(lower, time_to))

    def all(self) -> Iterator[WindowedEntry]:
        """Every live window of every key."""
        return self._entries(self._min_live(), _MAX_TIME, self._live_segments(0, _MAX_TIME))

    def _entries(self, lower: int, upper: int, segments: list[int]) -> Iterator[WindowedEntry]:
        for segment in segments:
            for raw, value in self._readable.scan(KeyRange.prefix(segment_prefix(segment))):
                key, start, _ = decode_window_key(raw)
                if lower <= start <= upper:
                    yield key, start, value

    def backward_fetch_range(
        self, key: bytes, time_from: int, time_to: int
    ) -> Iterator[tuple[int, bytes]]:
        """:meth:`fetch_range` newest first (Kafka's ``backwardFetch(key, timeFrom, timeTo)``)."""
        return reversed(list(self.fetch_range(key, time_from, time_to)))

    def backward_fetch_all(self, time_from: int, time_to: int) -> Iterator[WindowedEntry]:
        """:meth:`fetch_all` in exactly reversed order (Kafka's ``backwardFetchAll``)."""
        return reversed(list(self.fetch_all(time_from, time_to)))

    def backward_all(self) -> Iterator[WindowedEntry]:
        """:meth:`all` in exactly reversed order (Kafka's ``backwardAll``)."""
        return reversed(list(self.all()))

    def fetch_key_range(
        self, key_from: bytes | None, key_to: bytes | None, time_from: int, time_to: int
    ) -> Iterator[WindowedEntry]:
        """The windows of keys ``key_from <= key <= key_to`` (None: open on that side) with
        ``time_from <= start <= time_to``, as (key, start, value), ordered by key, then
        window start across segments (Kafka's ``fetch(keyFrom, keyTo, timeFrom, timeTo)``)."""
        _check_key_bounds(self.name, "fetch_key_range", key_from, key_to)
        check_timestamp(self.name, "time_from", time_from)
        check_timestamp(self.name, "time_to", time_to)
        lower = max(time_from, self._min_live())
        if lower > time_to or _empty_keys(key_from, key_to):
            return iter(())
        streams = [
            self._window_key_range(segment, key_from, key_to, lower, time_to)
            for segment in self._live_segments(lower, time_to)
        ]
        return (entry for _, entry in heapq.merge(*streams, key=_order_of))

    def backward_fetch_key_range(
        self, key_from: bytes | None, key_to: bytes | None, time_from: int, time_to: int
    ) -> Iterator[WindowedEntry]:
        """:meth:`fetch_key_range` in exactly reversed order (Kafka's ``backwardFetch(keyFrom,
        keyTo, timeFrom, timeTo)``)."""
        return reversed(list(self.fetch_key_range(key_from, key_to, time_from, time_to)))

    def _window_key_range(
        self, segment: int, key_from: bytes | None, key_to: bytes | None, lower: int, upper: int
    ) -> Iterator[tuple[_Order, WindowedEntry]]:
        span = _segment_key_span(segment, self.retention, key_from, key_to)
        for raw, value in _in_key_order(
            segment, self.retention, WINDOW_SUFFIX_SIZE, self._readable.scan(span)
        ):
            key, start, seq = decode_window_key(raw)
            if lower <= start <= upper and _key_within(key, key_from, key_to):
                yield (key, start, seq), (key, start, value)


class _SessionReads(_SegmentedReads):
    def fetch_session(self, key: bytes, start: int, end: int) -> bytes | None:
        """The value of ``key``'s session [start, end]; None if none or expired."""
        check_key(self.name, "fetch_session", key)
        _check_session(self.name, start, end)
        if end < self._min_live():
            return None
        return self._readable.get(session_key(self.retention.segment_of(end), key, start, end))

    def find_sessions(
        self, key: bytes, earliest_session_end: int, latest_session_start: int
    ) -> Iterator[SessionEntry]:
        """``key``'s sessions with ``end >= earliest_session_end`` and ``start <=
        latest_session_start`` (Kafka's ``findSessions``: the sessions a record at
        ``t`` merges with are ``find_sessions(key, t - gap, t + gap)``), by end then start."""
        check_key(self.name, "find_sessions", key)
        check_timestamp(self.name, "earliest session end", earliest_session_end)
        check_timestamp(self.name, "latest session start", latest_session_start)
        lower = max(earliest_session_end, self._min_live())
        segments = self._live_segments(lower, _MAX_TIME)
        return self._find(key, lower, latest_session_start, segments)

    def fetch(self, key: bytes) -> Iterator[SessionEntry]:
        """Every live session of ``key``."""
        return self.find_sessions(key, 0, _MAX_TIME)

    def _find(
        self, key: bytes, lower_end: int, latest_start: int, segments: list[int]
    ) -> Iterator[SessionEntry]:
        for segment in segments:
            head = segment_prefix(segment) + key
            span = KeyRange(head + timestamp_bytes(lower_end), prefix_successor(head))
            for raw, value in self._readable.scan(span):
                if session_key_matches(raw, key):
                    _, start, end = decode_session_key(raw)
                    if start <= latest_start:
                        yield key, start, end, value

    def find_all_sessions(
        self, earliest_session_end: int, latest_session_start: int
    ) -> Iterator[SessionEntry]:
        """Every key's sessions with ``end >= earliest_session_end`` and ``start <=
        latest_session_start``, segment by segment, in key order inside a segment."""
        check_timestamp(self.name, "earliest session end", earliest_session_end)
        check_timestamp(self.name, "latest session start", latest_session_start)
        lower = max(earliest_session_end, self._min_live())
        return self._all_sessions(
            lower, latest_session_start, self._live_segments(lower, _MAX_TIME)
        )

    def _all_sessions(
        self, lower_end: int, latest_start: int, segments: list[int]
    ) -> Iterator[SessionEntry]:
        for segment in segments:
            for raw, value in self._readable.scan(KeyRange.prefix(segment_prefix(segment))):
                key, start, end = decode_session_key(raw)
                if end >= lower_end and start <= latest_start:
                    yield key, start, end, value

    def backward_find_sessions(
        self, key: bytes, earliest_session_end: int, latest_session_start: int
    ) -> Iterator[SessionEntry]:
        """:meth:`find_sessions` in exactly reversed order (Kafka's ``backwardFindSessions``)."""
        return reversed(list(self.find_sessions(key, earliest_session_end, latest_session_start)))

    def backward_fetch(self, key: bytes) -> Iterator[SessionEntry]:
        """:meth:`fetch` in exactly reversed order (Kafka's ``backwardFetch(key)``)."""
        return reversed(list(self.fetch(key)))

    def find_key_range_sessions(
        self,
        key_from: bytes | None,
        key_to: bytes | None,
        earliest_session_end: int,
        latest_session_start: int,
    ) -> Iterator[SessionEntry]:
        """The sessions of keys ``key_from <= key <= key_to`` (None: open on that side) with
        ``end >= earliest_session_end`` and ``start <= latest_session_start``, ordered by
        key, then end, then start across segments (Kafka's ``findSessions(keyFrom, keyTo,
        earliestSessionEndTime, latestSessionStartTime)``; ``fetch(keyFrom, keyTo)`` is
        ``find_key_range_sessions(key_from, key_to, 0, 2**63 - 1)``)."""
        _check_key_bounds(self.name, "find_key_range_sessions", key_from, key_to)
        check_timestamp(self.name, "earliest session end", earliest_session_end)
        check_timestamp(self.name, "latest session start", latest_session_start)
        lower = max(earliest_session_end, self._min_live())
        if _empty_keys(key_from, key_to):
            return iter(())
        streams = [
            self._session_key_range(segment, key_from, key_to, lower, latest_session_start)
            for segment in self._live_segments(lower, _MAX_TIME)
        ]
        return (entry for _, entry in heapq.merge(*streams, key=_order_of))

    def backward_find_key_range_sessions(
        self,
        key_from: bytes | None,
        key_to: bytes | None,
        earliest_session_end: int,
        latest_session_start: int,
    ) -> Iterator[SessionEntry]:
        """:meth:`find_key_range_sessions` in exactly reversed order."""
        found = self.find_key_range_sessions(
            key_from, key_to, earliest_session_end, latest_session_start
        )
        return reversed(list(found))

    def _session_key_range(
        self,
        segment: int,
        key_from: bytes | None,
        key_to: bytes | None,
        lower_end: int,
        latest_start: int,
    ) -> Iterator[tuple[_Order, SessionEntry]]:
        span = _segment_key_span(segment, self.retention, key_from, key_to)
        for raw, value in _in_key_order(
            segment, self.retention, SESSION_SUFFIX_SIZE, self._readable.scan(span)
        ):
            key, start, end = decode_session_key(raw)
            if end >= lower_end and start <= latest_start and _key_within(key, key_from, key_to):
                yield (key, end, start), (key, start, end, value)


# Key-range reads. Inside a segment raw keys are ``key bytes | time | ...`` with every
# time in [segment, segment + interval), so a key's entries sort by time, and keys sort
# by their bytes unless one key extends another: the raw keys of b"a" lie in
# ``a | [segment, segment + interval)``, and so do those of a key b"a" + x whose x falls
# in that band of bytes (an 8-byte big-endian time inside the segment, say). Such keys
# interleave. Two corrections keep the answer exact at little cost for keys that do not
# (a band's bytes are rare in keys): a scan's upper bound reaches over the bands of the
# prefixes of ``key_to`` (:func:`_segment_key_span`), and :func:`_in_key_order` holds an
# entry back only until the scan has passed the bands of its key's prefixes, then emits
# in (key, time) order. Segments are merged by (key, time) with a heap, so the answer is
# in key order across segments. Backward reads reverse the forward answer in memory: the
# key-value stores under these views have no reverse iterators yet, and reversing keeps
# "exactly reversed" true by construction.


def _band_end(segment: int, retention: Retention) -> bytes:
    """Bytes above every time stored in ``segment`` (its entries' times are below its end)."""
    return timestamp_bytes(segment + retention.segment_interval_ms)


def _in_key_order(
    segment: int, retention: Retention, suffix: int, scan: Iterator[KeyValue]
) -> Iterator[KeyValue]:
    """A segment's raw entries (in byte order) in (key, time) order: see the comment above.

    ``suffix`` is the size of what follows the key in a raw key. An entry waits only
    while a later raw key could still belong to a proper prefix of its key: until the
    scan reaches ``segment | prefix | band end`` (its horizon).
    """
    band_end = _band_end(segment, retention)
    # (key, what follows it, horizon, raw, value): ordered by key, then time and tiebreak.
    waiting: list[tuple[bytes, bytes, bytes, bytes, bytes]] = []
    for raw, value in scan:
        while waiting and raw >= waiting[0][2]:
            held = heapq.heappop(waiting)
            yield held[3], held[4]
        horizon = _horizon(raw, suffix, band_end)
        if horizon is None and not waiting:
            yield raw, value
            continue
        cut = len(raw) - suffix
        key, rest = raw[SEGMENT_PREFIX_SIZE:cut], raw[cut:]
        heapq.heappush(waiting, (key, rest, raw if horizon is None else horizon, raw, value))
    while waiting:
        held = heapq.heappop(waiting)
        yield held[3], held[4]


def _horizon(raw: bytes, suffix: int, band_end: bytes) -> bytes | None:
    """The largest ``segment | prefix | band end`` above ``raw`` over the proper prefixes of
    its key; None when there is none (no later raw key can sort before this entry)."""
    key_end = len(raw) - suffix
    # ``raw[:i] + band_end > raw`` needs raw[i] <= band_end[0]; most keys have no such
    # byte, and min() finds that without a Python loop over the key.
    if key_end == SEGMENT_PREFIX_SIZE or min(raw[SEGMENT_PREFIX_SIZE:key_end]) > band_end[0]:
        return None
    best: bytes | None = None
    for i in range(SEGMENT_PREFIX_SIZE, key_end):
        candidate = raw[:i] + band_end
        if candidate > raw and (best is None or candidate > best):
            best = candidate
    return best


def _check_key_bounds(
    store: str, operation: str, key_from: bytes | None, key_to: bytes | None
) -> None:
    if key_from is not None:
        check_key(store, operation, key_from)
    if key_to is not None:
        check_key(store, operation, key_to)


def _empty_keys(key_from: bytes | None, key_to: bytes | None) -> bool:
    # Kafka answers an empty iterator (and logs a warning) when keyFrom > keyTo.
    return key_from is not None and key_to is not None and key_from > key_to


def _key_within(key: bytes, key_from: bytes | None, key_to: bytes | None) -> bool:
    return (key_from is None or key >= key_from) and (key_to is None or key <= key_to)


def _segment_key_span(
    segment: int, retention: Retention, key_from: bytes | None, key_to: bytes | None
) -> KeyRange:
    """The raw keys of ``segment`` that may hold keys in [key_from, key_to]: the upper end
    reaches over the time bands of ``key_to``'s proper prefixes (see the comment above)."""
    prefix = segment_prefix(segment)
    lower = prefix if key_from is None else prefix + key_from
    if key_to is None:
        return KeyRange(lower, prefix_successor(prefix))
    band_end = _band_end(segment, retention)
    bands = (prefix + key_to[:i] + band_end for i in range(len(key_to)))
    upper = max(bands, default=b"")
    successor = prefix_successor(prefix + key_to)
    return KeyRange(lower, upper if successor is None or upper > successor else successor)


def _order_of(item: tuple[_Order, object]) -> _Order:
    return item[0]


def _check_session(store: str, start: int, end: int) -> None:
    check_timestamp(store, "session start", start)
    check_timestamp(store, "session end", end)
    if end < start:
        raise StateStoreError(
            store,
            f'state store "{store}": a session cannot end ({end}) before it starts ({start}); '
            "pass start <= end",
        )


class _SegmentedOwner:
    """The owner's bookkeeping: observed stream time, live segments, expiry."""

    name: str
    retention: Retention
    _backing: KeyValueBytesStore
    # The segment-time of a raw key (window start, or session end).
    _time_of_raw: Callable[[bytes], int]

    def _init_owner(
        self,
        backing: KeyValueBytesStore,
        retention: Retention,
        before_drop: Callable[[], None] | None,
    ) -> None:
        self.name = backing.name
        self.retention = retention
        self._backing = backing
        self._before_drop = before_drop
        self._segment_set: set[int] | None = None
        self._observed_time = _NO_TIME
        self.expired_writes = 0

    def _load(self) -> set[int]:
        """At first use: the segments present and the observed stream time they imply."""
        segments = self._segment_set
        if segments is None:
            found = _discover_segments(self._backing, self.retention)
            if found:
                newest = found[-1]
                latest = _NO_TIME
                for raw, _ in self._backing.scan(KeyRange.prefix(segment_prefix(newest))):
                    timestamp = self._time_of_raw(raw)
                    if self.retention.segment_of(timestamp) != newest:
                        raise _changed_interval(self.name, newest, self.retention)
                    latest = max(latest, timestamp)
                self._observed_time = max(self._observed_time, latest)
            segments = self._segment_set = set(found)
            self._drop_expired()
        return segments

    @property
    def observed_stream_time(self) -> int:
        """The largest segment-time written (recovered at reopen); -1 before any."""
        self._load()
        return self._observed_time

    def _observed(self) -> int:
        self._load()
        return self._observed_time

    def _segments(self) -> list[int]:
        return sorted(self._load())

    def _admit(self, timestamp: int) -> int | None:
        """Advance observed time; the segment to write ``timestamp`` in, None if expired."""
        segments = self._load()
        if timestamp > self._observed_time:
            self._observed_time = timestamp
            self._drop_expired()
        segment = self.retention.segment_of(timestamp)
        if segment < self.retention.oldest_live_segment(self._observed_time):
            self.expired_writes += 1
            logger.debug(
                'state store "%s": skipping a write at %d ms, its segment expired (observed '
                "stream time %d ms, retention %d ms)",
                self.name,
                timestamp,
                self._observed_time,
                self.retention.retention_ms,
            )
            return None
        segments.add(segment)
        return segment

    def _drop_expired(self) -> None:
        segments = self._segment_set
        if segments is None or self._observed_time == _NO_TIME:
            return
        oldest_live = self.retention.oldest_live_segment(self._observed_time)
        expired = sorted(s for s in segments if s < oldest_live)
        if expired and self._before_drop is not None:
            # A record cache above the store may hold the segment's last updates, not yet
            # forwarded: they go out first, or the drop's deletes would overwrite them
            # unseen (a window's final result lost).
            self._before_drop()
        for segment in expired:
            # Collect first: deleting while a scan of the same store is open
            # would change what the scan sees.
            raws = [raw for raw, _ in self._backing.scan(KeyRange.prefix(segment_prefix(segment)))]
            for raw in raws:
                self._backing.delete(raw)
            segments.discard(segment)
            logger.debug('state store "%s": dropped expired segment %d', self.name, segment)


class _OwnedReader(_SegmentedReads):
    """Another thread's view of an owner's store: the owner's observed stream time (an
    int read, safe across threads; the owner loaded it at its first use), the segments
    as the reader's snapshot holds them."""

    def __init__(self, owner: _SegmentedOwner, inner: StoreReader) -> None:
        self._owner = owner
        self._readable = inner
        self.name = owner.name
        self.retention = owner.retention
        self.isolation = inner.isolation

    def _observed(self) -> int:
        return self._owner._observed_time

    def _segments(self) -> list[int]:
        return _discover_segments(self._readable, self.retention)


class SegmentedWindowStore(_SegmentedOwner, _WindowReads):
    """Windows of keys (key, window start -> value) over a transactional key-value store.

    The owner thread writes and reads; other threads use :meth:`reader`.
    Committing is the backing store's (the engine commits it with the task).
    """

    def __init__(
        self,
        backing: KeyValueBytesStore,
        retention: Retention,
        *,
        before_drop: Callable[[], None] | None = None,
    ) -> None:
        """``before_drop`` runs before expired segments are dropped (the engine flushes
        the record cache there)."""
        self._init_owner(backing, retention, before_drop)
        self._readable = backing
        self._time_of_raw = window_start_of_raw

    def put(self, key: bytes, window_start: int, value: bytes | None) -> bool:
        """Write ``key``'s window at ``window_start``; a None value deletes it.

        A window whose segment is no longer live (see the module docstring) is not
        written: the answer is then False.
        """
        check_key(self.name, "put", key)
        check_timestamp(self.name, "window start", window_start)
        segment = self._admit(window_start)
        if segment is None:
            return False
        raw = window_key(segment, key, window_start)
        if value is None:
            self._backing.delete(raw)
        else:
            self._backing.put(raw, value)
        return True

    def reader(self, isolation: IsolationLevel | str | None = None) -> WindowStoreReader:
        """A view for other threads at ``isolation`` (None: the backing store's default)."""
        return WindowStoreReader(self, self._backing.reader(isolation))


class WindowStoreReader(_OwnedReader, _WindowReads):
    """A window store as another thread (an interactive query) reads it."""


class SegmentedSessionStore(_SegmentedOwner, _SessionReads):
    """Sessions of keys (key, start, end -> value) over a transactional key-value store."""

    def __init__(
        self,
        backing: KeyValueBytesStore,
        retention: Retention,
        *,
        before_drop: Callable[[], None] | None = None,
    ) -> None:
        self._init_owner(backing, retention, before_drop)
        self._readable = backing
        self._time_of_raw = session_end_of_raw

    def put(self, key: bytes, start: int, end: int, value: bytes | None) -> bool:
        """Write ``key``'s session [start, end]; a None value removes it.

        A session whose end's segment is no longer live (see the module docstring) is
        not written (the answer is False).
        """
        check_key(self.name, "put", key)
        _check_session(self.name, start, end)
        segment = self._admit(end)
        if segment is None:
            return False
        raw = session_key(segment, key, start, end)
        if value is None:
            self._backing.delete(raw)
        else:
            self._backing.put(raw, value)
        return True

    def remove(self, key: bytes, start: int, end: int) -> None:
        """Remove ``key``'s session [start, end] (a merged session's old entry)."""
        check_key(self.name, "remove", key)
        _check_session(self.name, start, end)
        segment = self.retention.segment_of(end)
        if segment < self.retention.oldest_live_segment(self._observed()):
            return  # its segment is dropped (or about to be): nothing to delete
        self._backing.delete(session_key(segment, key, start, end))

    def reader(self, isolation: IsolationLevel | str | None = None) -> SessionStoreReader:
        return SessionStoreReader(self, self._backing.reader(isolation))


class SessionStoreReader(_OwnedReader, _SessionReads):
    """A session store as another thread reads it."""


def _observed_from_data(
    readable: ReadableBytes, retention: Retention, time_of_raw: Callable[[bytes], int]
) -> int:
    """The observed stream time a store's data implies: the largest segment-time in its
    newest segment (what the owner recovers at reopen); -1 for an empty store."""
    segments = _discover_segments(readable, retention)
    if not segments:
        return _NO_TIME
    newest = segments[-1]
    return max(
        (time_of_raw(raw) for raw, _ in readable.scan(KeyRange.prefix(segment_prefix(newest)))),
        default=_NO_TIME,
    )


class _DetachedReader(_SegmentedReads):
    """A store read through a plain key-value reader, without its owner: an interactive
    query of any copy (active or standby; a standby has no owner view).

    Expiry follows the observed stream time the data implies (read once, when the
    reader is made), so expired windows not yet dropped stay hidden as they do
    from the owner.
    """

    # Where a raw key's segment-time is: a window's start, or a session's end.
    _time_of_raw: Callable[[bytes], int]

    def __init__(self, inner: StoreReader, retention: Retention) -> None:
        self._readable = inner
        self.name = inner.name
        self.retention = retention
        self.isolation = inner.isolation
        self._observed_time = _observed_from_data(inner, retention, type(self)._time_of_raw)

    def _observed(self) -> int:
        return self._observed_time

    def _segments(self) -> list[int]:
        return _discover_segments(self._readable, self.retention)


class DetachedWindowReader(_DetachedReader, _WindowReads):
    """A window store read without its owner: see :class:`_DetachedReader`."""

    _time_of_raw = staticmethod(window_start_of_raw)


class DetachedSessionReader(_DetachedReader, _SessionReads):
    """A session store read without its owner: see :class:`_DetachedReader`."""

    _time_of_raw = staticmethod(session_end_of_raw)
