"""One live progress line for long work: done of the total, the rate, the time left.

``eddyline restore build``, ``eddyline demo wordcount`` (``make run``) and ``kubectl
eddyline upgrade`` all draw their progress with :class:`ProgressLine`, so the three look
and behave alike. On a terminal the line is redrawn in place (carriage return, erase to
the end of the line); on anything else (a pipe, a file, a container's log) it writes
nothing at all, so logs keep only the commands' own result lines. ``--no-progress``
turns it off on a terminal too (:func:`progress_wanted`). Other long commands (the
backfill issue's ``eddyline backfill``, once it exists) draw with it too, not a copy.

A leaf module (no eddyline imports): the runtime's commands and the operator's kubectl
plugin both import it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Final, TextIO

# How often the line is redrawn at most: a reader follows two updates a second, and a
# remote terminal (ssh, kubectl through a bastion) is not flooded by a busy loop.
MIN_REDRAW_SECONDS: Final = 0.5
# Carriage return, then ANSI "erase in line" (EL, to the end): every terminal emulator
# in use understands it, and it leaves a shorter line with no tail of the longer one.
_ERASE: Final = "\r\033[K"
# The width when the stream cannot tell its own (a terminal always can; this is a guard).
_FALLBACK_WIDTH: Final = 80


def progress_wanted(stream: TextIO, *, no_progress: bool = False) -> bool:
    """Whether a live line belongs on ``stream``: not ``--no-progress``, and a terminal."""
    if no_progress:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed stream, or a stand-in without isatty
        return False


class ProgressLine:
    """A line saying ``label: done of total unit (pct), rate/s, time left, elapsed``.

    ``update`` redraws it (at most every ``min_redraw`` seconds, unless the label or
    unit changed, or ``force``; a new label or unit starts the rate and elapsed time
    again, as a new phase); ``clear`` erases it so the caller can print a
    line of its own (the next ``update`` draws it again); ``close`` erases it for good.
    When not ``enabled`` every method does nothing. ``clock`` is a monotonic clock
    in seconds (tests pass a fake one). The rate is measured from the first update, so
    work done before it (a resumed build) does not inflate it. Calls may come from
    another thread than the one that made the line (a build's watcher thread).
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        label: str,
        unit: str,
        total: int | None = None,
        enabled: bool | None = None,
        show_rate: bool = True,
        clock: Callable[[], float] = time.monotonic,
        min_redraw: float = MIN_REDRAW_SECONDS,
        width: int | None = None,
    ) -> None:
        self._stream = stream
        self.label = label
        self.unit = unit
        self.total = total
        self.enabled = progress_wanted(stream) if enabled is None else enabled
        self._show_rate = show_rate
        self._clock = clock
        self._min_redraw = min_redraw
        self._width = width
        self._lock = threading.Lock()
        self._started: float | None = None
        self._first_done = 0
        self._drawn_at: float | None = None
        self._drawn_key: tuple[str, str] | None = None
        self._on_screen = False

    def update(
        self,
        done: int,
        *,
        total: int | None = None,
        label: str | None = None,
        unit: str | None = None,
        force: bool = False,
    ) -> None:
        """Show ``done`` (and a new ``total``, ``label`` or ``unit`` when given; a new
        label or unit is a new phase, whose total is ``total`` even when None)."""
        if not self.enabled:
            return
        with self._lock:
            now = self._clock()
            if (label is not None and label != self.label) or (
                unit is not None and unit != self.unit
            ):
                # A new phase (a build's read, then its write; an upgrade's next step):
                # its rate and elapsed time start again, in its own unit, and its total
                # is the one given (None: it has none).
                self._started = None
                self.total = total
            elif total is not None:
                self.total = total
            if self._started is None:
                self._started, self._first_done = now, done
            if label is not None:
                self.label = label
            if unit is not None:
                self.unit = unit
            # A new phase draws at once; a new total does not (the demo's grows with
            # every repartition record, many times a second).
            key = (self.label, self.unit)
            due = (
                force
                or self._drawn_at is None
                or key != self._drawn_key
                or now - self._drawn_at >= self._min_redraw
            )
            if not due:
                return
            self._stream.write(_ERASE + self._fit(self.text(done, now)))
            self._stream.flush()
            self._drawn_at, self._drawn_key, self._on_screen = now, key, True

    def text(self, done: int, now: float) -> str:
        """The line for ``done`` at clock time ``now`` (no control characters)."""
        started = self._started if self._started is not None else now
        elapsed = max(now - started, 0.0)
        parts = []
        if self.total is not None and self.total > 0:
            share = min(done / self.total, 1.0)
            parts.append(f"{done:,} of {self.total:,} {self.unit} ({share:.0%})")
        else:
            parts.append(f"{done:,} {self.unit}")
        rate = (done - self._first_done) / elapsed if elapsed > 0 else 0.0
        if self._show_rate and rate > 0:
            # Slow work (a few tasks or pods a second) keeps a decimal, else it reads "0/s".
            shown = f"{rate:,.0f}" if rate >= 10 else f"{rate:.1f}"
            parts.append(f"{shown} {self.unit}/s")
            if self.total is not None and done < self.total:
                parts.append(f"{duration_text((self.total - done) / rate)} left")
        parts.append(duration_text(elapsed))
        return f"{self.label}: {', '.join(parts)}"

    def clear(self) -> None:
        """Erase the line (if drawn) so the caller's next line starts on a clean row."""
        if not self.enabled:
            return
        with self._lock:
            if self._on_screen:
                self._stream.write(_ERASE)
                self._stream.flush()
                self._on_screen = False
                self._drawn_at = None  # the next update draws at once

    def close(self) -> None:
        self.clear()

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def _fit(self, text: str) -> str:
        # One column short of the width: a line that fills the last column wraps on some
        # terminals, and the carriage return would then redraw only its second row.
        width = self._width or _terminal_width(self._stream)
        limit = max(width - 1, 10)
        return text if len(text) <= limit else text[: limit - 1] + "…"


def duration_text(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``: short, and exact enough for a human."""
    whole = max(round(seconds), 0)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _terminal_width(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns or _FALLBACK_WIDTH
    except (AttributeError, OSError, ValueError):
        return _FALLBACK_WIDTH
