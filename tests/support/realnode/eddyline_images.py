"""The project's images on every real node, imported once per cluster (the ``realnode`` tier).

The nodes' containerds do not see the Docker engine's store: ``docker save`` of the built
images, then ``ctr -n k8s.io images import`` on each node. A node's containerd lives as long
as the session's cluster, so a module that finds the images there already (another module
imported them) skips the 30-40 s of saving and importing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.support.images import Images
from tests.support.realnode.cluster import RealCluster

# The names the chart (its appVersion) and the examples' manifests run.
OPERATOR_IMAGE = "ghcr.io/eddyline/eddyline:0.1.0"
EXAMPLES_IMAGE = "ghcr.io/eddyline/examples:0.1.0"


def missing_on(cluster: RealCluster, names: tuple[str, ...]) -> list[str]:
    """The nodes whose containerd lacks any of ``names``."""
    return [
        node.spec.name
        for node in cluster.nodes.values()
        if not set(names) <= set(node.ctr("images", "list", "-q").stdout.split())
    ]


def ensure_images(
    cluster: RealCluster,
    images: Images,
    into: Path,
    names: tuple[str, ...] = (OPERATOR_IMAGE, EXAMPLES_IMAGE),
) -> dict[str, float]:
    """Import ``names`` into every node that lacks them; seconds per step (empty: all there)."""
    lacking = missing_on(cluster, names)
    if not lacking:
        return {}
    archive = into / "eddyline-images.tar"
    started = time.monotonic()
    saved = images.docker("save", "-o", str(archive), *names)
    if saved.returncode != 0:
        raise RuntimeError(f"docker save {' '.join(names)} failed:\n{saved.stderr}")
    seconds = {"docker save": time.monotonic() - started}
    for name in lacking:
        started = time.monotonic()
        cluster.nodes[name].ctr("images", "import", str(archive))
        seconds[f"import {name}"] = time.monotonic() - started
    size = archive.stat().st_size
    archive.unlink()
    still = missing_on(cluster, names)
    if still:
        raise RuntimeError(f"after the import, nodes {still} still lack one of {names}")
    print(f"images ({size / 2**20:.0f} MiB archive), seconds:",
          json.dumps({step: round(value, 1) for step, value in seconds.items()}))  # fmt: skip
    return seconds
