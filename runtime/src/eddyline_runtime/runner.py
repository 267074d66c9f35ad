"""Run a StreamApp manifest locally: ``eddyline run MANIFEST``.

Loads the manifest (the same pydantic model the operator uses), imports the
topology it names, opens its log, and runs one instance with every task until
SIGINT/SIGTERM, or with ``until_caught_up`` until all input is processed and
committed. Either way it closes cleanly: a final commit, stores closed.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO

from eddyline_runtime.config import StreamsConfig, read_settings_file
from eddyline_runtime.log import Log, open_log
from eddyline_runtime.processing.instance import StreamsInstance
from eddyline_runtime.processing.loader import load_topology
from eddyline_runtime.spec import StreamApp, load_manifest

_PROGRESS_SECONDS = 1.0


def run_manifest(
    manifest: Path,
    *,
    instance_id: str = "0",
    config_file: Path | None = None,
    until_caught_up: bool = False,
    timeout: float | None = None,
    out: TextIO = sys.stderr,
    on_started: Callable[[StreamsInstance], None] | None = None,
) -> StreamsInstance:
    """Run until stopped (or caught up); returns the closed instance for its metrics.

    ``config_file`` (``.properties`` or YAML) overrides the manifest's
    ``spec.config``; the environment (``EDDYLINE_<NAME>``) overrides both.
    """
    app = load_manifest(manifest)
    if config_file is not None:
        settings = {**app.spec.config, **read_settings_file(config_file)}
        StreamsConfig.from_properties(settings)  # a bad value names its key, here
        app = app.model_copy(update={"spec": app.spec.model_copy(update={"config": settings})})
    log = open_log(app.spec.log.url)
    try:
        return run_app(
            app,
            log,
            search_path=[manifest.resolve().parent],
            instance_id=instance_id,
            until_caught_up=until_caught_up,
            timeout=timeout,
            out=out,
            on_started=on_started,
        )
    finally:
        log.close()


def run_app(
    app: StreamApp,
    log: Log,
    *,
    search_path: list[Path],
    instance_id: str = "0",
    until_caught_up: bool = False,
    timeout: float | None = None,
    out: TextIO = sys.stderr,
    on_started: Callable[[StreamsInstance], None] | None = None,
) -> StreamsInstance:
    config = app.streams_config()
    topology = load_topology(app.spec.topology, search_path)
    if app.spec.replicas > 1:
        print(
            f"note: spec.replicas is {app.spec.replicas}; this local run starts one instance "
            "that runs every task",
            file=out,
        )
    instance = StreamsInstance(topology, config, log, instance_id=instance_id)
    stop = threading.Event()
    with _stop_on_signals(stop):
        instance.start()
        if on_started is not None:
            on_started(instance)
        progress = _Progress(instance, out)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not stop.wait(0.05):
                if until_caught_up and instance.caught_up():
                    break
                instance.check()
                progress.maybe_print()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{app.metadata.name} still running after {timeout} s")
        finally:
            instance.close()
        progress.print_line(final=True)
    return instance


class _Progress:
    """One status line per second: processed records, rate, input lag, commits."""

    def __init__(self, instance: StreamsInstance, out: TextIO) -> None:
        self._instance = instance
        self._out = out
        self._started = time.monotonic()
        self._last_print = self._started
        self._last_processed = 0
        self._interactive = out.isatty()

    def maybe_print(self) -> None:
        if time.monotonic() - self._last_print >= _PROGRESS_SECONDS:
            self.print_line()

    def print_line(self, *, final: bool = False) -> None:
        now = time.monotonic()
        processed = self._instance.processed
        if final:
            rate = processed / max(now - self._started, 1e-9)
        else:
            rate = (processed - self._last_processed) / max(now - self._last_print, 1e-9)
        lags = self._instance.input_lags().values()
        lag = "?" if any(v is None for v in lags) else f"{sum(v or 0 for v in lags):,}"
        # A closed instance's threads no longer register metrics: use their last values.
        metrics = self._instance.final_metrics or self._instance.metrics.snapshot()
        commits = sum(value for name, value in metrics.items() if name.name == "commit-total")
        line = (
            f"processed {processed:,} records ({rate:,.0f}/s), input lag {lag}, "
            f"commits {commits:,.0f}"
        )
        if self._interactive and not final:
            print(f"\r{line}   ", end="", file=self._out, flush=True)
        else:
            print(("\r" if self._interactive else "") + line, file=self._out, flush=True)
        self._last_print, self._last_processed = now, processed


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM ask for a clean close (only possible on the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
