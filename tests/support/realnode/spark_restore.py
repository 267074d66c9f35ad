"""A Spark restore Job with executor pods on the real nodes, as the operator renders it.

Shared by the ``realnode`` test (tests/e2e/test_realnode_spark_restore.py) and
``make bench-restore``'s Kubernetes run. :func:`start` imports the restore image into every
node, starts a provisioner whose ``ReadWriteMany`` volumes every node mounts
(docs/nodes.md), a project Kafka broker on the bridge address, installs the operator's chart
with no operator replica (so the executor ClusterRole and the admission policies executor pods
must pass are the chart's own), and creates in a namespace
enforcing Pod Security ``restricted`` the StreamApp (the image policy's params) and what the
operator's pure functions render for a
StreamApp with ``spec.restore.master: k8s://https://kubernetes.default.svc``: its
ConfigMap, the build claim, the restore ServiceAccount, its RoleBinding to the chart's
executor ClusterRole and the executor pod template; then a changelog on the broker.
:meth:`SparkRestore.job` is the Job ``plan_restores`` launches for pods that report
partitions ``restorePending``, and :meth:`SparkRestore.observe` the operator's judgement of
it (the ``Restoring`` condition and ``status.restoreJobs``).

Not the operator process itself: no app pods report ``restorePending``; the reports are
made here (tests/e2e/test_operator_restore_job.py runs that loop on the kubelet stand-in).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eddyline_operator.reconcile import names, objects, restore_job
from eddyline_operator.reconcile.plan import parse_app
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.membership import RESTORE_PENDING, MemberReport, StoreCopy
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.spec import RestoreJobState, RestoreJobStatus, StreamApp, load_manifest
from tests.integration.restore.restore_changelogs import changelog_records
from tests.support.control_plane.client import ApiError, Client, wait_until
from tests.support.control_plane.operator import helm, rendered
from tests.support.control_plane.provisioner import LocalProvisioner
from tests.support.images import Images
from tests.support.kafka.broker import KafkaCluster
from tests.support.realnode import host
from tests.support.realnode.cluster import API_ADDRESS, RealCluster

# The name `make restore-image` tags (docs/containers.md).
RESTORE_IMAGE = "ghcr.io/eddyline/eddyline-restore:0.1.0"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
APP = "counts"
STORE = "totals"
Obj = dict[str, Any]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def import_image(cluster: RealCluster, images: Images, into: Path, image: str) -> None:
    """``docker save`` of ``image``, ``ctr -n k8s.io images import`` on every node."""
    archive = into / "image.tar"
    started = time.monotonic()
    saved = images.docker("save", "-o", str(archive), image, timeout=900)
    assert saved.returncode == 0, f"docker save failed:\n{saved.stderr}"
    seconds = {"docker save": time.monotonic() - started}
    for node in cluster.nodes.values():
        started = time.monotonic()
        node.ctr("images", "import", str(archive))
        seconds[f"import {node.spec.name}"] = time.monotonic() - started
    size = archive.stat().st_size
    archive.unlink()
    print(f"{image} ({size / 2**20:.0f} MiB archive), seconds:",
          json.dumps({step: round(value, 1) for step, value in seconds.items()}))  # fmt: skip


# The chart's release: its fullname is the release's name, so its executor ClusterRole is
# the one the operator binds by default (restore_job.DEFAULT_EXECUTOR_ROLE).
RELEASE = "eddyline-operator"


def install_chart(cluster: RealCluster, root: Path, namespace: str) -> None:
    """The chart, as a user installs it: the executor ClusterRole (templates/rbac.yaml) and
    the admission policies (templates/admission.yaml) are what the driver and its executors
    meet. The operator itself runs no replica: the test makes its children."""
    (result,) = helm(
        cluster.plane.admin_kubeconfig, root / "helm-home", namespace, RELEASE,
        {"action": "install", "values": {"replicas": 1, "watchNamespaces": [namespace]}},
    )  # fmt: skip
    if "error" in result:
        raise RuntimeError(f"helm install of the chart failed: {result['error']}")
    objects = rendered(result)
    # The chart wants a replica; none runs (its image is not on the nodes, and the test is
    # the operator here).
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    cluster.admin().patch(
        f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment['metadata']['name']}/scale",
        {"spec": {"replicas": 0}},
    )
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for wanted in (
        ("ClusterRole", restore_job.DEFAULT_EXECUTOR_ROLE),
        ("ValidatingAdmissionPolicy", f"{RELEASE}-restore-executors"),
        ("ValidatingAdmissionPolicy", f"{RELEASE}-restore-executor-image"),
    ):
        if wanted not in kinds:
            raise RuntimeError(f"the chart rendered no {wanted[0]} {wanted[1]}")


def uninstall_chart(cluster: RealCluster, root: Path, namespace: str) -> None:
    helm(cluster.plane.admin_kubeconfig, root / "helm-home", namespace, RELEASE,
         {"action": "uninstall"})  # fmt: skip


def streamapp(namespace: str, bootstrap: str, executors: int) -> Obj:
    return {
        "apiVersion": "eddyline.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": {"name": APP, "namespace": namespace},
        "spec": {
            "topology": {"ref": "wordcount:topology"},
            "log": {"url": f"kafka://{bootstrap}"},
            "restore": {
                "when": "WhenLagAbove",
                "lagAbove": 1000,
                "master": "k8s://https://kubernetes.default.svc",
                "executors": executors,
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


def _try_create(admin: Client, path: str, obj: Obj) -> Obj | None:
    """Created, or None while the API server does not serve the kind yet (404)."""
    try:
        return admin.create(path, obj)
    except ApiError as error:
        if error.code == 404:
            return None
        raise


_PLURALS = {
    "Job": "jobs",
    "ConfigMap": "configmaps",
    "ServiceAccount": "serviceaccounts",
    "RoleBinding": "rolebindings",
    "PersistentVolumeClaim": "persistentvolumeclaims",
}


def create(admin: Client, namespace: str, obj: Obj) -> Obj:
    group, _, version = obj["apiVersion"].rpartition("/")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    return admin.create(f"{base}/namespaces/{namespace}/{_PLURALS[obj['kind']]}", obj)


@dataclass
class SparkRestore:
    cluster: RealCluster
    admin: Client
    namespace: str
    bootstrap: str
    owner: Obj
    log: KafkaLog
    application_id: str
    claim_dir: Path
    root: Path
    records: int
    attempts: int = field(default=0)

    def app(self, executors: int = 2) -> StreamApp:
        return parse_app(streamapp(self.namespace, self.bootstrap, executors))

    def changelog(self, partition: int) -> TopicPartition:
        return TopicPartition(f"{self.application_id}-{STORE}-changelog", partition)

    def job(self, partitions: list[int], executors: int = 2) -> Obj:
        """The restore Job ``plan_restores`` launches for pods reporting these partitions
        pending (each call a new attempt, so a new Job name)."""
        self.attempts += 1
        copies = {p: StoreCopy(RESTORE_PENDING, self.records) for p in partitions}
        reports = {
            f"{APP}-0": MemberReport(
                member=f"{APP}-0", topology_hash="h", tasks=frozenset(), stateful=frozenset(),
                stores={STORE: copies}, ready=False,
            )
        }  # fmt: skip
        previous = [
            RestoreJobStatus(
                name=f"earlier-{n}", store=STORE, state=RestoreJobState.FAILED,
                startedAt="2020-01-01T00:00:00Z", finishedAt="2020-01-01T00:00:00Z",
            )
            for n in range(self.attempts - 1)
        ]  # fmt: skip
        app = self.app(executors)
        plan = restore_job.plan_restores(
            app, self.namespace, self.owner, reports=reports, jobs=[], job_pods=[],
            previous=previous, image=RESTORE_IMAGE, log_node=None, embedded_log=False,
            log_url=app.spec.log.url, now=now(),
        )  # fmt: skip
        (job,) = plan.create
        return job

    def observe(self, job: Obj) -> restore_job.RestorePlan:
        """The operator's view of the Job: the Restoring condition, status.restoreJobs."""
        name = job["metadata"]["name"]
        stored = self.admin.get(f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{name}")
        assert stored is not None, f"Job {name} is gone"
        app = self.app()
        return restore_job.plan_restores(
            app, self.namespace, self.owner, reports={}, jobs=[stored],
            job_pods=self.pods(restore_job.selector_string(APP)), previous=[],
            image=RESTORE_IMAGE, log_node=None, embedded_log=False, log_url=app.spec.log.url,
            now=now(),
        )  # fmt: skip

    def finished(self, job: Obj) -> RestoreJobStatus | None:
        (entry,) = self.observe(job).jobs
        return None if entry.state is RestoreJobState.RUNNING else entry

    def pods(self, selector: str) -> list[Obj]:
        found = self.admin.get(f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={selector}")
        return list((found or {}).get("items", []))

    def executors(self) -> list[Obj]:
        return self.pods("spark-role=executor")


@contextlib.contextmanager
def started(
    cluster: RealCluster,
    images: Images,
    root: Path,
    *,
    namespace: str,
    partitions: int,
    per_partition: int,
    keys: int,
) -> Iterator[SparkRestore]:
    """Everything above, torn down on exit (the namespace, the broker, the provisioner)."""
    # The test's tmp_path exists already; the benchmark passes a directory of its own.
    root.mkdir(parents=True, exist_ok=True)
    import_image(cluster, images, root, RESTORE_IMAGE)
    admin = cluster.admin()
    provisioner = LocalProvisioner(admin, host.DATA / "volumes", shared_across_nodes=True)
    provisioner.start()
    kafka = KafkaCluster(root / "kafka", 1, host=API_ADDRESS).start()
    log = KafkaLog.open(f"kafka://{kafka.bootstrap}", {})
    try:
        admin.ensure("/api/v1/namespaces", {"metadata": {"name": namespace, "labels": RESTRICTED}})
        install_chart(cluster, root, namespace)
        # The owner the operator gives every child is the StreamApp; a ConfigMap here (no
        # CRD on this cluster), which the garbage collector finds, so the children stay.
        anchor = admin.create(
            f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": f"{APP}-owner"}}
        )
        owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": anchor["metadata"]["name"],
                 "uid": anchor["metadata"]["uid"], "controller": True}  # fmt: skip
        manifest = streamapp(namespace, kafka.bootstrap, 2)
        # The image policy's params: the namespace's StreamApps (no operator runs: inert).
        wait_until(
            lambda: admin.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                              "streamapps.eddyline.dev"),
            "the StreamApp CRD", 60,
        )  # fmt: skip
        wait_until(
            lambda: _try_create(admin, f"/apis/eddyline.dev/v1alpha1/namespaces/{namespace}"
                                "/streamapps", manifest),
            "the StreamApp created", 60,
        )  # fmt: skip
        app = parse_app(manifest)
        children = [objects.config_map(app, namespace, owner)]
        children += restore_job.owned_objects(app, namespace, owner, embedded_log=False)
        for child in children:
            create(admin, namespace, child)
        rendered = root / "streamapp.yaml"
        rendered.write_text(children[0]["data"][names.MANIFEST_KEY])
        application_id = load_manifest(rendered).streams_config().application_id
        spark = SparkRestore(
            cluster=cluster, admin=admin, namespace=namespace, bootstrap=kafka.bootstrap,
            owner=owner, log=log, application_id=application_id,
            claim_dir=provisioner.directory(namespace, restore_job.claim_name(APP)), root=root,
            records=partitions * per_partition,
        )  # fmt: skip
        log.create_topic(spark.changelog(0).topic, partitions, compacted=True)
        began = time.monotonic()
        for partition in range(partitions):
            # changelog_records' keyless records are skipped: a compacted topic takes keys only.
            records = [
                r for r in changelog_records(partition, per_partition, keys) if r.key is not None
            ]
            for start in range(0, len(records), 50_000):
                log.produce(spark.changelog(partition), records[start : start + 50_000])
        print(f"{partitions * per_partition:,} changelog records produced in "
              f"{time.monotonic() - began:.1f} s")  # fmt: skip
        yield spark
    finally:
        log.close()
        # Before the namespace: Helm keeps its release record there.
        uninstall_chart(cluster, root, namespace)
        try:
            admin.delete(f"/api/v1/namespaces/{namespace}")
        except ApiError as error:
            if error.code != 404:
                raise
        kafka.stop()
        provisioner.stop()
