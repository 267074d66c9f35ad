"""Suppression: ``suppress(...)`` on a KTable, and ``emit_final``'s final results.

Kafka Streams' ``KTableSuppressProcessor``: every update replaces its key's
entry in a *suppression buffer*; an entry is forwarded, once, and removed when
the node's clock reaches its *buffer time* + the wait. Two kinds of buffer time:

* ``until_window_closes`` and ``emit_final`` (``buffer_time="window-end"``): the
  window's end (plus one when ``strict``: the window is due only once the clock
  passes end + wait); the wait is the windows' grace (sessions: gap + grace). A
  None update (a session merged away) removes the entry and is never forwarded:
  a window that no longer exists has no final result.
* ``until_time_limit`` (``buffer_time="first-update"``): the timestamp of the
  key's first update still buffered; a later update replaces the value and keeps
  that time. A None update (a deleted row) is buffered and forwarded like any
  other, as Kafka does.

A bounded buffer (``max_records`` / ``max_bytes``) that an update takes over its
bound either emits its oldest entries (by buffer time, then key) until within it,
or fails the task with :class:`SuppressionBufferFullError` (Kafka's
``BufferFullStrategy.EMIT`` and ``SHUT_DOWN``). Due entries go first, as in Kafka.

The buffer is an ordinary key-value store of the task (``Suppression.store``):
its writes are in the task's transaction, go to its changelog and are
committed with the output records and input offsets. So under exactly-once a
crash rolls the buffer back together with the outputs it had produced (the
result is forwarded again, once, after the restore), and a committed eviction
(due or early) is a committed delete: it is never repeated, and what is still
buffered comes out when due. Standbys, relocation and restore see plain
key-value writes.

Layout (raw keys sort by time, so due entries and the oldest ones are one
ordered range):

    entry:  buffer time (8, big-endian) | key bytes  ->  timestamp (8) | [present (1)] | value
    clock:  0xff "stream-time"                         ->  clock (8)

Key bytes are the windowed key's (``TimeWindowedSerde`` / ``SessionWindowedSerde``)
or the table key's. The present byte (1: a value, 0: a None update) is in
``first-update`` entries only, which keep None updates; ``window-end`` entries
keep the layout they always had. An entry's size, for ``max_bytes``, is its raw
key + raw value: Kafka's ``InMemoryTimeOrderedKeyValueBuffer`` counts the buffer
time, key and value too, and also the prior value and the record context (topic,
partition, offset, headers), which eddyline does not keep.

The clock is kept in the buffer so that a restored task does not start it over
and hold back results that were already due. The processor reads the clock, the
earliest entry and (for a bounded or time-limited buffer) an index of every
entry at its first record, not in ``init``: a task initialises its processors
before it restores their stores, and a buffer restored from its changelog (its
state wiped) was empty when ``init`` ran.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.processing.operators.stores import key_value_store
from eddyline_runtime.processing.topology import Processor, ProcessorContext
from eddyline_runtime.processing.windows import (
    BufferConfig,
    BufferFull,
    SessionWindowedSerde,
    TimeWindowedSerde,
    Windowed,
)
from eddyline_runtime.serde import serde_for

_TIME: Final = struct.Struct(">q")
# Sorts after every entry: buffer times are >= 0, so their first byte is <= 0x7f.
_CLOCK_KEY: Final = b"\xffstream-time"
_NO_TIME: Final = -1
_PRESENT: Final = b"\x01"
_ABSENT: Final = b"\x00"


class SuppressionBufferFullError(EddylineError):
    """A suppression buffer configured to ``shut_down_when_full()`` went over its bound;
    the task stops (Kafka: a ``StreamsException`` from ``KTableSuppressProcessor``)."""


@dataclass(frozen=True)
class Suppression:
    """What a suppress node (``suppress`` or ``emit_final``) does; the engine runs it.

    Buffers the latest update per key in the key-value store ``store``
    (transactional and changelogged, so results survive a crash exactly once) and
    forwards an entry when the clock reaches its buffer time + ``wait_ms`` (see the
    module docstring). ``window_kind`` is "time" (windowed keys of
    ``window_size_ms``), "session", or None (plain table keys). The clock is the
    newest timestamp of the updates reaching the node (Kafka's ``suppress``), not
    the task's stream time: with a record cache, updates reach the node at a flush,
    in the order of their last write, and a clock that ran ahead of them would close
    a window before its last update arrived, then emit it a second time.
    """

    node: str
    store: str
    wait_ms: int
    strict: bool
    window_kind: str | None
    window_size_ms: int
    key_serde: str | None
    value_serde: str | None
    buffer_config: BufferConfig
    buffer_time: Literal["window-end", "first-update"] = "window-end"
    # A table forwarding changes (new, old) passes its updates through this: the new
    # value is what is buffered and emitted (None: the updates are plain values).
    new_value: Callable[[Any], Any] | None = None
    # emit_final (Kafka's EmitStrategy.onWindowClose) rather than suppress: which of
    # Kafka's node metrics it keeps (see SuppressProcessor.init).
    emit_final: bool = False
    # The aggregation above emits its final results itself (a time-windowed emit_final,
    # WindowedAggregation.emit_final): this node only passes them on and counts them.
    finals_forwarded: bool = False


class SuppressProcessor(Processor):
    def __init__(self, spec: Suppression) -> None:
        self._spec = spec
        inner = serde_for(spec.key_serde)
        self._keys: Any = (
            inner
            if spec.window_kind is None
            else SessionWindowedSerde(inner)
            if spec.window_kind == "session"
            else TimeWindowedSerde(inner, spec.window_size_ms)
        )
        self._values: Any = serde_for(spec.value_serde)
        self._by_first_update = spec.buffer_time == "first-update"
        config = spec.buffer_config
        self._record_limit = config.record_limit
        self._byte_limit = config.byte_limit
        # An index of the entries (key bytes -> buffer time, size) is kept when an
        # entry's buffer time or the buffer's size is needed: a key's first update
        # fixes its buffer time, and a bound counts entries and bytes.
        self._indexed = self._by_first_update or config.bounded
        self._index: dict[bytes, tuple[int, int]] = {}
        self._bytes = 0
        self._clock = _NO_TIME
        # The smallest buffer time held (None: the buffer is empty), so a record
        # with nothing due costs no ordered read.
        self._earliest: int | None = None
        # Whether the clock, the earliest entry and the index were read from the
        # buffer (see the module docstring: at the first record, once it is restored).
        self._loaded = False

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        # Kafka's node metrics: emit_final's are its window aggregation's
        # window-aggregate-final-emit-total/-rate and -latency-avg/-max (ms spent
        # emitting), suppress's are suppression-emit-total/-rate.
        emitted = "window-aggregate-final-emit" if self._spec.emit_final else "suppression-emit"
        self._emitted = context.node_sensor(emitted)
        self._emit_latency = (
            context.node_sensor(f"{emitted}-latency") if self._spec.emit_final else None
        )
        # Kafka's suppression-buffer-size-avg/-max (bytes) and -count-avg/-max (entries),
        # recorded after each update, for the buffers that count their entries (see
        # Suppression): an unbounded until_window_closes / emit_final buffer does not.
        self._size_sensor = (
            context.node_sensor("suppression-buffer-size") if self._indexed else None
        )
        self._count_sensor = (
            context.node_sensor("suppression-buffer-count") if self._indexed else None
        )
        self._buffer = key_value_store(context, self._spec.store)
        self._loaded = False

    def _load(self) -> None:
        stored = self._buffer.get(_CLOCK_KEY)
        self._clock = _NO_TIME if stored is None else int(_TIME.unpack(stored)[0])
        self._index.clear()
        self._bytes = 0
        if self._indexed:
            for raw, data in self._buffer.scan(KeyRange(None, _CLOCK_KEY)):
                size = len(raw) + len(data)
                self._index[raw[_TIME.size :]] = (int(_TIME.unpack_from(raw)[0]), size)
                self._bytes += size
        self._earliest = self._first_time()
        self._loaded = True

    def _first_time(self) -> int | None:
        first = next(iter(self._buffer.scan(KeyRange(None, _CLOCK_KEY))), None)
        return None if first is None else int(_TIME.unpack_from(first[0])[0])

    def process(self, key: Any, value: Any) -> None:
        if self._spec.finals_forwarded:
            self._pass_on(key, value)
            return
        if not self._loaded:
            self._load()
        context = self.context
        spec = self._spec
        if spec.new_value is not None:
            value = spec.new_value(value)
        # The updates' own clock (see Suppression): never ahead of an update in flight.
        clock = max(self._clock, context.timestamp)
        if clock != self._clock:
            self._clock = clock
            self._buffer.put(_CLOCK_KEY, _TIME.pack(clock))
        key_bytes = self._keys.serialize(key)
        if self._by_first_update:
            held = self._index.get(key_bytes)
            buffer_time = context.timestamp if held is None else held[0]
        else:
            if not isinstance(key, Windowed):
                raise TypeError(
                    f"final results (emit_final / suppress(until_window_closes)) need "
                    f"windowed keys, got {type(key).__name__} {key!r}: suppress the table "
                    "of a windowed aggregation (windowed_by(...).count(...)), or use "
                    "Suppressed.until_time_limit"
                )
            buffer_time = key.window.end + (1 if spec.strict else 0)
        raw = _TIME.pack(buffer_time) + key_bytes
        if value is None and not self._by_first_update:
            self._buffer.delete(raw)
            self._unindex(key_bytes)
        else:
            data = _TIME.pack(context.timestamp)
            if self._by_first_update:
                data += _ABSENT if value is None else _PRESENT
            if value is not None:
                data += self._values.serialize(value)
            self._buffer.put(raw, data)
            if self._indexed:
                self._unindex(key_bytes)
                size = len(raw) + len(data)
                self._index[key_bytes] = (buffer_time, size)
                self._bytes += size
            if self._earliest is None or buffer_time < self._earliest:
                self._earliest = buffer_time
        self._evict_due(clock - spec.wait_ms)
        if self._over_bound():
            self._enforce_bound()
        if self._size_sensor is not None and self._count_sensor is not None:
            self._size_sensor.record(self._bytes)
            self._count_sensor.record(len(self._index))

    def _pass_on(self, key: Any, value: Any) -> None:
        """A final result the windowed aggregation emitted (it found the closed window
        by a scan of its store, KIP-825): forwarded as it is, and counted.

        The buffer store stays declared (the topology, its stores and changelogs are
        those of earlier releases) and holds nothing. A buffer an earlier release
        filled held exactly the windows that had not closed at its last commit; the
        aggregation's store holds them too and emits them when they close, so such a
        buffer is emptied here, at the first result, after its restoration."""
        if not self._loaded:
            self._loaded = True
            for raw, _ in list(self._buffer.scan(KeyRange(None, None))):
                self._buffer.delete(raw)
        started = time.perf_counter()
        self.context.forward(key, value)
        self._emitted.record(1)
        if self._emit_latency is not None:
            self._emit_latency.record((time.perf_counter() - started) * 1000)

    def _unindex(self, key_bytes: bytes) -> None:
        held = self._index.pop(key_bytes, None)
        if held is not None:
            self._bytes -= held[1]

    def _over_bound(self) -> bool:
        return (self._record_limit is not None and len(self._index) > self._record_limit) or (
            self._byte_limit is not None and self._bytes > self._byte_limit
        )

    def _evict_due(self, expiry: int) -> None:
        """Forward and remove every entry with buffer time <= ``expiry``, oldest first."""
        if self._earliest is None or self._earliest > expiry or expiry < 0:
            return
        # Collected first: deleting while the scan is open would change what it sees.
        self._emit(list(self._buffer.scan(KeyRange(None, _TIME.pack(expiry + 1)))))

    def _enforce_bound(self) -> None:
        spec = self._spec
        if spec.buffer_config.when_full is BufferFull.SHUT_DOWN:
            raise SuppressionBufferFullError(
                f'suppress node "{spec.node}" (buffer store "{spec.store}") went over its '
                f"bound {spec.buffer_config.describe()}: it holds {len(self._index)} "
                f"records, {self._bytes} bytes. Raise the bound, choose "
                ".emit_early_when_full() (until_time_limit only), or use "
                "BufferConfig.unbounded() (the buffer is a store on disk)"
            )
        # The oldest entries, until what is left is within the bound.
        records, size = len(self._index), self._bytes
        oldest: list[tuple[bytes, bytes]] = []
        for raw, data in self._buffer.scan(KeyRange(None, _CLOCK_KEY)):
            oldest.append((raw, data))
            records -= 1
            size -= len(raw) + len(data)
            if (self._record_limit is None or records <= self._record_limit) and (
                self._byte_limit is None or size <= self._byte_limit
            ):
                break
        self._emit(oldest)

    def _emit(self, entries: list[tuple[bytes, bytes]]) -> None:
        """Remove ``entries`` (oldest first) and forward their values, each with the
        timestamp of its latest update."""
        started = time.perf_counter()
        values = self._values
        for raw, data in entries:
            self._buffer.delete(raw)
            key_bytes = raw[_TIME.size :]
            self._unindex(key_bytes)
            timestamp: int = _TIME.unpack_from(data)[0]
            if not self._by_first_update:
                value = values.deserialize(data[_TIME.size :])
            elif data[_TIME.size : _TIME.size + 1] == _PRESENT:
                value = values.deserialize(data[_TIME.size + 1 :])
            else:
                value = None
            self.context.forward(self._keys.deserialize(key_bytes), value, timestamp=timestamp)
        self._earliest = self._first_time()
        self._emitted.record(len(entries))
        if self._emit_latency is not None:
            self._emit_latency.record((time.perf_counter() - started) * 1000)
