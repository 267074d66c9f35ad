"""The operator on the real control plane: Helm's library, kopf, the real ``kubectl``.

As a user would, the chart is installed through Helm's own library (helm-sdkpy, in a
subprocess) into a namespace of the test's own, which enforces Pod Security ``restricted``.
The operator then runs as its own process (``eddyline-operator``) with the chart's
environment and a TokenRequest token of the chart's ServiceAccount, so the real RBAC holds it
to the chart's rules. The chart's Deployment is scaled to 0: the tests freeze, kill, stop
and restart the operator and read its log, which a process of their own makes direct. The
chart's Deployment itself runs on the kubelet stand-in in
``tests/e2e/test_operator_chart.py`` (docs/operator.md, "Testing against a real control
plane").
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.support.control_plane.client import ApiError, Client, wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "eddyline-operator"
BIN = Path(sys.executable).parent
Obj = dict[str, Any]

# One Helm session per call: helm-sdkpy's Go library keeps process-wide state. Each step is
# {"action": "install" | "uninstall", "values": {...}}; one JSON result per step, in order.
_HELM_SESSION = """
import asyncio, json, sys
import helm_sdkpy

kubeconfig, namespace, chart, release, steps = sys.argv[1:6]
config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kubeconfig)
results = []
for step in json.loads(steps):
    try:
        if step["action"] == "install":
            result = asyncio.run(helm_sdkpy.Install(config).run(
                release, chart, values=step.get("values", {}), wait=False, timeout=120))
        else:
            result = asyncio.run(helm_sdkpy.Uninstall(config).run(release))
    except Exception as error:
        result = {"error": f"{type(error).__name__}: {error}"}
    results.append(result)
