"""Issue 34: a real Prometheus (built from its Go module) scrapes a running StreamApp on the
real control plane through Kubernetes service discovery, as the chart's PodMonitor tells a
Prometheus Operator to.

The chart is installed with its PodMonitor enabled (the Prometheus Operator's CRDs are in
the API server, which validates it); the scrape config is derived from that rendered
PodMonitor the way the Prometheus Operator derives it (``pod_monitor_scrape_config``), not
written by hand: ``role: pod`` discovery against the project's API server, with its CA and
the token of a ServiceAccount holding only the Role a Prometheus needs (get, list and watch
pods). No file-based discovery. The kubelet stand-in gives pods loopback addresses
(``127.x.y.z``), which Prometheus on this host reaches as a cluster's Prometheus reaches pod
IPs. The operator runs as a process of the test's own (tests/support/control_plane/operator.py
says why), so it has no pod to discover: it is scraped at the address the harness started it
on, with the ServiceMonitor's ``honorLabels``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_operator.reconcile import names
from eddyline_runtime.log import open_log
from tests.support.cluster_word_count import PARTITIONS, produce_lines, random_lines
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.monitoring import install_monitoring_crds
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import delete_apps
from tests.support.prometheus import pod_monitor_scrape_config, prometheus_api, running_prometheus
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "prometheus-sd"
APP = "wordcount"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
REPLICAS = 2
VALUES = {"metrics": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}}}
# Only what Prometheus' Kubernetes discovery of pods reads (Prometheus' own RBAC example,
# narrowed to pods in one namespace as the PodMonitor's namespaceSelector is).
PROMETHEUS_ROLE = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300
SCRAPED_TIMEOUT = 180


@pytest.fixture(scope="module")
def operator(
    control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    install_monitoring_crds(control_plane.admin())
    running = Operator(
        control_plane, tmp_path_factory.mktemp("operator-prometheus"), NAMESPACE, values=VALUES
    )
    running.install()
    running.start()
    running.wait_watching()
    try:
        yield running
    finally:
        try:
            delete_apps(running)
        finally:
            running.stop()


def rendered(operator: Operator, kind: str) -> dict[str, Any]:
    (found,) = [o for o in operator.rendered if o["kind"] == kind]
    return found


def prometheus_token(operator: Operator, directory: Path) -> Path:
    """A ServiceAccount ``prometheus`` bound to :data:`PROMETHEUS_ROLE`; its token's file."""
    admin, ns = operator.admin, operator.namespace
    admin.ensure(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "prometheus"}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    admin.ensure(f"{rbac}/roles", {"metadata": {"name": "prometheus"}, "rules": [PROMETHEUS_ROLE]})
    admin.ensure(
        f"{rbac}/rolebindings",
        {
            "metadata": {"name": "prometheus"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "prometheus"},
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": ns}],
        },
    )  # fmt: skip
    token = directory / "prometheus.token"
    token.write_text(operator.cluster.plane.service_account_token(ns, "prometheus"))
    return token


def start_wordcount(operator: Operator, tmp: Path) -> None:
    assert operator.cluster.provisioner is not None
    claim = operator.cluster.provisioner.directory(operator.namespace, f"{APP}-log")
    claim.mkdir(parents=True)
    log_url = f"sqlite:///{claim}/log.db"
    log = open_log(log_url)  # input topics exist before the app, as on a real cluster
    log.create_topic("text-lines", PARTITIONS)
    log.create_topic("watched-words", PARTITIONS)
    log.close()
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["spec"]["replicas"] = REPLICAS
    path = tmp / "streamapp.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    operator.kubectl("apply", "-f", str(path))
    produce_lines(
        log_url, random_lines(random.Random(34), [f"w{i:02d}" for i in range(20)], 200, 5)
    )


