"""Fault injection for Spark restore tests, loaded by Spark's Python workers.

The test module puts this folder on the PYTHONPATH of the session it starts
and names a flag file in ``EDDYLINE_TEST_FAULTS``; the workers inherit both.
The flag's content picks the fault, read at each use, so one session runs
every test:

* ``kill-first-attempt``: the task of Spark partition 1 writes its files, then
  its Python worker dies (``os._exit``) on the first attempt, as a killed
  executor would: its files stay behind, and no commit message names them;
* ``kill-always``: the same on every attempt, so the job fails;
* ``hang``: every task writes its files, then sleeps (a driver killed then).
"""

import contextlib
import os

_FLAG = os.environ.get("EDDYLINE_TEST_FAULTS")


def _install() -> None:
    import time

    from pyspark import TaskContext

    from eddyline_runtime.restore import sst_sink

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
        if mode in ("kill-first-attempt", "kill-always") and self.spark_partition == 1:
            context = TaskContext.get()
            if mode == "kill-always" or (context is not None and context.attemptNumber() == 0):
                self._finish_file()
                with open(f"{_FLAG}.fired", "a") as fired:  # proof for the test
                    fired.write(f"{self.attempt}\n")
                os._exit(17)
        return original(self)

    sst_sink._TaskFiles.finish = finish


if _FLAG:
    with contextlib.suppress(ImportError):  # a Python process that is no Spark worker
        _install()