print(json.dumps(results, default=str))
"""


def helm(kubeconfig: Path, home: Path, namespace: str, release: str, *steps: Obj) -> list[Obj]:
    """Helm's own library (helm-sdkpy, in a subprocess) run against the real API server."""
    if importlib.util.find_spec("helm_sdkpy") is None:
        # Never a skip: the operator's e2e tests must run wherever `make test` runs.
        raise RuntimeError("helm-sdkpy is not installed: run `make setup` (it pins the version)")
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home)}
    completed = subprocess.run(
        [sys.executable, "-c", _HELM_SESSION, str(kubeconfig), namespace, str(CHART), release,
         json.dumps(list(steps))],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    if completed.returncode != 0:
        raise RuntimeError(f"the Helm session failed:\n{completed.stderr}")
    results: list[Obj] = json.loads(completed.stdout.strip().splitlines()[-1])
    return results


def rendered(result: Obj) -> list[Obj]:
    """The objects a Helm install result's manifest holds."""
    return [doc for doc in yaml.safe_load_all(result["manifest"]) if doc]


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
        self,
        cluster: Cluster,
        root: Path,
        namespace: str,
        *,
        extra_env: dict[str, str] | None = None,
        values: Obj | None = None,
    ) -> None:
        """``values``: the chart's values for the install (e.g. the monitors enabled)."""
        self.cluster = cluster
        self.values = values or {}
        # The chart's cluster-scoped objects are named after the release: one release name
        # per namespace, so modules sharing the session's control plane never collide.
        self.release = namespace
        self.extra_env = extra_env or {}
        self.root = root
        self.namespace = namespace
        self.admin: Client = cluster.admin()
        self.kubectl = Kubectl(cluster.kubeconfig, root / "kubectl-home", namespace)
        self.process: subprocess.Popen[bytes] | None = None
        self.log = root / "operator.log"
        self.env: dict[str, str] = {}
        self.service_account = ""
        self.liveness = f"http://127.0.0.1:{free_port()}/healthz"
        # Where the running operator serves its metrics (set by :meth:`start`), for a test
        # that scrapes it (the rollback counter, the dashboard's operator panels).
        self.metrics_url = ""

    def install(self) -> Operator:
        self.root.mkdir(parents=True, exist_ok=True)
        labels = {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }
        self.admin.ensure(
            "/api/v1/namespaces", {"metadata": {"name": self.namespace, "labels": labels}}
        )
        (installed,) = helm(
            self.cluster.kubeconfig, self.root / "helm-home", self.namespace, self.release,
            {"action": "install", "values": self.values},
        )  # fmt: skip
        if "error" in installed:
            raise RuntimeError(f"helm install failed: {installed['error']}")
        self.rendered = rendered(installed)
        deployment = next(o for o in self.rendered if o["kind"] == "Deployment")
        pod = deployment["spec"]["template"]["spec"]
        self.service_account = pod["serviceAccountName"]
        self.env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
        # The operator runs as the test's own process (the module docstring says why).
        self.admin.patch(
            f"/apis/apps/v1/namespaces/{self.namespace}/deployments/"
            f"{deployment['metadata']['name']}/scale",
            {"spec": {"replicas": 0}},
        )
        self.kubectl("wait", "--for=condition=Established", "crd/streamapps.eddyline.dev")
        return self

    @property
    def token(self) -> str:
        """A TokenRequest token of the chart's ServiceAccount, as the operator runs with."""
        return self.cluster.plane.service_account_token(self.namespace, self.service_account)

    def start(self) -> None:
        # A port of this process's own each start (the chart's value names $(POD_IP), which
        # only a kubelet expands); a module's extra_env may name its own.
        self.metrics_url = self.extra_env.get(
            "EDDYLINE_OPERATOR_METRICS", f"http://127.0.0.1:{free_port()}/metrics"
        )
        self.process = self.spawn(
            self.log,
            {"EDDYLINE_OPERATOR_LIVENESS": self.liveness,
             "EDDYLINE_OPERATOR_METRICS": self.metrics_url},
        )  # fmt: skip

    def spawn(self, log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Another operator process with the chart's environment (a second replica)."""
        kubeconfig = self.cluster.plane.token_kubeconfig(
            self.root / "operator.kubeconfig", self.token
        )
        environment = {
            **self.env,  # WATCH_NAMESPACES, EDDYLINE_RUNTIME_IMAGE, ... as the chart sets
            "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
            "HOME": str(self.root),
            "KUBECONFIG": str(kubeconfig),
            # The chart's value names $(POD_IP), which only a kubelet expands: a port of
            # this process's own, as for the liveness endpoint.
            "EDDYLINE_OPERATOR_METRICS": f"http://127.0.0.1:{free_port()}/metrics",
            **self.extra_env,
            **env,
        }
        with log_path.open("ab") as log:
            return subprocess.Popen(
                self.command(), cwd=self.root, env=environment,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip

    def command(self) -> list[str]:
        """The operator's argv (a benchmark runs a variant of it the same way)."""
        return [str(BIN / "eddyline-operator")]

    def kill(self) -> None:
        """SIGKILL: a crash, no goodbye in the peering, nothing flushed."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)
        self.process = None

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

    def evict(self, pod: str, *, retry_seconds: float = 0.0, dry_run: bool = False) -> int:
        """Evicts ``pod`` of this namespace through the Eviction API (policy/v1); returns how
        many 429s it met. A 429 (the PodDisruptionBudget allows no disruption right now,
        which Kubernetes documents as "try again later") is retried every 0.5 s for up to
        ``retry_seconds``, as ``kubectl drain`` retries (every 5 s): an eddyline pod that a
        task just moved to is not Ready for about a second (docs/operator.md, "Evictions
        and drains"). ``dry_run``: the server decides and does nothing."""
        path = f"/api/v1/namespaces/{self.namespace}/pods/{pod}/eviction"
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": self.namespace},
        }
        refused = 0
        deadline = time.monotonic() + retry_seconds
        while True:
            try:
                self.admin.request(path + ("?dryRun=All" if dry_run else ""), "POST", body)
                return refused
            except ApiError as error:
                if error.code != 429 or time.monotonic() >= deadline:
                    raise
                refused += 1
                time.sleep(0.5)

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
