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

The same server loads the chart's alert rules from the rendered PrometheusRule (the lag
alert's window and ``for:`` set short through the chart's values) and evaluates them every
second. The app is a throttled word count (a fixed wall time per line) on one input
partition, autoscaled on lag: the test writes faster than it can process, so its backlog
grows; ``EddylineInputLagGrowing`` goes pending, then firing (Prometheus' /api/v1/alerts), and
the autoscaler scales out to the app's two tasks (its second pod is discovered too). Once the
test stops writing the pods work the backlog off and the alert resolves. Then every query of
the shipped dashboard answers with series, "Scaling decisions" and the standby lag included.
Before all that, while the app has one pod, that pod crashes having lost its state claim and
restores its store from its changelog, which the dashboard's "Restore" panel shows (records
restored, above 0, for that pod).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_operator.reconcile import names
from eddyline_runtime.log import Record, open_log
from eddyline_runtime.partitions import TopicPartition
from tests.support.cluster_word_count import random_lines
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.monitoring import install_monitoring_crds
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import delete_apps
from tests.support.prometheus import pod_monitor_scrape_config, prometheus_api, running_prometheus
from tests.support.topologies.throttled_wordcount import LINE_SECONDS
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "prometheus-sd"
APP = "wordcount"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
# The word count whose lines cost a fixed wall time each (tests/support/topologies): one
# stream thread works off at most 1 / LINE_SECONDS lines a second however quiet the machine.
TOPOLOGY = {"ref": "throttled_wordcount:topology", "revision": "1"}
# One input partition: one task does the throttled splitting, so a scale out cannot speed it
# up and the backlog grows for as long as the test writes faster than that.
INPUT = TopicPartition("text-lines", 0)
WORDS = [f"w{i:02d}" for i in range(20)]
# A pod buffers up to this many fetched records of a partition, which records-lag (the end
# offset its last fetch saw minus its fetch position) does not count: engine/stream_thread.py
# fetches 5,000 records whenever fewer than 2,500 are buffered. The test writes as many at
# once first, so the lag shows from the start, then writes half as fast again as the pod
# can process: the backlog grows by at least 500 lines/s.
BUFFERED = 7_500
PRODUCE_RATE = 1.5 / LINE_SECONDS
# The chart's lag alert with a short window and for: (its shipped 10m would take the test
# ten minutes), its slope sampled every second, as Prometheus evaluates rules here. The lag
# a pod reports moves only when it fetches (every 5,000 records it processes: 5 s at full
# speed, longer on a loaded machine), so the window must hold more than one fetch, or a
# window between two fetches sees no growth.
LAG_ALERT = "EddylineInputLagGrowing"
LAG_WINDOW = "15s"
LAG_METRIC = "eddyline_consumer_fetch_manager_metrics_records_lag"
VALUES = {
    "metrics": {
        "podMonitor": {"enabled": True},
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {
            "enabled": True,
            "inputLagGrowingFor": LAG_WINDOW,
            "inputLagGrowingResolution": "1s",
        },
    }
}
# Scale out on the same lag (docs/operator.md, "Lag-driven autoscaling"): to the app's two
# tasks; the down window keeps the second pod for the rest of the test (its standby fills
# the dashboard's standby lag).
AUTOSCALING = {
    "minReplicas": 1,
    "maxReplicas": 2,
    "maxLagRecords": 1_000,
    "scaleDownStabilizationSeconds": 600,
}
# Only what Prometheus' Kubernetes discovery of pods reads (Prometheus' own RBAC example,
# narrowed to pods in one namespace as the PodMonitor's namespaceSelector is).
PROMETHEUS_ROLE = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300
SCRAPED_TIMEOUT = 180
ALERT_TIMEOUT = 180
SCALE_TIMEOUT = 180
CATCH_UP_TIMEOUT = 300
RESOLVE_TIMEOUT = 30
RESTORE_TIMEOUT = 120
# Input lines counted before the restore: a changelog of a few dozen records (20 words).
RESTORE_LINES = 300


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


def start_wordcount(operator: Operator) -> str:
    """The throttled word count on the embedded log, one pod, autoscaled on lag; its log's URL
    (the claim's directory on this host, where the test writes the input)."""
    assert operator.cluster.provisioner is not None
    claim = operator.cluster.provisioner.directory(operator.namespace, f"{APP}-log")
    claim.mkdir(parents=True)
    log_url = f"sqlite:///{claim}/log.db"
    log = open_log(log_url)  # input topics exist before the app, as on a real cluster
    log.create_topic(INPUT.topic, 1)
    log.close()
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["spec"].update(replicas=1, topology=TOPOLOGY, autoscaling=AUTOSCALING)
    operator.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(document))
    return log_url


