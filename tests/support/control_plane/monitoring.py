"""The Prometheus Operator's PodMonitor, ServiceMonitor and PrometheusRule CRDs in the real
API server.

``scripts/monitoring-crds`` fetches them (the pinned release's Go module, through the Go
module proxy); installing them lets the API server validate the chart's monitors and alert
rules against the Prometheus Operator's own schemas, as a cluster running it would.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.control_plane.client import Client, wait_until

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "monitoring-crds"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def monitoring_crds() -> list[dict[str, Any]]:
    """The CRDs as fetched by the script (fetching them the first time)."""
    completed = subprocess.run(
        [str(SCRIPT)], capture_output=True, text=True, timeout=600, check=False
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{SCRIPT.name} failed:\n{completed.stderr}")
    directory = Path(completed.stdout.strip().splitlines()[-1])
    return [
        yaml.safe_load(path.read_text(encoding="utf-8"))
        for path in sorted(directory.glob("monitoring.coreos.com_*.yaml"))
    ]


def install_monitoring_crds(admin: Client) -> list[str]:
    """Create the CRDs (kept if present: the control plane is the session's) and wait until
    the API server serves them; returns their names."""
    names = []
    for crd in monitoring_crds():
        admin.ensure(CRDS, crd)
        names.append(crd["metadata"]["name"])
    for name in names:

        def established(name: str = name) -> bool:
            found = admin.get(f"{CRDS}/{name}") or {}
            conditions = (found.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_until(established, f"CRD {name} Established", 60)
    return names
