"""The cluster stand-in: StatefulSets become real processes on their own addresses."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.k8s.apiserver import ApiServer
from tests.support.k8s.client import request
from tests.support.k8s.cluster import Cluster
from tests.support.k8s.kubectl import Kubectl
from tests.support.waiting import wait_for

MERGE = "application/merge-patch+json"
# A pod that serves its claim's directory on its own address; ready once it answers.
SERVER = ["python", "-m", "http.server", "8080", "--bind", "$(POD_IP)", "--directory", "/data"]


@pytest.fixture
def cluster(apiserver: ApiServer, tmp_path: Path) -> Iterator[Cluster]:
    stand_in = Cluster(apiserver, tmp_path / "cluster", restart_backoff=(0.2, 1.0)).start()
    yield stand_in
    stand_in.stop()


def stateful_set(replicas: int = 3, **pod_spec: Any) -> dict[str, Any]:
    labels = {"app": "web"}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "serviceName": "web",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ],
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "web",
                            "image": "python",
                            "command": SERVER,
                            "env": [
                                {
                                    "name": "POD_IP",
                                    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                                }
                            ],
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            "readinessProbe": {
                                "httpGet": {"path": "/", "port": "http"},
                                "periodSeconds": 1,
                            },
                        }
                    ],
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "topologyKey": "topology.kubernetes.io/zone",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    **pod_spec,
                },
            },
        },
    }


def sts_url(api: ApiServer) -> str:
    return f"{api.url}/apis/apps/v1/namespaces/default/statefulsets"


def pods(api: ApiServer) -> list[dict[str, Any]]:
    return list(request(f"{api.url}/api/v1/namespaces/default/pods").body["items"])


def ready_replicas(api: ApiServer, count: int) -> bool:
    status = request(f"{sts_url(api)}/web").body.get("status", {})
    return bool(status.get("readyReplicas") == count and status.get("replicas") == count)


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


@pytest.mark.slow
def test_stateful_set_pods_run_on_their_own_addresses_in_three_zones(
    apiserver: ApiServer, cluster: Cluster
) -> None:
    assert request(sts_url(apiserver), "POST", stateful_set()).status == 201
    wait_for(lambda: ready_replicas(apiserver, 3), "3 ready replicas")
    running = pods(apiserver)
    assert sorted(p["metadata"]["name"] for p in running) == ["web-0", "web-1", "web-2"]
    addresses = {p["status"]["podIP"] for p in running}
    assert len(addresses) == 3 and all(a.startswith(f"{apiserver.pod_network}.") for a in addresses)
    nodes = {
        n["metadata"]["name"]: n for n in request(f"{apiserver.url}/api/v1/nodes").body["items"]
    }
    zones = {
        nodes[p["spec"]["nodeName"]]["metadata"]["labels"]["topology.kubernetes.io/zone"]
        for p in running
    }
    assert zones == {"zone-a", "zone-b", "zone-c"}
    claims = request(f"{apiserver.url}/api/v1/namespaces/default/persistentvolumeclaims").body
    assert sorted(c["metadata"]["name"] for c in claims["items"]) == [
        "data-web-0",
        "data-web-1",
        "data-web-2",
    ]
    # Each pod's /data is its own claim's directory, which outlives the pod.
    claim_dir = cluster.root / "claims" / "default" / "data-web-1"
    (claim_dir / "marker.txt").write_text("one")
    web_1 = next(p for p in running if p["metadata"]["name"] == "web-1")
    assert fetch(f"http://{web_1['status']['podIP']}:8080/marker.txt") == "one"


@pytest.mark.slow
def test_a_killed_container_restarts_and_a_deleted_pod_is_replaced(
    apiserver: ApiServer, cluster: Cluster
) -> None:
    request(sts_url(apiserver), "POST", stateful_set(replicas=2))
    wait_for(lambda: ready_replicas(apiserver, 2), "2 ready replicas")
    pid = cluster.kill_container("default", "web-0")
    wait_for(lambda: not ready_replicas(apiserver, 2), "web-0 not ready after the kill")
    wait_for(lambda: ready_replicas(apiserver, 2), "web-0 restarted and ready")
    web_0 = request(f"{apiserver.url}/api/v1/namespaces/default/pods/web-0").body
    assert web_0["status"]["containerStatuses"][0]["restartCount"] == 1
    assert web_0["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    old_uid = web_0["metadata"]["uid"]
    deleted = request(f"{apiserver.url}/api/v1/namespaces/default/pods/web-0", "DELETE")
    assert deleted.body["metadata"]["deletionTimestamp"]  # graceful: the kubelet finishes it

    def replaced() -> bool:
        pod = request(f"{apiserver.url}/api/v1/namespaces/default/pods/web-0").body
        return pod.get("metadata", {}).get("uid") not in (None, old_uid) and ready_replicas(
            apiserver, 2
        )

    wait_for(replaced, "a new web-0")
    request(f"{sts_url(apiserver)}/web", "PATCH", {"spec": {"replicas": 1}}, content_type=MERGE)
    wait_for(lambda: [p["metadata"]["name"] for p in pods(apiserver)] == ["web-0"], "scale down")
    wait_for(lambda: len(cluster.pods) == 1, "web-1's process gone")


@pytest.mark.slow
def test_kubectl_get_pods_prints_readiness_status_and_restarts(
    apiserver: ApiServer, cluster: Cluster, kubectl: Kubectl
) -> None:
    request(sts_url(apiserver), "POST", stateful_set(replicas=2))
    wait_for(lambda: ready_replicas(apiserver, 2), "2 ready replicas")
    table = kubectl("get", "pods", "-o", "wide").splitlines()
    assert table[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
    assert [row.split()[:4] for row in table[1:]] == [
        ["web-0", "1/1", "Running", "0"],
        ["web-1", "1/1", "Running", "0"],
    ]
    assert kubectl("get", "sts", "web").splitlines()[1].split()[:2] == ["web", "2/2"]


@pytest.mark.slow
def test_a_service_forwards_to_ready_pods_only(apiserver: ApiServer, cluster: Cluster) -> None:
    request(sts_url(apiserver), "POST", stateful_set(replicas=1))
    service = request(
        f"{apiserver.url}/api/v1/namespaces/default/services",
        "POST",
        {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
        },
    ).body
    address = service["spec"]["clusterIP"]
    assert address.startswith("127.") and not address.startswith(f"{apiserver.pod_network}.")
    wait_for(lambda: ready_replicas(apiserver, 1), "1 ready replica")
    (cluster.root / "claims" / "default" / "data-web-0" / "hello.txt").write_text("hi")
    assert wait_for(lambda: _try(f"http://{address}/hello.txt"), "the proxy") == "hi"


@pytest.mark.slow
def test_required_node_affinity_pins_every_pod_to_one_node(
    apiserver: ApiServer, cluster: Cluster
) -> None:
    pinned = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-b"]}
                        ]
                    }
                ]
            }
        }
    }
    request(sts_url(apiserver), "POST", stateful_set(replicas=3, affinity=pinned))
    wait_for(lambda: ready_replicas(apiserver, 3), "3 ready replicas")
    assert {p["spec"]["nodeName"] for p in pods(apiserver)} == {"node-b"}


@pytest.mark.slow
def test_a_job_runs_its_pod_to_completion(apiserver: ApiServer, cluster: Cluster) -> None:
    job = {
        "metadata": {"name": "once"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "python", "command": ["python", "-c", "print(1)"]}
                    ],
                }
            }
        },
    }
    request(f"{apiserver.url}/apis/batch/v1/namespaces/default/jobs", "POST", job)

    def complete() -> bool:
        status = request(f"{apiserver.url}/apis/batch/v1/namespaces/default/jobs/once").body.get(
            "status", {}
        )
        return any(c["type"] == "Complete" for c in status.get("conditions", []))

    wait_for(complete, "the job to complete")
    assert [p["status"]["phase"] for p in pods(apiserver)] == ["Succeeded"]


def _try(url: str) -> str | None:
    try:
        return fetch(url)
    except OSError:
        return None