class Producer(threading.Thread):
    """Writes ``burst`` lines to the app's single input partition at once, then ``rate``
    lines/s (by the wall clock, in batches every tenth of a second) until stopped: faster
    than the throttled pod can process them, so its backlog grows as long as this runs."""

    def __init__(self, log_url: str, burst: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.log_url, self.burst, self.rate = log_url, burst, rate
        self.written = 0
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(34)
        try:
            log = open_log(self.log_url)
            try:
                started = time.monotonic()
                while not self.stopped.wait(0.1):
                    elapsed = time.monotonic() - started
                    due = self.burst + int(elapsed * self.rate) - self.written
                    now = int(time.time() * 1000)
                    lines = random_lines(rng, WORDS, due, 3)
                    log.produce(INPUT, [Record(None, line.encode(), now) for line in lines])
                    self.written += due
            finally:
                log.close()
        except BaseException as error:  # the test reports it
            self.error = error

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)
        if self.error is not None:
            raise AssertionError(f"producing the input failed: {self.error!r}")


def test_prometheus_scrapes_the_app_through_kubernetes_discovery_as_the_pod_monitor_says(
    operator: Operator, tmp_path: Path
) -> None:
    """Discovery from the PodMonitor, the chart's lag alert pending, firing and resolved on a
    growing backlog, the autoscaler's scale out under it (a pod that appears later is
    discovered too), a restore after a lost state claim (before those), then every dashboard
    panel with series."""
    plane = operator.cluster.plane
    monitor = rendered(operator, "PodMonitor")
    scrape = pod_monitor_scrape_config(
        monitor, api_server=plane.url, ca_file=plane.pki.ca_cert,
        token_file=prometheus_token(operator, tmp_path),
    )  # fmt: skip
    assert "static_configs" not in scrape and scrape["kubernetes_sd_configs"][0]["role"] == "pod"
    # The alert rules as the chart rendered them into the API server (with the test's short
    # window, values VALUES), evaluated every second (running_prometheus).
    rules = rendered(operator, "PrometheusRule")["spec"]["groups"]
    log_url = start_wordcount(operator)
    wait_running(operator, 1)
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
    with running_prometheus(
        tmp_path / "prometheus", scrape_configs=[scrape, static], rule_groups=rules
    ) as url:
        check_discovered(operator, url, monitor, scrape, 1)

        def committed() -> list[dict[str, Any]] | None:
            result: list[dict[str, Any]] = prometheus_api(
                url, "query",
                query=f'sum by (pod) (eddyline_stream_thread_metrics_commit_total'
                      f'{{namespace="{operator.namespace}", app="{APP}"}})',
            )["result"]  # fmt: skip
            return result or None

        assert wait_for(committed, "the pod's commits in Prometheus", SCRAPED_TIMEOUT)

        def operator_apps() -> bool:
            result = prometheus_api(
                url, "query", query=f'eddyline_operator_apps{{namespace="{operator.namespace}"}}'
            )["result"]
            return bool(result) and float(result[0]["value"][1]) == 1

        wait_for(operator_apps, "the operator's app count, with the app's namespace", 60)
        drive_a_restore(operator, url, log_url)

        stopped = drive_the_lag_alert(operator, url, log_url)
        # The pod the scale out added is discovered and scraped as well.
        check_discovered(operator, url, monitor, scrape, 2)
        check_caught_up(operator, url, stopped)

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


def drive_the_lag_alert(operator: Operator, url: str, log_url: str) -> float:
    """The backlog grows until the chart's lag alert fires and the autoscaler has scaled out
    (on the same lag: maxLagRecords); then the test stops writing. When it stopped
    (``time.monotonic()``)."""
    producer = Producer(log_url, BUFFERED, PRODUCE_RATE)
    producer.start()
    started = time.monotonic()
    try:
        states, firing = watch_lag_alert(operator, url, until="firing")
        fired = time.monotonic() - started
        wait_for(lambda: scaled_out(operator), "the autoscaler's scale out", SCALE_TIMEOUT)
    finally:
        producer.stop()
    stopped = time.monotonic()
    # Pending first (for the rule's `for:`), then firing; in between it may have gone back
    # (a task the scale out moved reports no lag, -1, until its new pod fetched).
    assert states[0] == "pending" and states[-1] == "firing", states
    assert firing["labels"]["severity"] == "warning", firing
    assert float(firing["value"]) > 0, firing  # the lag, in records
    print(
        f"lag alert: states {states}, firing after {fired:.1f} s; {producer.written} lines "
        f"written in {stopped - started:.1f} s"
    )
    return stopped


