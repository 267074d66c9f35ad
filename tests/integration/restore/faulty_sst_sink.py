"""An ``eddyline_sst`` sink whose tasks can be made to die, for the Spark restore tests.

Shipped to the workers with ``SparkContext.addPyFile`` (the test module's
folder is not on their path). The fault is read at each use from the file
``fault-mode`` beside the build's output directory, so one session runs
every test:

* ``kill-first-attempt``: the task of Spark partition 1 writes its files, then
  its Python worker dies (``os._exit``) on the first attempt, as a killed
  executor would: its files stay behind, and no commit message names them;
* ``kill-always``: the same on every attempt, so the job fails.

Each kill appends the attempt id to ``fault-mode.fired``, the test's proof.
"""

from __future__ import annotations

import os
from pathlib import Path

from pyspark import TaskContext
from pyspark.sql.types import StructType

from eddyline_runtime.restore.spark.sst_sink import (
    BuildPlan,
    SstCommitMessage,
    SstDataSource,
    _SstWriter,
    _TaskFiles,
)


def fault_file(plan: BuildPlan) -> Path:
    """``OUTPUT/../fault-mode``: the build directory is OUTPUT/<app>/<store>/<build id>."""
    return Path(plan.build_dir).parents[3] / "fault-mode"


class _FaultyTaskFiles(_TaskFiles):
    def finish(self) -> SstCommitMessage:
        flag = fault_file(self.plan)
        mode = flag.read_text().strip() if flag.exists() else ""
        if mode in ("kill-first-attempt", "kill-always") and self.spark_partition == 1:
            context = TaskContext.get()
            if mode == "kill-always" or (context is not None and context.attemptNumber() == 0):
                self._finish_file()
                with open(f"{flag}.fired", "a") as fired:
                    fired.write(f"{self.attempt}\n")
                os._exit(17)
        return super().finish()


class _FaultyWriter(_SstWriter):
    def write(self, iterator):  # type: ignore[no-untyped-def]
        context = TaskContext.get()
        task = _FaultyTaskFiles(
            self.plan,
            context.partitionId() if context is not None else 0,
            context.taskAttemptId() if context is not None else 0,
        )
        try:
            for batch in iterator:
                task.add(batch)
            return task.finish()
        except BaseException:
            task.abort()
            raise


class FaultySstDataSource(SstDataSource):
    def writer(self, schema: StructType, overwrite: bool) -> _SstWriter:
        return _FaultyWriter(BuildPlan.decode(self.options["plan"]))