def test_prometheus_scrapes_the_app_through_kubernetes_discovery_as_the_pod_monitor_says(
    operator: Operator, tmp_path: Path
) -> None:
    plane = operator.cluster.plane
    monitor = rendered(operator, "PodMonitor")
    scrape = pod_monitor_scrape_config(
        monitor, api_server=plane.url, ca_file=plane.pki.ca_cert,
        token_file=prometheus_token(operator, tmp_path),
    )  # fmt: skip
    assert "static_configs" not in scrape and scrape["kubernetes_sd_configs"][0]["role"] == "pod"
    start_wordcount(operator, tmp_path)

    def running_pods() -> dict[str, str] | None:
        pods = {
            name: pod["status"].get("podIP", "")
            for name, pod in operator.pods(APP).items()
            if pod.get("status", {}).get("phase") == "Running"
        }
        return pods if len(pods) == REPLICAS and all(pods.values()) else None

    try:
        pods = wait_for(running_pods, f"{REPLICAS} running pods of {APP}", READY_TIMEOUT)
    except (AssertionError, TimeoutError):
        print(operator.describe_failure(APP))
        raise
    # The pods the monitor's selector selects, as the API server answers it.
    selector = ",".join(f"{k}={v}" for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    selected = operator.admin.request(
        f"/api/v1/namespaces/{operator.namespace}/pods?labelSelector={selector}"
    )["items"]
    assert {p["metadata"]["name"] for p in selected} == set(pods)
    service_monitor = rendered(operator, "ServiceMonitor")
    (endpoint,) = service_monitor["spec"]["endpoints"]
    static = {
        "job_name": "operator",
        "honor_labels": endpoint["honorLabels"],
        "metrics_path": endpoint["path"],
        "static_configs": [{"targets": [
            operator.metrics_url.removeprefix("http://").removesuffix("/metrics")
        ]}],
    }  # fmt: skip
    with running_prometheus(tmp_path / "prometheus", scrape_configs=[scrape, static]) as url:

        def targets_up() -> list[dict[str, Any]] | None:
            active = prometheus_api(url, "targets", state="active")["activeTargets"]
            found = [t for t in active if t["scrapePool"] == scrape["job_name"]]
            if len(found) == REPLICAS and all(t["health"] == "up" for t in found):
                return found
            return None

        found = wait_for(targets_up, "the app's pods discovered and scraped", SCRAPED_TIMEOUT)
        # Exactly the selected pods, at their pod IPs and the query port, labelled as the
        # Prometheus Operator and the monitor's relabelling label them.
        assert {t["labels"]["pod"] for t in found} == set(pods)
        for target in found:
            labels = target["labels"]
            assert target["scrapeUrl"] == (
                f"http://{pods[labels['pod']]}:{names.QUERY_PORT}/metrics"
            ), target
            assert labels["namespace"] == operator.namespace and labels["app"] == APP
            assert labels["job"] == f"{operator.namespace}/{monitor['metadata']['name']}"

        def committed() -> list[dict[str, Any]] | None:
            result: list[dict[str, Any]] = prometheus_api(
                url, "query",
                query=f'sum by (pod) (eddyline_stream_thread_metrics_commit_total'
                      f'{{namespace="{operator.namespace}", app="{APP}"}})',
            )["result"]  # fmt: skip
            return result if len(result) == REPLICAS else None

        assert wait_for(committed, "every pod's commits in Prometheus", SCRAPED_TIMEOUT)

        def operator_apps() -> bool:
            result = prometheus_api(
                url, "query", query=f'eddyline_operator_apps{{namespace="{operator.namespace}"}}'
            )["result"]
            return bool(result) and float(result[0]["value"][1]) == 1

        wait_for(operator_apps, "the operator's app count, with the app's namespace", 60)

        # Every query of the shipped dashboard answers with series, but those named in
        # EXPECTED_EMPTY (each with its reason): the dashboard never goes blank unnoticed.
        def blank_panels() -> dict[str, str]:
            return {
                title: expr
                for title, expr in dashboard_queries(operator.namespace)
                if title not in EXPECTED_EMPTY
                and not prometheus_api(url, "query", query=expr)["result"]
            }

        blank: dict[str, str] = {}

        def dashboard_filled() -> bool:
            blank.clear()
            blank.update(blank_panels())
            return not blank

        try:
            wait_for(dashboard_filled, "every dashboard panel's queries with series", 90)
        except AssertionError as error:
            raise AssertionError(f"dashboard panels without series: {blank}") from error


DASHBOARD = REPO / "charts" / "eddyline-operator" / "dashboards" / "eddyline.json"
# Grafana's $__rate_interval: max($__interval + scrape interval, 4 x scrape interval); the
# second wins at a test's 1 s scrape interval.
RATE_INTERVAL = "4s"
# Panels whose queries may answer no series in this test, and why. The issue asks for the
# events behind them to be driven (an autoscaling decision): not done yet, so named here.
EXPECTED_EMPTY = {
    "Scaling decisions": "the app has no spec.autoscaling in this test, so the operator "
    "exports no scaling_decisions_total series for it (driving a decision is still to do)",
}


def dashboard_queries(namespace: str) -> list[tuple[str, str]]:
    """(panel title, query) for every target of the shipped dashboard, with $namespace, $app
    and $__rate_interval as Grafana substitutes them for this namespace and app."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = (
                target["expr"]
                .replace("$namespace", namespace)
                .replace("$app", APP)
                .replace("$__rate_interval", RATE_INTERVAL)
            )
            queries.append((panel["title"], expr))
    return queries
