"""The README's cluster quick start on real kubelets (the ``realnode`` tier), embedded log.

The images ``make image`` and ``make examples-image`` build (on the test-only stand-in bases,
the ``images`` fixture) are saved from the project's Docker engine and imported into every
node's containerd under the names the chart and the examples use; nothing is pulled. Then the
README's steps: ``helm install`` of the chart (Helm's own library) into ``eddyline``, the
operator's Deployment runs on real nodes, reaching the API server through the ``kubernetes``
Service, and is Ready by its probe on its health endpoint; ``kubectl apply`` of the examples'
cluster manifest and the docs' topic step (docs/operator.md, run verbatim through bash), then
``kubectl wait --for=condition=Ready``; input produced by a pod on the log's claim, exact
counts read by a pod through the query Service; the README's last step, ``kubectl eddyline
status wordcount``, run verbatim with the package's ``kubectl-eddyline`` on the PATH (as
``pip install 'eddyline[kubectl]'`` puts it there), reads every pod through the API server's
pod proxy; ``kubectl delete`` leaves nothing of the app.

Where the README cannot be verbatim: the namespace is made beforehand with Pod Security
``restricted`` enforced (``--create-namespace`` would make it unlabelled), and the claims'
volumes come from the suite's local-directory provisioner (``local`` PVs with node affinity),
which stands in for a cluster's default StorageClass.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.spec import GROUP, PLURAL, VERSION
from tests.e2e.test_operator_quickstart import documented_commands
from tests.support.control_plane.client import Client, wait_until
from tests.support.control_plane.operator import Kubectl, helm
from tests.support.control_plane.provisioner import LocalProvisioner
from tests.support.images import Images
from tests.support.realnode import host
from tests.support.realnode.cluster import RealCluster
from tests.support.realnode.eddyline_images import EXAMPLES_IMAGE, OPERATOR_IMAGE, ensure_images

pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "eddyline"  # the README's
RELEASE = "eddyline"
DEPLOYMENT = f"{RELEASE}-eddyline-operator"  # the chart's fullname: release-chart
APP = "wordcount"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
README = REPO / "README.md"
STORE = "word-counts"
WORDS = [f"w{index:02d}" for index in range(20)]
LOG_URL = "sqlite:////var/lib/eddyline/log/log.db"  # the docs' topic pod's mount of the claim
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300
POD_TIMEOUT = 180
SCRIPT_TIMEOUT = 900
# Run in a pod of the examples image: ask the query Service for every word until each count
# is the expected one (a standby may answer stale before it catches up), then print them.
QUERY_SCRIPT = """python -c '
import json, time
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
expected = %s
router = QueryRouter(["wordcount-query:7070"], timeout=2)
deadline = time.monotonic() + 120
while True:
    counts, failed = {}, []
    for word in expected:
        try:
            result = router.get("word-counts", word)
        except QueryFailedError as error:
            failed.append(f"{word}: {error}")
            continue
        if result.found:
            counts[word] = int(result.value)
    if failed:
        print(len(failed), "failed, first", failed[0], flush=True)
    if counts == expected or time.monotonic() > deadline:
        break
    time.sleep(1)
print(json.dumps(counts))
'"""


@dataclass
class QuickStart:
    cluster: RealCluster
    admin: Client
    kubectl: Kubectl
    home: Path

    def shell(self, script: str) -> str:
        """``script`` through bash with the real ``kubectl``, its namespace ``eddyline``, and
        the package's console scripts (``kubectl-eddyline``: kubectl's plugin) on the PATH,
        found beside this interpreter; nothing else of the test's environment comes along."""
        scripts = str(Path(sys.executable).parent)
        env = {"PATH": os.pathsep.join([scripts, os.environ.get("PATH", "")]),
               "HOME": str(self.home),
               "KUBECONFIG": str(self.kubectl.env["KUBECONFIG"])}  # fmt: skip
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env,
            capture_output=True, text=True, timeout=SCRIPT_TIMEOUT, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{script}\nexited {done.returncode}:\n{done.stderr}"
        return done.stdout

    def one_shot(self, name: str, script: str, node: str) -> str:
        """Run ``script`` (sh) in a pod of the examples image on ``node`` with the log claim;
        return its log once it Succeeded."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "nodeName": node,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 10001,
                    # Write access to the claim's volume, as the app's pods get it.
                    "fsGroup": 10001,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "volumes": [{"name": "log", "persistentVolumeClaim": {"claimName": f"{APP}-log"}}],
                "containers": [
                    {
                        "name": name,
                        "image": EXAMPLES_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", script],
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": [{"name": "log", "mountPath": "/var/lib/eddyline/log"}],
                    }
                ],
            },
        }
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        self.admin.create(path, pod)

        def finished() -> str | None:
            phase = (self.admin.get(f"{path}/{name}") or {}).get("status", {}).get("phase")
            return phase if phase in {"Succeeded", "Failed"} else None

        wait_until(finished, f"pod {name} to finish", POD_TIMEOUT)
        log = self.kubectl("logs", name)
        assert finished() == "Succeeded", f"pod {name} failed:\n{log}"
        self.kubectl("delete", "pod", name)
        return log


def readme_cluster_steps() -> list[str]:
    """The shell lines of the README's "On a cluster" quick start, continuations joined."""
    text = README.read_text(encoding="utf-8")
    found = re.search(r"### On a cluster\n.*?```sh\n(.*?)```", text, re.DOTALL)
    assert found, "README.md lost its cluster quick start (### On a cluster, a sh block)"
    return re.sub(r"\\\n\s*", "", found.group(1)).strip().splitlines()


