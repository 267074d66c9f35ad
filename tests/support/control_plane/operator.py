"""The operator on the real control plane: Helm's library, kopf, the real ``kubectl``.

As a user would, the chart is installed through Helm's own library (helm-sdkpy, in a
subprocess) into a namespace of the test's own, which enforces Pod Security ``restricted``.
The operator then runs as its own process (``eddyline-operator``) with the chart's
environment and a TokenRequest token of the chart's ServiceAccount, so the real RBAC holds it
to the chart's rules. The chart's Deployment is scaled to 0: kopf, in a pod, reads its token
from the fixed in-cluster path, which a kubelet without mount namespaces cannot provide
(docs/operator.md, "Testing against a real control plane").
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.support.control_plane.client import ApiError, Client, wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.plane import free_port

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "eddyline-operator"
BIN = Path(sys.executable).parent
RELEASE = "eddyline"
Obj = dict[str, Any]

_HELM_SESSION = """
import asyncio, json, sys
import helm_sdkpy

kubeconfig, namespace, chart, release, values = sys.argv[1:6]
config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kubeconfig)
try:
    result = asyncio.run(helm_sdkpy.Install(config).run(
        release, chart, values=json.loads(values), wait=False, timeout=120))
except Exception as error:
    result = {"error": f"{type(error).__name__}: {error}"}
print(json.dumps(result, default=str))
"""


class KubectlError(AssertionError):
    """kubectl exited non-zero where the test expected success."""


class Kubectl:
    """The machine's real ``kubectl`` (its dispatcher picks the 1.33 client) as the admin."""

    def __init__(self, kubeconfig: Path, home: Path, namespace: str) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.namespace = namespace
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(home),
            "KUBECONFIG": str(kubeconfig),
        }

    def run(
        self, *args: str, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise RuntimeError("kubectl is not on PATH: install kubectl 1.33")
        return subprocess.run(
            [kubectl, f"--namespace={self.namespace}", *args],
            input=stdin, capture_output=True, text=True, env=self.env,
            timeout=timeout, check=False,
        )  # fmt: skip

    def __call__(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        result = self.run(*args, stdin=stdin, timeout=timeout)
        if result.returncode != 0:
            raise KubectlError(
                f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
            )
        return result.stdout


class Operator:
    """The chart installed into ``namespace`` and the operator process it configures."""

    def __init__(
        self, cluster: Cluster, root: Path, namespace: str, release: str = RELEASE
    ) -> None:
        # A second install in the same cluster needs its own release: the chart's
        # ClusterRoles are named after it, and Helm refuses another release's objects.
        self.release = release
        self.cluster = cluster
        self.root = root
        self.namespace = namespace
        self.admin: Client = cluster.admin()
        self.kubectl = Kubectl(cluster.kubeconfig, root / "kubectl-home", namespace)
        self.process: subprocess.Popen[bytes] | None = None
        self.log = root / "operator.log"
        self.env: dict[str, str] = {}
        self.service_account = ""
        self.liveness = f"http://127.0.0.1:{free_port()}/healthz"

    def install(self) -> Operator:
        self.root.mkdir(parents=True, exist_ok=True)
        labels = {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }
        self.admin.ensure(
            "/api/v1/namespaces", {"metadata": {"name": self.namespace, "labels": labels}}
        )
        installed = self._helm({})
        if "error" in installed:
            raise RuntimeError(f"helm install failed: {installed['error']}")
        rendered = [doc for doc in yaml.safe_load_all(installed["manifest"]) if doc]
        deployment = next(o for o in rendered if o["kind"] == "Deployment")
        pod = deployment["spec"]["template"]["spec"]
        self.service_account = pod["serviceAccountName"]
        self.env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
        # The operator runs outside the cluster (the module docstring says why).
        self.admin.patch(
            f"/apis/apps/v1/namespaces/{self.namespace}/deployments/"
            f"{deployment['metadata']['name']}/scale",
            {"spec": {"replicas": 0}},
        )
        self.kubectl("wait", "--for=condition=Established", "crd/streamapps.eddyline.dev")
        return self

    def _helm(self, values: Obj) -> Obj:
        home = self.root / "helm-home"
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HOME": str(home)}
        completed = subprocess.run(
            [sys.executable, "-c", _HELM_SESSION, str(self.cluster.kubeconfig), self.namespace,
             str(CHART), self.release, json.dumps(values)],
            capture_output=True, text=True, env=env, timeout=300, check=False,
        )  # fmt: skip
        if completed.returncode != 0:
            raise RuntimeError(f"the Helm session failed:\n{completed.stderr}")
        result: Obj = json.loads(completed.stdout.strip().splitlines()[-1])
        return result

    def start(self) -> None:
        token = self.cluster.plane.service_account_token(self.namespace, self.service_account)
        kubeconfig = self.cluster.plane.token_kubeconfig(self.root / "operator.kubeconfig", token)
        env = {
            **self.env,  # WATCH_NAMESPACES, EDDYLINE_RUNTIME_IMAGE, ... as the chart sets
            "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
            "HOME": str(self.root),
            "KUBECONFIG": str(kubeconfig),
            "EDDYLINE_OPERATOR_LIVENESS": self.liveness,
        }
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [str(BIN / "eddyline-operator")], cwd=self.root, env=env,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    # ----------------------------------------------------------- observations
    def path(self, group: str, plural: str, name: str = "") -> str:
        prefix = "/api/v1" if group == "" else f"/apis/{group}"
        if group not in ("", "eddyline.dev") and "/" not in group:
            prefix = f"/apis/{group}/v1"
        base = f"{prefix}/namespaces/{self.namespace}/{plural}"
        return f"{base}/{name}" if name else base

    def get(self, group: str, plural: str, name: str) -> Obj | None:
        return self.admin.get(self.path(group, plural, name))

    def objects(self, group: str, plural: str) -> list[Obj]:
        items: list[Obj] = self.admin.request(self.path(group, plural))["items"]
        return items

    def app(self, name: str) -> Obj:
        found = self.get("eddyline.dev/v1alpha1", "streamapps", name)
        if found is None:
            raise LookupError(f"StreamApp {self.namespace}/{name} does not exist")
        return found

    def condition(self, name: str, kind: str) -> Obj | None:
        for condition in self.app(name).get("status", {}).get("conditions", []):
            if condition["type"] == kind:
                return dict(condition)
        return None

    def pods(self, app: str) -> dict[str, Obj]:
        return {
            p["metadata"]["name"]: p
            for p in self.objects("", "pods")
            if p["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == app
        }

    def wait_watching(self, timeout: float = 120) -> None:
        """Until kopf's liveness endpoint answers: it has started and lists what exists."""

        def started() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"the operator exited:\n{self.output()[-3000:]}")
            try:
                with urllib.request.urlopen(self.liveness, timeout=5) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_until(started, "the operator to watch StreamApps", timeout)

    def describe_failure(self, app: str) -> str:
        lines: list[Any] = []
        try:
            lines.append(f"status: {self.app(app).get('status')}")
        except (LookupError, ApiError) as error:
            lines.append(str(error))
        kubelets = self.cluster.kubelets
        for name, pod in sorted(self.pods(app).items()):
            lines.append(
                f"{name} on {pod['spec'].get('nodeName')}: {pod.get('status', {}).get('phase')} "
                f"{pod.get('status', {}).get('conditions')} "
                f"{pod.get('status', {}).get('containerStatuses')}"
            )
            if kubelets is not None:
                lines.append(kubelets.pod_log(self.namespace, name)[-2000:])
        lines.append(self.output()[-4000:])
        return "\n".join(str(line) for line in lines)
