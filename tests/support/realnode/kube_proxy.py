"""kube-proxy (iptables mode) of the pinned release, for the real nodes' Services.

One kube-proxy serves all three nodes: they share this host's network namespace, so their
Service rules are the same iptables rules, and a second kube-proxy would only fight the first
over the ``KUBE-*`` chains. It runs in iptables mode: the kernel has no loadable modules and no
IPVS, and iptables (Debian's, on nf_tables) works. It authenticates as ``system:kube-proxy``,
the user Kubernetes' default RBAC binds to ``system:node-proxier``.

It is told to leave the host's settings alone: conntrack limits and timeouts as they are
(``0``), no ``route_localnet`` (``localhostNodePorts: false``), NodePorts only on the API
bridge's address. ``kube-proxy --cleanup`` removes its rules again (:func:`cleanup`).
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import yaml

from tests.support.control_plane.client import wait_until
from tests.support.control_plane.plane import ControlPlane
from tests.support.ports import free_port
from tests.support.realnode import host

# Bounds a hang; it writes its first rules within seconds.
START_SECONDS = 120.0
STOP_SECONDS = 10.0
CGROUP = f"{host.CGROUP_PARENT}/kube-proxy"


class KubeProxy:
    def __init__(self, *, binary: Path, plane: ControlPlane, node_name: str) -> None:
        self.binary = binary
        self.plane = plane
        self.node_name = node_name
        self.root = host.DATA / "kube-proxy"
        self.log = self.root / "kube-proxy.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # Found again by a purge after a crash, as the nodes' processes are.
        host.create_cgroup(CGROUP)
        kubeconfig = self.plane.certificate_kubeconfig("kube-proxy", "system:kube-proxy", [])
        healthz = free_port()
        config = self.root / "kube-proxy.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "clientConnection": {"kubeconfig": str(kubeconfig)},
                    "mode": "iptables",
                    "hostnameOverride": self.node_name,
                    "clusterCIDR": str(host.POD_NETWORK),
                    "healthzBindAddress": f"127.0.0.1:{healthz}",
                    "metricsBindAddress": f"127.0.0.1:{free_port()}",
                    "nodePortAddresses": [f"{self.plane.address}/32"],
                    "conntrack": {
                        "maxPerCore": 0,
                        "min": 0,
                        "tcpEstablishedTimeout": "0s",
                        "tcpCloseWaitTimeout": "0s",
                    },
                    "iptables": {
                        "localhostNodePorts": False,
                        "minSyncPeriod": "1s",
                        "syncPeriod": "30s",
                    },
                }
            ),
            encoding="utf-8",
        )
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [str(self.binary), f"--config={config}", "--v=2"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        host.move_into_cgroup(self.process.pid, CGROUP)
        wait_until(self._synced, "kube-proxy's first iptables sync", START_SECONDS)

    def _synced(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"kube-proxy exited with {self.process.returncode}:\n{self.tail()}")
        rules = subprocess.run(
            ["iptables", "-t", "nat", "-S", "KUBE-SERVICES"],
            capture_output=True, text=True, check=False, timeout=30,
        ).stdout  # fmt: skip
        # The `kubernetes` Service's rule: written once the proxy has synced Services and
        # EndpointSlices.
        return "default/kubernetes:https" in rules

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_SECONDS)

    def tail(self, size: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-size:] if self.log.exists() else ""


def cleanup(binary: Path) -> float:
    """Remove every rule and chain kube-proxy wrote; returns the seconds it took.

    ``kube-proxy --cleanup`` first; it leaves the chains kube-proxy shares with kubelets of
    old (``KUBE-MARK-MASQ``, ``KUBE-FIREWALL`` and the jumps to it) and its ``KUBE-PROXY-CANARY``
    chains, which this then removes in both families. Only the real nodes run a kube-proxy on
    this machine (one run at a time, ``host.exclusive``), so every ``KUBE-`` chain is theirs.
    """
    started = time.monotonic()
    completed = subprocess.run(
        [str(binary), "--cleanup", "--v=0"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if completed.returncode != 0:
        raise host.HostError(f"kube-proxy --cleanup failed:\n{completed.stderr[-2000:]}")
    for command in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            _remove_kube_chains(command, table)
    return time.monotonic() - started


def _remove_kube_chains(command: str, table: str) -> None:
    def run(*args: str) -> str:
        done = subprocess.run(
            [command, "-w", "-t", table, *args],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            raise host.HostError(f"{command} -t {table} {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    rules = run("-S").splitlines()
    chains = [line.split()[1] for line in rules if line.startswith("-N KUBE-")]
    for line in rules:
        words = line.split()
        # A jump from a chain that stays (INPUT, OUTPUT, ...) into one that goes.
        if words[0] == "-A" and not words[1].startswith("KUBE-") and "KUBE-" in line:
            run("-D", *words[1:])
    for chain in chains:
        run("-F", chain)
    for chain in chains:
        run("-X", chain)
