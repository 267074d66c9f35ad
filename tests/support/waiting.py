"""The one way tests wait: poll a condition until it holds, or fail naming what never came."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 60.0
DEFAULT_INTERVAL = 0.05


def wait_for(
    condition: Callable[[], T | None],
    what: str,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    interval: float = DEFAULT_INTERVAL,
) -> T:
    """Call ``condition`` every ``interval`` s until it returns something truthy; return that.

    After ``timeout`` s without, fail with an AssertionError naming ``what`` (a
    test failure, not an error of the test). Exceptions of ``condition`` propagate.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
