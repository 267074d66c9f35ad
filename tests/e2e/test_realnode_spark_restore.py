"""A Spark restore Job on Kubernetes for real: the driver in the Job's pod, executors as pods.

On the real nodes (the ``realnode`` tier), with a project Kafka broker on the bridge address:
the restore Job the operator renders for ``spec.restore.master: k8s://https://kubernetes.
default.svc`` (``restore_job.owned_objects`` and ``restore_job.job``, created as the operator
creates them) runs spark-submit in client mode in its pod; Spark creates two executor pods
from the restore image and the operator's pod template, on two nodes, owned by the driver
pod; they read a 1M-record changelog from the broker and write SST files to the build claim,
which every node mounts (the provisioner's stand-in for shared storage, docs/nodes.md). One
executor pod is deleted mid-build; Spark replaces it and the stores ingested from the build
equal stores replayed from the changelog, byte for byte. The operator's own judgement of the
Job (``plan_restores`` on the Job and its pods as the API server returns them) gives the
``Restoring`` condition and ``status.restoreJobs``. A driver whose RoleBinding is gone cannot
read its own pod, and its Job fails with a verdict that says so. The API calls the driver's
ServiceAccount made come from the API server's audit log (docs/operator.md).

What is not the operator process itself: the test creates the objects the operator's pure
functions render rather than running the operator with app pods that report
``restorePending`` (test_operator_restore_job.py does that on the kubelet stand-in).
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_operator.reconcile import names, objects, restore_job
from eddyline_operator.reconcile.plan import parse_app
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.membership import RESTORE_PENDING, MemberReport, StoreCopy
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.ingest.sst_restore import ingest_latest_manifest
from eddyline_runtime.spec import RestoreJobState, RestoreJobStatus, StreamApp, load_manifest
from tests.e2e.test_realnode_quickstart import RESTRICTED
from tests.integration.restore.restore_changelogs import (
    changelog_records,
    replay_store,
    store_contents,
)
from tests.support.control_plane.client import ApiError, Client, wait_until
from tests.support.control_plane.provisioner import LocalProvisioner
from tests.support.images import Images
from tests.support.kafka.broker import KafkaCluster
from tests.support.realnode import audit, host
from tests.support.realnode.cluster import API_ADDRESS, RealCluster

pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "spark-restore"
APP = "counts"
STORE = "totals"
RESTORE_IMAGE = "ghcr.io/eddyline/eddyline-restore:0.1.0"
# 1M changelog records over two partitions, 100k live keys: ten versions per key.
PARTITIONS = 2
PER_PARTITION = 500_000
KEYS = 50_000
# Bounds for a broken run on a loaded 2-core machine, not expectations.
EXECUTORS_TIMEOUT = 300
BUILD_TIMEOUT = 900
EXECUTOR_POD = {"spark-role": "executor"}


@dataclass
class SparkRestore:
    cluster: RealCluster
    admin: Client
    app: StreamApp
    owner: dict[str, Any]
    log: KafkaLog
    application_id: str
    claim_dir: Path
    root: Path

    def job(self, partitions: list[int], attempt: int) -> dict[str, Any]:
        """The restore Job the operator plans for pods reporting these partitions pending."""
        reports = {
            f"{APP}-0": MemberReport(
                member=f"{APP}-0",
                topology_hash="h",
                tasks=frozenset(),
                stateful=frozenset(),
                stores={STORE: {p: StoreCopy(RESTORE_PENDING, PER_PARTITION) for p in partitions}},
                ready=False,
            )
        }
        previous = [
            RestoreJobStatus(name=f"earlier-{n}", store=STORE, partitions=[],
                             state=RestoreJobState.FAILED,
                             message="", startedAt="2020-01-01T00:00:00Z",
                             finishedAt="2020-01-01T00:00:00Z")
            for n in range(attempt - 1)
        ]  # fmt: skip
        plan = restore_job.plan_restores(
            self.app, NAMESPACE, self.owner, reports=reports, jobs=[], job_pods=[],
            previous=previous, image=RESTORE_IMAGE, log_node=None, embedded_log=False,
            log_url=self.app.spec.log.url, now=_now(),
        )  # fmt: skip
        (job,) = plan.create
        return job

    def observe(self, job: dict[str, Any]) -> restore_job.RestorePlan:
        """The operator's view of the Job: condition and status.restoreJobs."""
        name = job["metadata"]["name"]
        stored = self.admin.get(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{name}")
        assert stored is not None
        selector = restore_job.selector_string(APP)
        pods = self.admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}")
        return restore_job.plan_restores(
            self.app, NAMESPACE, self.owner, reports={}, jobs=[stored],
            job_pods=(pods or {}).get("items", []), previous=[], image=RESTORE_IMAGE,
            log_node=None, embedded_log=False, log_url=self.app.spec.log.url, now=_now(),
        )  # fmt: skip

    def executors(self) -> list[dict[str, Any]]:
        found = self.admin.get(
            f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=spark-role=executor"
        )
        return list((found or {}).get("items", []))

    def finished(self, job: dict[str, Any]) -> RestoreJobStatus | None:
        plan = self.observe(job)
        (entry,) = plan.jobs
        return None if entry.state is RestoreJobState.RUNNING else entry


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def import_restore_image(cluster: RealCluster, images: Images, into: Path) -> None:
    archive = into / "restore-image.tar"
    started = time.monotonic()
    saved = images.docker("save", "-o", str(archive), RESTORE_IMAGE, timeout=900)
    assert saved.returncode == 0, f"docker save failed:\n{saved.stderr}"
    seconds = {"docker save": time.monotonic() - started}
    for node in cluster.nodes.values():
        started = time.monotonic()
        node.ctr("images", "import", str(archive))
        seconds[f"import {node.spec.name}"] = time.monotonic() - started
    size = archive.stat().st_size
    archive.unlink()
    print(f"restore image ({size / 2**20:.0f} MiB archive), seconds:",
          json.dumps({step: round(value, 1) for step, value in seconds.items()}))  # fmt: skip


