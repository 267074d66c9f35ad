"""``helm install`` of the operator's chart, by Helm's own library, into the real API server.

helm-sdkpy has no client-only render, so installing is how the chart is rendered: every object
Helm sends must be taken by the real kube-apiserver (its validation of built-in kinds, Pod
Security ``restricted`` on the release's namespace, the CRDs from the chart's ``crds/``
becoming Established) and is also checked against the Kubernetes 1.32 schemas. Each test
uninstalls what it installed: the control plane is the session's.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.control_plane.client import Client, wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Kubectl, helm, rendered

pytestmark = pytest.mark.slow

CRD_NAME = "streamapps.eddyline.dev"
MANIFEST = Path(__file__).resolve().parents[2] / "examples" / "wordcount" / "streamapp.cluster.yaml"
INSTALL = {"action": "install"}
UNINSTALL = {"action": "uninstall"}
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
# The path of each kind the chart renders, under the API server.
PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts/{name}",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{name}",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/{name}",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments/{name}",
    "KopfPeering": "/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings/{name}",
    "ClusterKopfPeering": "/apis/kopf.dev/v1/clusterkopfpeerings/{name}",
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}"
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{name}"
    ),
}


@pytest.fixture(scope="module")
def admin(control_plane: Cluster) -> Client:
    return control_plane.admin()


def namespace(admin: Client, name: str) -> str:
    admin.ensure("/api/v1/namespaces", {"metadata": {"name": name, "labels": RESTRICTED}})
    return name


@pytest.fixture
def run_helm(control_plane: Cluster, tmp_path: Path) -> Iterator[Any]:
    """Helm steps for a release of this test's own; uninstalled afterwards whatever happened."""
    used: list[tuple[str, str]] = []

    def run(ns: str, release: str, *steps: dict[str, Any]) -> list[dict[str, Any]]:
        used.append((ns, release))
        return helm(control_plane.kubeconfig, tmp_path / "helm", ns, release, *steps)

    yield run
    for ns, release in used:
        helm(control_plane.kubeconfig, tmp_path / "helm", ns, release, UNINSTALL)


def stored(admin: Client, obj: dict[str, Any], ns: str) -> dict[str, Any] | None:
    path = PATHS[obj["kind"]].format(
        ns=obj["metadata"].get("namespace", ns), name=obj["metadata"]["name"]
    )
    return admin.get(path)


