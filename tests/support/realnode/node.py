"""One real node: a containerd of its own and a real kubelet registered with the API server.

Several nodes share this host, so each has its own of everything two kubelets would otherwise
share: containerd root, state and socket (containers of one node are invisible to another),
kubelet root and pod-log directories, cgroup root, CNI network (a bridge and a pod subnet) and
ports. What the VM needs from every node is in ``../shared/facts/containers.md`` and the
comments below: no CAP_SYS_RESOURCE (``restrict_oom_score_adj``), cgroup v1 (``cgroupfs``,
``failCgroupV1: false``, the cgroup root made beforehand), no registry (the sandbox image is the
project's own pause image, imported with ``ctr``).
"""

from __future__ import annotations

import ipaddress
import json
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.control_plane.client import wait_until
from tests.support.control_plane.plane import ControlPlane
from tests.support.ports import free_port
from tests.support.realnode import cluster_dns, host
from tests.support.realnode.images import Image

CNI_BIN = Path("/usr/lib/cni")
# containerd answers on its socket within a second or two; this only bounds a hang.
RUNTIME_START_SECONDS = 60.0
STOP_SECONDS = 10.0


@dataclass(frozen=True)
class NodeSpec:
    """Who a node is: its name, zone and index (which picks its subnet and bridge)."""

    name: str
    zone: str
    index: int

    @property
    def pod_subnet(self) -> ipaddress.IPv4Network:
        # The (index + 1)th /24 of the pod network, on a bridge only this run makes; the host
        # does not forward (ip_forward stays as it is), so pod traffic ends on this machine.
        return list(host.POD_NETWORK.subnets(new_prefix=24))[self.index + 1]

    @property
    def bridge(self) -> str:
        return f"{host.BRIDGE_PREFIX}n{self.index}"

    @property
    def cgroup_root(self) -> str:
        """The kubelet's ``cgroupRoot``; containerd and its shims sit in ``runtime`` below it."""
        return f"/{host.CGROUP_PARENT}/{self.name}"


class RealNode:
    """Start with :meth:`start_runtime` then :meth:`start_kubelet`; :meth:`stop` ends both."""

    def __init__(
        self,
        spec: NodeSpec,
        *,
        bin_dir: Path,
        plane: ControlPlane,
        pause: Image,
        images: list[Image],
    ) -> None:
        self.spec = spec
        self.bin_dir = bin_dir
        self.plane = plane
        self.pause = pause
        self.images = images
        self.state = host.STATE / spec.name
        self.data = host.DATA / spec.name
        self.logs = self.data / "logs"
        self.socket = self.state / "containerd.sock"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.kubelet_port = 0

    # ------------------------------------------------------------------ runtime
    def start_runtime(self) -> None:
        """containerd with its CRI and CNI configuration, the images imported."""
        for directory in (self.state, self.data, self.logs, self.data / "net.d"):
            directory.mkdir(parents=True, exist_ok=True)
        host.create_cgroup(self.spec.cgroup_root)
        host.create_cgroup(f"{self.spec.cgroup_root}/runtime")
        (self.data / "net.d" / "10-bridge.conflist").write_text(
            json.dumps(self._cni_config(), indent=2), encoding="utf-8"
        )
        config = self.data / "containerd.toml"
        config.write_text(self._containerd_config(), encoding="utf-8")
        self._spawn("containerd", ["containerd", "--config", str(config)])
        wait_until(
            lambda: self._alive() and self.ctr("version", check=False).returncode == 0,
            f"containerd of node {self.spec.name} to answer on {self.socket}",
            RUNTIME_START_SECONDS,
        )
        for image in [self.pause, *self.images]:
            self.ctr("images", "import", str(image.archive))

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd, in the CRI's ``k8s.io`` namespace."""
        completed = subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        if check and completed.returncode != 0:
            raise RuntimeError(
                f"ctr {' '.join(args)} on node {self.spec.name} failed: {completed.stderr}"
            )
        return completed

    def _containerd_config(self) -> str:
        cri = '"io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{self.data / "containerd"}"
