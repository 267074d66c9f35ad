"""Builders for StreamApp bodies, pods and nodes as the API server returns them.

Shared by the operator's unit tests (``from tests.support.k8s_objects import ...``).
"""

from __future__ import annotations

import copy
from typing import Any

Obj = dict[str, Any]

BODY: Obj = {
    "apiVersion": "eddyline.dev/v1alpha1",
    "kind": "StreamApp",
    "metadata": {"name": "wc", "namespace": "apps", "uid": "uid-1", "generation": 3},
    "spec": {
        "topology": {"ref": "wordcount:topology", "revision": "1"},
        "image": "example/wordcount:1",
        "replicas": 3,
        "log": {"url": "kafka://kafka-0:9092,kafka-1:9092"},
        "config": {"processing.guarantee": "exactly_once_v2", "num.standby.replicas": 1},
    },
}


def body(**spec: Any) -> Obj:
    document = copy.deepcopy(BODY)
    document["spec"].update(spec)
    return document


def node(name: str, zone: str, *, ready: bool = True) -> Obj:
    return {
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pod(
    ordinal: int,
    *,
    app: str = "wc",
    node_name: str | None = None,
    running: bool = True,
    ready: bool = True,
    config_hash: str | None = None,
    revision: str = "1",
    deleting: bool = False,
    waiting: str | None = None,
) -> Obj:
    meta: Obj = {
        "name": f"{app}-{ordinal}",
        "namespace": "apps",
        "labels": {
            "app.kubernetes.io/name": "eddyline",
            "app.kubernetes.io/instance": app,
            "app.kubernetes.io/managed-by": "eddyline-operator",
            "eddyline.dev/revision": revision,
        },
        "annotations": {} if config_hash is None else {"eddyline.dev/config-hash": config_hash},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    state: Obj = {"running": {"startedAt": "2026-01-01T00:00:00Z"}} if running else {}
    if waiting:
        state = {"waiting": {"reason": waiting}}
    return {
        "metadata": meta,
        "spec": {"nodeName": node_name or f"node-{ordinal % 3}"},
        "status": {
            "phase": "Running" if running else "Pending",
            "podIP": f"127.0.0.{ordinal + 10}",
            "conditions": [{"type": "Ready", "status": "True" if ready and running else "False"}],
            "containerStatuses": [
                {"name": "eddyline", "started": running, "ready": ready, "state": state}
            ],
        },
    }


def three_zones() -> list[Obj]:
    return [node("node-0", "zone-a"), node("node-1", "zone-b"), node("node-2", "zone-c")]


def stateful_set(objects: list[Obj]) -> Obj:
    """The StatefulSet among a plan's objects, found by kind (the order is the apply order)."""
    return next(o for o in objects if o["kind"] == "StatefulSet")
