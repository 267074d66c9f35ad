"""Windows as topology authors see them: time and session windows, ``Windowed`` keys, serdes.

Semantics are Kafka Streams' (``TimeWindows``, ``SessionWindows``, ``Windowed``):

* a window is ``[start, end)``: start inclusive, end exclusive, ``end = start + size``;
* windows are aligned to the epoch: starts are multiples of the advance, and
  never negative; tumbling windows advance by their size, hopping ones by less,
  so a record falls in ``size / advance`` windows;
* a window *closes* once the task's stream time reaches ``end + grace``; a
  record for a closed window is dropped, counted in the task's
  ``dropped-records-total`` metric, and logged with the reason.

Session windows (``SessionWindows``) have no fixed size: a record starts a
session ``[t, t]`` (both ends inclusive) and merges with every session of its
key that ends at or after ``t - gap`` and starts at or before ``t + gap``; the
merged sessions' entries are removed (and their removal forwarded as a None
value) and the merged session is written. A session closes once stream time
passes its end + grace.

A windowed aggregation keeps its windows in a *window store* or *session
store*; processors reach them through the
:class:`~eddyline_runtime.processing.operators.stores.WindowStore` and
:class:`~eddyline_runtime.processing.operators.stores.SessionStore` interfaces
(what ``context.get_state_store`` returns), which the engine implements on its
transactional stores. The aggregations themselves are in
:mod:`~eddyline_runtime.processing.operators.windowed`.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, replace
from typing import Final, Generic, TypeVar

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.processing.topology import TopologyError
from eddyline_runtime.serde import Serde, SerdeError, register_wrapped_serde, serde_for

K = TypeVar("K")

_TIMESTAMP: Final = struct.Struct(">q")


@dataclass(frozen=True, slots=True, order=True)
class TimeWindow:
    """``[start, end)`` in milliseconds."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise TopologyError(f"a window cannot end ({self.end}) before it starts ({self.start})")


@dataclass(frozen=True, slots=True)
class Windowed(Generic[K]):
    """A key together with the window its aggregate belongs to."""

    key: K
    window: TimeWindow | SessionWindow

    def __str__(self) -> str:
        # Kafka Streams' Windowed.toString, so ported apps print the same keys.
        return f"[{self.key}@{self.window.start}/{self.window.end}]"


@dataclass(frozen=True, slots=True)
class TimeWindows:
    """Tumbling (advance = size) or hopping (advance < size) windows, with a grace period."""

    size_ms: int
    advance_ms: int
    grace_ms: int

    @classmethod
    def of_size_with_grace(cls, size_ms: int, grace_ms: int) -> TimeWindows:
        """Tumbling windows of ``size_ms`` accepting records up to ``grace_ms`` late."""
        windows = cls(size_ms, size_ms, grace_ms)
        windows._check()
        return windows

    @classmethod
    def of_size_without_grace(cls, size_ms: int) -> TimeWindows:
        """Tumbling windows that close at their end (Kafka's ``ofSizeWithNoGrace``)."""
        return cls.of_size_with_grace(size_ms, 0)

    def advance_by(self, advance_ms: int) -> TimeWindows:
        """Hopping windows: a new window every ``advance_ms`` (0 < advance <= size)."""
        windows = TimeWindows(self.size_ms, advance_ms, self.grace_ms)
        windows._check()
        return windows

    def _check(self) -> None:
        for what, value in (("size", self.size_ms), ("advance", self.advance_ms)):
            if type(value) is not int or value <= 0:
                raise TopologyError(
                    f"TimeWindows: the window {what} must be a whole number of milliseconds "
                    f"> 0, got {value!r}"
                )
        if self.advance_ms > self.size_ms:
            raise TopologyError(
                f"TimeWindows: the advance ({self.advance_ms} ms) cannot exceed the window size "
                f"({self.size_ms} ms): records between windows would fall in none"
            )
        if type(self.grace_ms) is not int or self.grace_ms < 0:
            raise TopologyError(
                f"TimeWindows: the grace period must be a whole number of milliseconds >= 0, "
                f"got {self.grace_ms!r}"
            )

    def windows_for(self, timestamp: int) -> list[TimeWindow]:
        """The windows ``timestamp`` falls in, oldest first (Kafka's ``windowsFor``)."""
        first = max(0, timestamp - self.size_ms + self.advance_ms) // self.advance_ms
        start = first * self.advance_ms
        found = []
        while start <= timestamp:
            found.append(TimeWindow(start, start + self.size_ms))
            start += self.advance_ms
        return found

    @property
    def retention_ms(self) -> int:
        """How long the window store keeps a window: size + grace (Kafka's minimum)."""
        return self.size_ms + self.grace_ms