def executor_cluster_role() -> dict[str, Any]:
    """The chart's executor ClusterRole (templates/rbac.yaml), under the name the operator
    binds by default: its rules as the chart writes them (the template's name and labels are
    Helm expressions; its rules are plain YAML)."""
    text = (REPO / "charts/eddyline-operator/templates/rbac.yaml").read_text()
    document = next(d for d in text.split("\n---") if "-restore-executor" in d)
    rules_text = document[document.index("rules:") :]
    plain = "\n".join(line for line in rules_text.splitlines() if "{{" not in line)
    rules = yaml.safe_load(plain)["rules"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": restore_job.DEFAULT_EXECUTOR_ROLE},
        "rules": rules,
    }


def streamapp(bootstrap: str) -> dict[str, Any]:
    return {
        "apiVersion": "eddyline.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": {"name": APP, "namespace": NAMESPACE},
        "spec": {
            "topology": "wordcount:topology",
            "log": {"url": f"kafka://{bootstrap}"},
            "restore": {
                "when": "WhenLagAbove",
                "lagAbove": 1000,
                "master": "k8s://https://kubernetes.default.svc",
                "executors": 2,
                "executorCores": 1,
                "executorMemory": "1g",
                "image": RESTORE_IMAGE,
                "resources": {
                    "requests": {"cpu": "250m", "memory": "1Gi"},
                    "limits": {"memory": "2Gi"},
                },
            },
        },
    }


def create(admin: Client, obj: dict[str, Any]) -> dict[str, Any]:
    kind = obj["kind"]
    group, _, version = obj["apiVersion"].rpartition("/")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    plural = {"Job": "jobs", "ConfigMap": "configmaps", "ServiceAccount": "serviceaccounts",
              "RoleBinding": "rolebindings", "PersistentVolumeClaim": "persistentvolumeclaims",
              "ClusterRole": "clusterroles"}[kind]  # fmt: skip
    namespaced = kind != "ClusterRole"
    path = f"{base}/namespaces/{NAMESPACE}/{plural}" if namespaced else f"{base}/{plural}"
    return admin.create(path, obj)


