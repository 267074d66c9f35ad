"""A task's window and session stores, as the DSL's windowed operators reach them.

The state package's segmented stores
(:class:`~eddyline_runtime.state.SegmentedWindowStore`,
:class:`~eddyline_runtime.state.SegmentedSessionStore`) are views over a key-value
store; in a task that store is the :class:`~eddyline_runtime.engine.task_store.TaskStore`
(record cache, changelog, transactional store). What this module adds is what a
task gives its operators besides: the record cache's flushes, forwarded to the
operator's listener with the raw key already decoded into the key and its
window (the operators never see the store's byte layout), and the cache flushed
before expired segments are dropped, so no window's last update is lost unseen.
Together they implement the authoring side's
:class:`~eddyline_runtime.processing.operators.stores.WindowStore` and
:class:`~eddyline_runtime.processing.operators.stores.SessionStore` interfaces.
"""

from __future__ import annotations

from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.processing.operators.stores import (
    SessionChangeListener,
    WindowChangeListener,
)
from eddyline_runtime.processing.topology import Change
from eddyline_runtime.state import Retention, SegmentedSessionStore, SegmentedWindowStore
from eddyline_runtime.state.window_layout import decode_session_key, decode_window_key


class TaskWindowStore(SegmentedWindowStore):
    """A window store over a task store."""

    def __init__(self, task_store: TaskStore, retention: Retention) -> None:
        super().__init__(task_store, retention, before_drop=task_store.flush)
        self._task_store = task_store

    def set_flush_listener(self, listener: WindowChangeListener, *, deletes: bool = True) -> bool:
        """``listener(key, window start, change)`` for each entry the cache flushes
        (without ``deletes``: each write only); False when the task store has no cache."""

        def flushed(raw: bytes, change: Change) -> None:
            if change.new is None and not deletes:
                return  # before decoding: most deletes are whole expired segments
            key, start, _ = decode_window_key(raw)
            listener(key, start, change)

        return self._task_store.set_flush_listener(flushed)


class TaskSessionStore(SegmentedSessionStore):
    """A session store over a task store."""

    def __init__(self, task_store: TaskStore, retention: Retention) -> None:
        super().__init__(task_store, retention, before_drop=task_store.flush)
        self._task_store = task_store

    def set_flush_listener(self, listener: SessionChangeListener) -> bool:
        """``listener(key, session start, session end, change)`` for each entry the
        cache flushes; False when the task store has no cache."""

        def flushed(raw: bytes, change: Change) -> None:
            key, start, end = decode_session_key(raw)
            listener(key, start, end, change)

        return self._task_store.set_flush_listener(flushed)
