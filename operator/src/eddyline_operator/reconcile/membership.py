"""Membership on a cluster: which pods are members, and the assignment to publish.

The operator is the membership authority, as the local group's supervisor is
locally. A pod is a member once it is Running with its container started,
and stops being one when the container stops running (a failed liveness
probe restarts it). A pod being deleted (a scale-in, an eviction, a drain,
``kubectl delete``) stays a member while its container runs, as a *leaving*
one: the assignor gives it nothing new and moves its active tasks only to
caught-up copies (warming one up first), and the pod exits once it holds
none, within its grace period (docs/operator.md, "Scaling in"). Readiness never decides
membership: a pod is not ready *until* it holds an assignment and while it
restores, so readiness-based membership would deadlock new pods and cascade
failovers. A member's zone comes from its Node's label (the downward API
cannot expose node labels).

A pod on a lost node is no member either: when a machine dies, its pods' phase and
container state freeze as last reported (nobody is left to update them) until the node
lifecycle controller evicts them, about 5 minutes later. A node is lost once its Lease in
``kube-node-lease`` (renewed every 10 s by a kubelet) has not been renewed for the grace
period, or its Ready condition has been other than True for that long. Fencing keeps a pod
that comes back safe: its transactions belong to an older generation.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eddyline_operator.reconcile import names
from eddyline_runtime.assignor import Assignment, Member, WarmupPolicy, assign
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.membership import MemberReport, Membership, StoreRole
from eddyline_runtime.membership import warmup_policy as reported_warmup_policy
from eddyline_runtime.partitions import TaskId

Obj = dict[str, Any]

# How long a node's Lease may go unrenewed (or its Ready condition stay other than True)
# before its pods leave the membership. A kubelet renews every 10 s: 15 s allows one late
# renewal, and a dead node's tasks move 5 to 15 s after it died.
NODE_GRACE_SECONDS = 15.0


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


def is_member(pod: Obj, lost: Collection[str] = ()) -> bool:
    """Running, its container started and running, not being deleted, with an IP, on a
    node that is not in ``lost`` (:func:`lost_nodes`)."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return _runs(pod, lost)


def is_leaving(pod: Obj, lost: Collection[str] = ()) -> bool:
    """Being deleted (scaled away, evicted, drained, deleted) while its container still
    runs: a member that hands its tasks over before it exits (its grace period)."""
    return bool(pod.get("metadata", {}).get("deletionTimestamp")) and _runs(pod, lost)


def _runs(pod: Obj, lost: Collection[str]) -> bool:
    if lost and pod.get("spec", {}).get("nodeName") in lost:
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
    pods: Iterable[Obj],
    node_labels: Mapping[str, Mapping[str, str]],
    zone_key: str,
    lost: Collection[str] = (),
    *,
    leaving: bool = False,
) -> list[Member]:
    """The member pods, each with its node's zone and its query address; with ``leaving``
    also the pods being deleted whose container still runs (:func:`is_leaving`)."""
    found = []
    for pod in pods:
        if not (is_member(pod, lost) or (leaving and is_leaving(pod, lost))):
            continue
        node = pod.get("spec", {}).get("nodeName")
        zone = node_labels.get(node, {}).get(zone_key) if node else None
        address = f"{pod['status']['podIP']}:{names.QUERY_PORT}"
        found.append(Member(pod["metadata"]["name"], zone=zone, address=address))
    return sorted(found)


def _seconds_since(stamp: Any, now: datetime.datetime) -> float | None:
    """Seconds from an API timestamp (RFC 3339, with or without microseconds) to ``now``;
    None when there is none or it cannot be read."""
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        then = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.UTC)
    return (now - then).total_seconds()