def import_images(cluster: RealCluster, images: Images, into: Path) -> None:
    """``docker save`` of the built images, ``ctr -n k8s.io images import`` on every node
    that lacks them (another module of the tier may have imported them already)."""
    ensure_images(cluster, images, into, (OPERATOR_IMAGE, EXAMPLES_IMAGE))


@pytest.fixture(scope="module")
def quickstart(
    real_cluster: RealCluster, images: Images, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[QuickStart]:
    root = tmp_path_factory.mktemp("realnode-quickstart")
    import_images(real_cluster, images, root)
    admin = real_cluster.admin()
    # Under the nodes' data directory, so the run's purge removes the volumes with the nodes.
    provisioner = LocalProvisioner(admin, host.DATA / "volumes").start()
    admin.ensure("/api/v1/namespaces", {"metadata": {"name": NAMESPACE, "labels": RESTRICTED}})
    kubeconfig = real_cluster.plane.admin_kubeconfig
    kubectl = Kubectl(kubeconfig, root / "kubectl-home", NAMESPACE)
    home = root / "home"
    home.mkdir()
    local = home / "kubeconfig"
    local.write_bytes(kubeconfig.read_bytes())
    kubectl.env["KUBECONFIG"] = str(local)
    kubectl("config", "set-context", "--current", f"--namespace={NAMESPACE}")
    try:
        yield QuickStart(real_cluster, admin, kubectl, home)
    finally:
        helm(kubeconfig, root / "helm", NAMESPACE, RELEASE, {"action": "uninstall"})
        provisioner.stop()


def _deployment_ready(admin: Client) -> dict[str, Any] | None:
    deployment = admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}")
    if deployment is None:
        return None
    want = deployment["spec"]["replicas"]
    status = deployment.get("status", {})
    return deployment if status.get("readyReplicas") == want == status.get("replicas") else None


def test_helm_install_runs_the_operator_ready_on_real_nodes(quickstart: QuickStart) -> None:
    (result,) = helm(
        quickstart.cluster.plane.admin_kubeconfig, quickstart.home / "helm", NAMESPACE, RELEASE,
        {"action": "install", "values": {"watchNamespaces": [NAMESPACE]}},
    )  # fmt: skip
    assert "error" not in result, result
    try:
        deployment = wait_until(
            lambda: _deployment_ready(quickstart.admin), "the operator Ready", READY_TIMEOUT
        )
    except TimeoutError:
        print(quickstart.kubectl("describe", "pods"))
        raise
    pods = quickstart.admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods")
    assert pods is not None
    operators = [p for p in pods["items"] if p["metadata"]["name"].startswith(DEPLOYMENT)]
    assert len(operators) == deployment["spec"]["replicas"]
    for pod in operators:
        assert pod["spec"]["nodeName"] in quickstart.cluster.nodes
        (container,) = pod["spec"]["containers"]
        assert container["image"] == OPERATOR_IMAGE


def test_the_quick_start_runs_the_word_count_with_exact_counts(quickstart: QuickStart) -> None:
    wait_until(lambda: _deployment_ready(quickstart.admin), "the operator Ready", READY_TIMEOUT)
    # docs/operator.md's topic step: apply, topic pod on the log's node, restart, wait Ready.
    try:
        quickstart.shell("".join(documented_commands()))
    except AssertionError:
        print(quickstart.kubectl("describe", "sapp,pods,pvc"))
        raise
    node = quickstart.kubectl("get", "sapp", APP, "-o", "jsonpath={.status.logNode}")
    assert node in quickstart.cluster.nodes
    rng = random.Random(1)
    lines = [" ".join(rng.choices(WORDS, k=rng.randint(1, 6))) for _ in range(500)]
    expected = collections.Counter(word for line in lines for word in line.split())
    produced = "\n".join(lines)
    quickstart.one_shot(
        "quickstart-input",
        f"printf '%s\\n' '{produced}' | eddyline log --log {LOG_URL} produce text-lines",
        node,
    )
    # Through the query Service, from a pod: host processes do not reach Service addresses
    # here (docs/nodes.md). The pod asks until every count is exact, then prints them. Not
    # named like the Service: a pod's own name resolves to itself (its /etc/hosts).
    script = QUERY_SCRIPT % json.dumps(dict(expected))
    answers = quickstart.one_shot("quickstart-counts", script, node)
    counts = json.loads(answers.strip().splitlines()[-1])
    assert counts == dict(expected), answers


