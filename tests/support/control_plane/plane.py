"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler as local processes.

The binaries come from ``scripts/build-control-plane`` (built once from the pinned Go
modules, then reused). Everything listens on loopback on free ports; each component logs to
``<root>/logs/<component>.log``. :meth:`ControlPlane.start` returns once ``/readyz`` answers,
the controller manager has created the ``default`` ServiceAccount and the scheduler is healthy.
Real nodes (``tests/support/realnode``) opt into an API server on an address of a bridge the
run creates (``address=``), which their pods reach too.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support.control_plane.client import ApiError, Client, wait_until
from tests.support.control_plane.pki import Pki
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[3]
Obj = dict[str, Any]
BUILD_SCRIPT = REPO / "scripts" / "build-control-plane"
# Pods get loopback addresses (127.<cluster>.<node>.<n>, docs/operator.md); Service VIPs come from a
# loopback range of their own so the stand-in proxy can listen on them without namespaces.
SERVICE_CIDR = "127.96.0.0/16"
# Controllers left out of `--controllers=*`, each with its reason (docs/operator.md): the
# cloud ones need a cloud provider (without one they would only log that they cannot run);
CLOUD_CONTROLLERS = (
    "service-lb-controller",
    "node-route-controller",
    "cloud-node-lifecycle-controller",
)
# endpoints and EndpointSlices would hold the kubelet stand-in's loopback pod IPs, which the API
# server refuses (real nodes' pods have real addresses, and keep these controllers).
DISABLED_CONTROLLERS = (
    "endpoints-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    *CLOUD_CONTROLLERS,
)
LOOPBACK = "127.0.0.1"
# A loaded 2-core machine starts the API server in tens of seconds; this only bounds a hang.
START_TIMEOUT = 240.0


def build_binaries(*arguments: str) -> Path:
    """The directory of the four binaries, building them first if absent (slow: minutes).

    ``build_binaries("--node")`` builds kubelet and kube-proxy instead, into the same directory.
    """
    completed = subprocess.run(
        [str(BUILD_SCRIPT), *arguments], capture_output=True, text=True, check=False,
        timeout=3600,
    )  # fmt: skip
    if completed.returncode != 0:
        raise RuntimeError(
            f"scripts/build-control-plane {' '.join(arguments)} failed:\n{completed.stderr[-4000:]}"
        )
    return Path(completed.stdout.strip().splitlines()[-1])


