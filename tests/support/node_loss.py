"""Losing a node on the control plane: what the node-loss test and the operator bench share.

``tests/e2e/test_operator_node_loss.py`` asserts the behaviour (issue 23, item 2) and
``tests/bench/bench_operator_kafka.py`` times it (``node_loss_to_processing_s``): both kill
the node of a pod holding active tasks with the kubelet stand-in, wait for the operator to
drop that pod from the published membership, and ask the survivors directly for counts.
"""

from __future__ import annotations

import json

from eddyline_operator.reconcile.names import QUERY_PORT
from eddyline_runtime.membership import MEMBERSHIP_FILE, Membership
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.operator import Operator


def membership(operator: Operator, app: str) -> Membership | None:
    """The membership the operator published in the app's ConfigMap; None before the first."""
    found = operator.get("", "configmaps", f"{app}-membership")
    raw = ((found or {}).get("data") or {}).get(MEMBERSHIP_FILE)
    return Membership.from_json(json.loads(raw)) if raw else None


def members(operator: Operator, app: str) -> set[str]:
    published = membership(operator, app)
    return set() if published is None else {m.id for m in published.assignment.members}


def wait_dropped(operator: Operator, app: str, victim: str, what: str, timeout: float) -> None:
    """Until the published membership no longer holds ``victim`` (the pod of a dead node)."""
    wait_until(
        lambda: membership(operator, app) is not None and victim not in members(operator, app),
        what,
        timeout,
    )


def survivor_addresses(operator: Operator, app: str, victim: str) -> list[str]:
    """The other pods' query addresses. Asked directly because the query Service keeps the
    dead pod as an endpoint until the node lifecycle controller marks it not ready (its
    node-monitor grace, 40 s and more), which is not what the operator's takeover waits for."""
    return [
        f"{pod['status']['podIP']}:{QUERY_PORT}"
        for name, pod in operator.pods(app).items()
        if name != victim and pod.get("status", {}).get("podIP")
    ]
