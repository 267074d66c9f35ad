"""Windowed aggregation processors: what ``windowed_by(...).count/reduce/aggregate`` runs.

Time windows: Kafka Streams' ``KStreamWindowAggregate``, record by record:

* a record with a null key is dropped (logged, counted once in
  ``dropped-records-total``) and changes nothing else: it never reaches the
  aggregation's clock;
* the clock is the aggregation's own *observed stream time* (Kafka's per-processor
  ``observedStreamTime``): the largest timestamp of the records that reached it
  with a key, never the task's stream time, which every record of the task's
  inputs advances (a null-key record with a late timestamp would otherwise close
  windows and make later on-time records late);
* Kafka starts that clock empty when a task is created; eddyline starts it at the
  newest record timestamp folded into the store (read at the first record, after
  the store is restored): that is exactly the clock the aggregation had at its
  last commit, so a window closed before a restart stays closed instead of being
  reopened with a fresh aggregate (docs/windows.md says why);
* for each window the record falls in (``TimeWindows.windows_for``), the window
  is *closed* when its end is at or before ``observed - grace``. A record for a
  closed window is dropped for that window, counted once per window, and logged
  with the reason; open windows fold it in;
* each window's value is timestamped with the newest record folded in, and a
  result carries that timestamp downstream;
* results go downstream keyed by ``Windowed(key, window)``: on every update
  without a record cache, once per window per flush with one (KIP-63), as
  key-value aggregations do. Deletes a cache flushes (expired segments being
  dropped) are not results and are not forwarded.

Session windows: Kafka Streams' ``KStreamSessionWindowAggregate``: a record at
``t`` starts the session ``[t, t]``, merges (``merger``) every session of its
key ending at or after ``t - gap`` and starting at or before ``t + gap`` that
the store still shows (its reads start at ``store observed - retention + 1``),
and is dropped when the merged session ends before ``observed - gap - grace``
(strictly: a session stays open for a gap after its end, then for the grace).
Unless the merged session is just ``[t, t]``, each merged session is removed
and its removal forwarded (a None value, timestamped with its end); the merged
session is then written and forwarded, timestamped with its end. The clock is
the aggregation's own observed stream time, as for time windows, started at the
newest session end in the store.

Each processor is built from its frozen description (:class:`WindowedAggregation`,
:class:`SessionWindowedAggregation`, :class:`SlidingWindowedAggregation`) by the
supplier the DSL attaches to its node, and reaches its store through the
:class:`~eddyline_runtime.processing.operators.stores.WindowStore` or
:class:`~eddyline_runtime.processing.operators.stores.SessionStore` interface
(the engine gives a view over the task store: record cache, changelog,
transactional RocksDB store).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eddyline_runtime.processing.operators.stores import (
    SessionStore,
    WindowStore,
    session_store,
    window_store,
)
from eddyline_runtime.processing.topology import Change, Processor, ProcessorContext
from eddyline_runtime.processing.windows import (
    SessionWindow,
    SessionWindows,
    SlidingWindows,
    TimeWindow,
    TimeWindows,
    Windowed,
)
from eddyline_runtime.serde import serde_for
from eddyline_runtime.value_and_timestamp import split_timestamped, timestamped_value

logger = logging.getLogger(__name__)

# A window start in a windowed key's bytes (TimeWindowedSerde: key bytes, then this).
_START = struct.Struct(">q")
_LATEST_START = (1 << 63) - 1


@dataclass(frozen=True)
class WindowedAggregation:
    """A time-windowed ``count``/``reduce``/``aggregate`` node (Kafka's ``KStreamWindowAggregate``).

    ``initializer()`` seeds a window, ``aggregator(key, value, aggregate)``
    folds a record in. Keys and aggregates reach the store through the serdes.
    """

    store: str
    windows: TimeWindows
    initializer: Any
    aggregator: Any
    key_serde: str | None
    value_serde: str | None
    # emit_final(): the aggregation forwards no updates, only each window's final result
    # once it closes, found by a scan of its store (KIP-825; see WindowAggregateProcessor).
    emit_final: bool = False


@dataclass(frozen=True)
class SessionWindowedAggregation:
    """A session-windowed ``count``/``reduce``/``aggregate`` node.

    ``merger(key, aggregate, other)`` combines two sessions' aggregates when a
    record bridges them.
    """

    store: str
    windows: SessionWindows
    initializer: Any
    aggregator: Any
    merger: Any
    key_serde: str | None
    value_serde: str | None
    # The store's retention: gap + grace, or longer (Materialized.with_retention).
    retention_ms: int


@dataclass(frozen=True)
class SlidingWindowedAggregation:
    """A sliding-windowed ``count``/``reduce``/``aggregate`` node."""

    store: str
    windows: SlidingWindows
    initializer: Any
    aggregator: Any
    key_serde: str | None
    value_serde: str | None


_NO_KEY: Any = object()  # a skip logged without the record's key (sliding windows)


def _skip_null(
    context: ProcessorContext,
    dropped: Callable[[], None],
    value: Any = _NO_KEY,
) -> None:
    """A record without a key has no window or session to go to: logged (in Kafka Streams'
    words) and counted as dropped. Without ``value``: the sliding aggregation's rule, which
    also drops a null value."""
    if value is _NO_KEY:
        logger.warning(
            "Skipping record due to null key or value. topic=[%s] partition=[%d] offset=[%d]",
            context.topic,
            context.partition,
            context.offset,
        )
    else:
        logger.warning(
            "Skipping record due to null key. value=[%s] topic=[%s] partition=[%d] offset=[%d]",
            value,
            context.topic,
            context.partition,
            context.offset,
        )
    dropped()


def _skip_expired(
    context: ProcessorContext,
    dropped: Callable[[], None],
    window: str,
    times: tuple[int, int],
    key: Any = _NO_KEY,
) -> None:
    """A record for a closed window (or session): logged as Kafka Streams logs it (with
    the key, except for sliding windows) and counted as dropped. ``times``: the close
    time and the stream time."""
    close_time, stream_time = times
    keyed = "" if key is _NO_KEY else f"key=[{key}] "
    logger.warning(
        "Skipping record for expired window. %stopic=[%s] partition=[%d] offset=[%d] "
        "timestamp=[%d] window=%s expiration=[%d] streamTime=[%d]",
        keyed,
        context.topic,
        context.partition,
        context.offset,
        context.timestamp,
        window,
        close_time,
        stream_time,
    )
    dropped()


class _WindowedAggregate(Processor):
    """What the time and sliding window aggregations share: their store and serdes,
    their own observed stream time (started at the store's newest record), and their
    results (forwarded on every write without a record cache, on the cache's flush
    with one)."""

    _store: WindowStore

    def __init__(
        self,
        spec: WindowedAggregation | SlidingWindowedAggregation,
        window_ms: int,
        *,
        emit_final: bool = False,
    ) -> None:
        self._store_name = spec.store
        self._window_ms = window_ms  # a window's end - start
        # The aggregation's observed stream time (None: not started yet, see _observe).
        self._observed: int | None = None
        self._keys: Any = serde_for(spec.key_serde)
        self._values: Any = serde_for(spec.value_serde)
        self._emit_final = emit_final
        # emit_final: the earliest end of a window not emitted yet (set with _observed).
        self._next_end = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store = window_store(context, self._store_name)
        self._observed = None  # read from this store at the first record
        self._dropped = context.record_dropped
        if self._emit_final:
            # No update is a result: nothing is forwarded on a write or a flush.
            self._forwards_updates = False
            return
        # The cache's deletes are expired segments being dropped: not results.
        forwards_on_flush = self._store.set_flush_listener(self._flushed, deletes=False)
        self._forwards_updates = not forwards_on_flush

    def _observe(self, timestamp: int) -> int:
        """Advance the aggregation's observed stream time to ``timestamp``; returns it.

        Only records that reach the aggregation with a key call this. It starts at the
        newest record timestamp in the store, read at the first record rather than in
        ``init``, which runs before the task's stores are restored."""
        observed = self._observed
        if observed is None:
            observed = _newest_stored_timestamp(self._store)
        observed = max(observed, timestamp)
        self._observed = observed
        return observed

    def _put(self, key: Any, stored_key: bytes, start: int, newest: int, aggregate: Any) -> bool:
        """Write the window at ``start``; forwarded now unless the cache's flush will.
        False: the store's retention already let the window go."""
        written = self._store.put(
            stored_key, start, timestamped_value(newest, self._values.serialize(aggregate))
        )
        if written and self._forwards_updates:
            window = TimeWindow(start, start + self._window_ms)
            self.context.forward(Windowed(key, window), aggregate, timestamp=newest)
        return written

    def _flushed(self, stored_key: bytes, start: int, change: Change) -> None:
        if change.new is None:  # never: the listener takes no deletes (see init)
            return
        newest, data = split_timestamped(change.new)
        window = TimeWindow(start, start + self._window_ms)
        self.context.forward(
            Windowed(self._keys.deserialize(stored_key), window),
            self._values.deserialize(data),
            timestamp=newest,
        )


class WindowAggregateProcessor(_WindowedAggregate):
    """Kafka's ``KStreamWindowAggregate``; with ``emit_final`` its ``onWindowClose``
    strategy as KIP-825 built it: updates are only written to the store, and each time
    the observed stream time closes windows, the windows it closed are read from the
    store by one range scan and forwarded, each once.

    Which windows a record closes: those ending in ``(previous close time, close
    time]``, the close time being ``observed - grace``. They are emitted before the
    record's own writes (which only touch windows still open, so the order changes
    nothing), while the store's retention still shows them. At a restart the previous
    close time is the one the aggregation had at its last commit (its observed time is
    started at the store's newest record timestamp, see ``_observe``), and every window
    that closed up to that commit was emitted in it: nothing is emitted twice or lost,
    and no clock needs a store of its own. The results, and their order, are those the
    window-close suppression buffer gave before (by window end, then by the windowed
    key's bytes), so ``emit_final`` outputs are unchanged; only their moment is
    earlier: at the record that closes the window, not at the next cache flush.

    Which windows are still to be emitted is kept in memory (``_open``: window start ->
    stored keys), so a close reads only the windows it closes, by point reads, instead
    of scanning their whole segments (which hold every key's windows of a span of time
    in key order: a scan read and decoded every open window at every close). The
    memory holds what the store holds: it is filled by one scan of the unemitted
    windows at the first record (when ``_observed`` is read; ``init`` runs again
    whenever the store is reopened), then by each write that creates a window. An entry
    is only a place to look: a window the store no longer has (retention) is skipped.
    """

    def __init__(self, spec: WindowedAggregation) -> None:
        super().__init__(spec, spec.windows.size_ms, emit_final=spec.emit_final)
        self._spec = spec
        self._windows = spec.windows
        # emit_final: the unemitted windows, start -> stored keys (see the class doc).
        self._open: dict[int, set[bytes]] = {}

    def process(self, key: Any, value: Any) -> None:
        context = self.context
        if key is None:
            _skip_null(context, self._dropped, value)
            return
        timestamp = context.timestamp
        grace = self._windows.grace_ms
        if self._emit_final:
            if self._observed is None:
                self._observed = _newest_stored_timestamp(self._store)
                self._next_end = self._first_end_after(self._observed - grace)
                self._open = self._unemitted_windows()
            stream_time = self._observe(timestamp)
            if stream_time - grace >= self._next_end:
                self._emit_closed(stream_time - grace)
        else:
            stream_time = self._observe(timestamp)
        close_time = stream_time - grace
        stored_key = self._keys.serialize(key)
        for window in self._windows.windows_for(timestamp):
            if window.end <= close_time:
                self._skip(key, window, close_time, stream_time)
                continue
            stored = self._store.fetch(stored_key, window.start)
            if stored is None:
                aggregate, newest = self._spec.initializer(), timestamp
            else:
                newest, data = split_timestamped(stored)
                aggregate = self._values.deserialize(data)
                newest = max(newest, timestamp)
            aggregate = self._spec.aggregator(key, value, aggregate)
            if not self._put(key, stored_key, window.start, newest, aggregate):
                # The store's retention already let this window go (after a restart,
                # before stream time caught up): it is closed all the same.
                self._skip(key, window, close_time, stream_time)
            elif stored is None and self._emit_final:
                self._open.setdefault(window.start, set()).add(stored_key)

    def _skip(self, key: Any, window: TimeWindow, close_time: int, stream_time: int) -> None:
        window_text = f"[{window.start},{window.end})"
        _skip_expired(self.context, self._dropped, window_text, (close_time, stream_time), key)

    def _first_end_after(self, time: int) -> int:
        """The earliest window end after ``time``: window starts are multiples of the
        advance, so which record closes a window is arithmetic, and most records close
        none and cost no read."""
        size, advance = self._windows.size_ms, self._windows.advance_ms
        return -(-max(0, time - size + 1) // advance) * advance + size

    def _emit_closed(self, close_time: int) -> None:
        """Forward the final result of every window ending in ``[self._next_end,
        close_time]``: those the observed stream time closed since the last call."""
        size = self._windows.size_ms
        # No open window starts before the old _next_end's window: a window that ends at
        # or before the close time takes no write, and the starting scan begins there.
        self._next_end = self._first_end_after(close_time)
        last = close_time - size
        store, open_windows = self._store, self._open
        keys, values, forward = self._keys, self._values, self.context.forward
        for start in sorted(s for s in open_windows if s <= last):
            stored_keys = open_windows.pop(start)
            window = TimeWindow(start, start + size)
            start_bytes = _START.pack(start)
            # The suppression buffer's order: window end, then the windowed key's bytes
            # (the key's, then its start's), as TimeWindowedSerde writes them.
            for stored_key in sorted(stored_keys, key=lambda k: k + start_bytes):
                stored = store.fetch(stored_key, start)
                if stored is None:
                    continue  # the store's retention let it go
                newest, data = split_timestamped(stored)
                forward(
                    Windowed(keys.deserialize(stored_key), window),
                    values.deserialize(data),
                    timestamp=newest,
                )

    def _unemitted_windows(self) -> dict[int, set[bytes]]:
        """The store's windows not emitted yet (ending at or after ``_next_end``), by
        start: one scan, when the aggregation starts on this store."""
        found: dict[int, set[bytes]] = {}
        first = self._next_end - self._windows.size_ms
        for stored_key, start, _ in self._store.fetch_all(max(0, first), _LATEST_START):
            found.setdefault(start, set()).add(stored_key)
        return found


class SessionAggregateProcessor(Processor):
    _store: SessionStore

    def __init__(self, spec: SessionWindowedAggregation) -> None:
        self._spec = spec
        self._windows = spec.windows
        self._retention_ms = spec.retention_ms
        self._keys: Any = serde_for(spec.key_serde)
        self._values: Any = serde_for(spec.value_serde)
        # How long a session stays open after its end: the gap (a record that late
        # still extends it), then the grace.
        self._open_ms = spec.windows.gap_ms + spec.windows.grace_ms
        # The aggregation's observed stream time (None: not started yet): as for time
        # windows, started at the store's newest session end once the store is restored.
        self._observed: int | None = None

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store = session_store(context, self._spec.store)
        self._observed = None  # read from this store at the first record
        self._dropped = context.record_dropped
        self._forwards_on_flush = self._store.set_flush_listener(self._flushed)

    def process(self, key: Any, value: Any) -> None:
        context = self.context
        if key is None:
            _skip_null(context, self._dropped, value)
            return
        spec, gap = self._spec, self._windows.gap_ms
        timestamp = context.timestamp
        stream_time = self._observed
        if stream_time is None:
            stream_time = self._store.observed_stream_time
        stream_time = max(stream_time, timestamp)
        self._observed = stream_time
        close_time = stream_time - self._open_ms
        stored_key = self._keys.serialize(key)
        aggregate = spec.initializer()
        start = end = timestamp
        merged: list[tuple[int, int]] = []
        for _, found_start, found_end, data in self._store.find_sessions(
            stored_key, max(0, timestamp - gap), timestamp + gap
        ):
            merged.append((found_start, found_end))
            aggregate = spec.merger(key, aggregate, self._values.deserialize(data))
            start, end = min(start, found_start), max(end, found_end)
        if end < close_time:
            self._skip(key, start, end, close_time, stream_time)
            return
        forwards = not self._forwards_on_flush
        if (start, end) != (timestamp, timestamp):
            for found_start, found_end in merged:
                self._store.remove(stored_key, found_start, found_end)
                if forwards:
                    window = SessionWindow(found_start, found_end)
                    context.forward(Windowed(key, window), None, timestamp=found_end)
        aggregate = spec.aggregator(key, value, aggregate)
        if not self._store.put(stored_key, start, end, self._values.serialize(aggregate)):
            self._skip(key, start, end, close_time, stream_time)
        elif forwards:
            context.forward(Windowed(key, SessionWindow(start, end)), aggregate, timestamp=end)

    def _skip(self, key: Any, start: int, end: int, close_time: int, stream_time: int) -> None:
        times = (close_time, stream_time)
        _skip_expired(self.context, self._dropped, f"[{start},{end}]", times, key)

    def _flushed(self, stored_key: bytes, start: int, end: int, change: Change) -> None:
        if change.new is None:
            observed = self._store.observed_stream_time
            if end < observed - self._retention_ms + 1:
                return  # an expired session's segment dropped: not a result
            value = None
        else:
            value = self._values.deserialize(change.new)
        self.context.forward(
            Windowed(self._keys.deserialize(stored_key), SessionWindow(start, end)),
            value,
            timestamp=end,
        )


_Pair = tuple[int, Any]  # (newest record timestamp folded in, aggregate)


class SlidingWindowAggregateProcessor(_WindowedAggregate):
    """Kafka Streams' ``KStreamSlidingWindowAggregate`` (its in-order store walk).

    For a record at ``t`` with time difference ``d``, the key's windows starting in
    ``[t - 2d, t + 1]`` are read once, oldest first: those ending before ``t``
    tell the newest earlier record (whose right window ``t`` may now fill) and
    the aggregate the record's left window starts from; windows holding ``t``
    fold it in; a window starting at ``t + 1`` means the right window exists.
    Then the missing windows are created: the previous record's right window,
    the record's left window ``[t - d, t]`` and, when later records exist within
    ``d``, its right window ``[t + 1, t + 1 + d]`` (their aggregate, without
    the record). Windows ending before ``stream time - grace`` are closed: the
    record is dropped for them, counted and logged.
    """

    def __init__(self, spec: SlidingWindowedAggregation) -> None:
        super().__init__(spec, spec.windows.time_difference_ms)
        self._spec = spec
        self._diff = spec.windows.time_difference_ms
        self._grace = spec.windows.grace_ms

    def process(self, key: Any, value: Any) -> None:
        context = self.context
        if key is None or value is None:
            _skip_null(context, self._dropped)
            return
        timestamp, diff = context.timestamp, self._diff
        stream_time = self._observe(timestamp)
        close_time = stream_time - self._grace
        if timestamp + diff < close_time:
            self._skip(timestamp, timestamp + diff, close_time, stream_time)
            return
        stored_key = self._keys.serialize(key)
        update = _SlidingUpdate(
            self, key, value, stored_key=stored_key, close_time=close_time, stream_time=stream_time
        )
        if timestamp < diff:
            update.early()
        else:
            update.in_order()

    def _pairs(self, stored_key: bytes, time_from: int, time_to: int) -> list[tuple[int, _Pair]]:
        """The key's windows with start in [from, to], oldest first, read before any write."""
        found = []
        for start, stored in self._store.fetch_range(stored_key, time_from, time_to):
            newest, data = split_timestamped(stored)
            found.append((start, (newest, self._values.deserialize(data))))
        return found

    def _skip(self, start: int, end: int, close_time: int, stream_time: int) -> None:
        _skip_expired(self.context, self._dropped, f"[{start},{end}]", (close_time, stream_time))


class _SlidingUpdate:
    """One record's pass over its key's sliding windows (Kafka's ``processInOrder`` and
    ``processEarly``); the names follow Kafka's so the two can be read side by side."""

    def __init__(
        self,
        owner: SlidingWindowAggregateProcessor,
        key: Any,
        value: Any,
        *,
        stored_key: bytes,
        close_time: int,
        stream_time: int,
    ) -> None:
        self.owner = owner
        self.key, self.value, self.stored_key = key, value, stored_key
        self.timestamp = owner.context.timestamp
        self.close_time, self.stream_time = close_time, stream_time
        self.starts: set[int] = set()

    def _fold(self, start: int, pair: _Pair) -> None:
        """Fold the record into the window at ``start`` holding ``pair``, unless it closed."""
        owner = self.owner
        end = start + owner._diff
        if end < self.close_time:
            owner._skip(start, end, self.close_time, self.stream_time)
            return
        newest, aggregate = pair
        folded = owner._spec.aggregator(self.key, self.value, aggregate)
        newest = self.timestamp if aggregate is None else max(self.timestamp, newest)
        if not owner._put(self.key, self.stored_key, start, newest, folded):
            owner._skip(start, end, self.close_time, self.stream_time)

    def _fresh(self) -> _Pair:
        return self.timestamp, self.owner._spec.initializer()

    def _unexpected(self, start: int) -> RuntimeError:
        return RuntimeError(
            f'sliding window store "{self.owner._store.name}": found a window starting at '
            f"{start} while processing a record at {self.timestamp}, which no sliding window "
            "aggregation writes; the store holds windows of another operation (give this "
            "aggregation its own store name)"
        )

    def in_order(self) -> None:
        t, diff = self.timestamp, self.owner._diff
        left: _Pair | None = None
        right: _Pair | None = None
        left_exists = right_exists = False
        previous: int | None = None
        for start, pair in self.owner._pairs(self.stored_key, max(0, t - 2 * diff), t + 1):
            self.starts.add(start)
            end = start + diff
            if end < t:
                left, previous = pair, pair[0]
            elif end == t:
                left_exists = True
                if pair[0] < t:
                    previous = pair[0]
                self._fold(start, pair)
            elif start <= t:
                right = pair
                self._fold(start, pair)
            elif start == t + 1:
                right_exists = True
            else:
                raise self._unexpected(start)
        # The previous record's right window, if it is missing and holds this record.
        if previous is not None:
            previous_right = previous + 1
            if previous_right not in self.starts and previous_right + diff >= t:
                self._fold(previous_right, self._fresh())
        if not left_exists:
            if previous is not None and left is not None and t - diff <= previous:
                self._fold(t - diff, (t, left[1]))
            else:
                self._fold(t - diff, self._fresh())
        self._create_right(right, right_exists)

    def early(self) -> None:
        """A record before the time difference: the windows it would open below 0 are
        the one window ``[0, d]`` (Kafka's "combined window")."""
        t = self.timestamp
        combined: _Pair | None = None
        right: _Pair | None = None
        right_exists = False
        previous: int | None = None
        for start, pair in self.owner._pairs(self.stored_key, 0, t + 1):
            self.starts.add(start)
            if start == 0:
                combined = pair
                if pair[0] < t:
                    previous = pair[0]
            elif start <= t:
                right = pair
                self._fold(start, pair)
            elif start == t + 1:
                right_exists = True
            else:
                raise self._unexpected(start)
        # Without a right window found, the combined window holds only records after
        # this one when its newest record is later (see Kafka's processEarly).
        if right is None and combined is not None and combined[0] > t:
            right = combined
        self._create_right(right, right_exists)
        if previous is not None and previous + 1 not in self.starts:
            self._fold(previous + 1, self._fresh())
        self._fold(0, combined if combined is not None else self._fresh())

    def _create_right(self, right: _Pair | None, exists: bool) -> None:
        """The record's right window: the later records' aggregate, without this record."""
        if not exists and right is not None and right[0] > self.timestamp:
            self.owner._put(self.key, self.stored_key, self.timestamp + 1, *right)


def _newest_stored_timestamp(store: WindowStore) -> int:
    """The newest record timestamp in a window store: it lies in the newest windows."""
    newest_start = store.observed_stream_time
    if newest_start < 0:
        return -1
    newest = store.fetch_all(newest_start, newest_start)
    return max((split_timestamped(value)[0] for _, _, value in newest), default=-1)
