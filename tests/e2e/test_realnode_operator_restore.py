"""The whole restore loop on real nodes, driven by the operator process: executor pods build
what a pod lost, the pod ingests it.

``test_realnode_spark_restore.py`` runs the restore Job the operator would render, created by
the test; here nothing stands between the pieces. The chart's operator (release
``edl-restore``) runs as a pod, the word count runs as one pod of the examples image on a
project Kafka broker with ``spec.restore`` set to ``master: k8s://https://kubernetes.default.svc``
(no standbys, so a lost store has no other copy), and its claims come from the provisioner
whose ``ReadWriteMany`` volumes every node mounts (docs/nodes.md). The pod's state claim is
wiped under it (its process frozen, the claim emptied, the process killed: the kubelet
restarts the container on an empty claim); the restarted pod finds every store partition
missing with a changelog above ``lagAbove``, reports them ``restorePending``; the operator
launches the Job, whose driver makes an executor pod from the restore image; the pod ingests
the build and the counts come back exact. The Restoring condition, ``status.restoreJobs`` and
the pod's restore metrics show each step.

Then the master is pointed at an address nothing serves (in the Service range, which the
host black-holes, so every connection attempt times out as it would to an unroutable API
server): the next lost store's Job fails within Spark's bound, the Restoring condition says
``BuildFailed`` naming the address and the error Spark printed, and the pod replays the
changelog instead, exact again.

Kept small (a few hundred lines of input): this is the correctness loop; the 1M-record build
is test_realnode_spark_restore.py's.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from eddyline_operator.reconcile import restore_executors, restore_job
from eddyline_runtime.query.client import QueryRouter
from tests.e2e.test_realnode_pods import container_id
from tests.support.cluster_word_count import (
    counts_exact,
    first_mismatch,
    produce_lines,
    random_lines,
)
from tests.support.control_plane.client import ApiError, Client, wait_until
from tests.support.control_plane.operator import Kubectl, helm
from tests.support.control_plane.provisioner import LocalProvisioner
from tests.support.control_plane.restore_app import restore_metrics
from tests.support.images import Images
from tests.support.kafka.broker import KafkaCluster
from tests.support.kafka.streamapp import create_input, manifest
from tests.support.realnode import host
from tests.support.realnode.cluster import API_ADDRESS, RealCluster
from tests.support.realnode.eddyline_images import ensure_images
from tests.support.realnode.spark_restore import RESTORE_IMAGE, RESTRICTED

pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(1800)]

NAMESPACE = "eddyline-restore"
# Not another module's release: the chart's ClusterRoles are named after the release.
RELEASE = "edl-restore"
DEPLOYMENT = f"{RELEASE}-eddyline-operator"
APP = "wc-restore"
SECRET = "wc-restore-log"
STORE = "word-counts"
WORDS = [f"r{index:02d}" for index in range(40)]
QUERY_PORT = 7070
# Changelog records above which a missing store waits for a build. Every round of input
# rewrites each word of a partition in a commit of its own (the test waits for exact counts
# between rounds), so five rounds put at least 5 x (keys + a commit marker) records in each
# changelog partition. The hash gives partition 0 only 4 of the 40 words: 25 at least, and a
# run once had exactly 33 there (30 then left partition 0 to replay in the next run).
LAG_ABOVE = 10
ROUNDS = 5
# An address in the real-node Service range that no Service has: the host holds a blackhole
# route for the range (docs/nodes.md), so a pod's connection to it times out, as one to an
# unroutable API server does, and nothing leaves the machine.
UNREACHABLE = "10.245.255.254"
# How long the pod waits for a build, and so the restore Job's deadline.
WAIT_SECONDS = 300
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300
COUNT_TIMEOUT = 180
BUILD_TIMEOUT = 600


@dataclass
class RestoreApp:
    cluster: RealCluster
    admin: Client
    kubectl: Kubectl
    broker: KafkaCluster
    provisioner: LocalProvisioner
    expected: collections.Counter[str] = field(default_factory=collections.Counter)
    rounds: int = 0

    def path(self, resource: str, group: str = "api/v1") -> str:
        return f"/{group}/namespaces/{NAMESPACE}/{resource}"

    def app(self) -> dict[str, Any]:
        found = self.admin.get(self.path(f"streamapps/{APP}", "apis/eddyline.dev/v1alpha1"))
        if found is None:
            raise LookupError(f"StreamApp {NAMESPACE}/{APP} does not exist")
        return found

    def condition(self, kind: str) -> dict[str, Any] | None:
        conditions = self.app().get("status", {}).get("conditions", [])
        return next((dict(c) for c in conditions if c["type"] == kind), None)

    def pod(self) -> dict[str, Any] | None:
        return self.admin.get(self.path(f"pods/{APP}-0"))

    def pods(self, selector: str) -> list[dict[str, Any]]:
        found = self.admin.get(self.path(f"pods?labelSelector={selector}"))
        return list((found or {}).get("items", []))

    def jobs(self) -> list[dict[str, Any]]:
        found = self.admin.get(self.path("jobs", "apis/batch/v1"))
        return list((found or {}).get("items", []))

    def router(self) -> QueryRouter:
        pod = self.pod()
        address = (pod or {}).get("status", {}).get("podIP")
        return QueryRouter([f"{address}:{QUERY_PORT}"] if address else [], timeout=2)

    def produce_round(self) -> None:
        """200 lines of the 40 words: every word's count is written again."""
        self.rounds += 1
        batch = random_lines(random.Random(self.rounds), WORDS, 200, most=6)
        produce_lines(f"kafka://{self.broker.bootstrap}", batch)
        self.expected.update(word for line in batch for word in line.split())

    def exact(self) -> bool:
        try:
            return counts_exact(self.router(), self.expected)
        except OSError:
            return False

    def ready(self) -> bool:
        found = self.app()
        status = found.get("status", {})
        condition = self.condition("Ready")
        return bool(
            status.get("readyReplicas") == 1
            and condition is not None
            and condition["status"] == "True"
            and status.get("observedGeneration") == found["metadata"]["generation"]
        )

    def wait_exact(self, what: str, timeout: float = COUNT_TIMEOUT) -> None:
        try:
            wait_until(lambda: self.ready() and self.exact(), what, timeout)
        except TimeoutError:
            raise AssertionError(f"{what}: {self.mismatch()}\n{self.describe()}") from None

    def mismatch(self) -> str | None:
        try:
            return first_mismatch(self.router(), self.expected)
        except OSError as error:
            return str(error)

    def lose_the_state(self) -> None:
        """The pod's state claim emptied under it: its process frozen (SIGSTOP through its
        node, so it writes nothing meanwhile), the claim's contents removed, the process
        killed; the kubelet restarts the container on the empty claim."""
        pod = self.pod()
        assert pod is not None
        node = self.cluster.nodes[pod["spec"]["nodeName"]]
        pid = node.task_pid(container_id(pod))
        assert pid is not None, f"no running task for {APP}-0"
        os.kill(pid, signal.SIGSTOP)
        state = self.provisioner.directory(NAMESPACE, f"state-{APP}-0")
        removed = 0
        for entry in state.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            removed += 1
        assert removed, f"the state claim {state} held nothing"
        os.kill(pid, signal.SIGKILL)

    def remove_builds(self) -> None:
        """Every build on the build claim (its verdicts stay)."""
        claim = self.provisioner.directory(NAMESPACE, restore_job.claim_name(APP))
        builds = [b for b in (claim / APP / STORE).glob("2*") if b.is_dir()]
        assert builds, f"no build on {claim}"
        for build in builds:
            shutil.rmtree(build)

    def describe(self) -> str:
        try:
            status = json.dumps(self.app().get("status"), indent=1)
        except (LookupError, ApiError) as error:
            status = str(error)
        described = self.kubectl.run("describe", "pods")
        logs = self.kubectl.run("logs", "--tail=60", "-l", restore_job.selector_string(APP))
        return f"status: {status}\n{described.stdout[-6000:]}\nrestore Job logs:\n{logs.stdout}"


