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
import random
import re
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_runtime.log import open_log
from eddyline_runtime.membership import Membership
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.query.client import QueryRouter
from eddyline_runtime.restore.manifest import read_manifest
from tests.support.cluster_word_count import counts_exact, produce_lines, random_lines
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Operator
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "warmup-restore"
APP = "wordcount"
STORE = "word-counts"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
WORDS = [f"w{index:02d}" for index in range(40)]
NEW_POD = f"{APP}-1"


@pytest.fixture(scope="module")
def harness(control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    if shutil.which("java") is None:
        raise RuntimeError("the Spark build needs Java: install a JDK 17 (`make setup` says how)")
    running = Operator(control_plane, tmp_path_factory.mktemp("warmup"), NAMESPACE)
    running.install()
    running.start()
    try:
        yield running
    finally:
        running.kubectl.run("delete", "sapp", "--all", "--timeout=60s")
        running.stop()


def claim_dir(harness: Operator, claim: str) -> Path:
    assert harness.cluster.provisioner is not None
    return harness.cluster.provisioner.directory(NAMESPACE, claim)


def membership(harness: Operator) -> Membership:
    found = harness.get("", "configmaps", f"{APP}-membership")
    assert found is not None
    return Membership.from_json(json.loads(found["data"]["membership.json"]))


def ready(harness: Operator, replicas: int) -> bool:
    status = harness.app(APP).get("status", {})
    found = harness.condition(APP, "Ready")
    return (
        status.get("readyReplicas") == replicas and found is not None and found["status"] == "True"
    )


def restore_metrics(pod_ip: str) -> dict[tuple[str, str], float]:
    """(metric, task) -> value for the store's restore and standby metrics."""
    with urllib.request.urlopen(f"http://{pod_ip}:7070/metrics", timeout=5) as response:
        text = response.read().decode()
    found: dict[tuple[str, str], float] = {}
    pattern = r"eddyline_stream_state_metrics_(restore_\w+)\{(.*)\} (\S+)$"
    for line in text.splitlines():
        match = re.match(pattern, line)
        if match and f'store="{STORE}"' in match.group(2):
            task = re.search(r'task_id="(\d+_\d+)"', match.group(2))
            assert task is not None
            found[(match.group(1), task.group(1))] = float(match.group(3))
    return found


def print_failure(harness: Operator) -> None:
    print(harness.describe_failure(APP))
    kubelets = harness.cluster.kubelets
    assert kubelets is not None
    for pod in harness.objects("", "pods"):
        print(kubelets.pod_log(NAMESPACE, pod["metadata"]["name"])[-4000:])


def start_one_pod(
    harness: Operator, tmp_path: Path
) -> tuple[str, QueryRouter, collections.Counter[str]]:
    """The word count on one pod with ``spec.restore.when: Always``, having counted a few
    rounds of input (each rewrites every word's count: a changelog worth building)."""
    log_claim = claim_dir(harness, f"{APP}-log")
    log_claim.mkdir(parents=True)
    log_url = f"sqlite:///{log_claim}/log.db"
    log = open_log(log_url)
    log.create_topic("text-lines", 4)
    log.close()
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["spec"]["replicas"] = 1
    # Warm-ups only: a standby of the tasks that stay would wait for a build as well.
    document["spec"]["config"]["num.standby.replicas"] = 0
    document["spec"]["restore"] = {"when": "Always", "master": "local[2]", "waitSeconds": 300}
    manifest = tmp_path / "streamapp.yaml"
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    harness.wait_watching()
    harness.kubectl("apply", "-f", str(manifest))
    try:
        wait_for(lambda: ready(harness, 1), "the first pod ready", 180)
    except (AssertionError, TimeoutError):
        print_failure(harness)
        raise
    service = harness.get("", "services", f"{APP}-query")
    assert service is not None
    router = QueryRouter([f"{service['spec']['clusterIP']}:7070"], timeout=2)
    expected: collections.Counter[str] = collections.Counter()
    for seed in range(3):  # each round rewrites every word's count: a changelog to build
        batch = random_lines(random.Random(seed), WORDS, 200, most=6)
        expected.update(word for line in batch for word in line.split())
        produce_lines(log_url, batch)
        wait_for(lambda: counts_exact(router, expected), "exact counts", 60)

    return log_url, router, expected


@pytest.mark.timeout(600)  # pods, a Spark Job's JVM and the moves on 2 busy cores (90-245 s)
def test_scaling_out_seeds_the_new_pods_warm_ups_from_a_spark_job(
    harness: Operator, tmp_path: Path
) -> None:
    log_url, router, expected = start_one_pod(harness, tmp_path)
    assert "scaled" in harness.kubectl("scale", "sapp", APP, "--replicas=2")

    def warming() -> frozenset[TaskId] | None:
        found = membership(harness).assignment.warmup.get(NEW_POD)
        return found or None

    try:
        warm_ups = wait_for(warming, f"warm-ups on {NEW_POD}", 180)

        def job() -> dict[str, Any] | None:
            jobs = harness.objects("batch", "jobs")
            return jobs[0] if jobs else None

        launched = wait_for(job, "a restore Job for the warm-ups", 120)
    except (AssertionError, TimeoutError):
        print_failure(harness)
        raise
    args = launched["spec"]["template"]["spec"]["containers"][0]["args"]
    partitions = sorted(t.partition for t in warm_ups)
    # Built: exactly the partitions the new pod warms up (the first pod holds the others).
    assert args[args.index("--partitions") + 1] == ",".join(map(str, partitions))
    # Input keeps coming while the warm-ups wait: the first pod counts it.
    batch = random_lines(random.Random(99), WORDS, 200, most=6)
    expected.update(word for line in batch for word in line.split())
    produce_lines(log_url, batch)

    def moved() -> bool:
        assignment = membership(harness).assignment
        mine = assignment.active.get(NEW_POD, frozenset())
        return bool(warm_ups <= mine) and not assignment.warmup_count

    try:
        wait_for(moved, "the warmed-up tasks moved to the new pod", 420)
        wait_for(lambda: ready(harness, 2) and counts_exact(router, expected), "exact", 120)
    except (AssertionError, TimeoutError):
        print_failure(harness)
        raise
    assert len(harness.objects("batch", "jobs")) == 1
    builds = sorted((claim_dir(harness, f"{APP}-restore") / APP / STORE).glob("2*"))
    assert len(builds) == 1, builds
    pod_ip = harness.pods(APP)[NEW_POD]["status"]["podIP"]
    restored = restore_metrics(pod_ip)
    kubelets = harness.cluster.kubelets
    assert kubelets is not None
    pod_log = kubelets.pod_log(NAMESPACE, NEW_POD)
    offsets = {}
    for task in sorted(warm_ups):
        built = read_manifest(builds[0] / f"partition-{task.partition}.manifest.json")
        offsets[str(task)] = built.offset
        # The warm-up was seeded from the build and replayed the changelog after it...
        assert (
            f"standby of task {task} store {STORE}: ingested" in pod_log
            and f"replaying the changelog after offset {built.offset}" in pod_log
        ), pod_log[-4000:]
        # ...so the move itself restored nothing.
        assert restored[("restore_total", str(task))] == 0, restored
    print(f"warm-ups seeded from build {builds[0].name} at offsets {offsets}")
