"""How the test-support servers (``python -m tests.support.<cluster>``) wait to be stopped."""

from __future__ import annotations

import signal
from types import FrameType


def wait_for_stop_signal() -> None:
    """Return on SIGINT or SIGTERM. The handler raises rather than set a threading.Event:
    one set by a handler deadlocks when the signal lands while this thread holds the
    Event's lock (eddyline_runtime.runner._stop_signals says how that was met)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