def check_caught_up(operator: Operator, url: str, stopped: float) -> None:
    """The app works its backlog off: Prometheus sees the input partition's lag known and 0
    (not merely unknown, -1, on a pod that took the task over), the summed lag 0, and the
    lag alert resolved (gone from /api/v1/alerts, its rule inactive). ``stopped``: when the
    test stopped writing (``time.monotonic()``)."""
    labels = f'namespace="{operator.namespace}", app="{APP}"'

    def caught_up() -> bool:
        lags = [
            prometheus_api(url, "query", query=query)["result"]
            for query in (
                f'{LAG_METRIC}{{{labels}, topic="{INPUT.topic}"}} >= 0',
                f"sum({LAG_METRIC}{{{labels}}} >= 0)",
            )
        ]
        return all(found and {float(r["value"][1]) for r in found} == {0.0} for found in lags)

    wait_for(caught_up, "the app caught up with its input, in Prometheus", CATCH_UP_TIMEOUT)
    wait_for(lambda: lag_alert(operator, url) is None, "the lag alert resolved", RESOLVE_TIMEOUT)
    assert lag_rule_state(url) == "inactive"
    print(f"caught up and the alert resolved {time.monotonic() - stopped:.1f} s after the stop")


def drive_a_restore(operator: Operator, url: str, log_url: str) -> None:
    """The app's only pod crashes having lost its state claim: with no other member to take
    its tasks over, it keeps them (the operator keeps the last assignment while every pod is
    down) and restores their store from its changelog, which the dashboard's "Restore" panel
    shows as records restored for that pod (the panel's own query, not one of the test's).
    Before the crash the panel shows 0 for it: nothing restored yet."""
    kubelets, provisioner = operator.cluster.kubelets, operator.cluster.provisioner
    assert kubelets is not None and provisioner is not None
    pod = f"{APP}-0"
    (query,) = [
        expr
        for title, expr in dashboard_queries(operator.namespace)
        if title == RESTORE_PANEL and "restore_total" in expr
    ]

    def restored() -> float | None:
        found = {
            r["metric"]["pod"]: float(r["value"][1])
            for r in prometheus_api(url, "query", query=query)["result"]
        }
        return found.get(pod)

    assert restored() in (None, 0.0), "a restore before the test drove one"
    # A changelog worth restoring: a few hundred lines, counted and committed (each counted
    # word is a changelog record once its task commits).
    log = open_log(log_url)
    try:
        now = int(time.time() * 1000)
        lines = random_lines(random.Random(3434), WORDS, RESTORE_LINES, 3)
        log.produce(INPUT, [Record(None, line.encode(), now) for line in lines])
        changelog = wait_for(
            lambda: changelog_records(log_url), "the count store's changelog records", 60
        )
    finally:
        log.close()
    restarts = restart_count(operator, pod)
    crashed = time.monotonic()
    kubelets.crash_with_volume_emptied(
        operator.namespace, pod, provisioner.directory(operator.namespace, f"state-{pod}")
    )
    records = wait_for(
        lambda: restored() or None, f"{pod}'s restored records in Prometheus", RESTORE_TIMEOUT
    )
    assert restart_count(operator, pod) == restarts + 1
    # No more than its changelog holds (its keyed records: a transaction's markers are not
    # restored).
    assert records <= changelog_records(log_url), (changelog, records)
    print(
        f"restore: {pod} restored {records:,.0f} changelog records, in Prometheus "
        f"{time.monotonic() - crashed:.1f} s after its crash"
    )


def changelog_records(log_url: str) -> int:
    """The keyed records in the app's changelog topics (what a restore replays)."""
    log = open_log(log_url, read_only=True)
    try:
        return sum(
            1
            for name, spec in log.topics().items()
            if name.endswith("-changelog")
            for partition in range(spec.partitions)
            for record in log.fetch(TopicPartition(name, partition), 0, 1_000_000).records
            if record.key is not None
        )
    finally:
        log.close()


def restart_count(operator: Operator, pod: str) -> int:
    statuses = operator.pods(APP)[pod]["status"].get("containerStatuses", [])
    return int(statuses[0]["restartCount"]) if statuses else 0


