"""The chart's optional ``kubectlPluginRole``: rendered by Helm's own library (its lint
renders every template with the values given), its rules the set docs/operator.md documents,
and that set the calls ``kubectl eddyline`` makes, read from the requests its commands send
(parsed as the API server's authorizer parses them), not listed by hand."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import yaml

from eddyline_operator.client import Kube
from eddyline_operator.kubectl import commands
from eddyline_operator.kubectl.render import Style
from eddyline_runtime.membership import MEMBERSHIP_FILE
from tests.unit.operator.test_chart import WARNING, lint
from tests.unit.operator.test_chart_dashboard import chart_with
from tests.unit.operator.test_kubectl_view import _app, _view_inputs

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "eddyline-operator"
RULES_FILE = CHART / "rbac" / "kubectl-eddyline-rules.yaml"
TEMPLATE = CHART / "templates" / "kubectl-plugin-role.yaml"
DOCS = ROOT / "docs" / "operator.md"

Grant = tuple[str, str, str]  # (API group, resource, verb), as RBAC grants one


def _grants(rules: list[dict[str, Any]]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _documented_rules() -> list[dict[str, Any]]:
    """The rules of the first YAML block in docs/operator.md's "kubectl eddyline" section."""
    section = DOCS.read_text(encoding="utf-8").split("\n## kubectl eddyline\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None, "no YAML block in the kubectl eddyline section"
    rules: list[dict[str, Any]] = yaml.safe_load(block.group(1))["rules"]
    return rules


def _chart_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    return rules


def test_the_role_is_off_by_default_and_renders_clean_when_asked_for(tmp_path: Path) -> None:
    assert yaml.safe_load((CHART / "values.yaml").read_text())["kubectlPluginRole"] == {
        "enabled": False
    }
    chart = chart_with(tmp_path, {"kubectlPluginRole": {"enabled": True}})
    assert [m for m in lint(chart) if m["Severity"] >= WARNING] == []
    template = TEMPLATE.read_text(encoding="utf-8")
    assert "{{- if .Values.kubectlPluginRole.enabled }}" in template
    # The template takes its rules from the file this test reads, whole.
    assert '.Files.Get "rbac/kubectl-eddyline-rules.yaml" | nindent 2' in template


def test_a_misspelt_role_value_is_refused_by_the_schema(tmp_path: Path) -> None:
    chart = chart_with(tmp_path, {"kubectlPluginRole": {"enable": True}})
    assert any(m["Severity"] > WARNING for m in lint(chart))


def test_the_chart_grants_exactly_the_documented_rules() -> None:
    assert _chart_rules() == [
        {**rule, "apiGroups": [str(g) for g in rule["apiGroups"]]} for rule in _documented_rules()
    ]
    # The e2e test binds every rule but the last to see the plugin refused without it.
    assert _chart_rules()[-1] == {"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get"]}


class _Recorder(Kube):
    """The plugin's client with the API server replaced: every request it would send is
    recorded and answered from a small app (two pods, their layouts, a membership)."""

    def __init__(self) -> None:  # no transport: nothing leaves the process
        self.requests: list[tuple[str, str]] = []
        pods, membership, reports = _view_inputs()
        self._app = _app()
        self._pods = pods
        self._membership = membership
        self._layout = reports["wc-0"].to_json()

    def _send(self, method: str, path: str, **_: Any) -> str | None:
        self.requests.append((method, path))
        if "/proxy/v1/layout" in path:
            return json.dumps(self._layout)
        if "/proxy/v1/stores/" in path:
            return json.dumps({"partition": 0, "active_host": "10.0.0.1:7070"})
        if path.endswith("/proxy/metrics"):
            return ""
        if path.endswith("/pods"):
            return json.dumps({"items": self._pods})
        if "/configmaps/" in path:
            return json.dumps({"data": {MEMBERSHIP_FILE: json.dumps(self._membership.to_json())}})
        if "/streamapps/" in path:
            return json.dumps(self._app)
        raise AssertionError(f"the plugin sent a request this test does not know: {method} {path}")


def _grant_of(method: str, path: str) -> Grant:
    """The (group, resource, verb) the API server's authorizer checks for a request
    (k8s.io/apiserver's RequestInfoFactory): a GET of a collection is "list"."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[0] == "namespaces":
        rest = rest[2:]
    resource = rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"
    verb = {"GET": "get" if len(rest) > 1 else "list", "PATCH": "patch"}[method]
    return group, resource, verb


def test_the_rules_are_the_calls_the_plugin_makes() -> None:
    kube = _Recorder()
    commands.read_view(kube, "team", "wc")  # status
    commands.where(kube, "team", "wc", "w01", None)
    commands.set_paused(kube, "team", "wc", paused=False, wait_seconds=0)  # resume
    commands.upgrade(
        kube,
        "team",
        "wc",
        ref="wordcount:topology_v2",
        revision=None,
        wait_seconds=None,
        out=io.StringIO(),
        style=Style(colour=False, width=None),
        progress=False,
    )
    called = {_grant_of(method, path) for method, path in kube.requests}
    granted = _grants(_chart_rules())
    assert called <= granted, called - granted
    # Granted beyond the calls, on purpose (docs/operator.md says why): listing StreamApps
    # finds an app's name (the plugin's own errors suggest `kubectl get streamapps`), and
    # getting a pod shows nothing listing the app's pods does not.
    assert granted - called == {("eddyline.dev", "streamapps", "list"), ("", "pods", "get")}
