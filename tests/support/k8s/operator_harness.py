"""The operator on the emulated cluster: API server, cluster stand-in, Helm, kopf, kubectl.

Shared by the end-to-end operator tests and ``tests/bench/bench_operator.py``. As a user
would: ``helm install`` the chart (its CRD, ServiceAccount and least-privilege RBAC), then the
operator runs as its own process (``eddyline-operator``, i.e. kopf) with the chart's
environment and its ServiceAccount's token, so the emulator holds it to the chart's RBAC.
Its ``sys.path`` lacks ``examples/``: it never imports user code. Pods run the real
``eddyline`` runtime with the example's directory on ``PYTHONPATH``, as the app's image would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.k8s.apiserver import ApiServer, Obj
from tests.support.k8s.client import request
from tests.support.k8s.cluster import Cluster
from tests.support.k8s.helm import INSTALL, chart_environment, deployment_container, helm
from tests.support.k8s.kubectl import Kubectl
from tests.support.ports import free_port
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "eddyline-operator"
BIN = Path(sys.executable).parent


class OperatorHarness:
    """Everything an operator test needs, started in order and stopped in reverse."""

    def __init__(
        self,
        root: Path,
        *,
        examples: list[str],
        namespace: str = "default",
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        # Set for the operator's process on top of the chart's environment (a test's beat).
        self.extra_env = dict(extra_env or {})
        self.namespace = namespace
        self.api = ApiServer()
        self.cluster = Cluster(
            self.api,
            root / "cluster",
            pythonpath=[str(REPO / "examples" / example) for example in examples],
            restart_backoff=(5.0, 40.0),  # a real kubelet: 10 s doubling to 300 s
        )
        self.kubectl: Kubectl | None = None
        self.operator_env: dict[str, Any] = {}
        self.operator_token = ""
        self.operator: subprocess.Popen[bytes] | None = None
        self.operator_log = root / "operator.log"

    def start(self) -> OperatorHarness:
        self.api.start()
        self.cluster.start()
        self.kubectl = Kubectl(self.api, self.root / "kubectl-home")
        (installed,) = helm(self.api, self.root / "helm", self.namespace, CHART, INSTALL)
        if "error" in installed:
            raise RuntimeError(f"helm install failed: {installed['error']}")
        self.kubectl("wait", "--for=condition=Established", "crd/streamapps.eddyline.dev")
        pod, container = deployment_container(installed)
        self.operator_env = chart_environment(container)
        self.operator_token = self.api.issue_token(self.namespace, pod["serviceAccountName"])
        self.start_operator()
        return self

    def wait_until_operator_watches(self, timeout: float = 60) -> None:
        """Until kopf has a watch open on StreamApps (it then handles what is applied)."""

        def watching() -> bool:
            if self.operator is not None and self.operator.poll() is not None:
                raise AssertionError(f"the operator exited:\n{self.operator_output()[-3000:]}")
            return any(
                r["agent"].startswith("kopf/")
                and r["path"].endswith("/streamapps")
                and r["query"].get("watch") == "true"
                for r in list(self.api.requests)
            )

        wait_for(watching, "the operator to watch StreamApps", timeout)

    def start_operator(self) -> None:
        self.operator = self.spawn_operator(self.operator_log)

    def spawn_operator(
        self, log_path: Path, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """One more operator process, as the chart's Deployment runs each replica (a test
        of leader election runs two; :meth:`start_operator` runs the usual one)."""
        kubeconfig = self.root / "operator-kubeconfig"
        kubeconfig.write_text(self.api.kubeconfig(self.operator_token), encoding="utf-8")
        env = {
            **self.operator_env,  # WATCH_NAMESPACES, EDDYLINE_RUNTIME_IMAGE, ... as the chart sets
            "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
            "HOME": str(self.root),
            "KUBECONFIG": str(kubeconfig),
            # Every test's operator on this machine would want the chart's port 8080.
            "EDDYLINE_OPERATOR_LIVENESS": f"http://127.0.0.1:{free_port()}/healthz",
            **self.extra_env,
            **(extra_env or {}),
        }
        with log_path.open("ab") as log:
            return subprocess.Popen(
                [str(BIN / "eddyline-operator")],
                cwd=self.root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def stop_operator(self) -> None:
        if self.operator is not None and self.operator.poll() is None:
            self.operator.send_signal(signal.SIGINT)
            try:
                self.operator.wait(10)
            except subprocess.TimeoutExpired:
                self.operator.kill()
                self.operator.wait(5)
        self.operator = None

    def stop(self) -> None:
        self.stop_operator()
        self.cluster.stop()
        self.api.stop()

    # ------------------------------------------------------------- observations
    def url(self, path: str) -> str:
        return self.api.url + path

    def app(self, name: str) -> Obj:
        body = request(
            self.url(f"/apis/eddyline.dev/v1alpha1/namespaces/{self.namespace}/streamapps/{name}")
        ).body
        return dict(body)

    def condition(self, name: str, kind: str) -> Obj | None:
        for condition in self.app(name).get("status", {}).get("conditions", []):
            if condition["type"] == kind:
                return dict(condition)
        return None

    def objects(self, group: str, plural: str) -> list[Obj]:
        resource = self.api.resource(group, plural)
        result: list[Obj] = self.api.call(lambda: self.api.select(resource, self.namespace))
        return result

    def get(self, group: str, plural: str, name: str) -> Obj | None:
        resource = self.api.resource(group, plural)
        found: Obj | None = self.api.call(lambda: self.api.find(resource, self.namespace, name))
        return found

    def operator_rss_mb(self) -> float:
        """The operator process's resident memory (Linux /proc), in MiB."""
        assert self.operator is not None
        status = Path(f"/proc/{self.operator.pid}/status").read_text(encoding="utf-8")
        rss = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        kib = int(rss.split()[1])
        return kib / 1024

    def pods(self, app: str) -> dict[str, Obj]:
        return {
            p["metadata"]["name"]: p
            for p in self.objects("", "pods")
            if p["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == app
        }

    def claim_dir(self, claim: str) -> Path:
        return self.cluster.root / "claims" / self.namespace / claim

    def operator_output(self) -> str:
        return self.operator_log.read_text(errors="replace") if self.operator_log.exists() else ""

    def describe_failure(self, app: str) -> str:
        """What to print when a test times out: status, pods and the operator's last lines."""
        lines: list[Any] = [f"status: {self.app(app).get('status')}"]
        for name, pod in sorted(self.pods(app).items()):
            lines.append(
                f"{name}: {pod.get('status', {}).get('phase')} "
                f"{pod.get('status', {}).get('containerStatuses')}"
            )
            lines.append(self.cluster.pod_log(self.namespace, name)[-2000:])
        lines.append(self.operator_output()[-4000:])
        return "\n".join(str(line) for line in lines)
