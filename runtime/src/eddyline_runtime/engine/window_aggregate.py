"""Windowed aggregation processors: what ``windowed_by(...).count/reduce/aggregate`` runs.

Time windows: Kafka Streams' ``KStreamWindowAggregate``, record by record:

* a record with a null key is dropped (logged, counted in ``dropped-records-total``);
* stream time is never behind what the store already holds: a new task's stream
  time starts over (Kafka restores it from commit metadata, eddyline does not
  yet), so at its first record the processor recovers the newest record
  timestamp folded into the store's newest windows, and a window that closed
  before a restart stays closed;
* for each window the record falls in (``TimeWindows.windows_for``), the window
  is *closed* when its end is at or before ``stream time - grace``, where
  stream time is the task's (the largest timestamp it has processed, this
  record included). A record for a closed window is dropped for that window,
  counted once per window, and logged with the reason; open windows fold it in;
* each window's value is timestamped with the newest record folded in, and a
  result carries that timestamp downstream;
* results go downstream keyed by ``Windowed(key, window)``: on every update
  without a record cache, once per window per flush with one (KIP-63), as
  key-value aggregations do. Deletes a cache flushes (expired segments being
  dropped) are not results and are not forwarded.

Session windows: Kafka Streams' ``KStreamSessionWindowAggregate``: a record at
``t`` starts the session ``[t, t]``, merges (``merger``) every session of its
key ending at or after ``t - gap`` and starting at or before ``t + gap``, and
is dropped when the merged session ends before ``stream time - grace``. Unless
the merged session is just ``[t, t]``, each merged session is removed and its
removal forwarded (a None value, timestamped with its end); the merged session
is then written and forwarded, timestamped with its end. The stream time is
never behind the newest session end in the store.

The processors reach their stores through the
:class:`~eddyline_runtime.processing.windows.WindowStore` protocol; the task
gives it a :class:`~eddyline_runtime.state.WindowStore` over the task store
(record cache, changelog, transactional RocksDB store).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from eddyline_runtime.engine.join_processors import build_join_operator
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.processing.topology import Change, Processor, ProcessorContext
from eddyline_runtime.processing.windows import (
    SessionStore,
    SessionWindow,
    SessionWindowedAggregation,
    TimeWindow,
    Windowed,
    WindowedAggregation,
    WindowStore,
)
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state.window_layout import (
    decode_session_key,
    decode_window_key,
    split_timestamped,
    timestamped_value,
)

logger = logging.getLogger(__name__)


def _skip_null_key(context: ProcessorContext, value: Any, dropped: Callable[[], None]) -> None:
    """A record without a key has no window or session to go to: logged (in Kafka Streams'
    words) and counted as dropped."""
    logger.warning(
        "Skipping record due to null key. value=[%s] topic=[%s] partition=[%d] offset=[%d]",
        value,
        context.topic,
        context.partition,
        context.offset,
    )
    dropped()


class WindowAggregateProcessor(Processor):
    def __init__(
        self,
        spec: WindowedAggregation,
        store: WindowStore,
        task_store: TaskStore,
        dropped: Callable[[], None],
    ) -> None:
        self._spec = spec
        self._windows = spec.windows
        self._store = store
        self._task_store = task_store
        self._dropped = dropped
        # The newest record timestamp the store holds (None: not read yet).
        self._recovered_time: int | None = None
        self._keys: Any = serde_for(spec.key_serde)
        self._values: Any = serde_for(spec.value_serde)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._forwards_on_flush = self._task_store.set_flush_listener(self._flushed)

    def process(self, key: Any, value: Any) -> None:
        context = self.context
        if key is None:
            _skip_null_key(context, value, self._dropped)
            return
        timestamp = context.timestamp
        recovered = self._recovered_time
        if recovered is None:
            recovered = self._recovered_time = self._newest_stored_timestamp()
        stream_time = max(context.stream_time, recovered)
        close_time = stream_time - self._windows.grace_ms
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
            written = self._store.put(
                stored_key,
                window.start,
                timestamped_value(newest, self._values.serialize(aggregate)),
            )
            if not written:
                # The store's retention already let this window go (after a restart,
                # before stream time caught up): it is closed all the same.
                self._skip(key, window, close_time, stream_time)
            elif not self._forwards_on_flush:
                context.forward(Windowed(key, window), aggregate, timestamp=newest)

    def _newest_stored_timestamp(self) -> int:
        """The newest record timestamp in the store: it lies in the newest windows."""
        newest_start = self._store.observed_stream_time
        if newest_start < 0:
            return -1
        return max(
            (
                split_timestamped(value)[0]
                for _, _, value in self._store.fetch_all(newest_start, newest_start)
            ),
            default=-1,
        )

    def _skip(self, key: Any, window: TimeWindow, close_time: int, stream_time: int) -> None:
        context = self.context
        logger.warning(
            "Skipping record for expired window. key=[%s] topic=[%s] partition=[%d] "
            "offset=[%d] timestamp=[%d] window=[%d,%d) expiration=[%d] streamTime=[%d]",
            key,
            context.topic,
            context.partition,
            context.offset,
            context.timestamp,
            window.start,
            window.end,
            close_time,
            stream_time,
        )
        self._dropped()

    def _flushed(self, raw_key: bytes, change: Change) -> None:
        if change.new is None:
            return  # an expired window's segment dropped: not a result
        stored_key, start, _ = decode_window_key(raw_key)
        newest, data = split_timestamped(change.new)
        window = TimeWindow(start, start + self._windows.size_ms)
        self.context.forward(
            Windowed(self._keys.deserialize(stored_key), window),
            self._values.deserialize(data),
            timestamp=newest,
        )


class SessionAggregateProcessor(Processor):
    def __init__(
        self,
        spec: SessionWindowedAggregation,
        store: SessionStore,
        task_store: TaskStore,
        dropped: Callable[[], None],
    ) -> None:
        self._spec = spec
        self._windows = spec.windows
        self._store = store
        self._task_store = task_store
        self._dropped = dropped
        self._keys: Any = serde_for(spec.key_serde)
        self._values: Any = serde_for(spec.value_serde)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._forwards_on_flush = self._task_store.set_flush_listener(self._flushed)

    def process(self, key: Any, value: Any) -> None:
        context = self.context
        if key is None:
            _skip_null_key(context, value, self._dropped)
            return
        spec, gap = self._spec, self._windows.gap_ms
        timestamp = context.timestamp
        stream_time = max(context.stream_time, self._store.observed_stream_time)
        close_time = stream_time - self._windows.grace_ms
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
        context = self.context
        logger.warning(
            "Skipping record for expired window. key=[%s] topic=[%s] partition=[%d] "
            "offset=[%d] timestamp=[%d] window=[%d,%d] expiration=[%d] streamTime=[%d]",
            key,
            context.topic,
            context.partition,
            context.offset,
            context.timestamp,
            start,
            end,
            close_time,
            stream_time,
        )
        self._dropped()

    def _flushed(self, raw_key: bytes, change: Change) -> None:
        stored_key, start, end = decode_session_key(raw_key)
        if change.new is None:
            observed = self._store.observed_stream_time
            if end < observed - self._windows.retention_ms + 1:
                return  # an expired session's segment dropped: not a result
            value = None
        else:
            value = self._values.deserialize(change.new)
        self.context.forward(
            Windowed(self._keys.deserialize(stored_key), SessionWindow(start, end)),
            value,
            timestamp=end,
        )


def build_operator(
    operator: object,
    views: dict[str, Any],
    stores: dict[str, TaskStore],
    dropped: Callable[[], None],
) -> Processor:
    """The processor for a DSL operation the engine implements."""
    if isinstance(operator, WindowedAggregation):
        return WindowAggregateProcessor(
            operator, views[operator.store], stores[operator.store], dropped
        )
    if isinstance(operator, SessionWindowedAggregation):
        return SessionAggregateProcessor(
            operator, views[operator.store], stores[operator.store], dropped
        )
    joining = build_join_operator(operator, views, stores, dropped)
    if joining is not None:
        return joining
    raise TypeError(
        f"the engine has no processor for {type(operator).__name__}; a topology node needs "
        "a processor supplier or an operator the DSL made"
    )