class Watcher:
    """What happens between polls: the Restoring conditions and the executor pods seen (a
    finished build's executors are deleted by its driver, so they are caught while they run)."""

    def __init__(self, app: RestoreApp) -> None:
        self.app = app
        self.restoring: list[tuple[str, str]] = []
        self.executors: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="restore-watcher", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                found = self.app.condition("Restoring")
                pods = self.app.pods(f"{restore_executors.SPARK_ROLE_LABEL}=executor")
            except (ApiError, OSError, LookupError):
                continue
            if found is not None:
                seen = (found["status"], found["reason"])
                if not self.restoring or self.restoring[-1] != seen:
                    self.restoring.append(seen)
            for pod in pods:
                self.executors[pod["metadata"]["name"]] = pod


def _deployment_ready(admin: Client) -> bool:
    deployment = admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}")
    if deployment is None:
        return False
    want = deployment["spec"]["replicas"]
    status = deployment.get("status", {})
    return bool(status.get("readyReplicas") == want == status.get("replicas"))


def app_manifest(bootstrap: str) -> dict[str, Any]:
    """The word count on the broker, one pod, no standbys, restores built by executor pods."""
    document = manifest(APP, bootstrap, SECRET)
    spec = document["spec"]
    spec["replicas"] = 1
    # A standby would be a second copy; the point is a store that has none left.
    spec["config"]["num.standby.replicas"] = 0
    del spec["standbyPlacement"]
    spec["storage"]["whenDeleted"] = "Delete"
    spec["restore"] = {
        "when": "WhenLagAbove",
        "lagAbove": LAG_ABOVE,
        "master": "k8s://https://kubernetes.default.svc",
        # One executor: executor pods at all, for the least memory and JVM start-ups (the
        # spread over two nodes is test_realnode_spark_restore.py's).
        "executors": 1,
        "executorCores": 1,
        "executorMemory": "512m",
        "image": RESTORE_IMAGE,
        "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "waitSeconds": WAIT_SECONDS,
    }
    return document


