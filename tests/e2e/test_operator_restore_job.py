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
import random
import re
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from eddyline_runtime.log import open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryRouter
from eddyline_runtime.restore.manifest import read_manifest
from tests.support.cluster_word_count import counts_exact, produce_lines, random_lines
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "restore-real"

APP = "wordcount"
STORE = "word-counts"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
WORDS = [f"w{index:02d}" for index in range(40)]
# Changelog records above which a missing store waits for a build instead of replaying: each
# round of input adds about 10 records (one per word) to each changelog partition.
LAG_ABOVE = 30
ROUNDS = 5


def require_java() -> None:
    if shutil.which("java") is None:
        raise RuntimeError("the Spark build needs Java: install a JDK 17 (`make setup` says how)")


harness = operator_fixture(NAMESPACE, directory="restore", watching=False, before=require_java)


def claim_dir(harness: Operator, claim: str) -> Path:
    assert harness.cluster.provisioner is not None
    return harness.cluster.provisioner.directory(NAMESPACE, claim)


def produce(log_url: str, expected: collections.Counter[str], lines: int, seed: int) -> None:
    batch = random_lines(random.Random(seed), WORDS, lines, most=6)
    expected.update(word for line in batch for word in line.split())
    produce_lines(log_url, batch)


def metrics(pod_ip: str) -> dict[tuple[str, str], float]:
    """(metric family, partition of the task) -> value, for the store's restore metrics."""
    with urllib.request.urlopen(f"http://{pod_ip}:7070/metrics", timeout=5) as response:
        text = response.read().decode()
    found: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        match = re.match(r"(eddyline_stream_state_metrics_restore_\w+)\{(.*)\} (\S+)$", line)
        if match and f'store="{STORE}"' in match.group(2):
            task = re.search(r'task_id="(\d+)_(\d+)"', match.group(2))
            assert task is not None
            found[(match.group(1), task.group(2))] = float(match.group(3))
    return found


def condition(harness: Operator, kind: str) -> dict[str, Any] | None:
    return harness.condition(APP, kind)


def start_app(harness: Operator, tmp_path: Path) -> tuple[str, QueryRouter]:
    """The word count, one pod, spec.restore set; returns its log URL and a query router."""
    log_claim = claim_dir(harness, f"{APP}-log")
    log_claim.mkdir(parents=True)
    log_url = f"sqlite:///{log_claim}/log.db"
    log = open_log(log_url)
    log.create_topic("text-lines", 4)
    log.close()
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["spec"]["replicas"] = 1
    document["spec"]["config"]["num.standby.replicas"] = 0
    document["spec"]["restore"] = {
        "when": "WhenLagAbove",
        "lagAbove": LAG_ABOVE,
        "master": "local[2]",
        "waitSeconds": 240,
    }
    manifest = tmp_path / "streamapp.yaml"
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    harness.wait_watching()
    harness.kubectl("apply", "-f", str(manifest))
    try:
        wait_for(lambda: ready(harness), "the pod ready", 180)
    except (AssertionError, TimeoutError):
        print(harness.describe_failure(APP))
        raise
    claim = harness.get("", "persistentvolumeclaims", f"{APP}-restore")
    assert claim is not None
    kubernetes_validate.validate(claim, "1.32", strict=True)
    service = harness.get("", "services", f"{APP}-query")
    assert service is not None
    return log_url, QueryRouter([f"{service['spec']['clusterIP']}:7070"], timeout=2)


def ready(harness: Operator) -> bool:
    status = harness.app(APP).get("status", {})
    found = condition(harness, "Ready")
    return status.get("readyReplicas") == 1 and found is not None and found["status"] == "True"


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
    state = claim_dir(harness, f"state-{APP}-0")
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


def print_failure(harness: Operator) -> None:
    print(harness.describe_failure(APP))
    kubelets = harness.cluster.kubelets
    assert kubelets is not None
    for pod in harness.objects("", "pods"):
        print(kubelets.pod_log(NAMESPACE, pod["metadata"]["name"])[-4000:])


def assert_only_the_tail_was_replayed(harness: Operator, log_url: str) -> Path:
    """Each store partition: ingested at its manifest's offset, then replayed what follows."""
    builds = sorted((claim_dir(harness, f"{APP}-restore") / APP / STORE).glob("2*"))
    assert len(builds) == 1, builds
    pod_ip = harness.pods(APP)[f"{APP}-0"]["status"]["podIP"]
    restored = metrics(pod_ip)
    family = "eddyline_stream_state_metrics_restore_"
    log = open_log(log_url, read_only=True)
    try:
        for partition in range(4):
            built = read_manifest(builds[0] / f"partition-{partition}.manifest.json")
            changelog = TopicPartition(f"{APP}-{STORE}-changelog", partition)
            records = log.fetch(changelog, built.offset + 1, 1_000_000).records
            tail = [r for r in records if r.key is not None]
            key = str(partition)
            assert restored[(family + "ingested_offset", key)] == built.offset
            assert restored[(family + "ingested_keys", key)] == built.keys
            assert restored[(family + "total", key)] == len(tail)
            assert built.records_read > built.keys  # many versions per key collapsed
    finally:
        log.close()
    return builds[0]


def test_a_pod_whose_volume_was_lost_is_restored_through_a_spark_job(
    harness: Operator, tmp_path: Path
) -> None:
    log_url, router = start_app(harness, tmp_path)
    expected: collections.Counter[str] = collections.Counter()
    # Rounds with a commit between them: every round writes each word's count again, so
    # the changelog holds many versions per key (what a build collapses).
    for round_ in range(ROUNDS):
        produce(log_url, expected, 200, seed=round_)
        wait_for(lambda: counts_exact(router, expected), "exact counts", 60)
    lose_the_volume(harness)
    lost_at = time.monotonic()

    def job() -> dict[str, Any] | None:
        jobs = harness.objects("batch", "jobs")
        return jobs[0] if jobs else None

    try:
        launched = wait_for(job, "a restore Job", 120)
    except (AssertionError, TimeoutError):
        print_failure(harness)
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
        wait_for(lambda: ready(harness) and counts_exact(router, expected), "restored, exact", 360)
    except (AssertionError, TimeoutError):
        print_failure(harness)
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
