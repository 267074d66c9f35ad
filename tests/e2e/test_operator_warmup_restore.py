"""Scaling out with ``spec.restore.when: Always``: the new pod's warm-ups are seeded by a Spark Job.

Issue 25 on the real control plane: the word count runs as one pod, then is
scaled to two. The operator gives the new pod warm-up replicas of the tasks
the balanced assignment wants there (KIP-441); their stores are missing, so
the pod reports them ``restorePending`` and keeps running while they wait. The
operator launches one restore Job for exactly those partitions; the warm-ups
ingest its build and replay only the changelog after it, report caught up, and
the tasks move. Counts stay exact throughout.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from eddyline_runtime.membership import MEMBERSHIP_FILE, Membership
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.query.client import QueryRouter
from eddyline_runtime.restore.manifest import read_manifest
from tests.support.cluster_word_count import counts_exact
from tests.support.control_plane import restore_app
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture
from tests.support.control_plane.restore_app import APP, STORE
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

NAMESPACE = "warmup-restore"
NEW_POD = f"{APP}-1"


harness = operator_fixture(
    NAMESPACE, directory="warmup", watching=False, before=restore_app.require_java
)


def membership(harness: Operator) -> Membership:
    found = harness.get("", "configmaps", f"{APP}-membership")
    assert found is not None
    return Membership.from_json(json.loads(found["data"][MEMBERSHIP_FILE]))


def start_with_counts(
    harness: Operator, tmp_path: Path
) -> tuple[str, QueryRouter, collections.Counter[str]]:
    """The word count on one pod with ``spec.restore.when: Always``, having counted a few
    rounds of input (each rewrites every word's count: a changelog worth building)."""
    restore = {"when": "Always", "master": "local[2]", "waitSeconds": 300}
    log_url, router = restore_app.start_one_pod(harness, tmp_path, restore)
    expected: collections.Counter[str] = collections.Counter()
    for seed in range(3):
        restore_app.produce_round(log_url, expected, seed)
        wait_for(lambda: counts_exact(router, expected), "exact counts", 60)
    return log_url, router, expected


@pytest.mark.timeout(600)  # pods, a Spark Job's JVM and the moves on 2 busy cores (90-245 s)
def test_scaling_out_seeds_the_new_pods_warm_ups_from_a_spark_job(
    harness: Operator, tmp_path: Path
) -> None:
    log_url, router, expected = start_with_counts(harness, tmp_path)
    assert "scaled" in harness.kubectl("scale", "sapp", APP, "--replicas=2")

    def warming() -> frozenset[TaskId] | None:
        found = membership(harness).assignment.warmup.get(NEW_POD)
        return found or None

    try:
        warm_ups = wait_for(warming, f"warm-ups on {NEW_POD}", 180)
        launched = wait_for(
            lambda: restore_app.restore_job(harness), "a restore Job for the warm-ups", 120
        )
    except (AssertionError, TimeoutError):
        restore_app.print_failure(harness)
        raise
    args = launched["spec"]["template"]["spec"]["containers"][0]["args"]
    partitions = sorted(t.partition for t in warm_ups)
    # Built: exactly the partitions the new pod warms up (the first pod holds the others).
    assert args[args.index("--partitions") + 1] == ",".join(map(str, partitions))
    # Input keeps coming while the warm-ups wait: the first pod counts it.
    restore_app.produce_round(log_url, expected, seed=99)

    def moved() -> bool:
        assignment = membership(harness).assignment
        mine = assignment.active.get(NEW_POD, frozenset())
        return bool(warm_ups <= mine) and not assignment.warmup_count

    try:
        wait_for(moved, "the warmed-up tasks moved to the new pod", 420)
        wait_for(
            lambda: restore_app.ready(harness, 2) and counts_exact(router, expected), "exact", 120
        )
    except (AssertionError, TimeoutError):
        restore_app.print_failure(harness)
        raise
    assert len(harness.objects("batch", "jobs")) == 1
    built_dirs = restore_app.builds(harness)
    assert len(built_dirs) == 1, built_dirs
    pod_ip = harness.pods(APP)[NEW_POD]["status"]["podIP"]
    restored = restore_app.restore_metrics(pod_ip)
    kubelets = harness.cluster.kubelets
    assert kubelets is not None
    pod_log = kubelets.pod_log(NAMESPACE, NEW_POD)
    offsets = {}
    for task in sorted(warm_ups):
        built = read_manifest(built_dirs[0] / f"partition-{task.partition}.manifest.json")
        offsets[str(task)] = built.offset
        # The warm-up was seeded from the build and replayed the changelog after it...
        assert (
            f"standby of task {task} store {STORE}: ingested" in pod_log
            and f"replaying the changelog after offset {built.offset}" in pod_log
        ), pod_log[-4000:]
        # ...so the move itself restored nothing.
        assert restored[("restore_total", task)] == 0, restored
    print(f"warm-ups seeded from build {built_dirs[0].name} at offsets {offsets}")