def test_helm_installs_the_chart_and_the_real_server_takes_every_object(
    admin: Client, run_helm: Any
) -> None:
    ns = namespace(admin, "chart-install")
    (result,) = run_helm(ns, "chart-install", INSTALL)
    assert "error" not in result, result.get("error")
    objects = rendered(result)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding",
                            "Role", "RoleBinding", "Deployment", "KopfPeering",
                            # the executor role's bind stays narrow, and restore accounts
                            # make only their Job's executor pods (templates/admission.yaml)
                            # (the image rule has params of its own)
                            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                            "ValidatingAdmissionPolicy",
                            "ValidatingAdmissionPolicyBinding"])  # fmt: skip
    for obj in objects:
        found = stored(admin, obj, ns)
        assert found is not None, f"{obj['kind']} {obj['metadata']['name']} was not created"
        if not obj["apiVersion"].startswith("kopf.dev/"):  # its CRD checks a custom resource
            kubernetes_validate.validate(obj, "1.32", strict=True)
            kubernetes_validate.validate(found, "1.32", strict=True)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["WATCH_NAMESPACES"] == ns
    # Two replicas elect one active operator in the release's peering (issue 23, item 6).
    assert deployment["spec"]["replicas"] == 2
    peering = next(o for o in objects if o["kind"] == "KopfPeering")
    assert env["EDDYLINE_OPERATOR_PEERING"] == peering["metadata"]["name"]
    assert peering["metadata"]["namespace"] == ns
    role = next(o for o in objects if o["kind"] == "Role")
    role_rules = role["rules"]
    assert role["metadata"]["namespace"] == ns
    assert any("kopfpeerings" in r["resources"] and "patch" in r["verbs"] for r in role_rules)
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
    # The executor role: pod calls only (docs/operator.md lists Spark's), and its marker.
    granted = {
        (g, r) for rule in executor["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert granted == {("", "pods"), ("eddyline.dev", "restoreexecutors")}

    # The real ReplicaSet controller made both pods: Pod Security "restricted" admitted the
    # chart's pod template (a refused pod would leave the ReplicaSet with FailedCreate).
    name = deployment["metadata"]["name"]
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/{name}"
    wait_until(
        lambda: (admin.get(path) or {}).get("status", {}).get("replicas") == 2,
        "the Deployment's two pods created",
        60,
    )
    crd = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
    assert crd is not None
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True"
    kubernetes_validate.validate(crd, "1.32", strict=True)


def test_the_charts_deployment_runs_the_operator_as_two_pods_in_one_peering(
    admin: Client, run_helm: Any, control_plane: Cluster
) -> None:
    """The operator as a pod: the kubelet stand-in runs the chart's container, kopf logs in
    with the pod's projected token (``EDDYLINE_SERVICE_ACCOUNT_DIR``, the operator's login
    handler), serves ``/healthz`` on the pod's address, and both replicas join the release's
    peering; the active one reconciles a StreamApp under the chart's RBAC."""
    ns = namespace(admin, "chart-pods")
    (result,) = run_helm(ns, "chart-pods", INSTALL)
    assert "error" not in result, result.get("error")
    objects = rendered(result)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    peering = next(o for o in objects if o["kind"] == "KopfPeering")
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/{deployment['metadata']['name']}"
    peering_path = PATHS["KopfPeering"].format(ns=ns, name=peering["metadata"]["name"])
    kubectl = Kubectl(control_plane.kubeconfig, control_plane.root / "kubectl-pods", ns)
    try:
        wait_until(
            lambda: (admin.get(path) or {}).get("status", {}).get("readyReplicas") == 2,
            "both operator pods Ready (kopf's /healthz)",
            120,
        )
        wait_until(
            lambda: len((admin.get(peering_path) or {}).get("status") or {}) == 2,
            "both operator pods in the peering",
            60,
        )
        app = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
        app["spec"]["suspend"] = True
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump(app))
        base = f"/apis/eddyline.dev/v1alpha1/namespaces/{ns}/streamapps/{app['metadata']['name']}"
        wait_until(
            lambda: ((admin.get(base) or {}).get("status") or {}).get("phase") == "Suspended",
            "the operator pod to reconcile a StreamApp",
            60,
        )
        # Each pod serves its own metrics at $(POD_IP):<metrics port> (the chart's env, as
        # the kubelet expands it): the active replica runs the app's daemon and its cycles.
        port = next(
            p["containerPort"]
            for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
            if p["name"] == "metrics"
        )
        selector = ",".join(
            f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items()
        )
        pods = admin.request(f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}")["items"]
        app_name = app["metadata"]["name"]

        def scraped() -> list[str]:
            texts = []
            for found in pods:
                url = f"http://{found['status']['podIP']}:{port}/metrics"
                with urllib.request.urlopen(url, timeout=10) as response:
                    texts.append(response.read().decode())
            return texts

        cycles = f'eddyline_operator_reconcile_cycles_total{{namespace="{ns}",app="{app_name}"'

        def counted() -> list[str] | None:
            texts = scraped()
            return texts if any(cycles in t for t in texts) else None

        texts = wait_until(
            counted,
            "the active operator pod's metrics to count the app's cycles",
            60,
        )
        assert sum(f'eddyline_operator_apps{{namespace="{ns}"}} 1' in t for t in texts) == 1
    except TimeoutError:
        for found in admin.request(f"/api/v1/namespaces/{ns}/pods")["items"]:
            name = found["metadata"]["name"]
            print(name, found.get("status", {}).get("containerStatuses"))
            if control_plane.kubelets is not None:
                print(control_plane.kubelets.pod_log(ns, name)[-3000:])
        raise
    finally:
        kubectl.run("delete", "sapp", "--all", "--timeout=60s")


def test_helm_uninstall_removes_the_release_and_keeps_the_crd(admin: Client, run_helm: Any) -> None:
    ns = namespace(admin, "chart-uninstall")
    installed, uninstalled = run_helm(ns, "chart-uninstall", INSTALL, UNINSTALL)
    assert "error" not in installed and "error" not in uninstalled, (installed, uninstalled)
    assert admin.request(f"/apis/apps/v1/namespaces/{ns}/deployments")["items"] == []
    accounts = admin.request(f"/api/v1/namespaces/{ns}/serviceaccounts")["items"]
    assert [a["metadata"]["name"] for a in accounts] == ["default"]  # the namespace's own
    for obj in rendered(installed):
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            assert stored(admin, obj, ns) is None, obj["metadata"]["name"]
    crd = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
    assert admin.get(crd) is not None  # Helm never deletes CRDs


def test_helm_renders_a_role_per_watched_namespace_or_one_cluster_role(
    admin: Client, run_helm: Any
) -> None:
    ns = namespace(admin, "chart-roles")
    teams = [namespace(admin, "chart-team-a"), namespace(admin, "chart-team-b")]
    result, _, wide = run_helm(
        ns,
        "chart-roles",
        {"action": "install", "values": {"watchNamespaces": teams}},
        UNINSTALL,
        {"action": "install", "values": {"clusterWide": True}},
    )  # fmt: skip
    assert "error" not in result and "error" not in wide, (result, wide)
    roles = [o for o in rendered(result) if o["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == teams
    peerings = [o for o in rendered(result) if o["kind"] == "KopfPeering"]
    assert sorted(p["metadata"]["namespace"] for p in peerings) == teams
    kinds = [o["kind"] for o in rendered(wide)]
    assert "Role" not in kinds and kinds.count("ClusterRole") == 3
    assert "ClusterKopfPeering" in kinds and "KopfPeering" not in kinds
    for obj in rendered(wide):
        assert stored(admin, obj, ns) is not None, f"{obj['kind']} {obj['metadata']['name']}"
        if not obj["apiVersion"].startswith("kopf.dev/"):
            kubernetes_validate.validate(obj, "1.32", strict=True)


def test_helm_refuses_values_the_schema_refuses_naming_the_value(
    admin: Client, run_helm: Any
) -> None:
    ns = namespace(admin, "chart-refused")
    (result,) = run_helm(ns, "chart-refused", {"action": "install", "values": {"livenessPort": 80}})
    assert "livenessPort" in result.get("error", ""), result


def test_after_helm_install_kubectl_knows_streamapps(
    admin: Client, run_helm: Any, control_plane: Cluster, tmp_path: Path
) -> None:
    ns = namespace(admin, "chart-kubectl")
    (result,) = run_helm(ns, "chart-kubectl", INSTALL)
    assert "error" not in result, result.get("error")
    kubectl = Kubectl(control_plane.kubeconfig, tmp_path / "kubectl-home", ns)
    kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}")
    assert "No resources found" in kubectl.run("get", "sapp").stderr