class ControlPlane:
    """The four processes, their certificates and kubeconfigs under ``root``."""

    def __init__(
        self,
        root: Path,
        *,
        bin_dir: Path | None = None,
        node_monitor_grace_seconds: int | None = None,
        crds: Sequence[Path] = (),
        address: str = LOOPBACK,
        on_spawn: Callable[[int], None] | None = None,
        service_cidr: str = SERVICE_CIDR,
        disabled_controllers: Sequence[str] = DISABLED_CONTROLLERS,
        audit_policy: Path | None = None,
    ) -> None:
        self.root = root
        # Opt-in: an audit policy file makes kube-apiserver log the requests it selects to
        # ``audit_log`` (JSON lines), for a test that records which calls a client makes.
        self.audit_policy = audit_policy
        # Where kube-apiserver binds and what it advertises. Loopback (the default) serves the
        # kubelet stand-in's pods, which share the host's network; pods in network namespaces
        # of their own reach only an address of a bridge the run creates, which the caller
        # sets up before start (tests/support/realnode).
        self.address = address
        # Called with each component's PID as it starts: real nodes put the control plane
        # into a cgroup of theirs, so a run after a crash finds and ends it.
        self.on_spawn = on_spawn
        # Real nodes need a Service range pods can route to (a real kube-proxy rewrites it on
        # the host); loopback addresses never leave a pod's own network namespace.
        self.service_cidr = service_cidr
        self.disabled_controllers = tuple(disabled_controllers)
        self.bin_dir = bin_dir
        # CustomResourceDefinitions created before the controller manager starts: its garbage
        # collector discovers resource types at start and then only every 30 s, so objects
        # owned by a custom resource of a CRD created later outlive their owner's deletion
        # by up to that long (the first operator e2e module waited on it).
        self.crds = tuple(crds)
        # None: the controller manager's own default (50 s in 1.33), which the node-loss e2e
        # relies on (the operator must act on a dead node's Lease well before it). A cluster
        # of a test's own may shorten it to see the node lifecycle controller act sooner.
        self.node_monitor_grace_seconds = node_monitor_grace_seconds
        self.pki = Pki(root / "pki")
        self.logs = root / "logs"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.port = 0
        self.url = ""
        self.admin_kubeconfig = root / "admin.kubeconfig"
        self.audit_log = self.logs / "audit.log"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ControlPlane:
        started = time.monotonic()
        self.bin_dir = self.bin_dir or build_binaries()
        self.logs.mkdir(parents=True, exist_ok=True)
        service_ip = str(next(ipaddress.ip_network(self.service_cidr).hosts()))
        self.pki.create(server_addresses=sorted({LOOPBACK, self.address, service_ip}))
        etcd_client, etcd_peer = free_port(), free_port()
        self.port = free_port()
        self.url = f"https://{self.address}:{self.port}"
        self._spawn(
            "etcd",
            f"--name=default --data-dir={self.root / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
            # A throwaway store: an fsync per write only slows a loaded machine down.
            "--unsafe-no-fsync",
            "--log-level=warn",
        )
        pki = self.pki.root
        self._spawn(
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_client}",
            f"--bind-address={self.address} --secure-port={self.port}",
            f"--advertise-address={self.address}",
            *self._address_flags(),
            f"--service-cluster-ip-range={self.service_cidr}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={self.pki.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.pki.sa_pub}",
            f"--service-account-signing-key-file={self.pki.sa_key}",
            "--authorization-mode=Node,RBAC",
            # The defaults (Pod Security among them) plus NodeRestriction, as kubeadm enables:
            # it holds the kubelet stand-in to what a kubelet may write.
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=false",
            "--profiling=false",
            *self._audit_flags(),
        )
        self._admin_files()
        wait_until(self._ready, "kube-apiserver /readyz", START_TIMEOUT)
        self._create_crds()
        manager = self.certificate_kubeconfig(
            "kube-controller-manager", "system:kube-controller-manager", []
        )
        self._spawn(
            "kube-controller-manager",
            f"--kubeconfig={manager}",
            f"--authentication-kubeconfig={manager}",
            f"--authorization-kubeconfig={manager}",
            f"--bind-address=127.0.0.1 --secure-port={free_port()}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            f"--cluster-signing-cert-file={self.pki.ca_cert}",
            f"--cluster-signing-key-file={self.pki.ca_key}",
            f"--service-cluster-ip-range={self.service_cidr}",
            "--controllers=*," + ",".join(f"-{name}" for name in self.disabled_controllers),
            "--profiling=false",
            *self._node_monitor_flags(),
        )
        scheduler = self.certificate_kubeconfig("kube-scheduler", "system:kube-scheduler", [])
        scheduler_port = free_port()
        self._spawn(
            "kube-scheduler",
            f"--kubeconfig={scheduler}",
            f"--authentication-kubeconfig={scheduler}",
            f"--authorization-kubeconfig={scheduler}",
            f"--bind-address=127.0.0.1 --secure-port={scheduler_port}",
            "--leader-elect=false",
            "--profiling=false",
        )
        admin = self.admin()
        wait_until(
            lambda: (
                self._alive() and admin.get("/api/v1/namespaces/default/serviceaccounts/default")
            ),
            "the controller manager to create the default ServiceAccount",
            START_TIMEOUT,
        )
        wait_until(
            lambda: self._alive() and _healthy(f"https://127.0.0.1:{scheduler_port}/healthz"),
            "kube-scheduler /healthz",
            START_TIMEOUT,
        )
        self.startup_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    # The API server drains its watches for longer; the store is thrown away.
                    process.wait(5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
        self.processes.clear()

    def _create_crds(self) -> None:
        admin = self.admin()
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        names = []
        for crd_file in self.crds:
            for document in yaml.safe_load_all(crd_file.read_text(encoding="utf-8")):
                if document:
                    admin.ensure(path, document)
                    names.append(document["metadata"]["name"])

        def established(name: str) -> bool:
            found = admin.get(f"{path}/{name}") or {}
            conditions = (found.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        for name in names:
            wait_until(lambda name=name: established(name), f"CRD {name} Established", 60)

    def _address_flags(self) -> list[str]:
        if self.address == LOOPBACK:
            # Its own `kubernetes` endpoints would be loopback addresses, which it refuses.
            return ["--endpoint-reconciler-type=none"]
        # On a bridge address the `kubernetes` Service's endpoints follow the advertised
        # address (the default lease reconciler), and real kubelets serve logs and exec: the
        # API server calls them with a client certificate of its own, by the InternalIP they
        # register (the same bridge address, each kubelet on a port of its own).
        cert, key = self.pki.certificate(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["system:masters"]
        )
        return [
            f"--kubelet-client-certificate={cert}",
            f"--kubelet-client-key={key}",
            "--kubelet-preferred-address-types=InternalIP",
        ]

    def _audit_flags(self) -> list[str]:
        if self.audit_policy is None:
            return []
        return [
            f"--audit-policy-file={self.audit_policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
        ]

    def _node_monitor_flags(self) -> list[str]:
        grace = self.node_monitor_grace_seconds
        if grace is None:
            return []
        # The kubelet stand-in renews its Lease every 10 s: a grace under 3 renewals would
        # mark a merely slow (loaded) node lost.
        if grace < 30:
            raise ValueError(f"node_monitor_grace_seconds={grace}: use 30 or more")
        # The controller looks at the Leases every node-monitor period (5 s by default).
        return [f"--node-monitor-grace-period={grace}s", "--node-monitor-period=1s"]

    # ----------------------------------------------------------------- identities
    def admin(self) -> Client:
        cert = self.pki.certificate("admin", "kubernetes-admin", ["system:masters"])
        return Client(self.url, self.pki.ca_cert, cert=cert, agent="eddyline-test-admin")

    def client_as(self, name: str, user: str, groups: list[str]) -> Client:
        cert = self.pki.certificate(name, user, groups)
        return Client(self.url, self.pki.ca_cert, cert=cert, agent=f"eddyline-test/{name}")

    def token_kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig that authenticates with a bearer token (a ServiceAccount's)."""
        path.write_text(
            _kubeconfig_text(self.url, self.pki.ca_cert, f"token: {token}"), encoding="utf-8"
        )
        return path

    def service_account_token(
        self, namespace: str, name: str, seconds: int = 86_400, *, pod: Obj | None = None
    ) -> str:
        """A token for a ServiceAccount from the TokenRequest API; with ``pod``, bound to that
        pod as a kubelet's projected token is (the API server then names the pod in the
        request's user extra, ``authentication.kubernetes.io/pod-name`` and ``pod-uid``)."""
        spec: Obj = {"expirationSeconds": seconds}
        if pod is not None:
            meta = pod["metadata"]
            spec["boundObjectRef"] = {
                "apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]
            }  # fmt: skip
        answer = self.admin().create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return str(answer["status"]["token"])

    def certificate_kubeconfig(self, name: str, user: str, groups: list[str]) -> Path:
        """A kubeconfig at ``<root>/<name>.kubeconfig`` with a client certificate for ``user``."""
        cert, key = self.pki.certificate(name, user, groups)
        path = self.root / f"{name}.kubeconfig"
        credentials = f"client-certificate: {cert}\n    client-key: {key}"
        path.write_text(_kubeconfig_text(self.url, self.pki.ca_cert, credentials), "utf-8")
        return path

    def _admin_files(self) -> None:
        written = self.certificate_kubeconfig("admin", "kubernetes-admin", ["system:masters"])
        if written != self.admin_kubeconfig:
            os.replace(written, self.admin_kubeconfig)

    # ----------------------------------------------------------------- processes
    def _spawn(self, name: str, *flags: str) -> None:
        assert self.bin_dir is not None
        argv = [str(self.bin_dir / name)]
        for flag in flags:
            argv.extend(flag.split(" "))
        log = (self.logs / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        if self.on_spawn is not None:
            self.on_spawn(self.processes[name].pid)

    def _alive(self) -> bool:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {process.returncode}:\n{self.log_tail(name)}"
                )
        return True

    def _ready(self) -> bool:
        self._alive()
        try:
            answer = self.admin().request("/readyz", timeout=5)
        except (ApiError, OSError):
            return False
        return answer == "ok"

    def log_tail(self, name: str, size: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""

    def log_report(self, size: int = 3000) -> str:
        """The end of every component's log, for a failed test's report."""
        return "\n".join(
            f"----- {path.name} (last {size} characters) -----\n"
            + path.read_text(errors="replace")[-size:]
            for path in sorted(self.logs.glob("*.log"))
        )


def _kubeconfig_text(server: str, ca: Path, credentials: str) -> str:
    return f"""apiVersion: v1
kind: Config
clusters:
- name: eddyline-test
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: user
  user:
    {credentials}
contexts:
- name: eddyline-test
  context:
    cluster: eddyline-test
    user: user
current-context: eddyline-test
"""


def _healthy(url: str) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its own self-signed serving certificate
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