def parse_now(now: str) -> datetime.datetime:
    """The cycle's ``now`` (RFC 3339) as an aware datetime."""
    parsed = datetime.datetime.fromisoformat(now.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def lost_nodes(
    nodes: Iterable[Obj], leases: Iterable[Obj], *, now: str, grace: float
) -> dict[str, str]:
    """The lost nodes, each with why: its Lease unrenewed for more than ``grace`` seconds,
    or its Ready condition other than True for that long. A node with no Lease and no
    Ready condition is not judged (nothing says it is gone). The reasons hold timestamps,
    not ages, so that status does not change every cycle while a node stays lost."""
    at = parse_now(now)
    lost: dict[str, str] = {}
    for lease in leases:
        name = lease.get("metadata", {}).get("name")
        renewed = (lease.get("spec") or {}).get("renewTime")
        age = _seconds_since(renewed, at)
        if name and age is not None and age > grace:
            lost[name] = f"its Lease was last renewed at {renewed}, over {grace:g} s ago"
    for node in nodes:
        name = node.get("metadata", {}).get("name")
        if not name or name in lost:
            continue
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") != "Ready" or condition.get("status") == "True":
                continue
            since = condition.get("lastTransitionTime")
            age = _seconds_since(since, at)
            if age is not None and age > grace:
                lost[name] = (
                    f"its Ready condition has been {condition.get('status')} since {since}, "
                    f"over {grace:g} s"
                )
    return lost


def next_node_check(
    member_nodes: Iterable[str], leases: Iterable[Obj], *, now: str, grace: float
) -> float | None:
    """Seconds until the first Lease of a node in ``member_nodes`` would pass its grace if
    it is not renewed: a cycle then notices a dead node even when nothing else wakes it (a
    dead node sends no pod event). None when no such Lease is known."""
    wanted = set(member_nodes)
    at = parse_now(now)
    ages = [
        _seconds_since((lease.get("spec") or {}).get("renewTime"), at)
        for lease in leases
        if lease.get("metadata", {}).get("name") in wanted
    ]
    known = [age for age in ages if age is not None and age <= grace]
    if not known:
        return None
    return max(0.0, grace - max(known))


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


def assignment_from_reports(
    reports: Mapping[str, MemberReport], layout: TaskLayout
) -> Assignment | None:
    """Where the members' stores are, as an assignment of the stateful tasks: each member's
    active (or restoring) store partitions as its active tasks, its standby copies as its
    standbys. The seed of a sticky assignment when the published one is gone (a deleted
    membership ConfigMap): tasks stay where their state is. A task two members claim
    active goes to the first by name; None when no member reports a store of ``layout``."""
    active: dict[str, set[TaskId]] = {}
    standby: dict[str, set[TaskId]] = {}
    owner: dict[TaskId, str] = {}
    for member in sorted(reports):
        report = reports[member]
        if report.topology_hash != layout.topology_hash:
            continue
        for store, partitions in report.stores.items():
            subtopology = report.store_owners.get(store)
            if subtopology is None:
                continue
            for partition, copy in partitions.items():
                task = TaskId(subtopology, partition)
                if task not in layout.tasks:
                    continue
                if copy.role is StoreRole.STANDBY:
                    standby.setdefault(member, set()).add(task)
                elif owner.setdefault(task, member) == member:
                    active.setdefault(member, set()).add(task)
    if not owner:
        return None
    return Assignment(
        active={m: frozenset(tasks) for m, tasks in active.items()},
        standby={
            m: frozenset(t for t in tasks if t in owner and owner[t] != m)
            for m, tasks in standby.items()
        },
    )


def next_membership(
    previous: Membership | None,
    current_members: list[Member],
    layout: TaskLayout | None,
    num_standby_replicas: int,
    *,
    last_generation: int | None = None,
    reports: Mapping[str, MemberReport] | None = None,
    warmups: WarmupPolicy | None = None,
    leaving: Collection[str] = (),
) -> Membership | None:
    """The membership to publish, or None when ``previous`` still holds (or none can be
    computed yet: no member, or no layout reported).

    With no member left, the previous assignment stays published: pods that come back
    resume from it (as the local group does). With no previous membership (a deleted
    ConfigMap), the generation continues from ``last_generation`` (status
    membershipGeneration) instead of starting again at 1, and the assignment stays sticky:
    it is seeded from where the members' ``reports`` say their stores are. With ``warmups``
    (:func:`warmup_policy`) a stateful task moves only to a caught-up copy, and ``leaving``
    members (:func:`leaving_members`) hand theirs over before they go."""
    if layout is None or not current_members:
        return None
    keep = previous.assignment if previous is not None else None
    if keep is not None and keep.tasks != layout.tasks:
        keep = None  # the topology or partition count changed: assign afresh
    if (previous is None or not previous.assignment.tasks) and reports:
        # Nothing to stay with (a deleted ConfigMap, nobody left after node loss, or an
        # upgrade's reset, which lists members but no task): start from where the members'
        # stores are.
        keep = assignment_from_reports(reports, layout)
    assignment = assign(
        layout.tasks,
        current_members,
        num_standby_replicas,
        previous=keep,
        stateful=layout.stateful,
        warmups=warmups,
        leaving=leaving,
    )
    if previous is not None and assignment == previous.assignment:
        return None
    base = previous.generation if previous is not None else (last_generation or 0)
    generation = base + 1
    return Membership(generation, assignment)


def leaving_members(
    pods: Iterable[Obj],
    reports: Mapping[str, MemberReport],
    *,
    removing: Collection[str] = (),
    lost: Collection[str] = (),
) -> frozenset[str]:
    """The members on their way out: pods being deleted (:func:`is_leaving`), pods that say
    so in their report (SIGTERM without a delete), and ``removing`` (pods a scale-in takes
    away, :mod:`.scale_in`). They get nothing new and hand their tasks over."""
    going = set(removing)
    for pod in pods:
        name = pod.get("metadata", {}).get("name")
        report = reports.get(name) if name else None
        if is_leaving(pod, lost) or (report is not None and report.leaving):
            going.add(str(name))
    return frozenset(going)


def nobody_takes_over(previous: Membership | None, pods: Iterable[Obj]) -> Membership | None:
    """While the membership is held (a topology upgrade stops every pod), deleted pods would
    wait their grace period for a hand-over that never comes: the previous assignment with
    every member leaving tells them to commit and exit now (``Assignment.handed_over``).
    None when no pod of it is being deleted or it says so already, or it hands out no task
    (an upgrade's reset: a pod given nothing may exit at once)."""
    if previous is None or not previous.assignment.tasks:
        return None
    assignment = previous.assignment
    named = set(assignment.active)
    deleting = {
        p["metadata"]["name"]
        for p in pods
        if p.get("metadata", {}).get("deletionTimestamp") and p["metadata"].get("name") in named
    }
    if not deleting or assignment.leaving >= named:
        return None
    return Membership(
        previous.generation + 1, dataclasses.replace(assignment, leaving=frozenset(named))
    )


def without_lost(previous: Membership | None, lost_pods: Collection[str]) -> Membership | None:
    """When every member is gone because its node is lost, the membership to publish: nobody,
    rather than the previous assignment naming pods that no longer run anywhere (queries were
    routed to them, and a status reader took them for members). None when nobody was lost,
    or the previous one names none of them. Pods that come back are assigned from their
    reports (``next_membership`` seeds from them when the previous names nobody)."""
    if previous is None or not lost_pods or not set(previous.assignment.active) & set(lost_pods):
        return None
    return Membership(previous.generation + 1, Assignment(active={}, standby={}))


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
    return reported_warmup_policy(
        {m.id: reports[m.id] for m in current if m.id in reports},
        acceptable_recovery_lag=config.acceptable_recovery_lag,
        max_warmup_replicas=config.max_warmup_replicas,
    )
