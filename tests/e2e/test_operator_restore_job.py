"""A lost volume restored through a Spark Job the operator launches, on the real control plane.

The word count runs as one pod with ``spec.restore`` set (``WhenLagAbove``,
``local[2]``). Its state claim is wiped while its container is down; on
restart every store partition is missing and its changelog is above the
threshold, so the pod reports them ``restorePending`` instead of replaying.
The operator launches one restore Job (``eddyline restore job``: spark-submit
in client mode; the real Job controller makes its pod, the real scheduler puts it beside
the claims, the kubelet stand-in runs it as a local process), reads its
verdict from the termination message, and shows ``Restoring``; the pod ingests
the build and replays only the changelog after each manifest's offset, which
its restore metrics show, and the counts come back exact.
"""

from __future__ import annotations

import collections
import json
import shutil
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from eddyline_runtime.log import open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryRouter
from eddyline_runtime.restore.manifest import read_manifest
from tests.support.cluster_word_count import counts_exact
from tests.support.control_plane import restore_app
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture
from tests.support.control_plane.restore_app import APP, STORE
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

NAMESPACE = "restore-real"
# Changelog records above which a missing store waits for a build instead of replaying: each
# round of input adds about 10 records (one per word) to each changelog partition.
LAG_ABOVE = 30
ROUNDS = 5


harness = operator_fixture(
    NAMESPACE, directory="restore", watching=False, before=restore_app.require_java
)


def condition(harness: Operator, kind: str) -> dict[str, Any] | None:
    return harness.condition(APP, kind)


def start_app(harness: Operator, tmp_path: Path) -> tuple[str, QueryRouter]:
    """The word count, one pod, spec.restore set; returns its log URL and a query router."""
    restore = {
        "when": "WhenLagAbove",
        "lagAbove": LAG_ABOVE,
        "master": "local[2]",
        "waitSeconds": 240,
    }
    log_url, router = restore_app.start_one_pod(harness, tmp_path, restore)
    claim = harness.get("", "persistentvolumeclaims", f"{APP}-restore")
    assert claim is not None
    kubernetes_validate.validate(claim, "1.32", strict=True)
    return log_url, router


def lose_the_volume(harness: Operator) -> None:
    """The container is killed and its state claim wiped while it is down: a kubelet
    restarts a first crash at once, so it is killed twice and wiped during the second
    crash's back-off (10 s)."""
    kubelets = harness.cluster.kubelets
    assert kubelets is not None
    pod = f"{APP}-0"

    def restarts() -> int:
        statuses = harness.pods(APP)[pod]["status"].get("containerStatuses", [])
        return int(statuses[0]["restartCount"]) if statuses else 0

    before = restarts()
    kubelets.kill_container(NAMESPACE, pod)
    wait_for(lambda: restarts() > before, f"{pod} restarted", 60)
    wait_for(lambda: _running(harness, pod), f"{pod} running again", 60)
    kubelets.kill_container(NAMESPACE, pod)
    state = restore_app.claim_dir(harness, f"state-{APP}-0")
    time.sleep(0.5)
    for entry in state.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def _running(harness: Operator, name: str) -> bool:
    kubelets = harness.cluster.kubelets
    assert kubelets is not None
    try:
        node = kubelets.node_of(NAMESPACE, name)
    except LookupError:
        return False
    with node.lock:
        runtime = next(r for r in node.pods.values() if (r.namespace, r.name) == (NAMESPACE, name))
        process = runtime.containers[0].process
        return process is not None and process.poll() is None


def assert_only_the_tail_was_replayed(harness: Operator, log_url: str) -> Path:
    """Each store partition: ingested at its manifest's offset, then replayed what follows."""
    found = restore_app.builds(harness)
    assert len(found) == 1, found
    pod_ip = harness.pods(APP)[f"{APP}-0"]["status"]["podIP"]
    # By partition: the store's tasks are those of one sub-topology.
    restored = {
        (m, task.partition): v for (m, task), v in restore_app.restore_metrics(pod_ip).items()
    }
    log = open_log(log_url, read_only=True)
    try:
        for partition in range(4):
            built = read_manifest(found[0] / f"partition-{partition}.manifest.json")
            changelog = TopicPartition(f"{APP}-{STORE}-changelog", partition)
            records = log.fetch(changelog, built.offset + 1, 1_000_000).records
            tail = [r for r in records if r.key is not None]
            assert restored[("restore_ingested_offset", partition)] == built.offset
            assert restored[("restore_ingested_keys", partition)] == built.keys
            assert restored[("restore_total", partition)] == len(tail)
            assert built.records_read > built.keys  # many versions per key collapsed
    finally:
        log.close()
    return found[0]


def test_a_pod_whose_volume_was_lost_is_restored_through_a_spark_job(
    harness: Operator, tmp_path: Path
) -> None:
    log_url, router = start_app(harness, tmp_path)
    expected: collections.Counter[str] = collections.Counter()
    # Rounds with a commit between them: every round writes each word's count again, so
    # the changelog holds many versions per key (what a build collapses).
    for round_ in range(ROUNDS):
        restore_app.produce_round(log_url, expected, seed=round_)
        wait_for(lambda: counts_exact(router, expected), "exact counts", 60)
    lose_the_volume(harness)
    lost_at = time.monotonic()
    try:
        launched = wait_for(lambda: restore_app.restore_job(harness), "a restore Job", 120)
    except (AssertionError, TimeoutError):
        restore_app.print_failure(harness)
        raise
    # A single GET carries apiVersion and kind (a list's items do not).
    stored = harness.get("batch", "jobs", launched["metadata"]["name"])
    assert stored is not None
    kubernetes_validate.validate(stored, "1.32", strict=True)
    restoring = condition(harness, "Restoring")
    assert restoring is not None and restoring["status"] == "True", restoring
    args = launched["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--partitions") + 1] == "0,1,2,3"
    try:
        wait_for(
            lambda: restore_app.ready(harness, 1) and counts_exact(router, expected),
            "restored, exact",
            360,
        )
    except (AssertionError, TimeoutError):
        restore_app.print_failure(harness)
        raise
    restored_after = time.monotonic() - lost_at

    def job_done() -> dict[str, Any] | None:
        # The pod ingests once the driver wrote the manifests, before the Job completes.
        found = condition(harness, "Restoring")
        return found if found is not None and found["status"] == "False" else None

    finished = wait_for(job_done, "Restoring=False", 60)
    assert finished["reason"] == "BuildSucceeded", finished
    jobs = harness.app(APP)["status"]["restoreJobs"]
    assert [j["state"] for j in jobs] == ["Succeeded"], jobs
    assert len(harness.objects("batch", "jobs")) == 1  # one build for every partition
    build = assert_only_the_tail_was_replayed(harness, log_url)
    verdict = json.loads(
        next(
            s["state"]["terminated"]["message"]
            for p in harness.objects("", "pods")
            if p["metadata"]["name"].startswith(f"{APP}-restore-")
            for s in p["status"]["containerStatuses"]
        )
    )
    assert verdict["state"] == "Succeeded" and verdict["build_id"] == build.name
    kubectl = harness.kubectl

    def described() -> str | None:
        text = kubectl("describe", "sapp", APP)
        return text if "RestoreSucceeded" in text else None

    text = wait_for(described, "the RestoreSucceeded event", 30)
    assert "RestoreStarted" in text and "Restoring" in text
    print(f"volume lost -> restored with exact counts in {restored_after:.1f} s")