def test_the_readme_quick_start_ends_with_kubectl_eddyline_status(quickstart: QuickStart) -> None:
    """The README's last step, verbatim: the plugin reads the app's status, membership and
    every pod's /v1/layout through the API server (pods/proxy) on real nodes."""
    last = readme_cluster_steps()[-1]
    assert last.startswith(f"kubectl eddyline status {APP} -n {NAMESPACE}"), last
    wait_until(lambda: _ready_with_hash(quickstart), "the app Ready with its hash", READY_TIMEOUT)
    text = quickstart.shell(last)
    print(text)
    assert text.startswith(f"{APP} in {NAMESPACE}: Running"), text
    hashes = {
        line.split()[-1] for line in text.splitlines() if line.startswith(f"  {APP}-")
    }  # the LAYOUT column of the pod rows: "hash <describe hash>" from each pod
    recorded = quickstart.kubectl("get", "sapp", APP, "-o", "jsonpath={.status.topology.hash}")
    assert hashes == {recorded}, text
    assert f"(describe hash {recorded})" in text
    assert f"draw it: eddyline describe MANIFEST --format svg > {APP}.svg" in text


def _ready_with_hash(quickstart: QuickStart) -> bool:
    app = quickstart.admin.get(f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}/{APP}")
    status = (app or {}).get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return ready and bool((status.get("topology") or {}).get("hash"))


def _app_objects(admin: Client) -> list[str]:
    """The app's pods, StatefulSet, Services and ConfigMaps the API still holds."""
    names = []
    ns = f"/api/v1/namespaces/{NAMESPACE}"
    for path in (f"{ns}/pods", f"{ns}/services", f"{ns}/configmaps",
                 f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets"):  # fmt: skip
        listed = admin.get(path) or {"items": []}
        names += [
            f"{path.rsplit('/', 1)[-1]}/{item['metadata']['name']}"
            for item in listed["items"]
            if item["metadata"]["name"].startswith(APP)
        ]
    return names


def _claims_and_volumes(admin: Client) -> tuple[list[str], list[str]]:
    claims = admin.get(f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims") or {"items": []}
    volumes = admin.get("/api/v1/persistentvolumes") or {"items": []}
    return (
        sorted(item["metadata"]["name"] for item in claims["items"]),
        sorted(
            item["metadata"]["name"]
            for item in volumes["items"]
            if item["spec"].get("claimRef", {}).get("namespace") == NAMESPACE
        ),
    )


def test_kubectl_delete_leaves_nothing_of_the_app_but_its_retained_claims(
    quickstart: QuickStart,
) -> None:
    """``kubectl delete -f`` of the manifest: its pods stop on the nodes and every child goes;
    the claims stay, as ``storage.whenDeleted`` (default ``Retain``) documents, until they are
    deleted too, and then their volumes and directories go."""
    quickstart.kubectl("delete", "-f", str(MANIFEST), "--wait=true", timeout=READY_TIMEOUT)
    try:
        wait_until(lambda: not _app_objects(quickstart.admin), "the app's children gone",
                   READY_TIMEOUT)  # fmt: skip
    except TimeoutError:
        raise AssertionError(f"left behind: {_app_objects(quickstart.admin)}") from None
    # The kubelets stopped every container of the app's pods, sandboxes included (stopped
    # containers stay listed until the kubelet's garbage collection, every minute).
    running = [
        f"{APP}-{ordinal} on {node.spec.name}"
        for node in quickstart.cluster.nodes.values()
        for ordinal in range(3)
        if any(node.task_pid(c) for c in node.pod_containers(NAMESPACE, f"{APP}-{ordinal}"))
    ]
    assert not running, f"containers still running: {running}"
    claims, volumes = _claims_and_volumes(quickstart.admin)
    assert claims == sorted([f"{APP}-log", *(f"state-{APP}-{ordinal}" for ordinal in range(3))])
    assert len(volumes) == len(claims)
    quickstart.kubectl("delete", "pvc", *claims, "--wait=true", timeout=READY_TIMEOUT)
    try:
        wait_until(lambda: _claims_and_volumes(quickstart.admin) == ([], []),
                   "the claims' volumes gone", READY_TIMEOUT)  # fmt: skip
    except TimeoutError:
        raise AssertionError(f"left: {_claims_and_volumes(quickstart.admin)}") from None
    directories = sorted((host.DATA / "volumes" / NAMESPACE).glob("*"))
    assert not directories, f"volume directories left: {directories}"
