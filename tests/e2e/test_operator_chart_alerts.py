"""The chart's PrometheusRule, rendered by Helm's own library (helm-sdkpy) into the real API
server (which validates it against the Prometheus Operator's CRD), then unit-tested group by
group with the real ``promtool test rules``: each alert fires on the series in
``tests/e2e/alerts/<group>.test.yaml`` that should make it fire, and stays quiet on the rest.

Rendering needs an API server (helm-sdkpy has no client-only render), hence an e2e module.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_operator import metrics as operator_metrics
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.monitoring import install_monitoring_crds
from tests.support.control_plane.operator import helm, rendered
from tests.support.prometheus import promtool
from tests.unit.operator.test_chart_dashboard import metric_names_in, runtime_metric_names

pytestmark = pytest.mark.slow

RELEASE = "chart-alerts"
TESTS = Path(__file__).resolve().parent / "alerts"
RULES_PATH = "/apis/monitoring.coreos.com/v1/namespaces/{ns}/prometheusrules/{name}"
# Series the alerts read that eddyline does not export: kube-state-metrics'.
KUBE_STATE_METRICS = {
    "kube_pod_container_status_waiting_reason",
    "kube_job_failed",
    "kube_job_status_start_time",
}


@pytest.fixture(scope="module")
def rule(control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The PrometheusRule at the chart's default values (alerts switched on), as the API
    server stored it."""
    admin = control_plane.admin()
    install_monitoring_crds(admin)
    ns = RELEASE
    admin.ensure("/api/v1/namespaces", {"metadata": {"name": ns}})
    home = tmp_path_factory.mktemp("helm-alerts")
    values = {"metrics": {"prometheusRule": {"enabled": True, "labels": {"role": "alerts"}}}}
    (result,) = helm(control_plane.kubeconfig, home, ns, RELEASE,
                     {"action": "install", "values": values})  # fmt: skip
    try:
        assert "error" not in result, result.get("error")
        (obj,) = [o for o in rendered(result) if o["kind"] == "PrometheusRule"]
        stored = admin.get(RULES_PATH.format(ns=ns, name=obj["metadata"]["name"]))
        assert stored is not None, "the PrometheusRule was not created"
        # Pruning would drop a field the CRD's schema does not know: none was dropped.
        assert stored["spec"] == obj["spec"]
        assert stored["metadata"]["labels"]["role"] == "alerts"
        yield stored
    finally:
        helm(control_plane.kubeconfig, home, ns, RELEASE, {"action": "uninstall"})


def groups_of(rule: Any) -> dict[str, dict[str, Any]]:
    return {group["name"]: group for group in rule["spec"]["groups"]}


def run_rule_tests(group: dict[str, Any], tmp_path: Path) -> tuple[int, str]:
    """``promtool test rules`` on the group's test file, with the group written beside it
    as the rule file the test names."""
    test_file = TESTS / f"{group['name']}.test.yaml"
    shutil.copy(test_file, tmp_path / test_file.name)
    rules = tmp_path / f"{group['name']}.rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [group]}, sort_keys=False))
    checked = promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stderr + checked.stdout
    tested = promtool("test", "rules", test_file.name, cwd=tmp_path)
    return tested.returncode, tested.stdout + tested.stderr


def test_every_group_has_a_test_file_and_every_alert_a_firing_case(rule: Any) -> None:
    groups = groups_of(rule)
    assert set(groups) == {"eddyline.streamapps", "eddyline.operator"}
    assert {p.name.removesuffix(".test.yaml") for p in TESTS.glob("*.test.yaml")} == set(groups)
    for name, group in groups.items():
        alerts = {r["alert"] for r in group["rules"]}
        tests = yaml.safe_load((TESTS / f"{name}.test.yaml").read_text())["tests"]
        cases = [case for test in tests for case in test.get("alert_rule_test", [])]
        firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
        assert firing == alerts, f"{name}: alerts without a firing case: {alerts - firing}"


@pytest.mark.parametrize("group_name", ["eddyline.streamapps", "eddyline.operator"])
def test_promtool_unit_tests_pass_for_each_alert_group(
    rule: Any, group_name: str, tmp_path: Path
) -> None:
    code, output = run_rule_tests(groups_of(rule)[group_name], tmp_path)
    assert code == 0, output


def test_the_rule_tests_fail_when_an_alert_is_changed(rule: Any, tmp_path: Path) -> None:
    """The tests above can fail: a lag alert that waits an hour does not fire at 20 minutes."""
    group = copy.deepcopy(groups_of(rule)["eddyline.streamapps"])
    (lag,) = [r for r in group["rules"] if r["alert"] == "EddylineInputLagGrowing"]
    lag["for"] = "1h"
    code, output = run_rule_tests(group, tmp_path)
    assert code != 0
    assert "EddylineInputLagGrowing" in output


def test_every_metric_an_alert_reads_is_exported(rule: Any) -> None:
    runtime, _ = runtime_metric_names()
    exported = runtime | set(operator_metrics.family_names()) | KUBE_STATE_METRICS
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            names = metric_names_in(alert["expr"])
            assert names, alert["alert"]
            assert names <= exported, f"{alert['alert']} reads {names - exported}"
