"""The Kubernetes part of ``make bench-restore``: restore Jobs with 1 and 2 executor pods.

On the real nodes (docs/nodes.md; needs root, takes the machine-wide real-node lock, builds
or reuses the images): the changelog goes to a project Kafka broker on the bridge address,
and the restore Job the operator renders (``k8s://https://kubernetes.default.svc``, client
mode, executor pods from the restore image) builds the store, first from one changelog
partition, then from all of them, with 1 and then 2 executors. Wall time is from the Job's
creation to its completion (pod start, JVM, executors' pods, the build, the manifests);
CPU is the nodes' pods' CPU (cpuacct of every node's ``kubepods`` cgroup: the driver,
executors and their Python workers; not the broker, which runs on the host).

Two sizes give the fixed cost (the line's intercept) and the cost per record (its slope) of
each executor count. ``crossover_records`` is where the 2-executor Job overtakes serial
replay at ``serial_records_per_s``, ``fixed / (1 / serial - per_record)``, or None when its
cost per record is no lower than serial replay's.
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

from tests.support.control_plane.client import wait_until
from tests.support.images import build_images
from tests.support.realnode import spark_restore
from tests.support.realnode.cluster import RealCluster

NAMESPACE = "bench-restore"
# One Job's bound on a loaded 2-core machine: a hang, not an expectation.
JOB_TIMEOUT = 1800


def pods_cpu_seconds() -> float:
    """CPU seconds of every pod of every real node so far (cpuacct, cgroup v1)."""
    paths = {
        os.path.realpath(path)
        for path in glob.glob("/sys/fs/cgroup/cpu*acct*/eddyline-realnode/*/kubepods/cpuacct.usage")
    }
    return sum(int(Path(path).read_text()) for path in paths) / 1e9


def timed_job(
    spark: spark_restore.SparkRestore, partitions: list[int], executors: int
) -> tuple[float, float]:
    """(wall s, pods' CPU s) of one restore Job, created to finished; it must succeed."""
    job = spark.job(partitions, executors=executors)
    cpu0, wall0 = pods_cpu_seconds(), time.perf_counter()
    spark_restore.create(spark.admin, NAMESPACE, job)
    entry = wait_until(lambda: spark.finished(job), f"Job {job['metadata']['name']}", JOB_TIMEOUT)
    wall, cpu = time.perf_counter() - wall0, pods_cpu_seconds() - cpu0
    assert entry.state.value == "Succeeded", entry.message
    # The executors go with the driver's pod; wait so the next Job starts on idle nodes.
    wait_until(lambda: not spark.executors(), "the executor pods to go", 300)
    return wall, cpu


def run(
    work: Path, *, records: int, keys: int, partitions: int, serial_records_per_s: float
) -> dict[str, object]:
    out: dict[str, object] = {}
    per_partition = records // partitions
    cluster = RealCluster(work / "cluster").start()
    try:
        images = build_images()
        with spark_restore.started(
            cluster, images, work / "k8s", namespace=NAMESPACE, partitions=partitions,
            per_partition=per_partition, keys=max(keys // partitions, 10),
        ) as spark:  # fmt: skip
            # What the broker holds (keyless records are not written to a compacted topic).
            one = spark.log.end_offset(spark.changelog(0)) - spark.log.beginning_offset(
                spark.changelog(0)
            )
            every = sum(
                spark.log.end_offset(spark.changelog(p))
                - spark.log.beginning_offset(spark.changelog(p))
                for p in range(partitions)
            )
            out["k8s_records"] = every
            for executors, label in ((1, "k8s_1_executor"), (2, "k8s_2_executors")):
                small_s, small_cpu = timed_job(spark, [0], executors)
                large_s, large_cpu = timed_job(spark, list(range(partitions)), executors)
                per_record = max(large_s - small_s, 1e-9) / (every - one)
                fixed = large_s - per_record * every
                out[f"{label}_records_per_s"] = round(every / large_s)
                out[f"{label}_wall_s"] = round(large_s, 1)
                out[f"{label}_fixed_s"] = round(fixed, 1)
                out[f"{label}_us_per_record"] = round(per_record * 1e6, 2)
                out[f"{label}_cpu_s_per_million"] = round(large_cpu / every * 1e6, 1)
                out[f"{label}_small_job_wall_s"] = round(small_s, 1)
                out[f"{label}_small_job_cpu_s"] = round(small_cpu, 1)
                print(f"{label}: {every:,} records in {large_s:.1f} s ({large_cpu:.1f} pod CPU-s); "
                      f"{one:,} in {small_s:.1f} s")  # fmt: skip
            per_record = float(out["k8s_2_executors_us_per_record"]) / 1e6  # type: ignore[arg-type]
            fixed = float(out["k8s_2_executors_fixed_s"])  # type: ignore[arg-type]
            gain = 1 / serial_records_per_s - per_record
            out["crossover_records"] = max(round(fixed / gain), 0) if gain > 0 else None
    finally:
        cluster.stop()
    return out
