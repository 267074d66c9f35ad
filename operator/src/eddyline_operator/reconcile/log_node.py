"""Pinning the embedded sqlite log's pods to one node.

SQLite's WAL needs every process on one host, so with a ``sqlite://`` log every pod (and
every restore Job) runs on one node, recorded in ``status.logNode``. The node stays while it
exists; a pod found elsewhere (the pin moved, or someone edited the StatefulSet) must not
open the shared log: it is restarted, and comes back on the pinned node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from eddyline_operator.reconcile.events import Event

Obj = dict[str, Any]


def node_is_ready(node: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in node.get("status", {}).get("conditions") or []
    )


def choose_log_node(previous: str | None, nodes: Sequence[Obj]) -> str | None:
    """The node the embedded log is pinned to: the same as before while it exists,
    else the first ready node by name (None: no node seen yet)."""
    existing = {n["metadata"]["name"] for n in nodes}
    if previous is not None and previous in existing:
        return previous
    ready = sorted(n["metadata"]["name"] for n in nodes if node_is_ready(n))
    return ready[0] if ready else None


@dataclass
class LogPin:
    """What the pin means this cycle."""

    node: str | None  # status.logNode (None: no embedded log, or no node to pin to yet)
    waiting: bool = False  # embedded, but no node yet: no StatefulSet until pods can be pinned
    off_node: list[str] = field(default_factory=list)  # pods to restart: they run elsewhere
    notes: list[str] = field(default_factory=list)


def pin(*, embedded: bool, previous: str | None, nodes: Sequence[Obj]) -> LogPin:
    """The node for this cycle (before any pod is looked at)."""
    if not embedded:
        return LogPin(None)
    node = choose_log_node(previous, nodes)
    if node is None:
        return LogPin(
            None, waiting=True, notes=["waiting for a ready node to pin the embedded sqlite log to"]
        )
    return LogPin(
        node,
        notes=[
            f"development only: the embedded sqlite log pins every pod to node {node} "
            "on one shared claim; use a kafka:// log in production"
        ],
    )


def restart_off_node(log_pin: LogPin, live_pods: Sequence[Obj], delete: list[str]) -> list[Event]:
    """Records the live pods that run off the pinned node in ``log_pin.off_node``, adds those
    not already going to ``delete``, and returns the warnings for them."""
    if log_pin.node is None:
        return []
    log_pin.off_node = sorted(
        p["metadata"]["name"]
        for p in live_pods
        if p.get("spec", {}).get("nodeName") not in (None, log_pin.node)
    )
    events = []
    for pod in log_pin.off_node:
        if pod not in delete:
            delete.append(pod)
            events.append(
                Event(
                    "Warning",
                    "LogSharedAcrossNodes",
                    f"restarting pod {pod}: it runs off node {log_pin.node}, and the embedded "
                    "sqlite log may not be shared across nodes",
                )
            )
    return events
