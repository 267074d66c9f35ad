"""The Dockerfile, checked without a Docker engine: every file it copies exists, every
stage it copies from is defined, and every command it or the manifests run resolves."""

from __future__ import annotations

import fnmatch
import importlib
import json
import re
import tomllib
from pathlib import Path

import yaml

from tests.support.images import build_images_script

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


def test_the_base_is_an_argument_defaulting_to_what_users_pull() -> None:
    found = instructions()
    assert found[0] == ("ARG", "PYTHON_BASE=python:3.11-slim")
    assert [rest for keyword, rest in found if keyword == "FROM"] == [
        "${PYTHON_BASE} AS build",
        "${PYTHON_BASE}",
    ]
    assert build_images_script().IMAGES["eddyline"].bases == {"PYTHON_BASE": "python"}


# What giving a build the machine's egress CA, or switching verification off, would look like.
TRUST_WORDS = re.compile(
    r"ca-certificates|update-ca-certificates|cacerts|PIP_CERT|SSL_CERT|REQUESTS_CA_BUNDLE"
    r"|trusted-host|insecure|verify|ssl\.insecure|COPY ca/",
    re.IGNORECASE,
)


def test_no_project_dockerfile_touches_certificates_or_verification() -> None:
    """The trust rule: only the test-only stand-in bases (tools/base-images) trust this
    machine's egress CA; an image users build or pull never does (docs/containers.md)."""
    for dockerfile in ("Dockerfile", "examples.Dockerfile", "restore.Dockerfile"):
        steps = [
            line
            for line in (ROOT / dockerfile).read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
        assert not [line for line in steps if TRUST_WORDS.search(line)], dockerfile
    trust = (ROOT / "tools" / "base-images" / "trust.Dockerfile").read_text()
    assert "update-ca-certificates" in trust  # the one place it happens
    assert "trust.Dockerfile" in (ROOT / "scripts" / "base-images").read_text()


def test_the_build_context_leaves_out_caches_environments_and_state() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in (".cache", ".venv", ".venv-bench", ".venv-bytewax", ".eddyline-state", ".git"):
        assert any(fnmatch.fnmatchcase(path, p) for p in patterns), f"{path} is in the context"
    for kept in ("runtime", "operator", "examples", "tools", "pyproject.toml", "README.md"):
        assert not any(fnmatch.fnmatchcase(kept, p) for p in patterns), kept


def test_the_images_are_tagged_as_the_chart_names_them() -> None:
    chart = yaml.safe_load((ROOT / "charts/eddyline-operator/Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts/eddyline-operator/values.yaml").read_text())
    assert values["image"]["tag"] == ""  # so the chart's default is its appVersion
    images = build_images_script().IMAGES
    assert f"{values['image']['repository']}:{chart['appVersion']}" in images["eddyline"].tags
    assert "eddyline:dev" in images["eddyline"].tags
    for name, image in images.items():
        assert (ROOT / image.dockerfile).is_file(), name
        text = (ROOT / image.dockerfile).read_text()
        for arg in (*image.args, *image.bases):
            assert re.search(rf"^ARG {arg}=", text, re.MULTILINE), f"{image.dockerfile}: {arg}"
    makefile = (ROOT / "Makefile").read_text()
    for target, name in (("image", "eddyline"), ("restore-image", "restore")):
        recipe = re.search(rf"^{target}:.*\n\t(.+)$", makefile, re.MULTILINE)
        assert recipe is not None and f"$(BUILD_IMAGES) {name}" in recipe.group(1), target


def test_nothing_imports_the_kubernetes_client_parts_the_image_drops() -> None:
    # The Dockerfile removes kubernetes.aio (68 MB) from the image's environment.
    assert "site-packages/kubernetes/aio" in DOCKERFILE.read_text()
    for source in (ROOT / "operator" / "src").rglob("*.py"):
        text = source.read_text()
        assert not re.search(r"kubernetes\.aio|from kubernetes import .*\baio\b", text), source
