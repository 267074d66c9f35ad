"""Repeated error lines of the query server are logged once per period, with a count."""

from __future__ import annotations

import asyncio
import logging

import pytest

from eddyline_runtime.query import limits
from eddyline_runtime.query.limits import RepeatedLogFilter, install_log_limits


def test_a_repeated_line_is_logged_once_then_with_the_count_and_no_traceback(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    logger = logging.getLogger("test.repeated.once")
    logger.addFilter(RepeatedLogFilter())
    monkeypatch.setattr(limits, "LOG_REPEAT_SECONDS", 3600.0)
    with caplog.at_level(logging.ERROR, logger="test.repeated.once"):
        for _ in range(1_000):
            try:
                raise OSError(24, "Too many open files")
            except OSError:
                logger.exception("accept failed")
    assert [r.getMessage() for r in caplog.records] == ["accept failed"]
    assert caplog.records[0].exc_info is not None  # the first one keeps its traceback

    caplog.clear()
    monkeypatch.setattr(limits, "LOG_REPEAT_SECONDS", 0.0)
    with caplog.at_level(logging.ERROR, logger="test.repeated.once"):
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            logger.exception("accept failed")
    (record,) = caplog.records
    assert record.getMessage() == "accept failed (and 999 more times in the last 0 s)"
    assert record.exc_info is None


def test_different_lines_are_each_logged(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.repeated.different")
    logger.addFilter(RepeatedLogFilter())
    with caplog.at_level(logging.WARNING, logger="test.repeated.different"):
        for number in range(5):
            logger.warning(f"line {number}")
    assert len(caplog.records) == 5


def test_the_event_loops_unhandled_errors_are_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.new_event_loop()
    try:
        install_log_limits(loop)
        with caplog.at_level(logging.WARNING):
            for _ in range(10_000):
                loop.call_exception_handler(
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": OSError(24, "Too many open files"),
                    }
                )
    finally:
        loop.close()
    # Out of descriptors is one line, without a traceback, however often it repeats.
    assert len(caplog.records) == 1
    assert caplog.records[0].exc_info is None and "out of file descriptors" in caplog.text
