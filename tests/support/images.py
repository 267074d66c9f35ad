"""The project's images as the container tests use them (registered in tests/conftest.py).

The session-scoped ``images`` fixture builds the three images on the test-only stand-in
bases with the project's own scripts (``scripts/build-images --bases standin``, which starts
the container engine and the bases as needed; ``make test`` runs the same command first as
``make test-images``, so here it only confirms the images are current). A cold build takes
minutes; warm, seconds.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
# The uid every image runs as (Dockerfile's useradd; the chart's runAsUser).
IMAGE_UID = 10001
# What `make test-images` builds, in that order (the others are built on eddyline:dev).
IMAGE_NAMES = ("eddyline", "examples", "restore")
# Seconds any one docker command of a test may take before the test fails instead of hanging.
DOCKER_TIMEOUT = 300


def build_images_script() -> ModuleType:
    """``scripts/build-images`` as a module: its table of images (Dockerfile, tags, base
    arguments), for the unit tests that hold it to the Dockerfiles, the chart and the
    manifests without an engine."""
    name = "eddyline_build_images"
    if name not in sys.modules:
        loader = importlib.machinery.SourceFileLoader(name, str(REPO / "scripts" / "build-images"))
        spec = importlib.util.spec_from_loader(name, loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while they are made
        loader.exec_module(module)
    return sys.modules[name]


@dataclass(frozen=True)
class Images:
    docker_host: str
    eddyline: str
    examples: str
    restore: str
    summary: dict[str, object]

    def docker(
        self, *args: str, stdin: str | None = None, timeout: float = DOCKER_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """One docker CLI command against the project's engine (never raises on failure)."""
        return subprocess.run(
            ["docker", *args],
            env={**os.environ, "DOCKER_HOST": self.docker_host},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def run(
        self, image: str, *command: str, options: Sequence[str] = (), stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``docker run --rm`` of ``command`` in ``image``: no network unless ``options``
        say otherwise, as every test container starts."""
        network = [] if any(o.startswith("--network") for o in options) else ["--network", "none"]
        interactive = ["-i"] if stdin is not None else []
        return self.docker(
            "run", "--rm", *interactive, *network, *options, image, *command, stdin=stdin
        )


@pytest.fixture(scope="session")
def images() -> Images:
    return build_images()


def build_images() -> Images:
    """The images, built or confirmed current (the fixture's body; benchmarks call it)."""
    host = subprocess.run(
        [REPO / "scripts" / "container-engine"], capture_output=True, text=True, check=False
    )
    assert host.returncode == 0, f"the container engine did not start:\n{host.stderr}"
    built = subprocess.run(
        [REPO / "scripts" / "build-images", "--bases", "standin", "--quiet", *IMAGE_NAMES],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, f"building the images failed:\n{built.stderr}"
    # What each build took and weighs; pytest shows it with -s or -rA.
    print(built.stderr)
    summary = json.loads(built.stdout.strip().splitlines()[-1])
    tags = {name: image["tags"][0] for name, image in summary["images"].items()}
    return Images(
        docker_host=host.stdout.strip(),
        eddyline=tags["eddyline"],
        examples=tags["examples"],
        restore=tags["restore"],
        summary=summary,
    )
