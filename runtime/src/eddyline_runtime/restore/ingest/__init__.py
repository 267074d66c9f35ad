"""Pod-side use of a Spark restore build: ingest its SST files, or wait for it.

:mod:`.sst_restore` ingests the newest manifest that fits a store and replays
the changelog's tail; :mod:`.build_wait` is ``restorePending``: a task whose
store is missing and whose changelog is long waits for a build instead of
replaying everything (an active task in one blocking wait, a standby or
warm-up one poll per turn of its thread's loop). Neither needs Spark.
"""
