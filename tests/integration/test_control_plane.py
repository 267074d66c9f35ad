"""The tests' control plane and its kubelet stand-in, on a cluster of this module's own.

The hooks later tests rely on: a killed node stops its Lease renewals and its processes
together, and the real node lifecycle controller then marks it not Ready; a liveness kill
honours the grace period (SIGTERM first, SIGKILL only after it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import Cluster

pytestmark = pytest.mark.slow

NAMESPACE = "harness"
# This module's cluster is its own: its node lifecycle controller gets a grace period shorter
# than the default 50 s (three of the stand-in's 10 s Lease renewals), which only shortens
# the wait for the node-c kill to be noticed.
NODE_MONITOR_GRACE_SECONDS = 30
# That grace period plus room for a loaded machine.
NODE_LOST_TIMEOUT = 180


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(
        tmp_path_factory.mktemp("harness-cluster"),
        node_monitor_grace_seconds=NODE_MONITOR_GRACE_SECONDS,
    ).start()
    running.admin().ensure("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    yield running
    running.stop()


def _pod(name: str, node: str, command: list[str], **spec: object) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "local", "command": command}],
            **spec,
        },
    }


def _create(cluster: Cluster, pod: dict[str, object]) -> None:
    """Create the pod once the namespace's default ServiceAccount exists (the real
    ServiceAccount admission refuses pods before the controller has made it)."""
    admin = cluster.admin()
    wait_until(
        lambda: admin.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"),
        "the default ServiceAccount",
        60,
    )
    admin.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)


def _ready_condition(cluster: Cluster, node: str) -> str:
    found = cluster.admin().get(f"/api/v1/nodes/{node}")
    assert found is not None
    return next(c["status"] for c in found["status"]["conditions"] if c["type"] == "Ready")


def test_a_pod_runs_as_a_process_and_a_killed_node_is_marked_lost(
    cluster: Cluster, tmp_path: Path
) -> None:
    assert cluster.kubelets is not None
    admin = cluster.admin()
    marker = tmp_path / "ran"
    _create(cluster, _pod("sleeper", "node-c", ["sh", "-c", f"touch {marker}; exec sleep 600"]))

    def running() -> bool:
        pod = admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods/sleeper")
        return bool(pod and pod.get("status", {}).get("phase") == "Running")

    wait_until(running, "the pod Running on node-c", 120)
    wait_until(marker.exists, "the pod's process to run", 30)
    assert _ready_condition(cluster, "node-c") == "True"
    lease = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-c"
    before = admin.get(lease)
    assert before is not None
    cluster.kubelets.kill_node("node-c")
    with pytest.raises(LookupError):
        cluster.kubelets.kill_container(NAMESPACE, "sleeper")  # its processes are gone
    killed = time.monotonic()
    wait_until(
        lambda: _ready_condition(cluster, "node-c") == "Unknown",
        "the node lifecycle controller to mark node-c lost",
        NODE_LOST_TIMEOUT,
    )
    after = admin.get(lease)
    assert after is not None and after["spec"]["renewTime"] == before["spec"]["renewTime"]
    print(f"node-c marked Unknown {time.monotonic() - killed:.0f} s after the kill")
    assert _ready_condition(cluster, "node-a") == "True"


def test_a_liveness_kill_waits_for_the_grace_period(cluster: Cluster, tmp_path: Path) -> None:
    """The process ignores SIGTERM: it is SIGKILLed only after the probe's grace period."""
    admin = cluster.admin()
    log = tmp_path / "signals"
    script = f"trap 'echo TERM >> {log}' TERM; while true; do sleep 0.2; done"
    probe = {
        "tcpSocket": {"port": 9},  # nothing listens: every probe fails
        "periodSeconds": 1,
        "failureThreshold": 1,
        "terminationGracePeriodSeconds": 5,
    }
    pod = _pod("stubborn", "node-a", ["sh", "-c", script])
    pod["spec"]["containers"][0]["livenessProbe"] = probe  # type: ignore[index]
    _create(cluster, pod)

    def restarted() -> dict[str, object] | None:
        found = admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods/stubborn")
        statuses = (found or {}).get("status", {}).get("containerStatuses", [])
        return statuses[0] if statuses and statuses[0]["restartCount"] >= 1 else None

    status = wait_until(restarted, "the liveness kill and restart", 120)
    assert log.read_text(encoding="utf-8").count("TERM") >= 1  # SIGTERM came first
    terminated = status["lastState"]["terminated"]  # type: ignore[index]
    assert terminated["exitCode"] == 137  # then SIGKILL, after the grace period
    started = _seconds(terminated["startedAt"])
    finished = _seconds(terminated["finishedAt"])
    assert finished - started >= 5


def _seconds(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
