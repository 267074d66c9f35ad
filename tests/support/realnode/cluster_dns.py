"""Cluster DNS for the real nodes: CoreDNS as a pod behind the ``kube-dns`` Service.

As kubeadm deploys it (ServiceAccount, the ``system:coredns`` role, a Corefile ConfigMap, a
Deployment, the ``kube-dns`` Service on a fixed address every kubelet names in
``clusterDNS``), with two differences, each for this machine:

- the Corefile answers only for the cluster (``cluster.local`` and reverse zones) and has no
  ``forward``: a name outside the cluster gets no answer rather than a query to the host's
  resolver, which would leave this machine;
- CoreDNS listens on 1053 (the Service maps 53 to it), so it runs as a non-root user with no
  capabilities, under Pod Security ``restricted`` like the tests' own pods.
"""

from __future__ import annotations

from typing import Any

from tests.support.control_plane.client import Client, wait_until
from tests.support.realnode import host

NAMESPACE = "kube-system"
NAME = "coredns"
# The tenth address of the Service range, as kubeadm picks it.
DNS_ADDRESS = str(list(host.SERVICE_NETWORK.hosts())[9])
CLUSTER_DOMAIN = "cluster.local"
PORT = 1053
# CoreDNS starts in a second; a first image import and the kubelet's sync bound the rest.
READY_SECONDS = 180.0

COREFILE = f""".:{PORT} {{
    errors
    health {{
        lameduck 2s
    }}
    ready
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    cache 30
}}
"""


def deploy(admin: Client, image: str) -> None:
    """Create every object CoreDNS needs and wait until the Service has a ready endpoint."""
    for path, body in _objects(image):
        admin.ensure(path, body)

    def ready() -> bool:
        slices = admin.request(
            f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
            "?labelSelector=kubernetes.io/service-name=kube-dns"
        )["items"]
        return any(
            (endpoint.get("conditions") or {}).get("ready")
            for found in slices
            for endpoint in found.get("endpoints") or []
        )

    wait_until(ready, "CoreDNS ready behind the kube-dns Service", READY_SECONDS)


def _objects(image: str) -> list[tuple[str, dict[str, Any]]]:
    labels = {"k8s-app": "kube-dns"}
    core = f"/api/v1/namespaces/{NAMESPACE}"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    return [
        (f"{core}/serviceaccounts", _meta("ServiceAccount", NAME)),
        (
            f"{rbac}/clusterroles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "system:coredns"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["endpoints", "services", "pods", "namespaces"],
                        "verbs": ["list", "watch"],
                    },
                    {
                        "apiGroups": ["discovery.k8s.io"],
                        "resources": ["endpointslices"],
                        "verbs": ["list", "watch"],
                    },
                ],
            },
        ),
        (
            f"{rbac}/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "system:coredns"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:coredns",
                },
                "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
            },
        ),
        (f"{core}/configmaps", {**_meta("ConfigMap", NAME), "data": {"Corefile": COREFILE}}),
        (f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", _deployment(image, labels)),
        (
            f"{core}/services",
            {
                **_meta("Service", "kube-dns", labels),
                "spec": {
                    "selector": labels,
                    "clusterIP": DNS_ADDRESS,
                    "ports": [
                        {"name": "dns", "port": 53, "targetPort": PORT, "protocol": "UDP"},
                        {"name": "dns-tcp", "port": 53, "targetPort": PORT, "protocol": "TCP"},
                    ],
                },
            },
        ),
    ]


def _deployment(image: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        **_meta("Deployment", NAME, labels),
        "apiVersion": "apps/v1",
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": NAME,
                    # Its own resolver would be itself; it forwards nowhere anyway.
                    "dnsPolicy": "Default",
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65534,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": NAME,
                            "image": image,
                            "imagePullPolicy": "Never",
                            "args": ["-conf", "/etc/coredns/Corefile"],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "resources": {
                                "requests": {"cpu": "10m", "memory": "32Mi"},
                                "limits": {"memory": "128Mi"},
                            },
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                            "readinessProbe": {
                                "httpGet": {"path": "/ready", "port": 8181},
                                "periodSeconds": 2,
                            },
                            "livenessProbe": {
                                "httpGet": {"path": "/health", "port": 8080},
                                "periodSeconds": 10,
                            },
                        }
                    ],
                    "volumes": [{"name": "config", "configMap": {"name": NAME}}],
                },
            },
        },
    }


def _meta(kind: str, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {}},
    }
