"""Asking the log to apply its topics' retention, at most once per interval, after commits.

A broker deletes records past a topic's ``retention.ms`` by itself (the log
port's default is a no-op); the embedded log deletes only when asked. Window
and session store changelogs are the topics that set a retention.
"""

from __future__ import annotations

import logging
import time

from eddyline_runtime.log import Log

logger = logging.getLogger(__name__)


class LogRetention:
    def __init__(self, log: Log, check_interval_ms: int) -> None:
        self._log = log
        self._interval_seconds = check_interval_ms / 1000
        self._last_check = time.monotonic()

    def after_commit(self) -> None:
        """At most once per ``log.retention.check.interval.ms``: apply retention now."""
        now = time.monotonic()
        if now - self._last_check < self._interval_seconds:
            return
        self._last_check = now
        removed = self._log.enforce_retention(time.time_ns() // 1_000_000)
        if removed:
            logger.debug("log retention deleted %d records", removed)
