"""Membership on a cluster: which pods are members, and the assignment to publish.

The operator is the membership authority, as the local group's supervisor is
locally. A pod is a member once it is Running with its container started,
and stops being one when the container stops running (a failed liveness
probe restarts it) or the pod is being deleted. Readiness never decides
membership: a pod is not ready *until* it holds an assignment and while it
restores, so readiness-based membership would deadlock new pods and cascade
failovers. A member's zone comes from its Node's label (the downward API
cannot expose node labels).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eddyline_operator.reconcile import names
from eddyline_runtime.assignor import Member, WarmupPolicy, assign
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.membership import MemberReport, Membership
from eddyline_runtime.partitions import TaskId

Obj = dict[str, Any]


@dataclass(frozen=True)
class TaskLayout:
    """What the operator knows of the topology, from the pods' reports."""

    topology_hash: str
    tasks: frozenset[TaskId]
    stateful: frozenset[TaskId]


def container_status(pod: Obj) -> Obj | None:
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") == names.CONTAINER:
            found: Obj = status
            return found
    return None


def is_member(pod: Obj) -> bool:
    """Running, its container started and running, not being deleted, with an IP."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    status = pod.get("status", {})
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    container = container_status(pod)
    if container is None:
        return False
    return bool(container.get("started")) and "running" in (container.get("state") or {})


def is_ready(pod: Obj) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in pod.get("status", {}).get("conditions") or []
    )


def members(
    pods: Iterable[Obj], node_labels: Mapping[str, Mapping[str, str]], zone_key: str
) -> list[Member]:
    """The member pods, each with its node's zone and its query address."""
    found = []
    for pod in pods:
        if not is_member(pod):
            continue
        node = pod.get("spec", {}).get("nodeName")
        zone = node_labels.get(node, {}).get(zone_key) if node else None
        address = f"{pod['status']['podIP']}:{names.QUERY_PORT}"
        found.append(Member(pod["metadata"]["name"], zone=zone, address=address))
    return sorted(found)


def layout_from(
    reports: Mapping[str, MemberReport], *, preferred: Iterable[str] = ()
) -> TaskLayout | None:
    """The task layout the pods report; None until one has.

    During a topology upgrade pods may disagree: the layout of the pods in
    ``preferred`` (those running the current pod template) wins, then the
    most common one."""
    if not reports:
        return None
    preferred_set = set(preferred)
    candidates = [r for m, r in reports.items() if m in preferred_set] or list(reports.values())
    counts = Counter(r.topology_hash for r in candidates)
    chosen_hash = sorted(counts, key=lambda h: (-counts[h], h))[0]
    report = next(r for r in candidates if r.topology_hash == chosen_hash)
    return TaskLayout(report.topology_hash, report.tasks, report.stateful)


def next_membership(
    previous: Membership | None,
    current_members: list[Member],
    layout: TaskLayout | None,
    num_standby_replicas: int,
    *,
    last_generation: int | None = None,
    warmups: WarmupPolicy | None = None,
) -> Membership | None:
    """The membership to publish, or None when ``previous`` still holds (or none can be
    computed yet: no member, or no layout reported).

    With no member left, the previous assignment stays published: pods that come back
    resume from it (as the local group does). With no previous membership (a deleted
    ConfigMap), the generation continues from ``last_generation`` (status
    membershipGeneration) instead of starting again at 1. With ``warmups``
    (:func:`warmup_policy`) a stateful task moves only to a caught-up copy."""
    if layout is None or not current_members:
        return None
    keep = previous.assignment if previous is not None else None
    if keep is not None and keep.tasks != layout.tasks:
        keep = None  # the topology or partition count changed: assign afresh
    assignment = assign(
        layout.tasks,
        current_members,
        num_standby_replicas,
        previous=keep,
        stateful=layout.stateful,
        warmups=warmups,
    )
    if previous is not None and assignment == previous.assignment:
        return None
    base = previous.generation if previous is not None else (last_generation or 0)
    generation = base + 1
    return Membership(generation, assignment)


def effective_standbys(requested: int, replicas: int) -> int:
    """What the assignor will run: at most replicas - 1 standbys per task."""
    return max(0, min(requested, replicas - 1))


def warmup_policy(
    config: StreamsConfig, reports: Mapping[str, MemberReport], current: Iterable[Member]
) -> WarmupPolicy:
    """Warm before moving (KIP-441) with the app's ``acceptable.recovery.lag`` and
    ``max.warmup.replicas``: each member's lags are what it last reported; a member that has
    not reported holds no copy (a new pod's warm-ups start from nothing).

    There is no probing timer here: each cycle (every few seconds, with fresh reports) assigns
    again, so a warm-up that catches up becomes active at the next cycle, well before
    ``probing.rebalance.interval.ms``."""
    lags = {m.id: reports[m.id].task_lags() for m in current if m.id in reports}
    return WarmupPolicy(
        lags,
        acceptable_recovery_lag=config.acceptable_recovery_lag,
        max_warmup_replicas=config.max_warmup_replicas,
    )
