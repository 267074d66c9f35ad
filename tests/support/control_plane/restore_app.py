"""The word count on one pod with ``spec.restore`` set, for the e2e tests of restore Jobs.

What ``tests/e2e/test_operator_restore_job.py`` (a lost volume restored through a Spark Job)
and ``tests/e2e/test_operator_warmup_restore.py`` (warm-ups seeded by one) share on the real
control plane: ``examples/wordcount`` under its own name on a SQLite log in a claim of its
own, one pod, no standbys, the ``spec.restore`` each test sets; its input in rounds that each
rewrite every word's count (a changelog worth building); the restore Job the operator
launches, the builds it leaves in the restore claim, and the pods' restore metrics.
"""

from __future__ import annotations

import random
import re
import shutil
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from eddyline_runtime.partitions import TaskId
from eddyline_runtime.query.client import QueryRouter
from tests.support.cluster_word_count import create_input_topic, produce_lines, random_lines
from tests.support.control_plane.operator import Operator
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[3]
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
APP = "wordcount"  # the example's own name
STORE = "word-counts"
WORDS = [f"w{index:02d}" for index in range(40)]
# A bound for a broken run on a loaded 2-core machine, not an expectation.
READY_TIMEOUT = 180
_RESTORE_METRIC = re.compile(r"eddyline_stream_state_metrics_(restore_\w+)\{(.*)\} (\S+)$")


def require_java() -> None:
    """The ``before`` of the modules' operator fixture: a build runs Spark on a JVM."""
    if shutil.which("java") is None:
        raise RuntimeError("the Spark build needs Java: install a JDK 17 (`make setup` says how)")


def claim_dir(harness: Operator, claim: str) -> Path:
    """Where the provisioner keeps ``claim`` of the harness's namespace on this machine."""
    assert harness.cluster.provisioner is not None
    return harness.cluster.provisioner.directory(harness.namespace, claim)


def ready(harness: Operator, replicas: int) -> bool:
    status = harness.app(APP).get("status", {})
    found = harness.condition(APP, "Ready")
    return (
        status.get("readyReplicas") == replicas and found is not None and found["status"] == "True"
    )


def print_failure(harness: Operator) -> None:
    """The operator's view of the app and the end of every pod's log (the Job's too)."""
    print(harness.describe_failure(APP))
    kubelets = harness.cluster.kubelets
    assert kubelets is not None
    for pod in harness.objects("", "pods"):
        print(kubelets.pod_log(harness.namespace, pod["metadata"]["name"])[-4000:])


def start_one_pod(
    harness: Operator, tmp_path: Path, restore: dict[str, Any]
) -> tuple[str, QueryRouter]:
    """The word count on one pod with no standbys and ``spec.restore`` = ``restore``, its log
    a SQLite file in the claim ``<app>-log``; returns the log's URL and a router on the query
    Service once the pod is ready."""
    log_claim = claim_dir(harness, f"{APP}-log")
    log_claim.mkdir(parents=True)
    log_url = f"sqlite:///{log_claim}/log.db"
    create_input_topic(log_url)
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["spec"]["replicas"] = 1
    # A standby of a task would wait for a build as well (and the tests want none).
    document["spec"]["config"]["num.standby.replicas"] = 0
    document["spec"]["restore"] = restore
    manifest = tmp_path / "streamapp.yaml"
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    harness.wait_watching()
    harness.kubectl("apply", "-f", str(manifest))
    try:
        wait_for(lambda: ready(harness, 1), "the first pod ready", READY_TIMEOUT)
    except (AssertionError, TimeoutError):
        print_failure(harness)
        raise
    service = harness.get("", "services", f"{APP}-query")
    assert service is not None
    return log_url, QueryRouter([f"{service['spec']['clusterIP']}:7070"], timeout=2)


def produce_round(log_url: str, expected: Counter[str], seed: int, lines: int = 200) -> None:
    """``lines`` random lines of the 40 words: every word's count is written again."""
    batch = random_lines(random.Random(seed), WORDS, lines, most=6)
    expected.update(word for line in batch for word in line.split())
    produce_lines(log_url, batch)


def restore_job(harness: Operator) -> dict[str, Any] | None:
    """The first Job of the namespace (the restore Job the operator launched), or None."""
    jobs = harness.objects("batch", "jobs")
    return jobs[0] if jobs else None


def builds(harness: Operator) -> list[Path]:
    """The store's builds in the restore claim, oldest first (their names are timestamps)."""
    return sorted((claim_dir(harness, f"{APP}-restore") / APP / STORE).glob("2*"))


def restore_metrics(pod_ip: str) -> dict[tuple[str, TaskId], float]:
    """(metric, task) -> value for the store's restore metrics of the pod (``restore_total``,
    ``restore_ingested_offset``, ...)."""
    with urllib.request.urlopen(f"http://{pod_ip}:7070/metrics", timeout=5) as response:
        text = response.read().decode()
    found: dict[tuple[str, TaskId], float] = {}
    for line in text.splitlines():
        match = _RESTORE_METRIC.match(line)
        if match and f'store="{STORE}"' in match.group(2):
            task = re.search(r'task_id="(\d+_\d+)"', match.group(2))
            assert task is not None
            found[(match.group(1), TaskId.parse(task.group(1)))] = float(match.group(3))
    return found
