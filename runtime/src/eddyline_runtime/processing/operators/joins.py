"""Join processors: what ``join``/``left_join``/``outer_join`` run (Kafka Streams' semantics).

Stream-stream (``KStreamJoinWindow`` + ``KStreamKStreamJoin{Left,Right}Side``):

* each side's *buffer* node forwards a record to its join node first and then
  writes it into its window store (key, timestamp -> the records of that key at
  that timestamp, in arrival order), so a record never meets itself;
* both join nodes of a task share one stream time, the largest timestamp
  either side has seen (records dropped for a null key or value included).
  After a restart it is recovered from the two window stores (the newest
  timestamp each holds), since the shared time itself is not persisted;
* a record with a null value is dropped, logged and counted, and so is one with a
  null key on an inner side; on a left/outer side a keyless record gets its null
  join at once (KIP-962: it can never meet a partner);
* a record meets the other side's records of its key in ``[t - before, t + after]``
  (the right side: ``[t - after, t + before]``), oldest first; each result is
  ``joiner(left, right)`` timestamped with the later of the two; for a
  left/outer side, each partner found is removed from the shared store of
  non-joined records (it has a partner now);
* a left/outer record with no partner: if its window is already past (``t +
  after < stream time``) its null join goes out at once, else it waits in the
  shared store, keyed ``timestamp | side | key`` so a scan meets the oldest first;
* when a record arrives in order (its timestamp is the stream time), the shared
  store is scanned from the oldest entry and each entry whose window has closed
  (``t + after (left) or before (right) + grace < stream time``) goes out as its
  null join, timestamped with its own time, and is removed; the scan stops once
  both sides meet an open window. Kafka Streams throttles this scan to once per
  ``emit.interval`` of wall-clock time (1 s by default); eddyline scans on every
  in-order record, which is Kafka's behaviour with the interval at 0 (what its
  tests use), so results never wait for wall-clock time.

Every store is a task store: transactional, changelogged, restored and relocated
like any other, so a crash under exactly-once neither loses nor repeats a join
result. Each processor is built from its frozen description (``JoinWindowBuffer``,
``StreamStreamJoin``, ``StreamTableJoin``, ``TableTableJoin``) by the supplier
the DSL attaches to its node, and reaches its stores through the interfaces of
:mod:`~eddyline_runtime.processing.operators.stores` (a table-table side's rows
through ``TimestampedKeyValueStore``: each row with its update's timestamp).
"""

from __future__ import annotations

import logging
import struct
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.processing.joins import JoinWindows, ValueJoiner
from eddyline_runtime.processing.operators.stores import (
    KeyValueStore,
    TimestampedKeyValueStore,
    WindowStore,
    is_versioned,
    key_value_store,
    versioned_store,
    window_store,
)
from eddyline_runtime.processing.operators.tables import TableChange, as_change
from eddyline_runtime.processing.topology import Processor, ProcessorContext
from eddyline_runtime.serde import serde_for

logger = logging.getLogger(__name__)

_TIME: Final = struct.Struct(">q")
_LEFT, _RIGHT = b"\x01", b"\x00"  # Kafka's join-side byte: right sorts before left
_SHARED_PREFIX = _TIME.size + 1
_UNKNOWN = -1
# The shared store is empty: no scan until a record goes into it.
_NOTHING_WAITS = 1 << 62


_LENGTH: Final = struct.Struct(">I")


def join_store_names(
    store_name: str, *, left_outer: bool, right_outer: bool
) -> tuple[str, str, str]:
    """The left window store, the right one and the shared store of non-joined records,
    named from the user's ``store_name`` as Kafka Streams names them
    (``StreamJoined.withStoreName``)."""
    this = f"{store_name}{'-outer-this-join' if right_outer else '-this-join'}-store"
    other = f"{store_name}{'-outer-other-join' if left_outer else '-other-join'}-store"
    shared = f"{store_name}{'-outer-shared-join' if right_outer else '-left-shared-join'}-store"
    return this, other, shared


def pack_values(values: Iterable[bytes]) -> bytes:
    """Several values under one store key (records of one key at one timestamp, kept
    in arrival order, as Kafka's duplicate-retaining window store keeps them)."""
    return b"".join(_LENGTH.pack(len(value)) + value for value in values)


