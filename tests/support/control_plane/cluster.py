"""The control plane plus the stand-ins for the machines: the whole test cluster."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support.control_plane import pod_network
from tests.support.control_plane.client import Client, wait_until
from tests.support.control_plane.kubelet import Kubelets, Node, free_address_octet
from tests.support.control_plane.plane import ControlPlane
from tests.support.control_plane.provisioner import LocalProvisioner
from tests.support.control_plane.proxy import ServiceProxy

ZONES = ("zone-a", "zone-b", "zone-c")


class Cluster:
    """Start with :meth:`start`; tests reach everything through the attributes."""

    def __init__(
        self,
        root: Path,
        *,
        pythonpath: list[str] | None = None,
        restart_backoff: tuple[float, float] = (10.0, 300.0),
        node_monitor_grace_seconds: int | None = None,
        crds: Sequence[Path] = (),
        routable_pods: bool = False,
    ) -> None:
        """``routable_pods``: pod addresses from :data:`.pod_network.NETWORK` (global
        unicast, so the API server's pod proxy reaches them; the host needs the route
        :func:`.pod_network.routed` adds) instead of loopback ones."""
        self.root = root
        self.routable_pods = routable_pods
        self.plane = ControlPlane(
            root / "control-plane",
            node_monitor_grace_seconds=node_monitor_grace_seconds,
            crds=crds,
        )
        self.pythonpath = pythonpath or []
        self.restart_backoff = restart_backoff
        self.kubelets: Kubelets | None = None
        self.provisioner: LocalProvisioner | None = None
        self.proxy: ServiceProxy | None = None
        self.startup_seconds = 0.0

    @property
    def kubeconfig(self) -> Path:
        return self.plane.admin_kubeconfig

    def admin(self) -> Client:
        return self.plane.admin()

    def start(self) -> Cluster:
        started = time.monotonic()
        try:
            self.plane.start()
            admin = self.plane.admin()
            self.provisioner = LocalProvisioner(admin, self.root / "volumes").start()
            # The proxy reads pods as well as Services, which kube-proxy's role does not grant.
            self.proxy = ServiceProxy(admin).start()
            nodes = []
            first, octets = (
                (pod_network.FIRST_OCTET, pod_network.SECOND_OCTETS)
                if self.routable_pods
                else (127, (20, 250))
            )
            address_octet = free_address_octet(len(ZONES), first=first, octets=octets)
            for index, zone in enumerate(ZONES):
                name = f"node-{chr(ord('a') + index)}"
                client = self.plane.client_as(
                    f"kubelet-{name}", f"system:node:{name}", ["system:nodes"]
                )
                nodes.append(
                    Node(
                        client,
                        name,
                        zone,
                        index,
                        self.root / "nodes" / name,
                        api_host="127.0.0.1",
                        api_port=self.plane.port,
                        path=[str(Path(sys.executable).parent)],
                        pythonpath=self.pythonpath,
                        restart_backoff=self.restart_backoff,
                        address_octet=address_octet,
                        address_first_octet=first,
                    )
                )
            self.kubelets = Kubelets(nodes).start()
            self._wait_nodes_ready(admin)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _wait_nodes_ready(self, admin: Client) -> None:
        def ready() -> bool:
            nodes = admin.request("/api/v1/nodes")["items"]
            return len(nodes) == len(ZONES) and all(
                any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n["status"].get("conditions", [])
                )
                and not any(
                    t["key"] == "node.kubernetes.io/not-ready" for t in n["spec"].get("taints", [])
                )
                for n in nodes
            )

        wait_until(ready, "three Ready nodes without the not-ready taint", 120)

    def stop(self) -> None:
        if self.kubelets is not None:
            self.kubelets.stop()
        if self.proxy is not None:
            self.proxy.stop()
        if self.provisioner is not None:
            self.provisioner.stop()
        self.plane.stop()

    def failure_report(self) -> str:
        """Component logs and stand-in errors, printed when a test fails."""
        errors = self.kubelets.errors() if self.kubelets is not None else []
        return (
            self.plane.log_report()
            + "\n----- kubelet stand-in errors -----\n"
            + "\n".join(errors[-50:])
        )
