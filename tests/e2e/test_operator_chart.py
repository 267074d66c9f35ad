"""``helm install`` of the operator's chart, by Helm's own library, against the emulated API server.

helm-sdkpy has no client-only render, so installing is how the chart is rendered: every object
Helm sends is validated against the Kubernetes 1.32 schemas, and the CRD from the chart's
``crds/`` becomes Established (``tests/support/k8s/helm.py`` says how Helm runs here). The
operator's end-to-end tests run it with this chart's ServiceAccount and RBAC.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.support.k8s.apiserver import ApiServer
from tests.support.k8s.client import request
from tests.support.k8s.helm import INSTALL, UNINSTALL, rendered
from tests.support.k8s.helm import helm as helm_session
from tests.support.k8s.kubectl import KUBECTL, Kubectl
from tests.support.k8s.operator_harness import REPO

helm_sdkpy = pytest.importorskip("helm_sdkpy")

CHART = REPO / "charts" / "eddyline-operator"
CRD_NAME = "streamapps.eddyline.dev"


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer().start()
    yield server
    server.stop()


def helm(api: ApiServer, tmp_path: Path, namespace: str, *steps: dict[str, Any]) -> list[Any]:
    return helm_session(api, tmp_path / "helm", namespace, CHART, *steps)


def create_namespace(api: ApiServer, name: str) -> None:
    created = request(f"{api.url}/api/v1/namespaces", "POST", {"metadata": {"name": name}})
    assert created.status == 201, created


def test_helm_installs_the_chart_and_every_rendered_object_is_valid(
    api: ApiServer, tmp_path: Path
) -> None:
    create_namespace(api, "eddyline-system")
    (result,) = helm(api, tmp_path, "eddyline-system", INSTALL)
    assert "error" not in result, result.get("error")
    objects = rendered(result)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding",
                            "Role", "RoleBinding", "Deployment", "KopfPeering"])  # fmt: skip
    for obj in objects:
        if not obj["apiVersion"].startswith("kopf.dev/"):  # its CRD checks a custom resource
            kubernetes_validate.validate(obj, "1.32", strict=True)
        resource = api.resource_for(obj)
        namespace = (
            obj["metadata"].get("namespace", "eddyline-system") if resource.namespaced else None
        )
        name = obj["metadata"]["name"]
        stored = api.call(lambda r=resource, ns=namespace, n=name: api.find(r, ns, n))
        assert stored is not None, f"{obj['kind']} {obj['metadata']['name']} was not created"
        if not obj["apiVersion"].startswith("kopf.dev/"):
            kubernetes_validate.validate(stored, "1.32", strict=True)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["WATCH_NAMESPACES"] == "eddyline-system"
    # Two replicas elect one active operator in the release's peering (issue 23, item 6).
    assert deployment["spec"]["replicas"] == 2
    peering = next(o for o in objects if o["kind"] == "KopfPeering")
    assert env["EDDYLINE_OPERATOR_PEERING"] == peering["metadata"]["name"]
    assert peering["metadata"]["namespace"] == "eddyline-system"
    role_rules = next(o for o in objects if o["kind"] == "Role")["rules"]
    assert any("kopfpeerings" in r["resources"] and "patch" in r["verbs"] for r in role_rules)
    role = next(o for o in objects if o["kind"] == "Role")
    assert role["metadata"]["namespace"] == "eddyline-system"
    cluster_role = next(o for o in objects if o["metadata"]["name"].endswith("-cluster"))
    verbs = {v for rule in cluster_role["rules"] for v in rule["verbs"]}
    assert verbs == {"get", "list", "watch"}  # cluster-wide, the operator only reads
    # Restore Jobs' executor rights: a ClusterRole the operator may bind by name, not hold.
    executor = next(o for o in objects if o["metadata"]["name"].endswith("-restore-executor"))
    assert env["EDDYLINE_RESTORE_EXECUTOR_ROLE"] == executor["metadata"]["name"]
    binds = [r for r in role_rules if "bind" in r["verbs"]]
    assert binds == [
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "verbs": ["bind"],
            "resourceNames": [executor["metadata"]["name"]],
        }
    ]
    pod_verbs = {v for r in role_rules if "pods" in r["resources"] for v in r["verbs"]}
    assert "create" not in pod_verbs

    crd_url = f"{api.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
    crd = request(crd_url).body
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True"
    kubernetes_validate.validate(crd, "1.32", strict=True)


def test_helm_uninstall_removes_the_release_and_keeps_the_crd(
    api: ApiServer, tmp_path: Path
) -> None:
    installed, uninstalled = helm(api, tmp_path, "default", INSTALL, UNINSTALL)
    assert "error" not in installed and "error" not in uninstalled, (installed, uninstalled)
    assert request(f"{api.url}/apis/apps/v1/namespaces/default/deployments").body["items"] == []
    assert request(f"{api.url}/api/v1/namespaces/default/serviceaccounts").body["items"] == []
    crd_url = f"{api.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
    assert request(crd_url).status == 200  # Helm never deletes CRDs


def test_helm_renders_a_role_per_watched_namespace_or_one_cluster_role(
    api: ApiServer, tmp_path: Path
) -> None:
    for name in ("eddyline-system", "team-a", "team-b"):
        create_namespace(api, name)
    result, _, wide = helm(
        api,
        tmp_path,
        "eddyline-system",
        {"action": "install", "values": {"watchNamespaces": ["team-a", "team-b"]}},
        UNINSTALL,
        {"action": "install", "values": {"clusterWide": True}},
    )  # fmt: skip
    roles = [o for o in rendered(result) if o["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    peerings = [o for o in rendered(result) if o["kind"] == "KopfPeering"]
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    kinds = [o["kind"] for o in rendered(wide)]
    assert "Role" not in kinds and kinds.count("ClusterRole") == 3
    assert "ClusterKopfPeering" in kinds and "KopfPeering" not in kinds
    for obj in rendered(wide):
        if not obj["apiVersion"].startswith("kopf.dev/"):
            kubernetes_validate.validate(obj, "1.32", strict=True)


def test_helm_refuses_values_the_schema_refuses_naming_the_value(
    api: ApiServer, tmp_path: Path
) -> None:
    (result,) = helm(
        api, tmp_path, "default", {"action": "install", "values": {"livenessPort": 80}}
    )
    assert "livenessPort" in result.get("error", ""), result


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")
def test_after_helm_install_kubectl_knows_streamapps(api: ApiServer, tmp_path: Path) -> None:
    helm(api, tmp_path, "default", INSTALL)
    kubectl = Kubectl(api, tmp_path / "kubectl-home")
    kubectl("wait", "--for=condition=Established", "crd/streamapps.eddyline.dev")
    assert "No resources found" in kubectl.run("get", "sapp").stderr