def unpack_values(data: bytes) -> list[bytes]:
    values, offset = [], 0
    while offset < len(data):
        (size,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        values.append(data[offset : offset + size])
        offset += size
    return values


@dataclass(frozen=True)
class JoinWindowBuffer:
    """A side's buffer node (Kafka's ``KStreamJoinWindow``): forwards each record to the
    side's join node, then keeps it in the side's window store."""

    store: str
    windows: JoinWindows
    key_serde: str | None
    value_serde: str | None


@dataclass(frozen=True)
class StreamStreamJoin:
    """One side of a windowed stream-stream join (Kafka's ``KStreamKStreamJoin*Side``).

    ``left`` says which side this node joins for; ``outer`` whether its records
    without a partner produce a null join; ``shared_store`` holds those until their
    window closes (None for inner joins). ``time_key`` names the store both sides
    share a stream time through (the left window store).
    """

    left: bool
    this_store: str
    other_store: str
    shared_store: str | None
    time_key: str
    windows: JoinWindows
    joiner: ValueJoiner
    outer: bool
    key_serde: str | None
    left_value_serde: str | None
    right_value_serde: str | None


@dataclass(frozen=True)
class StreamTableJoin:
    """A KStream-KTable join node: reads the table's store (``KStreamKTableJoin``)."""

    table_store: str
    joiner: ValueJoiner
    left: bool
    key_serde: str | None
    table_value_serde: str | None


@dataclass(frozen=True)
class GlobalTableJoin:
    """A KStream-GlobalKTable join node (``KStreamGlobalKTableJoin``): each record looks
    the global table up by ``key_mapper(key, value)``, not by its own key."""

    global_store: str
    key_mapper: Callable[[Any, Any], Any]
    joiner: ValueJoiner
    left: bool
    table_key_serde: str | None
    table_value_serde: str | None


@dataclass(frozen=True)
class TableTableJoin:
    """One side of a KTable-KTable join: reads the other table's store on each update.

    ``kind`` is Kafka's processor for the side: ``inner`` (both sides of an inner
    join), ``left`` (this side survives without a partner: the left side of a left
    join), ``right`` (the other side does: the right side of a left join) or
    ``outer`` (both sides of an outer join).
    """

    left: bool
    other_store: str
    joiner: ValueJoiner
    kind: str
    key_serde: str | None
    other_value_serde: str | None
    send_old_values: Callable[[], bool]


def _skip(context: ProcessorContext, what: str, dropped: Callable[[], None]) -> None:
    logger.warning(
        "Skipping record due to null %s. topic=[%s] partition=[%d] offset=[%d]",
        what,
        context.topic,
        context.partition,
        context.offset,
    )
    dropped()


@dataclass
class _TimeTracker:
    """The stream time both sides of one join in one task share (Kafka's ``TimeTracker``)."""

    stream_time: int = _UNKNOWN
    # The oldest timestamp the shared store may hold; None: not known (a new task
    # over a restored store), so the next in-order record scans.
    min_time: int | None = None


# One tracker per join per task: keyed by the task's left window store object,
# which both join nodes of a task reach and no other task has.
_TRACKERS: weakref.WeakKeyDictionary[WindowStore, _TimeTracker] = weakref.WeakKeyDictionary()


class JoinWindowBufferProcessor(Processor):
    def __init__(self, spec: JoinWindowBuffer) -> None:
        self._spec = spec
        self._keys: Any = serde_for(spec.key_serde)
        self._values: Any = serde_for(spec.value_serde)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store = window_store(context, self._spec.store)

    def process(self, key: Any, value: Any) -> None:
        context = self.context
        context.forward(key, value)
        if key is None or value is None:
            # Nothing can join it: not kept (Kafka's duplicate-retaining window store
            # skips a null value's put, and a null key is never written).
            return
        stored_key = self._keys.serialize(key)
        timestamp = context.timestamp
        data = self._values.serialize(value)
        present = self._store.fetch(stored_key, timestamp)
        packed = pack_values([data]) if present is None else present + pack_values([data])
        self._store.put(stored_key, timestamp, packed)


class StreamStreamJoinProcessor(Processor):
    _shared: KeyValueStore | None

    def __init__(self, spec: StreamStreamJoin) -> None:
        self._spec = spec
        windows = spec.windows
        # Seen from this side: how far back and ahead the other side's records may be.
        self._before = windows.before_ms if spec.left else windows.after_ms
        self._after = windows.after_ms if spec.left else windows.before_ms
        self._grace = windows.grace_ms
        self._keys: Any = serde_for(spec.key_serde)
        self._left_values: Any = serde_for(spec.left_value_serde)
        self._right_values: Any = serde_for(spec.right_value_serde)
        self._this_values = self._left_values if spec.left else self._right_values
        self._other_values = self._right_values if spec.left else self._left_values
        self._side = _LEFT if spec.left else _RIGHT
        self._other_side = _RIGHT if spec.left else _LEFT

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        spec = self._spec
        self._other = window_store(context, spec.other_store)
        self._this_window = window_store(context, spec.this_store)
        self._shared = (
            None if spec.shared_store is None else key_value_store(context, spec.shared_store)
        )
        self._dropped = context.record_dropped
        time_key = window_store(context, spec.time_key)
        tracker = _TRACKERS.get(time_key)
        if tracker is None:
            tracker = _TRACKERS[time_key] = _TimeTracker()
        self._tracker = tracker

    def _join(self, this: Any, other: Any) -> Any:
        if self._spec.left:
            return self._spec.joiner(this, other)
        return self._spec.joiner(other, this)

    def process(self, key: Any, value: Any) -> None:
        context, tracker = self.context, self._tracker
        timestamp = context.timestamp
        if tracker.stream_time == _UNKNOWN:
            # A new task: the stores hold the newest times each side buffered.
            tracker.stream_time = max(
                self._other.observed_stream_time, self._this_window.observed_stream_time
            )
        tracker.stream_time = max(tracker.stream_time, timestamp)
        if key is None and value is not None and self._spec.outer:
            # KIP-962: a left/outer side keeps a record without a key; it can never
            # meet a partner, so its null join goes out at once.
            context.forward(key, self._join(value, None))
            return
        if key is None or value is None:
            _skip(context, "key or value", self._dropped)
            return
        if self._shared is not None and timestamp == tracker.stream_time:
            self._emit_closed()
        stored_key = self._keys.serialize(key)
        found = False
        for other_time, packed in self._other.fetch_range(
            stored_key, max(0, timestamp - self._before), max(0, timestamp + self._after)
        ):
            found = True
            if self._shared is not None:
                # The partner has a partner now: it never gets a null join.
                self._shared.delete(self._shared_key(self._other_side, other_time, stored_key))
            for data in unpack_values(packed):
                context.forward(
                    key,
                    self._join(value, self._other_values.deserialize(data)),
                    timestamp=max(timestamp, other_time),
                )
        if found or not self._spec.outer:
            return
        if self._shared is None or timestamp + self._after < tracker.stream_time:
            # Its window is already past: no partner can come any more.
            context.forward(key, self._join(value, None))
            return
        tracker.min_time = (
            timestamp if tracker.min_time is None else min(tracker.min_time, timestamp)
        )
        shared_key = self._shared_key(self._side, timestamp, stored_key)
        present = self._shared.get(shared_key)
        data = pack_values([self._this_values.serialize(value)])
        self._shared.put(shared_key, data if present is None else present + data)

    @staticmethod
    def _shared_key(side: bytes, timestamp: int, stored_key: bytes) -> bytes:
        return _TIME.pack(timestamp) + side + stored_key

    def _emit_closed(self) -> None:
        """Null joins for the shared store's records whose window has closed, oldest first."""
        tracker, shared, grace = self._tracker, self._shared, self._grace
        assert shared is not None
        windows = self._spec.windows
        if (
            tracker.min_time is not None
            and tracker.min_time + self._after + grace >= tracker.stream_time
        ):
            return  # nothing in the store can have closed yet
        tracker.min_time = _NOTHING_WAITS  # stays so if the store is empty
        open_left = open_right = False
        emitted: list[bytes] = []
        for raw, packed in shared.scan(KeyRange()):
            timestamp = _TIME.unpack_from(raw)[0]
            tracker.min_time = timestamp
            if open_left and open_right:
                break
            left = raw[_TIME.size : _SHARED_PREFIX] == _LEFT
            look_back = windows.after_ms if left else windows.before_ms
            if timestamp + look_back + grace >= tracker.stream_time:
                if left:
                    open_left = True
                else:
                    open_right = True
                continue
            key = self._keys.deserialize(raw[_SHARED_PREFIX:])
            for data in unpack_values(packed):
                if left:
                    result = self._spec.joiner(self._left_values.deserialize(data), None)
                else:
                    result = self._spec.joiner(None, self._right_values.deserialize(data))
                self.context.forward(key, result, timestamp=timestamp)
            emitted.append(raw)
        for raw in emitted:
            shared.delete(raw)


class StreamTableJoinProcessor(Processor):
    def __init__(self, spec: StreamTableJoin) -> None:
        self._spec = spec
        self._keys: Any = serde_for(spec.key_serde)
        self._values: Any = serde_for(spec.table_value_serde)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        # A versioned table joins each record with the table as of the record's time
        # (KIP-914); otherwise with the table as it is now.
        self._versioned = (
            versioned_store(context, self._spec.table_store)
            if is_versioned(context, self._spec.table_store)
            else None
        )
        if self._versioned is None:
            self._table = key_value_store(context, self._spec.table_store)
        self._dropped = context.record_dropped

    def process(self, key: Any, value: Any) -> None:
        spec, context = self._spec, self.context
        if spec.left and key is None and value is not None:
            context.forward(key, spec.joiner(value, None))
            return
        if key is None or value is None:
            _skip(context, "join key or value", self._dropped)
            return
        stored = self._table_value(self._keys.serialize(key), context.timestamp)
        if stored is None and not spec.left:
            return
        table_value = None if stored is None else self._values.deserialize(stored)
        context.forward(key, spec.joiner(value, table_value))

    def _table_value(self, stored_key: bytes, timestamp: int) -> bytes | None:
        if self._versioned is None:
            return self._table.get(stored_key)
        # Older than the table's history retention: no version (None), as Kafka.
        record = self._versioned.get(stored_key, timestamp)
        return None if record is None else record.value


class GlobalTableJoinProcessor(Processor):
    """Kafka's ``KStreamKTableJoinProcessor`` over a GlobalKTable's value getter.

    The record's value and the key mapper's result decide: a null value is
    dropped (logged and counted) by both joins; a null mapped key or a key the
    global table does not hold gives no result for an inner join and
    ``joiner(value, None)`` for a left join. A result keeps the stream record's
    key and timestamp. The stream's own key is never used for the look-up, so
    a keyless record joins like any other.
    """

    def __init__(self, spec: GlobalTableJoin) -> None:
        self._spec = spec
        self._keys: Any = serde_for(spec.table_key_serde)
        self._values: Any = serde_for(spec.table_value_serde)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._table = key_value_store(context, self._spec.global_store)
        self._dropped = context.record_dropped

    def process(self, key: Any, value: Any) -> None:
        spec, context = self._spec, self.context
        if value is None:
            _skip(context, "join value", self._dropped)
            return
        mapped = spec.key_mapper(key, value)
        if mapped is None:
            if spec.left:
                context.forward(key, spec.joiner(value, None))
            else:
                _skip(context, "mapped join key", self._dropped)
            return
        stored = self._table.get(self._keys.serialize(mapped))
        if stored is None:
            if spec.left:
                context.forward(key, spec.joiner(value, None))
            return
        context.forward(key, spec.joiner(value, self._values.deserialize(stored)))


class TableTableJoinProcessor(Processor):
    """One side of a KTable-KTable join (Kafka's ``KTableKTable{Inner,Left,Right,Outer}Join``).

    Each side keeps its table in its own store (timestamped values), written by
    the side's materializing node before this one runs; this node reads the
    other side's store.
    """

    def __init__(self, spec: TableTableJoin) -> None:
        self._spec = spec
        self._keys: Any = serde_for(spec.key_serde)
        self._other_values: Any = serde_for(spec.other_value_serde)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._other = TimestampedKeyValueStore(key_value_store(context, self._spec.other_store))
        self._dropped = context.record_dropped

    def _join(self, this: Any, other: Any) -> Any:
        if self._spec.left:
            return self._spec.joiner(this, other)
        return self._spec.joiner(other, this)

    def process(self, key: Any, value: Any) -> None:
        spec, context = self._spec, self.context
        if key is None:
            _skip(context, "key", self._dropped)
            return
        change = as_change(value)
        stored = self._other.get(self._keys.serialize(key))
        if stored is None:
            other_time, other = _UNKNOWN, None
        else:
            other_time, data = stored
            other = self._other_values.deserialize(data)
        kind, send_old = spec.kind, spec.send_old_values()
        if other is None:
            if kind in ("inner", "right"):
                return  # no partner, and this side does not survive alone
            if change.new is None and change.old is None:
                return
        timestamp = max(context.timestamp, other_time)
        new = old = None
        # Kafka's KTableKTable{Inner,Left,Right,Outer}Join, case by case.
        if kind == "right":
            new = self._join(change.new, other)
            if send_old:
                old = self._join(change.old, other)
        elif kind == "outer":
            if other is not None or change.new is not None:
                new = self._join(change.new, other)
            if send_old and (other is not None or change.old is not None):
                old = self._join(change.old, other)
        else:
            if change.new is not None:
                new = self._join(change.new, other)
            if send_old and change.old is not None:
                old = self._join(change.old, other)
        context.forward(key, TableChange(new, old), timestamp=timestamp)


class JoinSideStoreProcessor(Processor):
    """A table-table join side's own copy of its table (timestamped values): written
    before the side's join node runs, read by the other side's; forwards the change
    with the old value it replaced."""

    def __init__(self, store: str, keys: Any, values: Any) -> None:
        self._store_name, self._keys, self._values = store, keys, values

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store = TimestampedKeyValueStore(key_value_store(context, self._store_name))

    def process(self, key: Any, value: Any) -> None:
        if key is None:
            self.context.forward(key, value)  # the join node logs and counts it
            return
        new = as_change(value).new
        stored_key = self._keys.serialize(key)
        stored = self._store.get(stored_key)
        old = None if stored is None else self._values.deserialize(stored[1])
        if new is None:
            self._store.delete(stored_key)
        else:
            self._store.put(stored_key, self._values.serialize(new), self.context.timestamp)
        self.context.forward(key, TableChange(new, old))
