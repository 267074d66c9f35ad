"""A Spark client-mode driver as a process of its own: ``python -m
tests.support.control_plane.spark_driver SETTINGS_JSON``.

It starts a SparkSession with the given settings (a ``k8s://`` master: the executors are pods),
prints ``SPARK-STARTED``, waits for a line on stdin, stops the session and prints
``SPARK-STOPPED``. Its API calls are whatever its settings' token allows, so a test can run
Spark's own Kubernetes calls under a restricted account and read what was refused from its log.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession


def main() -> None:
    settings: dict[str, str] = json.loads(sys.argv[1])
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    print("SPARK-STARTED", flush=True)
    sys.stdin.readline()
    spark.stop()
    print("SPARK-STOPPED", flush=True)


if __name__ == "__main__":
    main()
