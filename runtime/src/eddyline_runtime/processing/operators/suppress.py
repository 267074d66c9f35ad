"""Final results of windowed aggregations: ``emit_final`` and ``suppress(until_window_closes)``.

Kafka Streams' ``KTableSuppressProcessor`` with ``Suppressed.untilWindowCloses``
(and, for ``emit_final``, the window close of its ``EmitStrategy.onWindowClose``):
every update of a windowed aggregate replaces the key's entry in a *suppression
buffer*; once the clock reaches a window's end + the wait (the windows' grace;
for sessions, gap + grace), the entry is forwarded, once, and removed. A None
update (a session merged away) removes the entry and is never forwarded: a
window that no longer exists has no final result.

The buffer is an ordinary key-value store of the task (``FinalResults.store``):
its writes are in the task's transaction, go to its changelog and are
committed with the output records and input offsets. So under exactly-once a
crash rolls the buffer back together with the outputs it had produced (the
result is forwarded again, once, after the restore), and a committed eviction
is never repeated: no final result is lost or emitted twice. Standbys,
relocation and restore see plain key-value writes.

Layout (raw keys sort by time, so due entries are one ordered range):

    buffer entry:  buffer time (8, big-endian) | windowed key bytes  ->  timestamp (8) | value
    clock:         0xff "stream-time"                                ->  clock (8)

The buffer time is the window end, plus one when ``strict`` (the window is
due only once the clock passes end + wait). The clock is kept in the buffer
so that a restored task does not start it over and hold back results that
were already due. The processor reads the clock and the earliest entry at its
first record, not in ``init``: a task initialises its processors before it
restores their stores, and a buffer restored from its changelog (its state
wiped) was empty when ``init`` ran.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any, Final

from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.processing.operators.stores import key_value_store
from eddyline_runtime.processing.topology import Processor, ProcessorContext
from eddyline_runtime.processing.windows import (
    SessionWindowedSerde,
    TimeWindowedSerde,
    Windowed,
)
from eddyline_runtime.serde import serde_for

_TIME: Final = struct.Struct(">q")
# Sorts after every entry: buffer times are >= 0, so their first byte is <= 0x7f.
_CLOCK_KEY: Final = b"\xffstream-time"
_NO_TIME: Final = -1


@dataclass(frozen=True)
class FinalResults:
    """What a final-results node (``emit_final`` or ``suppress``) does; the engine runs it.

    Buffers the latest update per windowed key in the key-value store ``store``
    (transactional and changelogged, so final results survive a crash exactly
    once) and forwards a window's value when the stream time reaches its end +
    ``wait_ms`` (``strict``: passes it). ``window_kind`` is "time" (windowed keys
    of ``window_size_ms``) or "session". The clock is the newest timestamp of the
    updates reaching the node (Kafka's ``suppress``), not the task's stream time:
    with a record cache, updates reach the node at a flush, in the order of their
    last write, and a clock that ran ahead of them would close a window before
    its last update arrived, then emit it a second time.
    """

    store: str
    wait_ms: int
    strict: bool
    window_kind: str
    window_size_ms: int
    key_serde: str | None
    value_serde: str | None
    # emit_final (Kafka's EmitStrategy.onWindowClose) rather than suppress: which of
    # Kafka's node metrics it keeps (see FinalResultsProcessor.init).
    emit_final: bool = False


class FinalResultsProcessor(Processor):
    def __init__(self, spec: FinalResults) -> None:
        self._spec = spec
        inner = serde_for(spec.key_serde)
        self._keys: Any = (
            SessionWindowedSerde(inner)
            if spec.window_kind == "session"
            else TimeWindowedSerde(inner, spec.window_size_ms)
        )
        self._values: Any = serde_for(spec.value_serde)
        self._clock = _NO_TIME
        # The smallest buffer time held (None: the buffer is empty), so a record
        # with nothing due costs no ordered read.
        self._earliest: int | None = None
        # Whether the clock and the earliest entry were read from the buffer (see the
        # module docstring: at the first record, once the buffer is restored).
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
        self._buffer = key_value_store(context, self._spec.store)
        self._loaded = False

    def _load(self) -> None:
        stored = self._buffer.get(_CLOCK_KEY)
        self._clock = _NO_TIME if stored is None else int(_TIME.unpack(stored)[0])
        self._earliest = self._first_time()
        self._loaded = True

    def _first_time(self) -> int | None:
        first = next(iter(self._buffer.scan(KeyRange(None, _CLOCK_KEY))), None)
        return None if first is None else int(_TIME.unpack_from(first[0])[0])

    def process(self, key: Any, value: Any) -> None:
        if not isinstance(key, Windowed):
            raise TypeError(
                f"final results (emit_final / suppress(until_window_closes)) need windowed "
                f"keys, got {type(key).__name__} {key!r}: suppress the table of a windowed "
                "aggregation (windowed_by(...).count(...))"
            )
        if not self._loaded:
            self._load()
        context = self.context
        spec = self._spec
        # The updates' own clock (see FinalResults): never ahead of an update in flight.
        clock = max(self._clock, context.timestamp)
        if clock != self._clock:
            self._clock = clock
            self._buffer.put(_CLOCK_KEY, _TIME.pack(clock))
        buffer_time = key.window.end + (1 if spec.strict else 0)
        raw = _TIME.pack(buffer_time) + self._keys.serialize(key)
        if value is None:
            self._buffer.delete(raw)
        else:
            self._buffer.put(raw, _TIME.pack(context.timestamp) + self._values.serialize(value))
            if self._earliest is None or buffer_time < self._earliest:
                self._earliest = buffer_time
        self._evict(clock - spec.wait_ms)

    def _evict(self, expiry: int) -> None:
        """Forward and remove every entry with buffer time <= ``expiry``, oldest first."""
        if self._earliest is None or self._earliest > expiry or expiry < 0:
            return
        started = time.perf_counter()
        # Collected first: deleting while the scan is open would change what it sees.
        due = list(self._buffer.scan(KeyRange(None, _TIME.pack(expiry + 1))))
        for raw, data in due:
            self._buffer.delete(raw)
            timestamp: int = _TIME.unpack_from(data)[0]
            self.context.forward(
                self._keys.deserialize(raw[_TIME.size :]),
                self._values.deserialize(data[_TIME.size :]),
                timestamp=timestamp,
            )
        self._earliest = self._first_time()
        self._emitted.record(len(due))
        if self._emit_latency is not None:
            self._emit_latency.record((time.perf_counter() - started) * 1000)
