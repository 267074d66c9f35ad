"""The Helm chart, linted by Helm's own library (helm-sdkpy), and its values schema.

Rendering needs an API server (helm-sdkpy has no client-only render): the
rendered objects are installed into the real API server and validated in
tests/e2e/test_operator_chart.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import helm_sdkpy
import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "eddyline-operator"
# helm lint severities: 1 info, 2 warning, 3 error.
WARNING = 2


def lint(chart: Path) -> list[dict[str, Any]]:
    # Lint never contacts a cluster; the kubeconfig only has to be given.
    config = helm_sdkpy.Configuration(namespace="default", kubeconfig="/nonexistent")
    result = asyncio.run(helm_sdkpy.Lint(config).run(str(chart)))
    messages: list[dict[str, Any]] = result.get("Messages") or []
    return messages


def test_the_chart_lints_clean() -> None:
    problems = [m for m in lint(CHART) if m["Severity"] >= WARNING]
    assert problems == []


def test_lint_fails_on_values_the_schema_refuses(tmp_path: Path) -> None:
    chart = tmp_path / "eddyline-operator"
    shutil.copytree(CHART, chart)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    values["image"]["pullPolicy"] = "Sometimes"
    (chart / "values.yaml").write_text(yaml.safe_dump(values))
    assert any(m["Severity"] > WARNING for m in lint(chart))


def test_the_default_values_meet_the_values_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
        ({"clusterWide": "yes"}, "clusterWide"),
        ({"livenessPort": 80}, "livenessPort"),
        ({"replicaCount": 2}, "replicaCount"),
    ],
)
def test_the_values_schema_names_what_it_refuses(values: dict[str, Any], path: str) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    merged = {**yaml.safe_load((CHART / "values.yaml").read_text()), **values}
    with pytest.raises(jsonschema.ValidationError) as error:
        jsonschema.validate(merged, schema)
    # The path of a bad value, or the name of an unknown key in the message.
    assert path in [*error.value.absolute_path] or f"'{path}'" in error.value.message


def test_the_chart_ships_the_generated_crd() -> None:
    assert (CHART / "crds" / "streamapps.eddyline.dev.yaml").read_text() == (
        ROOT / "crds" / "streamapps.eddyline.dev.yaml"
    ).read_text()


def test_the_operator_deployment_runs_non_root_on_a_read_only_root() -> None:
    template = (CHART / "templates" / "deployment.yaml").read_text()
    for needle in (
        "runAsNonRoot: true",
        "readOnlyRootFilesystem: true",
        "allowPrivilegeEscalation: false",
        "path: /healthz",
        'command: ["eddyline-operator"]',
    ):
        assert needle in template
