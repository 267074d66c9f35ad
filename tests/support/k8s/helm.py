"""Helm's own library (helm-sdkpy) against the emulated API server, in a subprocess.

Helm keeps its releases in memory (``HELM_DRIVER=memory``): its default Secret storage sends
protobuf, which the emulator does not speak. The Go runtime reads the environment once when
the library loads, so every Helm session is a subprocess started with that environment, and
a release lives only as long as its session: install and uninstall go in one call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.support.k8s.apiserver import ApiServer, Obj

INSTALL: Obj = {"action": "install"}
UNINSTALL: Obj = {"action": "uninstall"}
RELEASE = "eddyline"

_SESSION = """
import asyncio, json, sys
import helm_sdkpy

kubeconfig, namespace, chart, release, steps = sys.argv[1:6]
config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kubeconfig)
results = []
for step in json.loads(steps):
    try:
        if step["action"] == "install":
            result = asyncio.run(helm_sdkpy.Install(config).run(
                release, chart, values=step.get("values", {}), wait=False, timeout=30))
        else:
            uninstall = helm_sdkpy.Uninstall(config)
            result = asyncio.run(uninstall.run(release, wait=False, timeout=30))
    except Exception as error:
        result = {"error": f"{type(error).__name__}: {error}"}
    results.append(result)
print(json.dumps(results, default=str))
"""


def helm(api: ApiServer, home: Path, namespace: str, chart: Path, *steps: Obj) -> list[Obj]:
    """Run install/uninstall steps in one Helm session; one result (or ``error``) per step."""
    home.mkdir(parents=True, exist_ok=True)
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text(api.kubeconfig(), encoding="utf-8")
    env = {**os.environ, "HELM_DRIVER": "memory", "HOME": str(home)}
    completed = subprocess.run(
        [sys.executable, "-c", _SESSION, str(kubeconfig), namespace, str(chart), RELEASE,
         json.dumps(steps)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    if completed.returncode != 0:
        raise RuntimeError(f"the Helm session failed:\n{completed.stderr}")
    results: list[Obj] = json.loads(completed.stdout.strip().splitlines()[-1])
    return results


def rendered(result: Obj) -> list[Obj]:
    """The objects of an install's manifest (the chart's crds/ are not part of it)."""
    return [doc for doc in yaml.safe_load_all(result["manifest"]) if doc]


def deployment_container(result: Obj) -> tuple[Obj, Obj]:
    """The rendered Deployment's pod spec and first container."""
    deployment = next(o for o in rendered(result) if o["kind"] == "Deployment")
    pod: Obj = deployment["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def chart_environment(container: Obj) -> dict[str, Any]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
