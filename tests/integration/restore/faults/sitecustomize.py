"""Fault injection for a Spark restore build run in its own process, loaded by its workers.

The test that kills a driver mid-build puts this folder on the PYTHONPATH of
the driver process it starts and names a flag file in
``EDDYLINE_TEST_FAULTS``; the JVM and its Python workers inherit both. With
the flag reading ``hang``, every task writes its files, then sleeps, so the
driver is killed while files exist and no manifest does.
"""

import contextlib
import os

_FLAG = os.environ.get("EDDYLINE_TEST_FAULTS")


def _install() -> None:
    import time

    from eddyline_runtime.restore.spark import sst_sink

    original = sst_sink._TaskFiles.finish

    def finish(self):  # type: ignore[no-untyped-def]
        try:
            with open(_FLAG) as handle:  # type: ignore[arg-type]
                mode = handle.read().strip()
        except FileNotFoundError:
            mode = ""
        if mode == "hang":
            self._finish_file()
            time.sleep(600)
        return original(self)

    sst_sink._TaskFiles.finish = finish


if _FLAG:
    with contextlib.suppress(ImportError):  # a Python process that is no Spark worker
        _install()
