"""Which API calls a workload's ServiceAccount makes, from kube-apiserver's audit log.

The real-node cluster starts its API server with :func:`write_policy`'s policy: requests of
ServiceAccounts (group ``system:serviceaccounts``) at level ``Metadata`` (who, verb,
resource; no bodies), once each when the response is complete, and nothing else, so the log
stays small. :func:`calls_by` reads it back as (verb, resource) pairs, e.g. to list what a
Spark driver asks for when it runs its executors (docs/operator.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


def write_policy(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "audit-policy.yaml"
    path.write_text(yaml.safe_dump(POLICY))
    return path


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def calls_by(log: Path, user: str) -> dict[tuple[str, str], set[int]]:
    """(verb, resource[/subresource]) -> the response codes the API server gave ``user``."""
    found: dict[tuple[str, str], set[int]] = {}
    if not log.exists():
        return found
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event.get("user", {}).get("username") != user:
            continue
        target = event.get("objectRef") or {}
        resource = str(target.get("resource", event.get("requestURI", "")))
        if target.get("subresource"):
            resource += f"/{target['subresource']}"
        code = int((event.get("responseStatus") or {}).get("code", 0))
        found.setdefault((str(event.get("verb")), resource), set()).add(code)
    return found
