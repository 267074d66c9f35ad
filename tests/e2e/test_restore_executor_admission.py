"""Restore executors get the calls Spark makes and nothing more (issue 38), on the real API
server: the chart's executor ClusterRole (``templates/rbac.yaml``) and its
ValidatingAdmissionPolicy ``<release>-restore-executors`` (``templates/admission.yaml``).

Before, the role granted create/delete/patch on pods, Services, ConfigMaps and claims, so
``spec.restore.image`` (which the StreamApp's author chooses) could make any pod in the
namespace, one running as the operator's ServiceAccount included. Here the restore account
``<app>-restore`` is bound to the role as the operator binds it, and every pod is created
with server-side dry runs **with a token bound to the restore Job's pod**, as Spark's driver
makes its calls (``kubectl auth can-i`` cannot see admission policies). The release's
namespace is the apps' namespace (the operator's own account is a name there) without Pod
Security enforcement, so every refusal is the policy's and names its rule.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_operator.reconcile import restore_executors
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Kubectl, Operator

pytestmark = pytest.mark.slow

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
NAMESPACE = "restore-executors"
APP = "builder"
ACCOUNT = f"{APP}-restore"
IMAGE = "registry.example/eddyline-restore:4.2.0"
# A restore Job's pod: the Job <app>-restore-<10 hex> and the Job controller's 5 characters.
DRIVER = f"{ACCOUNT}-0123456789-bcdfg"
POLICY = "ValidatingAdmissionPolicy"


@dataclass
class Setting:
    operator: Operator
    driver: Obj  # the restore Job's pod, as the API server stored it
    as_driver: Kubectl  # a token bound to that pod, as the driver's projected token is
    token: str


def streamapp(name: str, image: str) -> str:
    document: Obj = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["metadata"] = {"name": name, "namespace": NAMESPACE}
    document["spec"]["suspend"] = True
    document["spec"]["restore"] = {
        "when": "Always",
        "master": "k8s://https://kubernetes.default.svc",
        "image": image,
    }
    return yaml.safe_dump(document)


def restricted_pod() -> Obj:
    """A pod with the executor template's security (Pod Security ``restricted``)."""
    pod = restore_executors.executor_pod_template(ACCOUNT, {})
    # The identity is each case's own (a namespace without the account has none).
    del pod["spec"]["serviceAccountName"]
    return pod


@pytest.fixture(scope="module")
def setting(control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setting]:
    operator = Operator(control_plane, tmp_path_factory.mktemp(NAMESPACE), NAMESPACE).install()
    admin, kubectl = operator.admin, operator.kubectl
    # The policy, not Pod Security, must be what refuses each pod below.
    admin.patch(
        f"/api/v1/namespaces/{NAMESPACE}",
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": None}}},
    )
    # Two apps: the policy's params are every StreamApp of the namespace and all must pass.
    kubectl("apply", "-f", "-", stdin=streamapp(APP, IMAGE))
    kubectl("apply", "-f", "-", stdin=streamapp("neighbour", "registry.example/other:1"))
    role = next(
        o["metadata"]["name"]
        for o in operator.rendered
        if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-restore-executor")
    )
    # What the operator makes for a k8s:// master (reconcile/restore_job.py).
    kubectl("create", "serviceaccount", ACCOUNT)
    kubectl(
        "create", "rolebinding", ACCOUNT, f"--clusterrole={role}",
        f"--serviceaccount={NAMESPACE}:{ACCOUNT}",
    )  # fmt: skip
    # The Job's pod, never scheduled (no node has the label): only its identity is needed.
    driver = restricted_pod()
    driver["metadata"] = {"name": DRIVER, "namespace": NAMESPACE}
    driver["spec"]["serviceAccountName"] = ACCOUNT
    driver["spec"]["nodeSelector"] = {"eddyline.dev/test": "never-scheduled"}
    driver["spec"]["containers"][0].update({"name": "restore", "image": IMAGE})
    stored = admin.create(f"/api/v1/namespaces/{NAMESPACE}/pods", driver)
    token = control_plane.plane.service_account_token(NAMESPACE, ACCOUNT, 3600, pod=stored)
    kubeconfig = control_plane.plane.token_kubeconfig(operator.root / "driver.kubeconfig", token)
    as_driver = Kubectl(kubeconfig, operator.root / "driver-home", NAMESPACE)
    yield Setting(operator, stored, as_driver, token)
    kubectl.run("delete", "sapp", "--all", "--wait=false")
    kubectl.run("delete", "pod", DRIVER, "--wait=false")