@pytest.fixture(scope="module")
def restoring_app(
    real_cluster: RealCluster, images: Images, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RestoreApp]:
    root = tmp_path_factory.mktemp("realnode-operator-restore")
    seconds: dict[str, float] = {}
    started = time.monotonic()
    ensure_images(real_cluster, images, root)
    ensure_images(real_cluster, images, root, (RESTORE_IMAGE,))
    seconds["images on the nodes"] = time.monotonic() - started
    admin = real_cluster.admin()
    provisioner = LocalProvisioner(admin, host.DATA / "volumes", shared_across_nodes=True).start()
    broker = KafkaCluster(root / "kafka", 1, host=API_ADDRESS).start()
    admin.ensure("/api/v1/namespaces", {"metadata": {"name": NAMESPACE, "labels": RESTRICTED}})
    kubeconfig = real_cluster.plane.admin_kubeconfig
    kubectl = Kubectl(kubeconfig, root / "kubectl-home", NAMESPACE)
    app = RestoreApp(real_cluster, admin, kubectl, broker, provisioner)
    try:
        create_input(broker.bootstrap)
        started = time.monotonic()
        (result,) = helm(
            kubeconfig, root / "helm", NAMESPACE, RELEASE,
            {"action": "install", "values": {"replicas": 1, "watchNamespaces": [NAMESPACE]}},
        )  # fmt: skip
        assert "error" not in result, result
        wait_until(lambda: _deployment_ready(admin), "the operator Ready", READY_TIMEOUT)
        seconds["helm install to the operator Ready"] = time.monotonic() - started
        # One broker: eddyline's topics get one replica (docs/kafka.md's client settings).
        kubectl("create", "secret", "generic", SECRET, "--from-literal=replication.factor=1")
        started = time.monotonic()
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump(app_manifest(broker.bootstrap)))
        try:
            wait_until(app.ready, "the app Ready", READY_TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"the app Ready:\n{app.describe()}") from None
        seconds["kubectl apply to the app Ready"] = time.monotonic() - started
        print("seconds:", json.dumps({step: round(value, 1) for step, value in seconds.items()}))
        yield app
    finally:
        # The app goes while its operator runs (kopf's finalizer), then the operator.
        kubectl.run("delete", "sapp", "--all", "--wait=true", timeout=READY_TIMEOUT)
        helm(kubeconfig, root / "helm", NAMESPACE, RELEASE, {"action": "uninstall"})
        kubectl.run("delete", "jobs,pods", "--all", "--wait=true", timeout=READY_TIMEOUT)
        kubectl.run("delete", "pvc", "--all", "--wait=true", timeout=READY_TIMEOUT)
        try:
            admin.delete(f"/api/v1/namespaces/{NAMESPACE}")
        except ApiError as error:
            if error.code != 404:
                raise
        broker.stop()
        provisioner.stop()


def ingested_partitions(app: RestoreApp) -> dict[int, float]:
    """Store partition -> the changelog offset the pod ingested a build at (its metric)."""
    pod = app.pod()
    assert pod is not None
    metrics = restore_metrics(pod["status"]["podIP"])
    return {
        task.partition: value
        for (metric, task), value in metrics.items()
        if metric == "restore_ingested_offset" and value >= 0
    }


