"""Pods on real kubelets: what the kubelet stand-in cannot show (the ``realnode`` tier).

Three kubelets built from the pinned release, each on a containerd of its own with runc and
the CNI bridge (``tests/support/realnode``), are registered with the real API server, which
listens on a bridge address the pods reach. The real scheduler spreads three pods over the
three zones; each is checked from the host, through its container's first process: its user,
its seccomp mode, its read-only root, its memory cgroup's limit, its address in its node's
subnet, and (through its readiness probe, run in the pod by the kubelet) that it reaches the
API server. Then what a cluster gives pods: the API server through the ``kubernetes``
Service, a Service over pods on all three nodes (kube-proxy), names from the cluster DNS
(CoreDNS); and what it holds them to: the kernel's OOM killer at the memory limit, no packet
forwarded beyond the run's bridges, a failing probe that keeps a pod unready. Deleting a pod
stops its container and removes its sandbox.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.control_plane.client import ApiError, Client, wait_until
from tests.support.realnode import cluster_dns, host
from tests.support.realnode.cluster import API_ADDRESS, ZONES, RealCluster, container_id
from tests.support.realnode.host import memory_cgroup, memory_limit

# The first test's setup may build kubelet and kube-proxy (minutes, cold) when the tier runs
# without `make test` or `make test-realnode`, which build them first.
pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(900)]

NAMESPACE = "realnode-pods"
APP = "probe"
MEMORY_LIMIT = 48 * 1024 * 1024
# The nobody user of Debian: any non-root uid the image does not name.
UID = 65534
SERVE = "httpd -p 8080 -h /"
IDLE = "while :; do sleep 1; done"
# A command run over and over, for tests that read a pod's log.
REPEAT = "trap 'exit 0' TERM; while :; do {}; sleep 0.5; done"
# busybox's wget; the probe shows reachability, the certificate is not what it checks.
FETCH = ("wget", "-q", "-O", "/dev/null", "--no-check-certificate")
# Bounds for a broken run on a loaded 2-core machine, not expectations.
RUNNING_TIMEOUT = 180
GONE_TIMEOUT = 120


def pod(name: str, image: str, api_port: int) -> dict[str, Any]:
    readyz = f"https://{API_ADDRESS}:{api_port}/readyz"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": APP}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": UID,
                "runAsGroup": UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            # One pod per zone, by the scheduler's own spreading.
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": APP}},
                }
            ],
            "containers": [
                {
                    "name": APP,
                    "image": image,
                    "imagePullPolicy": "Never",
                    # Serves its root file system read-only on 8080 (/etc/hostname names the
                    # pod). PID 1 ignores SIGTERM unless it traps it: exit at once on delete.
                    "command": ["/bin/sh", "-c", f"trap 'exit 0' TERM; {SERVE}; {IDLE}"],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "resources": {
                        "requests": {"cpu": "10m", "memory": str(MEMORY_LIMIT)},
                        "limits": {"cpu": "100m", "memory": str(MEMORY_LIMIT)},
                    },
                    # Run inside the pod's network namespace by the kubelet (CRI ExecSync):
                    # Ready means the pod reached the API server's bridge address.
                    "readinessProbe": {
                        "exec": {"command": [*FETCH, readyz]},
                        "periodSeconds": 2,
                        "timeoutSeconds": 5,
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def pods(real_cluster: RealCluster) -> Iterator[list[dict[str, Any]]]:
    admin = real_cluster.admin()
    admin.create(
        "/api/v1/namespaces",
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": NAMESPACE,
                "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
            },
        },
    )
    wait_until(
        lambda: admin.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"),
        "the default ServiceAccount",
        60,
    )
    for index in range(len(ZONES)):
        admin.create(
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            pod(f"{APP}-{index}", image(real_cluster), real_cluster.plane.port),
        )

    def all_ready() -> list[dict[str, Any]] | None:
        found = admin.request(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        ready_pods = [p for p in found if ready(p)]
        return ready_pods if len(ready_pods) == len(ZONES) else None

    found: list[dict[str, Any]] = wait_until(all_ready, "three pods Ready", RUNNING_TIMEOUT)
    yield found
    admin.delete(f"/api/v1/namespaces/{NAMESPACE}")


def test_nodes_register_with_the_api_server_in_three_zones(real_cluster: RealCluster) -> None:
    nodes = real_cluster.admin().request("/api/v1/nodes")["items"]
    zones = {n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes}
    assert zones == set(ZONES)
    for node in nodes:
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.33.13"
        assert info["containerRuntimeVersion"].startswith("containerd://1.6")
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses["InternalIP"] == API_ADDRESS


def test_the_kubernetes_service_endpoint_follows_the_bridge_address(
    real_cluster: RealCluster,
) -> None:
    endpoints = real_cluster.admin().request("/api/v1/namespaces/default/endpoints/kubernetes")
    [subset] = endpoints["subsets"]
    assert [a["ip"] for a in subset["addresses"]] == [API_ADDRESS]
    assert [p["port"] for p in subset["ports"]] == [real_cluster.plane.port]


def test_the_scheduler_spreads_pods_over_the_zones(
    real_cluster: RealCluster, pods: list[dict[str, Any]]
) -> None:
    nodes = sorted(p["spec"]["nodeName"] for p in pods)
    assert nodes == sorted(real_cluster.nodes)


def test_each_pod_gets_an_address_of_its_nodes_subnet(
    real_cluster: RealCluster, pods: list[dict[str, Any]]
) -> None:
    for found in pods:
        node = real_cluster.nodes[found["spec"]["nodeName"]]
        assert ipaddress.ip_address(found["status"]["podIP"]) in node.spec.pod_subnet


def test_each_container_runs_confined_as_its_spec_says(
    real_cluster: RealCluster, pods: list[dict[str, Any]]
) -> None:
    for found in pods:
        node = real_cluster.nodes[found["spec"]["nodeName"]]
        pid = real_cluster.pod_pid(found)
        status = dict(
            line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        assert status["Uid"].split() == [str(UID)] * 4
        # 2: a seccomp filter is installed (RuntimeDefault); 0 would mean none.
        assert status["Seccomp"].strip() == "2"
        assert status["CapEff"].strip() == "0000000000000000"
        root = next(
            line.split()
            for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
            if line.split()[4] == "/"
        )
        assert "ro" in root[5].split(","), f"root mounted {root[5]}"
        assert memory_limit(pid) == MEMORY_LIMIT
        cgroup = memory_cgroup(pid)
        assert cgroup.startswith(f"{node.spec.cgroup_root}/kubepods/"), cgroup


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service(
    real_cluster: RealCluster, pods: list[dict[str, Any]]
) -> None:
    """As in-cluster clients do: the kubelet's service environment, kube-proxy's rules."""
    admin = real_cluster.admin()
    client = lone_pod("in-cluster", real_cluster)
    service = "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/readyz"
    [container] = client["spec"]["containers"]
    container["readinessProbe"]["exec"]["command"] = ["sh", "-c", " ".join([*FETCH, service])]
    admin.create(f"/api/v1/namespaces/{NAMESPACE}/pods", client)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/in-cluster"
    found = wait_until(lambda: ready(admin.get(path)), "in-cluster pod Ready", RUNNING_TIMEOUT)
    pid = real_cluster.pod_pid(found)
    environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    service_ip = next(host.SERVICE_NETWORK.hosts())
    assert f"KUBERNETES_SERVICE_HOST={service_ip}".encode() in environment
    admin.delete(path)


def test_a_service_spreads_requests_over_pods_on_every_node(
    real_cluster: RealCluster, pods: list[dict[str, Any]]
) -> None:
    """kube-proxy's rules and the EndpointSlice controller, across the nodes' bridges."""
    admin = real_cluster.admin()
    service = admin.create(
        f"/api/v1/namespaces/{NAMESPACE}/services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": APP},
            "spec": {"selector": {"app": APP}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    address = service["spec"]["clusterIP"]
    assert ipaddress.ip_address(address) in host.SERVICE_NETWORK
    # A client asking over and over which pod answers; its log is read through the API
    # server, which fetches it from the client's kubelet.
    client = lone_pod("client", real_cluster)
    # (Without -T: busybox 1.35's wget crashes with a timeout set.)
    fetch = f"wget -q -O - http://{address}/etc/hostname"
    [container] = client["spec"]["containers"]
    container["command"] = ["/bin/sh", "-c", REPEAT.format(fetch)]
    admin.create(f"/api/v1/namespaces/{NAMESPACE}/pods", client)
    names = {p["metadata"]["name"] for p in pods}

    def answered() -> bool:
        try:
            log = admin.request(f"/api/v1/namespaces/{NAMESPACE}/pods/client/log")
        except ApiError:
            return False  # not running yet
        return names <= set(str(log).split())

    wait_until(answered, f"answers from each of {sorted(names)} through {address}", RUNNING_TIMEOUT)
    admin.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/client")


def test_nothing_a_pod_sends_is_forwarded_beyond_the_runs_bridges(
    real_cluster: RealCluster, pods: list[dict[str, Any]]
) -> None:
    """The CNI bridge plugin turns the host's ip_forward on; the run's guard keeps it inside.

    The "outside" is a namespace of the host's own that the host reaches; a pod's request to
    it would be forwarded there but for the guard, so its probe fails and the guard counts.
    """
    port = 9000
    outside = host.start_outside_server(port)
    wait_until(
        lambda: subprocess.run(
            ["busybox", "wget", "-q", "-O", "/dev/null", f"http://{outside}:{port}/status"],
            capture_output=True, check=False, timeout=30,
        ).returncode == 0,
        f"the host to reach the outside server {outside}:{port}",
        60,
    )  # fmt: skip
    before = host.guard_drops()
    admin = real_cluster.admin()
    prober = lone_pod("outside", real_cluster)
    [container] = prober["spec"]["containers"]
    container["readinessProbe"]["exec"]["command"] = [*FETCH, f"http://{outside}:{port}/status"]
    container["readinessProbe"]["timeoutSeconds"] = 2
    admin.create(f"/api/v1/namespaces/{NAMESPACE}/pods", prober)
    wait_until(
        lambda: unhealthy(admin, "outside") and host.guard_drops() > before,
        "the outside probe to fail with the guard dropping its packets",
        RUNNING_TIMEOUT,
    )
    found = admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods/outside")
    assert ready(found) is None
    admin.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/outside")


def test_a_container_over_its_memory_limit_is_oom_killed_by_the_kernel(
    real_cluster: RealCluster, pods: list[dict[str, Any]]
) -> None:
    """The limit is enforced, not only written: the cgroup's OOM killer ends the container."""
    admin = real_cluster.admin()
    hungry = lone_pod("hungry", real_cluster)
    hungry["spec"]["restartPolicy"] = "Never"
    [container] = hungry["spec"]["containers"]
    container["command"] = ["tail", "/dev/zero"]
    del container["readinessProbe"]
    admin.create(f"/api/v1/namespaces/{NAMESPACE}/pods", hungry)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/hungry"

    def terminated() -> dict[str, Any] | None:
        statuses = ((admin.get(path) or {}).get("status") or {}).get("containerStatuses") or []
        state: dict[str, Any] | None = statuses[0]["state"].get("terminated") if statuses else None
        return state

    state = wait_until(terminated, "the hungry container to end", RUNNING_TIMEOUT)
    assert state["reason"] == "OOMKilled"
    assert state["exitCode"] == 137  # 128 + SIGKILL
    admin.delete(path)


