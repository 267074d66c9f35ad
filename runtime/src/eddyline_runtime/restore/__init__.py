"""Restore: bringing state stores up to their changelogs, as three programs.

* :mod:`eddyline_runtime.restore.replay` (in the pod): the one rule for where
  changelog replay starts (:func:`~eddyline_runtime.restore.replay.replay_start`,
  with its verdicts), the batched replay step, active restoration and
  standby replicas (:class:`~eddyline_runtime.restore.replay.StandbyTask`).
* :mod:`eddyline_runtime.restore.spark` (the Spark restore job, its own image):
  reads a changelog, collapses it to one value per key and writes SST files
  with a manifest. The only modules that import ``pyspark`` and ``pyarrow``.
* :mod:`eddyline_runtime.restore.ingest` (in the pod): ingests what a build
  wrote, and waits for a build while a store is ``restorePending``.

Between the two sides, as files on the shared claim: the manifests
(:mod:`~eddyline_runtime.restore.manifest`) and the job results
(:mod:`~eddyline_runtime.restore.job_result`). Restore sits between the engine
and the stores and log it reads (``engine`` > ``restore`` > ``state`` | ``log``)
and never imports the engine, so restore jobs that run outside an instance can
use it. This package's own namespace stays empty: importing the job result
(the operator does) pulls in neither the log nor the stores.
"""