@pytest.fixture(scope="module")
def spark(
    real_cluster: RealCluster, images: Images, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SparkRestore]:
    root = tmp_path_factory.mktemp("realnode-spark")
    import_restore_image(real_cluster, images, root)
    admin = real_cluster.admin()
    provisioner = LocalProvisioner(admin, host.DATA / "volumes", shared_across_nodes=True).start()
    kafka = KafkaCluster(root / "kafka", 1, host=API_ADDRESS).start()
    log = KafkaLog.open(f"kafka://{kafka.bootstrap}", {})
    try:
        admin.ensure("/api/v1/namespaces", {"metadata": {"name": NAMESPACE, "labels": RESTRICTED}})
        admin.ensure("/apis/rbac.authorization.k8s.io/v1/clusterroles", executor_cluster_role())
        # The owner the operator would give every child (the StreamApp); a ConfigMap here, so
        # the garbage collector finds it and the children stay.
        anchor = admin.create(
            f"/api/v1/namespaces/{NAMESPACE}/configmaps", {"metadata": {"name": f"{APP}-owner"}}
        )
        owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": anchor["metadata"]["name"],
                 "uid": anchor["metadata"]["uid"], "controller": True}  # fmt: skip
        app = parse_app(streamapp(kafka.bootstrap))
        children = [objects.config_map(app, NAMESPACE, owner)]
        children += restore_job.owned_objects(app, NAMESPACE, owner, embedded_log=False)
        for child in children:
            create(admin, child)
        rendered = root / "streamapp.yaml"
        rendered.write_text(children[0]["data"][names.MANIFEST_KEY])
        application_id = load_manifest(rendered).streams_config().application_id
        topic = f"{application_id}-{STORE}-changelog"
        log.create_topic(topic, PARTITIONS, compacted=True)
        started = time.monotonic()
        for partition in range(PARTITIONS):
            records = [
                r for r in changelog_records(partition, PER_PARTITION, KEYS) if r.key is not None
            ]
            for start in range(0, len(records), 50_000):
                log.produce(TopicPartition(topic, partition), records[start : start + 50_000])
        print(f"{PARTITIONS * PER_PARTITION:,} changelog records produced in "
              f"{time.monotonic() - started:.1f} s")  # fmt: skip
        yield SparkRestore(
            cluster=real_cluster, admin=admin, app=app, owner=owner, log=log,
            application_id=application_id,
            claim_dir=provisioner.directory(NAMESPACE, restore_job.claim_name(APP)), root=root,
        )  # fmt: skip
    finally:
        log.close()
        try:
            admin.delete(f"/api/v1/namespaces/{NAMESPACE}")
        except ApiError as error:
            if error.code != 404:
                raise
        kafka.stop()
        provisioner.stop()


def assert_made_from_the_template(
    spark: SparkRestore, pods: list[dict[str, Any]], name: str
) -> None:
    """On two nodes, as the pod template says, owned by the driver pod."""
    admin = spark.admin
    assert len({p["spec"]["nodeName"] for p in pods}) == 2, [p["spec"]["nodeName"] for p in pods]
    selector = f"{restore_job.LABEL_JOB}={name},{restore_job.selector_string(APP)}"
    driver = admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}")
    assert driver is not None
    (driver_pod,) = driver["items"]
    for pod in pods:
        spec = pod["spec"]
        assert spec["serviceAccountName"] == restore_job.service_account_name(APP)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        (container,) = spec["containers"]
        assert container["image"] == RESTORE_IMAGE
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["resources"]["limits"]["cpu"] == "1"
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("Pod", driver_pod["metadata"]["uid"])
        assert pod["metadata"]["labels"][restore_job.LABEL_JOB] == name