def test_cluster_dns_answers_for_services_and_headless_pods(
    real_cluster: RealCluster, pods: list[dict[str, Any]]
) -> None:
    """CoreDNS behind kube-dns, named in every pod's resolv.conf by its kubelet."""
    admin = real_cluster.admin()
    admin.create(
        f"/api/v1/namespaces/{NAMESPACE}/services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "headless"},
            "spec": {"clusterIP": "None", "selector": {"app": APP}, "ports": [{"port": 8080}]},
        },
    )
    resolver = lone_pod("resolver", real_cluster)
    names = ["kubernetes.default.svc.cluster.local", f"headless.{NAMESPACE}.svc.cluster.local"]
    lookups = "; ".join(f"nslookup {name}" for name in names)
    [container] = resolver["spec"]["containers"]
    # resolv.conf first: the kubelet's clusterDNS in it.
    container["command"] = ["/bin/sh", "-c", f"cat /etc/resolv.conf; {REPEAT.format(lookups)}"]
    admin.create(f"/api/v1/namespaces/{NAMESPACE}/pods", resolver)
    expected = {str(next(host.SERVICE_NETWORK.hosts()))} | {p["status"]["podIP"] for p in pods}

    def resolved() -> str | None:
        try:
            log = str(admin.request(f"/api/v1/namespaces/{NAMESPACE}/pods/resolver/log"))
        except ApiError:
            return None  # not running yet
        return log if expected <= set(log.replace(":", " ").split()) else None

    log = wait_until(resolved, f"the resolver pod to resolve {expected}", RUNNING_TIMEOUT)
    assert f"nameserver {cluster_dns.DNS_ADDRESS}" in log
    admin.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/resolver")


