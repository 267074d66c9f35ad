"""The chart's Grafana dashboard queries only metrics that exist, and the monitoring values
render (Helm's own lint renders every template with the values given).

The metric names are derived from the code, never listed by hand: the runtime's from every
``MetricName`` its modules register (read from their source, then named by the exporter's own
:func:`~eddyline_runtime.query.prometheus.metric_family`), the operator's from
:func:`eddyline_operator.metrics.family_names`.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from eddyline_operator import metrics as operator_metrics
from eddyline_runtime.metrics import MetricName
from eddyline_runtime.query.prometheus import metric_family
from tests.unit.operator.test_chart import WARNING, lint

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "eddyline-operator"
DASHBOARD = CHART / "dashboards" / "eddyline.json"
RUNTIME = ROOT / "runtime" / "src" / "eddyline_runtime"


# ------------------------------------------------------------------ the runtime's metric names
class _UnresolvedError(Exception):
    pass


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` / ``NAME: Final = "text"``."""
    found: dict[str, str] = {}
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            found[target.id] = value.value
    return found


def _is_metric_name_call(node: ast.AST) -> bool:
    """``MetricName.of(...)`` or ``MetricName(...)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return (
            func.attr == "of" and isinstance(func.value, ast.Name) and func.value.id == "MetricName"
        )
    return isinstance(func, ast.Name) and func.id == "MetricName"


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def _values(
    expr: ast.expr, node: ast.AST, constants: dict[str, str], parents: dict[ast.AST, ast.AST]
) -> list[str]:
    """What a group/name argument can be: a literal, a module constant, or a loop variable
    over a literal tuple of tuples (``for name, read in (("a", ...), ("b", ...))``)."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return [expr.value]
    if isinstance(expr, ast.Name):
        if expr.id in constants:
            return [constants[expr.id]]
        scope: ast.AST | None = node
        while scope is not None:
            if isinstance(scope, ast.For) and isinstance(scope.iter, (ast.Tuple, ast.List)):
                target = scope.target
                names = [t.id for t in target.elts] if isinstance(target, ast.Tuple) else []
                if isinstance(target, ast.Name):
                    names = [target.id]
                if expr.id in names:
                    index = names.index(expr.id)
                    found = []
                    for item in scope.iter.elts:
                        element = item.elts[index] if isinstance(item, ast.Tuple) else item
                        found += _values(element, scope, constants, parents)
                    return found
            scope = parents.get(scope)
    raise _UnresolvedError(ast.unparse(expr))


def _forwarder(
    call: ast.Call, forwarders: dict[ast.AST, tuple[int, int]], parents: dict[ast.AST, ast.AST]
) -> ast.AST | None:
    """The forwarder ``call`` calls: one of that name defined in a scope enclosing it."""
    if not isinstance(call.func, ast.Name):
        return None
    for func in forwarders:
        if func.name != call.func.id:  # type: ignore[attr-defined]
            continue
        scope, ancestor = parents.get(func), parents.get(call)
        while ancestor is not None and ancestor is not scope:
            ancestor = parents.get(ancestor)
        if ancestor is scope:
            return func
    return None


def runtime_metric_names() -> tuple[set[str], list[str]]:
    """Every Prometheus family the runtime can export, and the registrations this reading
    could not resolve (which must stay none, so a new way of naming metrics is noticed)."""
    families: set[str] = set()
    unresolved: list[str] = []
    for path in sorted(RUNTIME.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants, parents = _constants(tree), _parents(tree)
        # Functions that pass their own (group, name) parameters on to MetricName.of: the
        # thread's `register(group, name, read)`; their calls in the scope that defines them
        # (a nested def is seen only there) name metrics too.
        forwarders: dict[ast.AST, tuple[int, int]] = {}
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = [a.arg for a in func.args.args]
            for call in ast.walk(func):
                if _is_metric_name_call(call) and len(call.args) >= 2:  # type: ignore[attr-defined]
                    group, name = call.args[:2]  # type: ignore[attr-defined]
                    if (
                        isinstance(group, ast.Name)
                        and isinstance(name, ast.Name)
                        and {group.id, name.id} <= set(params)
                    ):
                        forwarders[func] = (params.index(group.id), params.index(name.id))

        for call in ast.walk(tree):
            if not isinstance(call, ast.Call):
                continue
            forwarder = _forwarder(call, forwarders, parents)
            if _is_metric_name_call(call):
                positions = (0, 1)
            elif forwarder is not None:
                positions = forwarders[forwarder]
            else:
                continue
            if len(call.args) <= max(positions):
                unresolved.append(f"{path.name}:{call.lineno}: {ast.unparse(call)}")
                continue
            try:
                groups = _values(call.args[positions[0]], call, constants, parents)
                metric_names = _values(call.args[positions[1]], call, constants, parents)
            except _UnresolvedError:
                # A forwarder's own body (its parameters) is resolved at its calls.
                enclosing = parents.get(call)
                while enclosing is not None and enclosing not in forwarders:
                    enclosing = parents.get(enclosing)
                if enclosing is not None:
                    continue
                unresolved.append(f"{path.name}:{call.lineno}: {ast.unparse(call)}")
                continue
            families |= {metric_family(MetricName(g, n)) for g in groups for n in metric_names}
    return families, unresolved


def test_every_runtime_metric_registration_is_read() -> None:
    families, unresolved = runtime_metric_names()
    assert unresolved == []
    # What a pod's /metrics shows (see query/prometheus.py): the reading found the known ones.
    assert {
        "eddyline_stream_thread_metrics_process_rate",
        "eddyline_rocksdb_memory_metrics_budget_bytes",
        "eddyline_consumer_fetch_manager_metrics_records_lag",
    } <= families


# ------------------------------------------------------------------ the dashboard's PromQL
_FUNCTIONS_AND_KEYWORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "group", "count_values", "rate", "irate", "increase", "delta", "idelta", "deriv",
    "histogram_quantile", "clamp_min", "clamp_max", "abs", "label_values", "label_replace",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "offset", "bool", "time", "vector", "scalar", "sort", "sort_desc", "absent",
    "max_over_time", "min_over_time", "avg_over_time", "sum_over_time", "last_over_time",
    "inf", "nan",
}  # fmt: skip


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana ``label_values``) selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors
    # Label lists: `by (a, b)`, `without (...)`, `on (...)`, `ignoring (...)`.
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    # label_values(metric, label): the second argument is a label.
    text = re.sub(r"(label_values\s*\([^,()]*),\s*[A-Za-z_]\w*\s*\)", r"\1)", text)
    found = set()
    for match in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in _FUNCTIONS_AND_KEYWORDS:
            continue
        found.add(word)
    return found


