"""The Dockerfile, checked without a Docker engine: every file it copies exists, every
stage it copies from is defined, and every command it or the manifests run resolves."""

from __future__ import annotations

import importlib
import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def scripts() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    result: dict[str, str] = project["scripts"]
    return result


def test_every_copied_source_exists_and_is_not_ignored() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    copies = [rest for keyword, rest in instructions() if keyword == "COPY"]
    assert copies
    for rest in copies:
        if rest.startswith("--from="):
            continue
        *sources, _destination = rest.split()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the build context"
            assert source not in ignored, f"COPY {source}: excluded by .dockerignore"


def test_copies_from_stages_that_exist() -> None:
    stages = {
        rest.split(" AS ")[1].strip()
        for keyword, rest in instructions()
        if keyword == "FROM" and " AS " in rest
    }
    for keyword, rest in instructions():
        if keyword == "COPY" and rest.startswith("--from="):
            assert rest.split()[0].removeprefix("--from=") in stages


def test_the_image_runs_as_the_non_root_user_it_creates() -> None:
    users = [rest for keyword, rest in instructions() if keyword == "USER"]
    assert users == ["10001"]
    assert any(
        "useradd --uid 10001" in rest for keyword, rest in instructions() if keyword == "RUN"
    )


def test_every_command_the_image_and_the_manifests_run_resolves() -> None:
    commands = set()
    for keyword, rest in instructions():
        if keyword in ("CMD", "ENTRYPOINT"):
            commands.add(json.loads(rest)[0])
    deployment = (ROOT / "charts/eddyline-operator/templates/deployment.yaml").read_text()
    commands.update(re.findall(r'command: \["([^"]+)"\]', deployment))
    from eddyline_operator.reconcile.objects import pod_template
    from eddyline_operator.reconcile.plan import parse_app

    app = parse_app(
        {
            "apiVersion": "eddyline.dev/v1alpha1",
            "kind": "StreamApp",
            "metadata": {"name": "wc", "namespace": "default"},
            "spec": {"topology": "wordcount:topology", "log": {"url": "kafka://k:9092"}},
        }
    )
    commands.update(
        pod_template(app, default_image="x", log_node=None)["spec"]["containers"][0]["command"]
    )
    assert commands >= {"eddyline", "eddyline-operator"}
    for command in commands:
        target = scripts().get(command)
        assert target is not None, f'"{command}" is not a console script of pyproject.toml'
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function))


def test_the_image_installs_the_operator_extra() -> None:
    runs = " ".join(rest for keyword, rest in instructions() if keyword == "RUN")
    assert "'.[operator]'" in runs