def test_a_probe_that_cannot_reach_its_target_keeps_the_pod_unready(
    real_cluster: RealCluster, pods: list[dict[str, Any]]
) -> None:
    """The control for the Ready pods above: the probe runs, and fails when it cannot reach."""
    admin = real_cluster.admin()
    # Port 1 on the API server's address: reachable host, nothing listening.
    unready = lone_pod("unreachable", real_cluster, api_port=1)
    admin.create(f"/api/v1/namespaces/{NAMESPACE}/pods", unready)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/unreachable"

    wait_until(lambda: unhealthy(admin, "unreachable"), "the probe to fail", RUNNING_TIMEOUT)
    found = admin.get(path)
    assert found is not None
    conditions = {c["type"]: c["status"] for c in found["status"]["conditions"]}
    assert conditions["Ready"] == "False"
    admin.delete(path)


def test_deleting_a_pod_stops_its_container_and_sandbox(
    real_cluster: RealCluster, pods: list[dict[str, Any]]
) -> None:
    victim = pods[0]
    name = victim["metadata"]["name"]
    node = real_cluster.nodes[victim["spec"]["nodeName"]]
    container = container_id(victim)
    pid = node.task_pid(container)
    assert pid is not None
    cgroup = Path("/sys/fs/cgroup/memory") / memory_cgroup(pid).lstrip("/")
    # The pod's sandbox (the pause container) and its app container, both running.
    containers = node.pod_containers(NAMESPACE, name)
    assert len(containers) == 2
    assert all(node.task_pid(c) for c in containers)
    admin = real_cluster.admin()
    admin.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    # The kubelet confirms the deletion only once the containers are stopped.
    wait_until(
        lambda: admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}") is None,
        f"pod {name} gone from the API",
        GONE_TIMEOUT,
    )
    assert not Path(f"/proc/{pid}").exists()
    wait_until(
        lambda: not any(node.task_pid(c) for c in containers),
        f"{name}'s sandbox stopped on {node.spec.name}",
        GONE_TIMEOUT,
    )
    # The pod's cgroup goes on the kubelet's next housekeeping (every 2 s); the stopped
    # containers themselves wait for its garbage collection (every minute).
    wait_until(lambda: not cgroup.exists(), f"{name}'s cgroup {cgroup} removed", GONE_TIMEOUT)


def lone_pod(name: str, cluster: RealCluster, *, api_port: int | None = None) -> dict[str, Any]:
    """A pod like the spread ones, with a label of its own and placed anywhere."""
    found = pod(name, image(cluster), api_port or cluster.plane.port)
    found["metadata"]["labels"] = {"app": name}
    del found["spec"]["topologySpreadConstraints"]
    return found


def image(cluster: RealCluster) -> str:
    """The busybox image every node holds."""
    assert cluster.busybox is not None
    return cluster.busybox.reference


def unhealthy(admin: Client, name: str) -> bool:
    """The pod's container runs and the kubelet has reported a failed probe for it."""
    found = admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}") or {}
    statuses = found.get("status", {}).get("containerStatuses") or []
    running = bool(statuses) and "running" in statuses[0]["state"]
    events = admin.request(
        f"/api/v1/namespaces/{NAMESPACE}/events"
        f"?fieldSelector=involvedObject.name={name},reason=Unhealthy"
    )["items"]
    return running and bool(events)


def ready(found: dict[str, Any] | None) -> dict[str, Any] | None:
    """The pod when its Ready condition is True, else None."""
    conditions = ((found or {}).get("status") or {}).get("conditions") or []
    is_ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return found if is_ready else None
