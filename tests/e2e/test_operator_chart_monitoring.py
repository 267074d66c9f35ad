"""The chart's optional monitoring objects, rendered by Helm's own library (helm-sdkpy) and
taken by the real API server with the Prometheus Operator's CRDs installed, so that its
schemas (not ours) validate the PodMonitor and the ServiceMonitor; and the Grafana dashboard's
ConfigMap as Grafana's sidecar finds it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from eddyline_operator.reconcile import names
from tests.support.control_plane.client import ApiError
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.monitoring import install_monitoring_crds
from tests.support.control_plane.operator import CHART, helm, rendered

pytestmark = pytest.mark.slow

RELEASE = "chart-monitoring"
VALUES = {
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "podMonitor": {"enabled": True, "labels": {"release": "prometheus"}, "interval": "15s"},
        "dashboard": {"enabled": True},
    }
}
PATHS = {
    "Service": "/api/v1/namespaces/{ns}/services/{name}",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps/{name}",
    "ServiceMonitor": "/apis/monitoring.coreos.com/v1/namespaces/{ns}/servicemonitors/{name}",
    "PodMonitor": "/apis/monitoring.coreos.com/v1/namespaces/{ns}/podmonitors/{name}",
}


@pytest.fixture(scope="module")
def installed(control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    admin = control_plane.admin()
    install_monitoring_crds(admin)
    ns = RELEASE
    admin.ensure("/api/v1/namespaces", {"metadata": {"name": ns}})
    home = tmp_path_factory.mktemp("helm-monitoring")
    (result,) = helm(control_plane.kubeconfig, home, ns, RELEASE,
                     {"action": "install", "values": VALUES})  # fmt: skip
    try:
        assert "error" not in result, result.get("error")
        yield admin, ns, rendered(result)
    finally:
        helm(control_plane.kubeconfig, home, ns, RELEASE, {"action": "uninstall"})


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def test_the_real_api_server_takes_the_monitors_the_service_and_the_dashboard(
    installed: Any,
) -> None:
    admin, ns, objects = installed
    for kind, path in PATHS.items():
        obj = by_kind(objects, kind)
        stored = admin.get(path.format(ns=ns, name=obj["metadata"]["name"]))
        assert stored is not None, f"{kind} {obj['metadata']['name']} was not created"
        if kind in ("Service", "ConfigMap"):
            kubernetes_validate.validate(obj, "1.32", strict=True)
        else:
            # Pruning would drop a field the CRD's schema does not know: none was dropped.
            assert stored["spec"] == obj["spec"], kind
            assert stored["metadata"]["labels"]["release"] == "prometheus"


def test_the_operators_service_monitor_reaches_the_deployments_metrics_port(installed: Any) -> None:
    _, _, objects = installed
    deployment, service = by_kind(objects, "Deployment"), by_kind(objects, "Service")
    monitor = by_kind(objects, "ServiceMonitor")
    template = deployment["spec"]["template"]
    container = template["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["EDDYLINE_OPERATOR_METRICS"] == f"http://$(POD_IP):{ports['metrics']}/metrics"
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True


def test_the_pod_monitor_selects_the_pods_the_operator_makes(installed: Any) -> None:
    _, ns, objects = installed
    monitor = by_kind(objects, "PodMonitor")
    pod_labels = names.labels("wordcount", "runtime")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [ns]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == names.QUERY_PORT_NAME and endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "15s"
    # The StreamApp's name becomes "app", from the label the operator puts on its pods.
    (relabel,) = endpoint["relabelings"]
    label = relabel["sourceLabels"][0].removeprefix("__meta_kubernetes_pod_label_")
    assert label == names.LABEL_APP.replace(".", "_").replace("/", "_")
    assert relabel["targetLabel"] == "app"


def test_the_dashboard_configmap_is_labelled_for_grafanas_sidecar(installed: Any) -> None:
    admin, ns, objects = installed
    config_map = by_kind(objects, "ConfigMap")
    stored = admin.get(PATHS["ConfigMap"].format(ns=ns, name=config_map["metadata"]["name"]))
    assert stored is not None and stored["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(stored["data"]["eddyline.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "eddyline.json").read_text())


def test_the_api_server_refuses_a_monitor_its_crd_does_not_allow(installed: Any) -> None:
    """The check above means something: the same PodMonitor with a bad scheme is refused."""
    admin, ns, objects = installed
    monitor = json.loads(json.dumps(by_kind(objects, "PodMonitor")))
    monitor["metadata"] = {"name": "refused", "namespace": ns}
    monitor["spec"]["podMetricsEndpoints"][0]["scheme"] = "gopher"
    with pytest.raises(ApiError) as refused:
        admin.create(f"/apis/monitoring.coreos.com/v1/namespaces/{ns}/podmonitors", monitor)
    assert refused.value.code == 422
    assert "scheme" in json.dumps(refused.value.body)


def test_a_service_monitor_without_the_metrics_endpoint_is_refused_by_name(
    control_plane: Cluster, tmp_path: Path
) -> None:
    """helm lint only logs a template's ``fail``; an install stops with its message."""
    values = {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}}
    (result,) = helm(control_plane.kubeconfig, tmp_path, "default", "chart-monitoring-refused",
                     {"action": "install", "values": values})  # fmt: skip
    assert "metrics.serviceMonitor.enabled needs metrics.enabled" in result.get("error", ""), result


@pytest.mark.parametrize(("share", "taken"), [(0.5, True), (1, True), (0, False), (1.5, False)])
def test_the_real_api_server_takes_a_memory_share_in_the_interval_only(
    installed: Any, share: float, taken: bool
) -> None:
    """The StreamApp CRD the chart installed, on the real API server (a dry run: nothing is
    stored, so no operator acts on it)."""
    admin, ns, _ = installed
    app = {
        "apiVersion": "eddyline.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": {"name": "share", "namespace": ns},
        "spec": {
            "topology": {"ref": "wordcount:topology"},
            "log": {"url": "kafka://k:9092"},
            "config": {"rocksdb.memory.limit.share": share},
        },
    }
    path = f"/apis/eddyline.dev/v1alpha1/namespaces/{ns}/streamapps?dryRun=All"
    if taken:
        stored = admin.create(path, app)
        assert stored["spec"]["config"]["rocksdb.memory.limit.share"] == share
        return
    with pytest.raises(ApiError) as refused:
        admin.create(path, app)
    assert refused.value.code == 422
    assert "rocksdb.memory.limit.share must be a number above 0 and at most 1" in str(refused.value)
