"""Counts the SIGKILLs the test process sends: ``pytest -p tests.support.kill_count``.

The suite's crash tests claim hundreds of SIGKILLs with nothing lost; this plugin says how
many a run really sent, per test module and in total, at the end of the run. It wraps
``os.kill`` and ``os.killpg``, through which ``Popen.kill``/``send_signal`` and the kubelet
stand-in's kills go. Kills sent by child processes (a worker killing its own child, a shell
script) are not seen. Not registered in tests/conftest.py: a measurement, run on demand.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable, Generator

import pytest

_sent: Counter[str] = Counter()
_current = ["(outside tests)"]


def _counting(real: Callable[[int, int], None]) -> Callable[[int, int], None]:
    def send(target: int, sig: int) -> None:
        real(target, sig)  # first: a kill that raises (no such process) did not happen
        if sig == signal.SIGKILL:
            _sent[_current[0]] += 1

    return send


def pytest_configure(config: pytest.Config) -> None:
    os.kill = _counting(os.kill)
    os.killpg = _counting(os.killpg)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    _current[0] = item.nodeid.split("::")[0]
    try:
        return (yield)
    finally:
        _current[0] = "(outside tests)"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.section("SIGKILLs sent by the test process")
    for module, count in sorted(_sent.items()):
        terminalreporter.write_line(f"{count:6d}  {module}")
    terminalreporter.write_line(f"{sum(_sent.values()):6d}  in total")