def wait_running(operator: Operator, replicas: int) -> dict[str, str]:
    """The app's running pods and their IPs, once there are ``replicas`` of them."""

    def running_pods() -> dict[str, str] | None:
        pods = {
            name: pod["status"].get("podIP", "")
            for name, pod in operator.pods(APP).items()
            if pod.get("status", {}).get("phase") == "Running"
        }
        return pods if len(pods) == replicas and all(pods.values()) else None

    try:
        return wait_for(running_pods, f"{replicas} running pods of {APP}", READY_TIMEOUT)
    except AssertionError:
        print(operator.describe_failure(APP))
        raise


def check_discovered(
    operator: Operator, url: str, monitor: dict[str, Any], scrape: dict[str, Any], replicas: int
) -> None:
    """Prometheus scrapes exactly the pods the monitor's selector selects (``replicas`` of
    them), at their pod IPs and the query port, labelled as the Prometheus Operator and the
    monitor's relabelling label them."""
    pods = wait_running(operator, replicas)
    # The pods the monitor's selector selects, as the API server answers it.
    selector = ",".join(f"{k}={v}" for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    selected = operator.admin.request(
        f"/api/v1/namespaces/{operator.namespace}/pods?labelSelector={selector}"
    )["items"]
    assert {p["metadata"]["name"] for p in selected} == set(pods)

    def targets_up() -> list[dict[str, Any]] | None:
        active = prometheus_api(url, "targets", state="active")["activeTargets"]
        found = [t for t in active if t["scrapePool"] == scrape["job_name"]]
        if {t["labels"]["pod"] for t in found} == set(pods) and all(
            t["health"] == "up" for t in found
        ):
            return found
        return None

    found = wait_for(targets_up, f"the app's {replicas} pods scraped", SCRAPED_TIMEOUT)
    for target in found:
        labels = target["labels"]
        assert target["scrapeUrl"] == (
            f"http://{pods[labels['pod']]}:{names.QUERY_PORT}/metrics"
        ), target
        assert labels["namespace"] == operator.namespace and labels["app"] == APP
        assert labels["job"] == f"{operator.namespace}/{monitor['metadata']['name']}"


def lag_alert(operator: Operator, url: str) -> dict[str, Any] | None:
    """The app's EddylineInputLagGrowing alert in Prometheus' /api/v1/alerts (pending or
    firing), or None."""
    found = [
        a
        for a in prometheus_api(url, "alerts")["alerts"]
        if a["labels"].get("alertname") == LAG_ALERT
        and a["labels"].get("namespace") == operator.namespace
        and a["labels"].get("app") == APP
    ]
    assert len(found) <= 1, found
    return found[0] if found else None


def watch_lag_alert(
    operator: Operator, url: str, *, until: str
) -> tuple[list[str], dict[str, Any]]:
    """The lag alert's states as seen from its first appearance (each change once, "absent"
    while it is gone), polled until it is in state ``until``; and the alert then."""
    states: list[str] = []

    def reached() -> dict[str, Any] | None:
        alert = lag_alert(operator, url)
        state = "absent" if alert is None else str(alert["state"])
        if (states or state != "absent") and (not states or states[-1] != state):
            states.append(state)
        return alert if state == until else None

    alert = wait_for(reached, f"the {LAG_ALERT} alert {until}", ALERT_TIMEOUT, interval=0.25)
    return states, alert


def lag_rule_state(url: str) -> str:
    (rule,) = [
        r
        for group in prometheus_api(url, "rules", type="alert")["groups"]
        for r in group["rules"]
        if r["name"] == LAG_ALERT
    ]
    return str(rule["state"])


def scaled_out(operator: Operator) -> dict[str, Any] | None:
    """The autoscaler's last decision once it is the scale out from 1 to 2 pods."""
    status = operator.app(APP).get("status", {}).get("autoscaling") or {}
    decision: dict[str, Any] | None = status.get("lastDecision")
    if decision and (decision["fromReplicas"], decision["toReplicas"]) == (1, 2):
        return decision
    return None


DASHBOARD = REPO / "charts" / "eddyline-operator" / "dashboards" / "eddyline.json"
# Grafana's $__rate_interval: max($__interval + scrape interval, 4 x scrape interval); the
# second wins at a test's 1 s scrape interval.
RATE_INTERVAL = "4s"
# The panel whose "restored" series the test drives above 0 (drive_a_restore).
RESTORE_PANEL = "Restore"
# Panels whose queries may answer no series in this test, and why: none. The test drives the
# events behind every panel (a scale decision for "Scaling decisions", a second pod for the
# standby lag, a lost state claim for "Restore"); a panel that must stay empty here is named
# with its reason.
EXPECTED_EMPTY: dict[str, str] = {}


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