class TimeWindowedSerde(Generic[K]):
    """``Windowed`` keys as bytes: the inner key's bytes, then the window start as an
    8-byte big-endian long (Kafka's ``TimeWindowedSerializer``); the end is start + size."""

    def __init__(self, inner: Serde[K], window_size_ms: int) -> None:
        self._inner = inner
        self._size = window_size_ms

    def serialize(self, value: Windowed[K] | None) -> bytes | None:
        if value is None:
            return None
        key = self._inner.serialize(value.key)
        if key is None:
            raise SerdeError(f"windowed key {value}: its key serialized to None")
        return key + _TIMESTAMP.pack(value.window.start)

    def deserialize(self, data: bytes | None) -> Windowed[K] | None:
        if data is None:
            return None
        if len(data) < _TIMESTAMP.size:
            raise SerdeError(
                f"bytes {data[:32]!r} are too short for a windowed key (key + 8-byte start)"
            )
        start: int = _TIMESTAMP.unpack_from(data, len(data) - _TIMESTAMP.size)[0]
        key = self._inner.deserialize(data[: -_TIMESTAMP.size])
        return Windowed(key, TimeWindow(start, start + self._size))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, order=True)
class SessionWindow:
    """A session ``[start, end]``: both ends inclusive (the first and last record's times)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise TopologyError(
                f"a session cannot end ({self.end}) before it starts ({self.start})"
            )


@dataclass(frozen=True, slots=True)
class SessionWindows:
    """Sessions of activity separated by at least ``gap_ms`` of inactivity."""

    gap_ms: int
    grace_ms: int

    @classmethod
    def of_inactivity_gap_with_grace(cls, gap_ms: int, grace_ms: int) -> SessionWindows:
        for what, value, least in (("inactivity gap", gap_ms, 1), ("grace period", grace_ms, 0)):
            if type(value) is not int or value < least:
                raise TopologyError(
                    f"SessionWindows: the {what} must be a whole number of milliseconds >= "
                    f"{least}, got {value!r}"
                )
        return cls(gap_ms, grace_ms)

    @classmethod
    def of_inactivity_gap_without_grace(cls, gap_ms: int) -> SessionWindows:
        return cls.of_inactivity_gap_with_grace(gap_ms, 0)

    @property
    def retention_ms(self) -> int:
        """How long the session store keeps a session after its end: gap + grace."""
        return self.gap_ms + self.grace_ms


class SessionWindowedSerde(Generic[K]):
    """Session-``Windowed`` keys as bytes: the inner key's bytes, then the session end and
    start as 8-byte big-endian longs (Kafka's ``SessionWindowedSerializer``)."""

    def __init__(self, inner: Serde[K]) -> None:
        self._inner = inner

    def serialize(self, value: Windowed[K] | None) -> bytes | None:
        if value is None:
            return None
        key = self._inner.serialize(value.key)
        if key is None:
            raise SerdeError(f"windowed key {value}: its key serialized to None")
        return key + _TIMESTAMP.pack(value.window.end) + _TIMESTAMP.pack(value.window.start)

    def deserialize(self, data: bytes | None) -> Windowed[K] | None:
        if data is None:
            return None
        size = 2 * _TIMESTAMP.size
        if len(data) < size:
            raise SerdeError(
                f"bytes {data[:32]!r} are too short for a session key (key + end + start)"
            )
        end: int = _TIMESTAMP.unpack_from(data, len(data) - size)[0]
        start: int = _TIMESTAMP.unpack_from(data, len(data) - _TIMESTAMP.size)[0]
        key = self._inner.deserialize(data[:-size])
        return Windowed(key, SessionWindow(start, end))  # type: ignore[arg-type]


class WindowedSerdes:
    """Kafka's ``WindowedSerdes``: names of the serdes for windowed keys, for ``to()``,
    ``builder.stream()`` and stores (``key_serde=WindowedSerdes.time_windowed_serde_from(
    "string", 60_000)``). Their bytes are Kafka's ``TimeWindowedSerializer``'s and
    ``SessionWindowedSerializer``'s, so Kafka Streams' deserializers read what
    eddyline writes and the other way round. A time-windowed key carries its window's
    start only: reading one back needs the window size (its end is start + size)."""

    @staticmethod
    def time_windowed_serde_from(inner: str, window_size_ms: int) -> str:
        """The serde name for ``Windowed`` keys of windows of ``window_size_ms``, inner
        keys with the serde named ``inner``: ``time-windowed(<inner>,<size>)``."""
        name = f"time-windowed({inner},{window_size_ms})"
        serde_for(name, key="key_serde")  # refused here, where the author wrote it
        return name

    @staticmethod
    def session_windowed_serde_from(inner: str) -> str:
        """The serde name for session-``Windowed`` keys: ``session-windowed(<inner>)``."""
        name = f"session-windowed({inner})"
        serde_for(name, key="key_serde")
        return name


def _time_windowed(arguments: str, key: str) -> TimeWindowedSerde[object]:
    inner, _, size = arguments.rpartition(",")
    if not inner or not size.strip().isdigit() or int(size) <= 0:
        raise ConfigError(
            key,
            f"time-windowed({arguments})",
            "time-windowed(<key serde>,<window size in ms, > 0>)",
            hint='WindowedSerdes.time_windowed_serde_from("string", 60000) writes one',
        )
    return TimeWindowedSerde(serde_for(inner.strip(), key=key), int(size))


def _session_windowed(arguments: str, key: str) -> SessionWindowedSerde[object]:
    return SessionWindowedSerde(serde_for(arguments.strip(), key=key))


register_wrapped_serde("time-windowed", _time_windowed)
register_wrapped_serde("session-windowed", _session_windowed)


@dataclass(frozen=True, slots=True)
class SlidingWindows:
    """Sliding windows (Kafka Streams' ``SlidingWindows``): windows of ``time_difference_ms``
    defined by the records themselves, both ends inclusive.

    Two records fall in one window when their timestamps differ by at most the
    time difference. Each record creates its *left* window ``[t - d, t]`` and,
    when a later record of its key falls within ``d``, its *right* window
    ``[t + 1, t + 1 + d]``; a window exists only while it holds a record, so
    a count never sees an empty window. Windows are keyed ``Windowed(key,
    TimeWindow(start, start + d))``. Records before ``d`` (whose left window
    would start below 0) share the window ``[0, d]``, as in Kafka Streams.
    """

    time_difference_ms: int
    grace_ms: int

    @classmethod
    def of_time_difference_and_grace(cls, time_difference_ms: int, grace_ms: int) -> SlidingWindows:
        for what, value in (("time difference", time_difference_ms), ("grace period", grace_ms)):
            if type(value) is not int or value < 0:
                raise TopologyError(
                    f"SlidingWindows: the {what} must be a whole number of milliseconds >= 0, "
                    f"got {value!r}"
                )
        return cls(time_difference_ms, grace_ms)

    @classmethod
    def of_time_difference_without_grace(cls, time_difference_ms: int) -> SlidingWindows:
        return cls.of_time_difference_and_grace(time_difference_ms, 0)

    @property
    def size_ms(self) -> int:
        """A window's span from start to end (both inclusive): the time difference."""
        return self.time_difference_ms

    @property
    def retention_ms(self) -> int:
        """Two time differences + grace (Kafka's minimum for sliding windows): a record
        looks back at the windows up to ``2 * d`` before it to build its own."""
        return 2 * self.time_difference_ms + self.grace_ms


class BufferFull(enum.StrEnum):
    """What a bounded suppression buffer does when an update takes it over its bound:
    Kafka's ``BufferFullStrategy`` (``EMIT`` and ``SHUT_DOWN``)."""

    EMIT_EARLY = "emit_early"
    SHUT_DOWN = "shut_down"


def _bound(what: str, value: int) -> int:
    if type(value) is not int or value < 0:
        raise TopologyError(
            f"BufferConfig: {what} must be a whole number >= 0, got {value!r}; for no "
            "bound use BufferConfig.unbounded()"
        )
    return value


@dataclass(frozen=True, slots=True)
class BufferConfig:
    """How much a suppression buffer may hold: Kafka's ``Suppressed.BufferConfig``.

    ``record_limit`` and ``byte_limit`` (None: no bound) bound the entries and their
    bytes (see ``docs/windows.md`` for what is counted); ``when_full`` says what an
    update that takes the buffer over a bound does. As in Kafka, a bound given on its
    own emits early (``max_records``, ``max_bytes``: an *eager* config) and
    ``unbounded()`` is *strict* (it can never be full). ``until_window_closes`` takes
    strict configs only, since a window emitted early is not final.

    Kafka's names: ``maxRecords`` -> ``max_records``, ``maxBytes`` -> ``max_bytes``,
    ``withMaxRecords`` / ``withMaxBytes`` / ``withNoBound`` -> ``with_max_records`` /
    ``with_max_bytes`` / ``with_no_bound``, ``emitEarlyWhenFull`` /
    ``shutDownWhenFull`` -> ``emit_early_when_full`` / ``shut_down_when_full``.
    """

    record_limit: int | None = None
    byte_limit: int | None = None
    when_full: BufferFull = BufferFull.SHUT_DOWN

    @classmethod
    def max_records(cls, records: int) -> BufferConfig:
        """At most ``records`` keys buffered; the oldest are emitted early beyond it."""
        return cls(_bound("max_records", records), None, BufferFull.EMIT_EARLY)

    @classmethod
    def max_bytes(cls, size: int) -> BufferConfig:
        """At most ``size`` bytes buffered; the oldest are emitted early beyond it."""
        return cls(None, _bound("max_bytes", size), BufferFull.EMIT_EARLY)

    @classmethod
    def unbounded(cls) -> BufferConfig:
        """No bound (the buffer is a store on disk, so it is bounded by the disk)."""
        return cls()

    def with_max_records(self, records: int) -> BufferConfig:
        return replace(self, record_limit=_bound("max_records", records))

    def with_max_bytes(self, size: int) -> BufferConfig:
        return replace(self, byte_limit=_bound("max_bytes", size))

    def with_no_bound(self) -> BufferConfig:
        """Kafka's ``withNoBound``: unbounded, hence strict."""
        return BufferConfig()

    def emit_early_when_full(self) -> BufferConfig:
        """Over a bound, emit the oldest entries (by buffer time) until within it."""
        return replace(self, when_full=BufferFull.EMIT_EARLY)

    def shut_down_when_full(self) -> BufferConfig:
        """Over a bound, fail the task (``SuppressionBufferFullError``)."""
        return replace(self, when_full=BufferFull.SHUT_DOWN)

    @property
    def bounded(self) -> bool:
        return self.record_limit is not None or self.byte_limit is not None

    @property
    def strict(self) -> bool:
        """Never emits before its time (Kafka's ``StrictBufferConfig``)."""
        return not self.bounded or self.when_full is BufferFull.SHUT_DOWN

    def describe(self) -> str:
        """The config as the DSL writes it, for error messages."""
        if not self.bounded:
            return "BufferConfig.unbounded()"
        bounds = [
            f"{what}({limit})"
            for what, limit in (("max_records", self.record_limit), ("max_bytes", self.byte_limit))
            if limit is not None
        ]
        text = "BufferConfig." + ".with_".join(bounds)
        return f"{text}.{self.when_full.value}_when_full()"


@dataclass(frozen=True, slots=True)
class Suppressed:
    """``KTable.suppress`` configuration: Kafka Streams' ``Suppressed``.

    ``time_to_wait_ms`` None: until the window closes (``until_window_closes``);
    else until that much stream time has passed since the key's first buffered
    update (``until_time_limit``). ``name`` names the suppression buffer's store
    (and changelog); without it the buffer is named after the table's store, which
    is stable too (a table without a store needs the name).
    """

    name: str | None = None
    time_to_wait_ms: int | None = None
    buffer_config: BufferConfig = BufferConfig()

    @classmethod
    def until_window_closes(
        cls, buffer_config: BufferConfig | None = None, *, name: str | None = None
    ) -> Suppressed:
        """One result per window: its final value, once stream time passes its end + grace.
        ``buffer_config`` must be strict: unbounded, or bounded with
        ``shut_down_when_full()`` (Kafka's ``untilWindowCloses(StrictBufferConfig)``)."""
        config = BufferConfig() if buffer_config is None else buffer_config
        if not isinstance(config, BufferConfig):
            raise TopologyError(
                f"Suppressed.until_window_closes takes a BufferConfig, got {config!r}; "
                "name the buffer with name=..."
            )
        if not config.strict:
            raise TopologyError(
                f"Suppressed.until_window_closes takes a strict buffer config, got "
                f"{config.describe()}: a window emitted early would not be its final "
                "result. Add .shut_down_when_full(), use BufferConfig.unbounded(), or use "
                "Suppressed.until_time_limit to emit early"
            )
        return cls(name, None, config)

    @classmethod
    def until_time_limit(
        cls, time_to_wait_ms: int, buffer_config: BufferConfig, *, name: str | None = None
    ) -> Suppressed:
        """Each key's latest update, once ``time_to_wait_ms`` of stream time has passed
        since the key's first update still buffered (Kafka's ``untilTimeLimit``)."""
        if type(time_to_wait_ms) is not int or time_to_wait_ms < 0:
            raise TopologyError(
                "Suppressed.until_time_limit: the time to wait must be a whole number of "
                f"milliseconds >= 0, got {time_to_wait_ms!r}"
            )
        if not isinstance(buffer_config, BufferConfig):
            raise TopologyError(
                f"Suppressed.until_time_limit takes a BufferConfig, got {buffer_config!r}: "
                "BufferConfig.max_records(n), .max_bytes(n) or .unbounded()"
            )
        return cls(name, time_to_wait_ms, buffer_config)
