"""The Spark restore job: changelog in, SST files and a manifest out.

:mod:`.spark_build` drives it (``eddyline restore build``), reading changelogs
through :mod:`.changelog_source` in the offset ranges of :mod:`.offset_ranges`
and writing through :mod:`.sst_sink`; :mod:`.job_runner` runs it as a
Kubernetes Job and writes its verdict. These are the only modules of the
runtime that import ``pyspark`` or ``pyarrow`` (the runtime image has
neither), so nothing outside this package imports them, and this file imports
none of them.
"""