state = "{self.state / "containerd"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.data / "containerd-opt"}"
[plugins.{cri}]
  # No registry is reachable: the project's own pause image, imported beforehand.
  sandbox_image = "{self.pause.reference}"
  # The VM withholds CAP_SYS_RESOURCE: without this runc cannot lower oom_score_adj and
  # every sandbox fails ("can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  # Network namespaces under this node's state directory, so a purge finds them.
  netns_mounts_under_state_dir = true
  # kubectl exec/attach/port-forward streams: loopback only, any free port.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins.{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins.{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.{cri}.containerd.runtimes.runc.options]
        # cgroup v1 with the kubelet's cgroupfs driver (no systemd here).
        SystemdCgroup = false
  [plugins.{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{self.data / "net.d"}"
"""

    def _cni_config(self) -> dict[str, object]:
        subnet = self.spec.pod_subnet
        return {
            "cniVersion": "0.4.0",
            "name": f"{host.CNI_NETWORK_PREFIX}{self.spec.name}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.spec.bridge,
                    # The bridge holds the subnet's first address: the pods' gateway, and the
                    # host's address on their network.
                    "isGateway": True,
                    # No masquerading: pod traffic is not meant to leave this machine.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(subnet)}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.data / "ipam"),
                    },
                }
            ],
        }

    # ------------------------------------------------------------------ kubelet
    def start_kubelet(self) -> None:
        """The kubelet, as ``system:node:<name>``; it registers its Node on its own."""
        name = self.spec.name
        kubeconfig = self.plane.certificate_kubeconfig(
            f"kubelet-{name}", f"system:node:{name}", ["system:nodes"]
        )
        self.kubelet_port = free_port()
        config = self.data / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config()), encoding="utf-8")
        self._spawn(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.data / 'kubelet'}",
                f"--hostname-override={name}",
                # The API server's bridge address: what the API server calls for logs and
                # exec (each kubelet on its own port), never this machine's outside address.
                f"--node-ip={self.plane.address}",
                f"--node-labels=topology.kubernetes.io/zone={self.spec.zone}",
                "--v=2",
            ],
        )

    def _kubelet_config(self) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.plane.address,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            # The API server is the only caller: it presents a certificate from the harness
            # CA (plane.py); nothing else on this machine is let in.
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.plane.pki.ca_cert)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            # This VM mounts cgroup v1; 1.33 refuses it unless told.
            "failCgroupV1": False,
            "cgroupRoot": self.spec.cgroup_root,
            "podLogsDir": str(self.data / "pod-logs"),
            # No resolver for pods: the host's would point outside this machine.
            "resolvConf": "",
            "clusterDNS": [cluster_dns.DNS_ADDRESS],
            "clusterDomain": cluster_dns.CLUSTER_DOMAIN,
            "failSwapOn": False,
            # Evictions for disk and memory the machine's other tenants use, not this node:
            # only a near-empty disk should evict the tests' pods.
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            # No image garbage collection (100 turns it off): every image here was imported
            # (no registry can be reached), so one collected is gone for the rest of the run.
            # A full disk once had the kubelets remove the pause image mid-tier, and every
            # pod after that failed to get a sandbox.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "maxPods": 30,
            "serializeImagePulls": False,
            # The kubelet's iptables canary chains would outlive the run in the host's tables.
            "makeIPTablesUtilChains": False,
        }

    # ------------------------------------------------------------------ processes
    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        self.processes[name] = process
        # Under the node's cgroup before it starts anything, so what it starts (shims,
        # containers) is found again by a purge after a crash.
        host.move_into_cgroup(process.pid, f"{self.spec.cgroup_root}/runtime")

    def _alive(self) -> bool:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(
                    f"{name} of node {self.spec.name} exited with {process.returncode}:\n"
                    f"{self.log_tail(name)}"
                )
        return True

    def stop(self) -> None:
        """SIGTERM kubelet then containerd; what they leave (shims, containers) the purge ends."""
        for name in ("kubelet", "containerd"):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_SECONDS)

    def log_tail(self, name: str, size: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""

    def task_pid(self, container_id: str) -> int | None:
        """The host PID of a running container's first process, None when it has no task."""
        for line in self.ctr("tasks", "ls").stdout.splitlines()[1:]:
            task, pid, status = line.split()
            if task == container_id and status == "RUNNING":
                return int(pid)
        return None

    def pod_containers(self, namespace: str, pod: str) -> set[str]:
        """The IDs of a pod's containers on this node, its sandbox (pause) included."""
        labels = f'labels."io.kubernetes.pod.namespace"=={namespace}'
        name = f'labels."io.kubernetes.pod.name"=={pod}'
        return set(self.ctr("containers", "ls", "--quiet", f"{labels},{name}").stdout.split())

    def wait_registered(self, timeout: float) -> float:
        """Seconds until the Node reports Ready (the kubelet registered, CNI ready)."""
        started = time.monotonic()
        admin = self.plane.admin()

        def ready() -> bool:
            self._alive()
            node = admin.get(f"/api/v1/nodes/{self.spec.name}") or {}
            conditions = (node.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_until(ready, f"node {self.spec.name} Ready", timeout)
        return time.monotonic() - started