def dashboard_expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expression) for every panel target and templating query."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable["type"] == "query":
            query = variable["query"]
            yield (
                f"variable {variable['name']}",
                query["query"] if isinstance(query, dict) else query,
            )


def test_the_expression_reader_finds_metrics_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, app) (rate(a_bucket{namespace=~"$ns", '
        'x="by (b)"}[$__rate_interval]))) / on (app) group_left sum(b_total offset 5m) > 0'
    )
    assert metric_names_in(expr) == {"a_bucket", "b_total"}
    assert metric_names_in('label_values(c_metric{namespace=~"$namespace"}, app)') == {"c_metric"}


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    runtime, _ = runtime_metric_names()
    exported = runtime | set(operator_metrics.family_names())
    queried: dict[str, set[str]] = {}
    for where, expr in dashboard_expressions(dashboard):
        names = metric_names_in(expr)
        assert names, f"{where}: no metric in {expr!r}"
        for name in names:
            queried.setdefault(name, set()).add(where)
    missing = {name: sorted(where) for name, where in queried.items() if name not in exported}
    assert missing == {}
    # The panels the chart promises: the pods' and the operator's.
    wanted = {
        "eddyline_stream_thread_metrics_process_rate",
        "eddyline_stream_thread_metrics_process_ratio",
        "eddyline_consumer_fetch_manager_metrics_records_lag",
        "eddyline_stream_thread_metrics_commit_latency_avg",
        "eddyline_stream_state_metrics_restore_total",
        "eddyline_rocksdb_memory_metrics_block_cache_usage_bytes",
        "eddyline_rocksdb_memory_metrics_write_buffer_usage_bytes",
        "eddyline_stream_task_metrics_dropped_records_rate",
        operator_metrics.CYCLES,
        f"{operator_metrics.CYCLE_SECONDS}_bucket",
        operator_metrics.APPS,
        operator_metrics.APPS_PAUSED,
        operator_metrics.SCALING_DECISIONS,
    }
    assert wanted <= set(queried)


def test_the_dashboard_is_one_grafana_can_import() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            # Every panel reads the dashboard's data-source variable, not a fixed one.
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


# ------------------------------------------------------------------ values and rendering
def chart_with(tmp_path: Path, values: dict[str, Any]) -> Path:
    """A copy of the chart whose values.yaml has ``values`` merged in (lint reads only it)."""
    chart = tmp_path / "eddyline-operator"
    shutil.copytree(CHART, chart)
    merged = yaml.safe_load((chart / "values.yaml").read_text())
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    (chart / "values.yaml").write_text(yaml.safe_dump(merged))
    return chart


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            _merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


EVERYTHING = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "podMonitor": {"enabled": True},
    "dashboard": {"enabled": True, "namespace": "monitoring"},
    "prometheusRule": {"enabled": True, "alertLabels": {"team": "streaming"}},
}


@pytest.mark.parametrize(
    "values",
    [
        {"metrics": EVERYTHING},
        {"metrics": EVERYTHING, "clusterWide": True},
        {"metrics": EVERYTHING, "watchNamespaces": ["team-a", "team-b"]},
        {"metrics": {"enabled": False}},
    ],
    ids=["everything", "cluster-wide", "namespaces", "no-metrics"],
)
def test_the_monitoring_values_render_clean(tmp_path: Path, values: dict[str, Any]) -> None:
    problems = [m for m in lint(chart_with(tmp_path, values)) if m["Severity"] >= WARNING]
    assert problems == []


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"metrics": {"port": 80}}, "port"),
        ({"metrics": {"podMonitor": {"interval": "every minute"}}}, "interval"),
        ({"metrics": {"dashboard": {"labels": {"grafana_dashboard": 1}}}}, "grafana_dashboard"),
        ({"metrics": {"serviceMonitor": {"enable": True}}}, "enable"),
        (
            {"metrics": {"prometheusRule": {"restoringLongerThan": "half an hour"}}},
            "restoringLongerThan",
        ),
        ({"metrics": {"prometheusRule": {"notReconcilingSeconds": 0}}}, "notReconcilingSeconds"),
        (
            {"metrics": {"prometheusRule": {"inputLagGrowingResolution": "1 minute"}}},
            "inputLagGrowingResolution",
        ),
        (
            {"metrics": {"prometheusRule": {"upgradeRolledBackWindow": 3600}}},
            "upgradeRolledBackWindow",
        ),
    ],
)
def test_the_values_schema_refuses_bad_monitoring_values(values: dict[str, Any], path: str) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    merged = _merge(yaml.safe_load((CHART / "values.yaml").read_text()), values)
    with pytest.raises(jsonschema.ValidationError) as error:
        jsonschema.validate(merged, schema)
    assert path in [*error.value.absolute_path] or f"'{path}'" in error.value.message