def executor_pod(driver: Obj) -> Obj:
    """An executor pod as Spark 4.2's ExecutorPodsAllocator sends it (BasicExecutorFeatureStep,
    LocalDirsFeatureStep and MountVolumesFeatureStep on the executor pod template), with the
    settings of ``reconcile/restore_executors.py``."""
    pod = restricted_pod()
    pod["metadata"] = {
        "name": "eddyline-restore-counts-5f0c1d2e3a4b5c6d-exec-1",
        "namespace": NAMESPACE,
        "labels": {
            "spark-app-selector": "spark-5f0c1d2e3a4b4c6d8e9f0a1b2c3d4e5f",
            "spark-app-name": "eddyline-restore-counts",
            "spark-exec-id": "1",
            "spark-exec-resourceprofile-id": "0",
            "spark-role": "executor",
        },
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": driver["metadata"]["name"],
                "uid": driver["metadata"]["uid"],
                "controller": True,
            }
        ],
    }
    pod["spec"].update(
        {
            "serviceAccountName": ACCOUNT,
            "restartPolicy": "Never",
            "hostname": "eddyline-restore-counts-5f0c1d2e3a4b5c6d-exec-1",
            "volumes": [
                {"name": "spark-local-dir-1", "emptyDir": {}},
                {"name": "restore", "persistentVolumeClaim": {"claimName": f"{APP}-restore"}},
                {"name": "log", "persistentVolumeClaim": {"claimName": f"{APP}-log"}},
            ],
        }
    )
    pod["spec"]["containers"][0].update(
        {
            "image": IMAGE,
            "args": ["executor"],
            "env": [
                {"name": "SPARK_EXECUTOR_ID", "value": "1"},
                {
                    "name": "SPARK_DRIVER_URL",
                    "value": "spark://CoarseGrainedScheduler@10.0.0.1:7078",
                },
            ],
            "ports": [{"name": "blockmanager", "containerPort": 7079}],
            "resources": {"requests": {"cpu": "1", "memory": "1408Mi"}},
            "volumeMounts": [
                {"name": "spark-local-dir-1", "mountPath": "/tmp"},
                {"name": "restore", "mountPath": "/var/lib/eddyline/restore"},
                {"name": "log", "mountPath": "/var/lib/eddyline/log"},
            ],
        }
    )
    return pod