def assert_build_equals_replay(spark: SparkRestore) -> None:
    # Byte for byte: each partition's store from the build equals a replayed one.
    for partition in range(PARTITIONS):
        changelog = TopicPartition(f"{spark.application_id}-{STORE}-changelog", partition)
        built = spark.root / f"built-{partition}" / STORE
        attempt = ingest_latest_manifest(
            spark.claim_dir, application=spark.application_id, store=STORE,
            changelog=changelog, directory=built,
            log_start=spark.log.beginning_offset(changelog),
            log_end=spark.log.end_offset(changelog),
        )  # fmt: skip
        assert attempt.refusals == () and attempt.result is not None, attempt
        replayed = spark.root / f"replayed-{partition}" / STORE
        replay_store(STORE, replayed, spark.log, changelog)
        assert store_contents(STORE, built, changelog) == store_contents(STORE, replayed, changelog)


def test_executor_pods_on_two_nodes_build_exactly_though_one_is_lost(
    spark: SparkRestore,
) -> None:
    admin = spark.admin
    job = spark.job(list(range(PARTITIONS)), attempt=1)
    name = job["metadata"]["name"]
    create(admin, job)
    running = spark.observe(job).condition
    assert running is not None and running.status is True, running

    # Two executors, Running, on two nodes, made from the template and owned by the driver.
    def two_running() -> list[dict[str, Any]] | None:
        pods = [p for p in spark.executors() if p["status"].get("phase") == "Running"]
        return pods if len(pods) >= 2 else None

    try:
        pods = wait_until(two_running, "two executor pods Running", EXECUTORS_TIMEOUT)
    except Exception:
        print(spark.observe(job).jobs[0].message)
        print(json.dumps([p["status"] for p in spark.executors()])[:4000])
        raise
    assert_made_from_the_template(spark, pods, name)
    # One executor goes mid-build (its pod deleted, as a node drain or an eviction does):
    # Spark asks for a replacement and reruns the lost tasks.
    victim = pods[0]["metadata"]["name"]
    time.sleep(5)
    assert spark.finished(job) is None, "the build finished before an executor could be lost"
    admin.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{victim}")
    wait_until(
        lambda: any(p["metadata"]["name"] not in {q["metadata"]["name"] for q in pods}
                    for p in spark.executors()) or spark.finished(job),
        "a replacement executor", EXECUTORS_TIMEOUT,
    )  # fmt: skip
    try:
        entry = wait_until(lambda: spark.finished(job), f"Job {name} to finish", BUILD_TIMEOUT)
    except Exception:
        print(spark.cluster.failure_report()[-5000:])
        raise
    plan = spark.observe(job)
    assert entry.state.value == "Succeeded", entry.message
    assert plan.condition is not None and plan.condition.status is False
    assert plan.condition.reason == "BuildSucceeded", plan.condition
    assert [j.state.value for j in plan.jobs] == ["Succeeded"]
    assert_build_equals_replay(spark)
    calls = audit.calls_by(
        spark.cluster.plane.audit_log,
        audit.service_account_user(NAMESPACE, restore_job.service_account_name(APP)),
    )
    print("API calls of the restore ServiceAccount:",
          json.dumps(sorted(f"{verb} {resource} {sorted(codes)}"
                            for (verb, resource), codes in calls.items())))  # fmt: skip
    assert ("create", "pods") in calls and ("get", "pods") in calls


def test_a_driver_that_may_not_read_its_pod_fails_the_job_naming_why(
    spark: SparkRestore,
) -> None:
    binding = restore_job.service_account_name(APP)
    spark.admin.delete(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings/{binding}"
    )
    job = spark.job([0], attempt=2)
    create(spark.admin, job)
    entry = wait_until(lambda: spark.finished(job), "the Job to fail", BUILD_TIMEOUT)
    assert entry.state.value == "Failed"
    assert "forbidden" in entry.message, entry.message
    plan = spark.observe(job)
    assert plan.condition is not None and plan.condition.reason == "BuildFailed"
    assert "forbidden" in plan.condition.message
    assert not spark.executors()
    print("the Restoring condition:", plan.condition.message)
