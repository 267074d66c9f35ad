"""The real control plane on a bridge address and real nodes in three zones: the whole cluster.

:meth:`RealCluster.start` holds the machine-wide lock, clears what a crashed run left
(:func:`host.purge`), installs missing Debian packages, builds (or reuses) the binaries and
images, puts the API server on :data:`API_ADDRESS` (a bridge of the run's own, which pods and
the host both reach) with a Service range pods can route to, then starts every node's
containerd and kubelet, waits until each Node is Ready, and starts one kube-proxy for all of
them (:mod:`.kube_proxy`) and CoreDNS behind ``kube-dns`` (:mod:`.cluster_dns`).
:meth:`RealCluster.stop` stops them and purges again, so the next run starts clean. Every
step's duration lands in :attr:`RealCluster.timings`.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.support.control_plane.client import Client
from tests.support.control_plane.plane import CLOUD_CONTROLLERS, ControlPlane, build_binaries
from tests.support.realnode import audit, cluster_dns, host, kube_proxy
from tests.support.realnode.images import Image, busybox_image, coredns_image, pause_image
from tests.support.realnode.kube_proxy import KubeProxy
from tests.support.realnode.node import NodeSpec, RealNode

ZONES = ("zone-a", "zone-b", "zone-c")
# The API server's address for real nodes, on the bridge API_BRIDGE: from a private range no
# interface of this machine uses, on a bridge the run creates and deletes.
API_ADDRESS = "10.243.0.1"
API_BRIDGE = f"{host.BRIDGE_PREFIX}api"
# A cold kubelet registers, reports its runtime and CNI ready within tens of seconds on a
# loaded 2-core machine; this only bounds a hang.
REGISTER_SECONDS = 180.0
# etcd and the Kubernetes components, found again by a purge after a crash as the nodes are.
CONTROL_PLANE_CGROUP = f"{host.CGROUP_PARENT}/control-plane"

T = TypeVar("T")


class RealCluster:
    """Start with :meth:`start`; tests reach the API through :meth:`admin`, nodes by name."""

    def __init__(self, root: Path, *, zones: tuple[str, ...] = ZONES) -> None:
        self.root = root
        self.specs = [
            NodeSpec(name=f"realnode-{zone.removeprefix('zone-')}", zone=zone, index=index)
            for index, zone in enumerate(zones)
        ]
        self.plane = ControlPlane(
            root / "control-plane",
            address=API_ADDRESS,
            service_cidr=str(host.SERVICE_NETWORK),
            # Pods have real addresses here: EndpointSlices for kube-proxy.
            disabled_controllers=CLOUD_CONTROLLERS,
            on_spawn=lambda pid: host.move_into_cgroup(pid, CONTROL_PLANE_CGROUP),
            # ServiceAccounts' calls only (tests/support/realnode/audit.py): what a workload
            # such as a Spark driver asks of the API server.
            audit_policy=audit.write_policy(root / "audit"),
        )
        self.nodes: dict[str, RealNode] = {}
        self.kube_proxy: KubeProxy | None = None
        self.node_bin: Path | None = None
        # What the tests' own pods run; every image the nodes hold is in ``images``.
        self.busybox: Image | None = None
        self.images: list[Image] = []
        self.timings: dict[str, float] = {}
        self._held = contextlib.ExitStack()
        # Only the holder of the machine-wide lock may purge: a run that failed to take it must
        # not take down the nodes of the run that holds it.
        self._locked = False

    def pod_pid(self, pod: dict[str, Any]) -> int:
        """The host PID of a running pod's container's first process, through its node (to
        freeze, kill or inspect it as the kernel sees it)."""
        pid = self.nodes[pod["spec"]["nodeName"]].task_pid(container_id(pod))
        assert pid is not None, f"no running task for {pod['metadata']['name']}"
        return pid

    def admin(self) -> Client:
        return self.plane.admin()

    def start(self) -> RealCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        host.check_host()
        self._held.enter_context(host.exclusive())
        self._locked = True
        self._timed("install packages", host.install_missing_packages)
        plane_bin = self._timed("control-plane binaries", build_binaries)
        node_bin = self.node_bin = self._timed("kubelet binaries", lambda: build_binaries("--node"))
        self._timed("purge stale state", self._purge)
        pause = self._timed("pause image", pause_image)
        self.busybox = self._timed("busybox image", busybox_image)
        coredns = self._timed("CoreDNS image", lambda: coredns_image(node_bin / "coredns"))
        self.images = [self.busybox, coredns]
        host.create_bridge(API_BRIDGE, f"{API_ADDRESS}/24")
        host.blackhole_services()
        host.open_forwarding()
        host.create_cgroup(CONTROL_PLANE_CGROUP)
        self.plane.bin_dir = plane_bin
        self._timed("control plane start", self.plane.start)
        for spec in self.specs:
            node = RealNode(
                spec, bin_dir=node_bin, plane=self.plane, pause=pause, images=self.images
            )
            self.nodes[spec.name] = node
            self._timed(f"containerd start {spec.name}", node.start_runtime)
        started = time.monotonic()
        for node in self.nodes.values():
            node.start_kubelet()
        for node in self.nodes.values():
            node.wait_registered(REGISTER_SECONDS)
            self.timings[f"node Ready {node.spec.name}"] = time.monotonic() - started
        self.kube_proxy = KubeProxy(
            binary=node_bin / "kube-proxy", plane=self.plane, node_name=self.specs[0].name
        )
        self._timed("kube-proxy first sync", self.kube_proxy.start)
        self._timed("CoreDNS Ready", lambda: cluster_dns.deploy(self.admin(), coredns.reference))

    def stop(self) -> None:
        """Stop every node and the control plane, keep their logs, and purge the host."""
        try:
            if self.kube_proxy is not None:
                self.kube_proxy.stop()
            for node in self.nodes.values():
                node.stop()
            self.plane.stop()
            self._keep_node_logs()
            if self._locked:
                self._purge()
        finally:
            self._locked = False
            self._held.close()

    def _purge(self) -> None:
        host.purge()
        if self.node_bin is not None:
            kube_proxy.cleanup(self.node_bin / "kube-proxy")

    def failure_report(self) -> str:
        parts = [self.plane.log_report()]
        if self.kube_proxy is not None:
            parts.append(f"----- kube-proxy -----\n{self.kube_proxy.tail(3000)}")
        for node in self.nodes.values():
            for name in ("kubelet", "containerd"):
                parts.append(f"----- {node.spec.name} {name} -----\n{node.log_tail(name, 3000)}")
        return "\n".join(parts)

    def _keep_node_logs(self) -> None:
        # The purge deletes the nodes' directories; their logs stay with the run's own files.
        for node in self.nodes.values():
            if node.logs.is_dir():
                shutil.copytree(node.logs, self.root / "node-logs" / node.spec.name,
                                dirs_exist_ok=True)  # fmt: skip
        if self.kube_proxy is not None and self.kube_proxy.log.exists():
            (self.root / "node-logs").mkdir(exist_ok=True)
            shutil.copy(self.kube_proxy.log, self.root / "node-logs" / "kube-proxy.log")

    def _timed(self, step: str, action: Callable[[], T]) -> T:
        started = time.monotonic()
        result = action()
        self.timings[step] = time.monotonic() - started
        return result


def container_id(pod: dict[str, Any]) -> str:
    """The containerd ID of a one-container pod's container, from its status."""
    [status] = pod["status"]["containerStatuses"]
    runtime, _, identifier = str(status["containerID"]).partition("://")
    assert runtime == "containerd", status["containerID"]
    return identifier