def dry_run(kubectl: Kubectl, document: Obj) -> str:
    result = kubectl.run("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(document))
    return "allowed" if result.returncode == 0 else result.stderr


def container(pod: Obj) -> Obj:
    found: Obj = pod["spec"]["containers"][0]
    return found


def can_i(setting: Setting, *args: str) -> str:
    as_ = f"--as=system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
    return setting.operator.kubectl.run("auth", "can-i", *args, as_).stdout.strip()


def test_the_executor_role_grants_the_pod_calls_spark_makes_and_nothing_else(
    setting: Setting,
) -> None:
    """Before: create/delete/patch on pods, Services, ConfigMaps and claims."""
    for verb in ("get", "list", "watch", "create", "delete", "deletecollection"):
        assert can_i(setting, verb, "pods") == "yes", verb
    assert can_i(setting, "patch", "pods") == "no"
    assert can_i(setting, "update", "pods") == "no"
    for resource in ("services", "configmaps", "persistentvolumeclaims", "secrets"):
        for verb in ("create", "delete", "list"):
            assert can_i(setting, verb, resource) == "no", (verb, resource)
    assert can_i(setting, "create", "pods", "--namespace=default") == "no"


def test_a_restore_job_creates_its_executor_pods(setting: Setting) -> None:
    assert dry_run(setting.as_driver, executor_pod(setting.driver)) == "allowed"


def _no_owner(pod: Obj) -> None:
    del pod["metadata"]["ownerReferences"]


def _a_sibling_owner(pod: Obj) -> None:
    pod["metadata"]["ownerReferences"][0].update(name=f"{ACCOUNT}-9876543210-xxxxx")


def _owner_not_controller(pod: Obj) -> None:
    del pod["metadata"]["ownerReferences"][0]["controller"]


def _privilege_escalation(pod: Obj) -> None:
    # (privileged: true itself this API server refuses for everyone: --allow-privileged=false)
    container(pod)["securityContext"]["allowPrivilegeEscalation"] = True


def _capabilities_kept(pod: Obj) -> None:
    del container(pod)["securityContext"]["capabilities"]


def _a_capability(pod: Obj) -> None:
    container(pod)["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]


def _root(pod: Obj) -> None:
    pod["spec"]["securityContext"].update(runAsNonRoot=False, runAsUser=0)


def _unconfined(pod: Obj) -> None:
    pod["spec"]["securityContext"]["seccompProfile"] = {"type": "Unconfined"}


def _host_path(pod: Obj) -> None:
    pod["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})


def _host_network(pod: Obj) -> None:
    pod["spec"].update(hostNetwork=True, hostPID=True)


def _another_apps_claim(pod: Obj) -> None:
    pod["spec"]["volumes"][1]["persistentVolumeClaim"]["claimName"] = "neighbour-restore"


def _a_secret(pod: Obj) -> None:
    pod["spec"]["volumes"].append({"name": "s", "secret": {"secretName": "anything"}})


def _a_token(pod: Obj) -> None:
    pod["spec"]["automountServiceAccountToken"] = True


def _another_image(pod: Obj) -> None:
    container(pod)["image"] = "registry.example/anything:1"


def _another_image_in_an_init_container(pod: Obj) -> None:
    init = copy.deepcopy(container(pod))
    init.update(name="init", image="registry.example/anything:1")
    pod["spec"]["initContainers"] = [init]


def _the_neighbours_image(pod: Obj) -> None:
    container(pod)["image"] = "registry.example/other:1"


REFUSED: dict[str, tuple[Callable[[Obj], None], str]] = {
    "no owner": (_no_owner, "executor pods of its own Job"),
    "a pod of another Job as owner": (_a_sibling_owner, "executor pods of its own Job"),
    "an owner that is not the controller": (_owner_not_controller, "of its own Job"),
    "privilege escalation": (_privilege_escalation, "allowPrivilegeEscalation: false"),
    "capabilities kept": (_capabilities_kept, "drops ALL capabilities"),
    "an added capability": (_a_capability, "drops ALL capabilities"),
    "root": (_root, "run as non-root"),
    "seccomp Unconfined": (_unconfined, "seccomp profile RuntimeDefault or Localhost"),
    "a hostPath volume": (_host_path, "mount only emptyDir volumes"),
    "host network and PID": (_host_network, "no host network, PID or IPC"),
    "another app's claim": (_another_apps_claim, "the app's own claims"),
    "a Secret volume": (_a_secret, "mount only emptyDir volumes"),
    "an API token": (_a_token, "mount no API token"),
    "another image": (_another_image, f"the app's restore image {IMAGE}"),
    "another image in an init container": (
        _another_image_in_an_init_container,
        f"restore image {IMAGE}",
    ),
    "another app's restore image": (_the_neighbours_image, f"restore image {IMAGE}"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_restore_job_creates_nothing_but_its_executor_pods(setting: Setting, case: str) -> None:
    change, words = REFUSED[case]
    pod = executor_pod(setting.driver)
    change(pod)
    refused = dry_run(setting.as_driver, pod)
    assert POLICY in refused and words in refused, refused


def test_an_executor_pod_runs_as_the_restore_account_never_the_operators(
    setting: Setting,
) -> None:
    """The issue's dry run: before, the restore account made a pod that ran as the operator's
    ServiceAccount (so with the operator's rights)."""
    for account in (setting.operator.service_account, "default"):
        pod = executor_pod(setting.driver)
        pod["spec"]["serviceAccountName"] = account
        refused = dry_run(setting.as_driver, pod)
        assert POLICY in refused and "run as the restore account" in refused, refused


def test_a_token_not_bound_to_the_jobs_pod_creates_no_pod(setting: Setting) -> None:
    """The owner is tied to the request's token: impersonating the account (no bound pod),
    as a legacy Secret token would be, makes nothing."""
    as_ = f"--as=system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
    pod = yaml.safe_dump(executor_pod(setting.driver))
    result = setting.operator.kubectl.run("create", "--dry-run=server", as_, "-f", "-", stdin=pod)
    assert result.returncode != 0 and POLICY in result.stderr, result.stderr
    assert "executor pods of its own Job" in result.stderr


@pytest.mark.parametrize("kind", ["Service", "ConfigMap", "PersistentVolumeClaim"])
def test_a_restore_job_creates_no_service_configmap_or_claim(setting: Setting, kind: str) -> None:
    """RBAC's refusal: the role has no right on them (Spark's settings in
    reconcile/restore_executors.py make it need none)."""
    spec: dict[str, Obj] = {
        "Service": {"spec": {"ports": [{"port": 80}]}},
        "ConfigMap": {"data": {"a": "b"}},
        "PersistentVolumeClaim": {
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            }
        },
    }
    document = {"apiVersion": "v1", "kind": kind, "metadata": {"name": "grab"}, **spec[kind]}
    refused = dry_run(setting.as_driver, document)
    assert "is forbidden" in refused and f"{ACCOUNT}" in refused, refused


def test_accounts_without_the_executor_role_are_not_the_policys(setting: Setting) -> None:
    """Another *-restore account (a platform team's backup tool, say) is RBAC's business
    only: the policy asks the authorizer for the executor role's own right first."""
    kubectl = setting.operator.kubectl
    kubectl("create", "serviceaccount", "backup-restore")
    kubectl(
        "create", "rolebinding", "backup-restore", "--clusterrole=edit",
        f"--serviceaccount={NAMESPACE}:backup-restore",
    )  # fmt: skip
    pod = restricted_pod()
    pod["metadata"] = {"name": "backup", "namespace": NAMESPACE}
    container(pod)["image"] = "registry.example/backup:1"
    as_ = f"--as=system:serviceaccount:{NAMESPACE}:backup-restore"
    result = kubectl.run("create", "--dry-run=server", as_, "-f", "-", stdin=yaml.safe_dump(pod))
    assert result.returncode == 0, result.stderr


def test_spark_runs_its_executor_pods_with_the_role_and_the_policy(
    setting: Setting, control_plane: Cluster, tmp_path: Path
) -> None:
    """Spark 4.2 itself, not a pod shaped like its: a client-mode driver (a process here,
    with the Job pod's bound token) given reconcile/restore_executors.py's settings and the
    restore Job's, creates its executor pods, watches and lists them, and deletes them when it
    stops, with no call refused. The executors are never scheduled (no node has the label):
    only the driver's calls are under test."""
    token_file = tmp_path / "token"
    token_file.write_text(setting.token, encoding="utf-8")
    template = tmp_path / restore_executors.TEMPLATE_KEY
    template.write_text(
        yaml.safe_dump(restore_executors.executor_pod_template(ACCOUNT, {})), "utf-8"
    )
    settings = {
        "spark.master": f"k8s://{control_plane.plane.url}",
        "spark.submit.deployMode": "client",
        "spark.app.name": "eddyline-restore-counts",
        **restore_executors.spark_conf(ACCOUNT),
        "spark.kubernetes.executor.podTemplateFile": str(template),
        # What reconcile/restore_job.py sets for a k8s:// master.
        "spark.kubernetes.namespace": NAMESPACE,
        "spark.kubernetes.driver.pod.name": DRIVER,
        "spark.kubernetes.container.image": IMAGE,
        "spark.kubernetes.authenticate.caCertFile": str(control_plane.plane.pki.ca_cert),
        "spark.kubernetes.authenticate.oauthTokenFile": str(token_file),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.instances": "2",
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.local.dir": str(tmp_path / "local"),
        "spark.ui.enabled": "false",
        # The session starts without waiting 30 s for executors that never register.
        "spark.scheduler.minRegisteredResourcesRatio": "0",
        "spark.kubernetes.executor.node.selector.eddyline.dev/test": "never-scheduled",
    }
    for volume, claim, path in (
        ("restore", f"{APP}-restore", "/var/lib/eddyline/restore"),
        ("log", f"{APP}-log", "/var/lib/eddyline/log"),
    ):
        prefix = f"spark.kubernetes.executor.volumes.persistentVolumeClaim.{volume}"
        settings[f"{prefix}.options.claimName"] = claim
        settings[f"{prefix}.mount.path"] = path
    log = tmp_path / "driver.log"
    selector = "labelSelector=spark-role%3Dexecutor"
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods?{selector}"
    admin = setting.operator.admin
    with log.open("wb") as out:
        command = [sys.executable, "-m", "tests.support.control_plane.spark_driver"]
        driver = subprocess.Popen(
            [*command, json.dumps(settings)],
            stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip
        try:
            executors = wait_until(
                lambda: (admin.get(pods_path) or {}).get("items") or None,
                "Spark's executor pods created",
                120,
            )
            wait_until(
                lambda: len((admin.get(pods_path) or {}).get("items") or []) == 2,
                "both executor pods",
                60,
            )
            driver.communicate(b"stop\n", timeout=120)
            assert driver.returncode == 0, log.read_text(errors="replace")[-4000:]
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.communicate()
    text = log.read_text(errors="replace")
    assert "SPARK-STOPPED" in text, text[-4000:]
    for refused in ("Forbidden", "forbidden", "ValidatingAdmissionPolicy"):
        assert refused not in text, text[-4000:]
    pod = executors[0]
    assert pod["spec"]["serviceAccountName"] == ACCOUNT
    assert pod["metadata"]["ownerReferences"][0]["uid"] == setting.driver["metadata"]["uid"]
    # The driver deleted its executors when it stopped (deletecollection by label).
    wait_until(lambda: not (admin.get(pods_path) or {}).get("items"), "the executors deleted", 60)


def test_pods_of_a_namespace_without_streamapps_are_not_the_policys(setting: Setting) -> None:
    """The API server resolves a binding's params before its matchConditions: with
    ``parameterNotFoundAction: Deny`` the image rule refused every pod of a namespace without
    StreamApps (the ReplicaSet controller's in the chart's own e2e test, for one)."""
    admin = setting.operator.admin
    admin.ensure("/api/v1/namespaces", {"metadata": {"name": f"{NAMESPACE}-none"}})
    pod = restricted_pod()
    pod["metadata"] = {"name": "anyones"}
    container(pod)["image"] = "registry.example/anything:1"
    created = admin.create(f"/api/v1/namespaces/{NAMESPACE}-none/pods?dryRun=All", pod)
    assert created["metadata"]["name"] == "anyones"
