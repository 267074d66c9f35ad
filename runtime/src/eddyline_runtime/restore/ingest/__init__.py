"""Pod-side use of a Spark restore build: ingest its SST files, or wait for it.

:mod:`.sst_restore` ingests the newest manifest that fits a store and replays
the changelog's tail; :mod:`.build_wait` is ``restorePending``: a task whose
store is missing and whose changelog is long waits for a build instead of
replaying everything. Neither needs Spark.
"""