def test_the_operator_restores_a_lost_store_through_executor_pods_on_real_nodes(
    restoring_app: RestoreApp,
) -> None:
    app = restoring_app
    for _ in range(ROUNDS):
        app.produce_round()
        app.wait_exact("exact counts before the loss")
    with Watcher(app) as watcher:
        lost_at = time.monotonic()
        app.lose_the_state()
        try:
            (job,) = wait_until(app.jobs, "the operator's restore Job", READY_TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"no restore Job:\n{app.describe()}") from None
        launched = time.monotonic() - lost_at
        name = job["metadata"]["name"]
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--master") + 1] == "k8s://https://kubernetes.default.svc"
        assert args[args.index("--partitions") + 1] == "0,1,2,3"
        app.wait_exact("restored, exact counts", BUILD_TIMEOUT)
        restored = time.monotonic() - lost_at

        def finished() -> dict[str, Any] | None:
            found = app.condition("Restoring")
            return found if found is not None and found["status"] == "False" else None

        done = wait_until(finished, "Restoring=False", COUNT_TIMEOUT)
    assert done["reason"] == "BuildSucceeded", done
    assert name in done["message"], done
    # The condition went through BuildRunning (the operator's, while the Job ran).
    assert ("True", "BuildRunning") in watcher.restoring, watcher.restoring
    jobs = app.app()["status"]["restoreJobs"]
    assert [(j["name"], j["state"]) for j in jobs] == [(name, "Succeeded")], jobs
    assert sorted(jobs[0]["partitions"]) == [0, 1, 2, 3], jobs
    # Executors ran as pods of this Job, from the restore image, owned by its driver pod.
    (driver,) = app.pods(f"{restore_job.LABEL_JOB}={name},{restore_job.selector_string(APP)}")
    assert watcher.executors, "no executor pod was seen"
    for pod in watcher.executors.values():
        assert pod["metadata"]["labels"][restore_job.LABEL_JOB] == name
        assert pod["spec"]["containers"][0]["image"] == RESTORE_IMAGE
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("Pod", driver["metadata"]["uid"])
    # The pod ingested the build for every partition instead of replaying the changelog.
    assert sorted(ingested_partitions(app)) == [0, 1, 2, 3]
    events = app.kubectl("describe", "sapp", APP)
    assert "RestoreStarted" in events and "RestoreSucceeded" in events, events
    print(f"stores lost -> Job created {launched:.1f} s, exact counts {restored:.1f} s; "
          f"executors {sorted(watcher.executors)}; Restoring went {watcher.restoring}")  # fmt: skip


def test_a_driver_that_cannot_reach_the_api_server_fails_the_build_naming_why(
    restoring_app: RestoreApp,
) -> None:
    app = restoring_app
    unreachable = f"k8s://https://{UNREACHABLE}:443"
    app.kubectl(
        "patch", "sapp", APP, "--type=merge",
        "-p", json.dumps({"spec": {"restore": {"master": unreachable}}}),
    )  # fmt: skip
    app.produce_round()
    app.wait_exact("exact counts on the patched app")
    before = {j["metadata"]["name"] for j in app.jobs()}
    # The first test's build is still on the build claim, and a pod that lost its store
    # ingests whatever build covers it, then replays the tail (the first run of this test
    # found exactly that, and no second Job). Gone with it, only a new build would do.
    app.remove_builds()
    app.lose_the_state()
    lost_at = time.monotonic()
    try:
        (job,) = wait_until(
            lambda: [j for j in app.jobs() if j["metadata"]["name"] not in before],
            "a second restore Job", READY_TIMEOUT,
        )  # fmt: skip
    except TimeoutError:
        raise AssertionError(f"no second restore Job:\n{app.describe()}") from None
    name = job["metadata"]["name"]

    def failed() -> dict[str, Any] | None:
        found = app.condition("Restoring")
        ok = found is not None and found["status"] == "False" and name in found["message"]
        return found if ok else None

    try:
        done = wait_until(failed, "Restoring=False for the second Job", BUILD_TIMEOUT)
    except TimeoutError:
        raise AssertionError(f"the second Job did not end:\n{app.describe()}") from None
    took = time.monotonic() - lost_at
    print(f"unreachable master: the Job failed {took:.1f} s after the loss; "
          f"Restoring: {done['message']}")  # fmt: skip
    assert done["reason"] == "BuildFailed", done
    # The address the driver tried, and what Spark said about it.
    assert UNREACHABLE in done["message"], done
    # Spark 4.2's words (fabric8's Vert.x client): "The timeout of 10000 ms has been exceeded
    # when getting a connection to <address>:443".
    assert f"when getting a connection to {UNREACHABLE}:443" in done["message"], done
    # Spark's own bound ended it (the driver exited, its one attempt spent), not the Job's
    # deadline (activeDeadlineSeconds = waitSeconds), which would say DeadlineExceeded.
    stored = app.admin.get(app.path(f"jobs/{name}", "apis/batch/v1"))
    assert stored is not None
    assert stored["spec"]["activeDeadlineSeconds"] == WAIT_SECONDS
    reasons = [c.get("reason") for c in stored["status"].get("conditions", [])]
    assert "DeadlineExceeded" not in reasons and "BackoffLimitExceeded" in reasons, reasons
    jobs = app.app()["status"]["restoreJobs"]
    assert [j["state"] for j in jobs if j["name"] == name] == ["Failed"], jobs
    assert not [p for p in app.pods(f"{restore_job.LABEL_JOB}={name}")
                if p["metadata"]["labels"].get(restore_executors.SPARK_ROLE_LABEL)]  # fmt: skip
    # The pod replays the changelog instead, and serves exact counts again.
    app.wait_exact("exact counts after the failed build", BUILD_TIMEOUT)
