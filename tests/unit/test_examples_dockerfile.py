"""The examples' image (examples.Dockerfile), checked without a Docker engine: it copies files
that exist, puts every example's module where its ``PYTHONPATH`` finds it, so each topology
ref of the examples' cluster manifests resolves inside the image, and it is the image those
manifests name (issue 23, item 9: the quickstart named an image nothing built)."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path, PurePosixPath

import yaml

from tests.support.images import build_images_script

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "examples.Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def image_files() -> dict[PurePosixPath, Path]:
    """Where each copied file lands in the image, and its source in the repository."""
    placed: dict[PurePosixPath, Path] = {}
    for keyword, rest in instructions():
        if keyword != "COPY":
            continue
        *sources, destination = rest.split()
        for source in sources:
            path = ROOT / source
            assert path.is_file(), f"COPY {source}: no such file in the build context"
            assert destination.endswith("/"), f"COPY {source} {destination}: copy into a dir"
            placed[PurePosixPath(destination) / path.name] = path
    return placed


def python_path() -> list[PurePosixPath]:
    for keyword, rest in instructions():
        if keyword == "ENV" and rest.startswith("PYTHONPATH="):
            return [PurePosixPath(p) for p in rest.removeprefix("PYTHONPATH=").split(":")]
    raise AssertionError("examples.Dockerfile sets no PYTHONPATH")


def cluster_manifests() -> list[Path]:
    found = sorted(ROOT.glob("examples/*/streamapp.cluster.yaml"))
    assert found
    return found


def test_copied_sources_exist_and_are_not_ignored() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for source in image_files().values():
        relative = source.relative_to(ROOT)
        assert not any(relative.match(pattern) for pattern in ignored), relative


def test_every_topology_ref_of_the_cluster_manifests_resolves_in_the_image() -> None:
    files = image_files()
    search = python_path()
    for manifest in cluster_manifests():
        document = yaml.safe_load(manifest.read_text())
        topology = document["spec"]["topology"]
        ref = topology["ref"] if isinstance(topology, dict) else topology
        module, _, function = ref.partition(":")
        where = [d / f"{module}.py" for d in search if d / f"{module}.py" in files]
        assert where, f"{manifest.relative_to(ROOT)}: module {module!r} is not on PYTHONPATH"
        spec = importlib.util.spec_from_file_location(f"_image_{module}", files[where[0]])
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        assert callable(getattr(loaded, function)), f"{ref}: no function {function!r}"


def test_the_manifests_name_the_image_the_makefile_builds() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    examples = build_images_script().IMAGES["examples"]
    assert examples.dockerfile == "examples.Dockerfile"
    assert f"ghcr.io/eddyline/examples:{version}" in examples.tags
    for manifest in cluster_manifests():
        image = yaml.safe_load(manifest.read_text())["spec"]["image"]
        assert image in examples.tags, manifest
    # Built on what `make image` tags, after it.
    assert examples.args == {"BASE": "eddyline:dev"}
    assert "eddyline:dev" in build_images_script().IMAGES["eddyline"].tags
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^examples-image: image .*\n\t(.+)$", makefile, re.MULTILINE)
    assert target is not None, "Makefile: no examples-image target after image"
    assert "$(BUILD_IMAGES) examples" in target.group(1)


def test_the_image_keeps_the_non_root_user_of_its_base() -> None:
    assert [rest for keyword, rest in instructions() if keyword == "USER"] == ["10001"]
    assert [rest for keyword, rest in instructions() if keyword == "FROM"] == ["${BASE}"]
