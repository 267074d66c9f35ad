"""A Spark restore Job on Kubernetes for real: the driver in the Job's pod, executors as pods.

On the real nodes (the ``realnode`` tier), with a project Kafka broker on the bridge address
(tests/support/realnode/spark_restore.py sets it all up): the restore Job the operator
renders for ``spec.restore.master: k8s://https://kubernetes.default.svc`` runs spark-submit
in client mode in its pod; Spark creates two executor pods from the restore image and the
operator's pod template, on two nodes, owned by the driver pod; they read a changelog of 1M
records from the broker and write SST files to the build claim, which every node mounts (the
provisioner's stand-in for shared storage, docs/nodes.md). One executor pod is deleted
mid-build; Spark replaces it and the stores ingested from the build equal stores replayed
from the changelog, byte for byte. The operator's own judgement of the Job
(``plan_restores`` on the Job and its pods as the API server returns them) gives the
``Restoring`` condition and ``status.restoreJobs``. A driver whose RoleBinding is gone
cannot read its own pod, and its Job fails with a verdict that says so. The API calls the
restore ServiceAccount made come from the API server's audit log (docs/operator.md).

Not the operator process itself: the Job is the one ``plan_restores`` launches for reports
of pending partitions made here, not by app pods (test_operator_restore_job.py runs that
loop on the kubelet stand-in).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from eddyline_operator.reconcile import restore_job
from eddyline_runtime.restore.ingest.sst_restore import ingest_latest_manifest
from tests.integration.restore.restore_changelogs import replay_store, store_contents
from tests.support.control_plane.client import wait_until
from tests.support.images import Images
from tests.support.realnode import audit, spark_restore
from tests.support.realnode.cluster import RealCluster
from tests.support.realnode.spark_restore import APP, RESTORE_IMAGE, STORE, SparkRestore

pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(1800)]

NAMESPACE = "spark-restore"
# Two changelog partitions of 505,000 records (1% keyless, which a compacted topic does not
# take): 1M records on the broker, ~10 versions per key, a quarter of them tombstones.
PARTITIONS = 2
PER_PARTITION = 505_000
KEYS = 50_000
# Bounds for a broken run on a loaded 2-core machine, not expectations.
EXECUTORS_TIMEOUT = 300
BUILD_TIMEOUT = 900


@pytest.fixture(scope="module")
def spark(
    real_cluster: RealCluster, images: Images, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SparkRestore]:
    with spark_restore.started(
        real_cluster, images, tmp_path_factory.mktemp("realnode-spark"), namespace=NAMESPACE,
        partitions=PARTITIONS, per_partition=PER_PARTITION, keys=KEYS,
    ) as started:  # fmt: skip
        yield started


def driver_log(spark: SparkRestore, job: str) -> str:
    """The Job's driver pod's log, through the API server (from the kubelet)."""
    (pod,) = spark.pods(f"{restore_job.LABEL_JOB}={job},{restore_job.selector_string(APP)}")
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}/log"
    with spark.admin.open(path, "GET", None) as response:
        return bytes(response.read()).decode(errors="replace")


def assert_made_from_the_template(
    spark: SparkRestore, pods: list[dict[str, Any]], name: str
) -> None:
    """On two nodes, as the pod template says, owned by the driver pod."""
    assert len({p["spec"]["nodeName"] for p in pods}) == 2, [p["spec"]["nodeName"] for p in pods]
    selector = f"{restore_job.LABEL_JOB}={name},{restore_job.selector_string(APP)}"
    (driver_pod,) = spark.pods(selector)
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
        assert spec["automountServiceAccountToken"] is False
        # The only volumes: Spark's local dir (an emptyDir at /tmp) and the app's claims.
        assert all("emptyDir" in v or "persistentVolumeClaim" in v for v in spec["volumes"])
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("Pod", driver_pod["metadata"]["uid"])
        # The admission policy requires the controller flag: Spark sets it.
        assert owner.get("controller") is True, owner
        assert pod["metadata"]["labels"][restore_job.LABEL_JOB] == name


def assert_build_equals_replay(spark: SparkRestore) -> None:
    # Byte for byte: each partition's store from the build equals a replayed one.
    for partition in range(PARTITIONS):
        changelog = spark.changelog(partition)
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
    job = spark.job(list(range(PARTITIONS)))
    name = job["metadata"]["name"]
    spark_restore.create(admin, NAMESPACE, job)
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
    # One executor goes mid-build (its pod deleted, as a node drain or an eviction does) once
    # a task runs on it: Spark asks for a replacement and reruns the lost tasks.
    victim = pods[0]
    victim_id = victim["metadata"]["labels"]["spark-exec-id"]
    wait_until(
        lambda: f",executor {victim_id}," in driver_log(spark, name) or spark.finished(job),
        f"a task on executor {victim_id}", EXECUTORS_TIMEOUT,
    )  # fmt: skip
    assert spark.finished(job) is None, "the build finished before an executor could be lost"
    admin.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{victim['metadata']['name']}")
    before = {p["metadata"]["name"] for p in pods}
    replacement = wait_until(
        lambda: [p for p in spark.executors() if p["metadata"]["name"] not in before],
        "a replacement executor", EXECUTORS_TIMEOUT,
    )  # fmt: skip
    new_id = replacement[0]["metadata"]["labels"]["spark-exec-id"]
    try:
        entry = wait_until(lambda: spark.finished(job), f"Job {name} to finish", BUILD_TIMEOUT)
    except Exception:
        print(spark.cluster.failure_report()[-5000:])
        raise
    plan = spark.observe(job)
    assert entry.state.value == "Succeeded", entry.message
    # The replacement ran tasks of this build (the lost executor's among them).
    assert f"(executor {new_id})" in driver_log(spark, name)
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
    # Every call fits the chart's executor role (pods only) and none was refused.
    assert {resource for _, resource in calls} == {"pods"}, calls
    assert all(code < 400 for codes in calls.values() for code in codes), calls


def test_a_driver_that_may_not_read_its_pod_fails_the_job_naming_why(
    spark: SparkRestore,
) -> None:
    binding = restore_job.service_account_name(APP)
    spark.admin.delete(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings/{binding}"
    )
    job = spark.job([0])
    spark_restore.create(spark.admin, NAMESPACE, job)
    entry = wait_until(lambda: spark.finished(job), "the Job to fail", BUILD_TIMEOUT)
    assert entry.state.value == "Failed"
    assert "forbidden" in entry.message, entry.message
    plan = spark.observe(job)
    assert plan.condition is not None and plan.condition.reason == "BuildFailed"
    assert "forbidden" in plan.condition.message
    assert not spark.executors()
    print("the Restoring condition:", plan.condition.message)
