"""A Spark restore build in its own process, for the test that SIGKILLs a driver mid-build."""

import sys
from pathlib import Path

from eddyline_runtime.restore.spark.spark_build import build, spark_session

log_url, output = sys.argv[1], Path(sys.argv[2])
spark = spark_session("local[2]")
build(
    spark,
    application="app",
    store="counts",
    changelog_topic="app-counts-changelog",
    partitions=[0, 1, 2],
    output=output,
    log_url=log_url,
)
