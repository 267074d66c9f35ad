"""The app's conditions per the Kubernetes API conventions, and the phase they add up to.

Conditions carry type, status, reason, message, lastTransitionTime and observedGeneration;
a condition's lastTransitionTime changes only when its status does. The phase is the
one-word summary ``kubectl get sapp`` prints.

This module is the only place conditions are built (as Strimzi's ``StatusUtils``): their
types are :class:`~eddyline_runtime.spec.ConditionType`; the parts that own a condition's
meaning (upgrade, restore Jobs, scale-in) hand over a :class:`~.seed.Seed`. What the
handlers write is :func:`compose_status`'s result: the plan's status, the autoscaler's, and
the children the API server refused, put together once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eddyline_operator.reconcile.events import Event
from eddyline_operator.reconcile.membership import is_member
from eddyline_operator.reconcile.seed import Seed
from eddyline_operator.reconcile.status import RolloutStep, crash_looping, crash_message
from eddyline_operator.reconcile.upgrade import Decision
from eddyline_runtime.errors import RECORD_FAILURE
from eddyline_runtime.membership import Membership
from eddyline_runtime.spec import (
    AutoscalingStatus,
    Condition,
    ConditionStatus,
    ConditionType,
    Phase,
    StreamApp,
    StreamAppStatus,
)

READY = ConditionType.READY
PROGRESSING = ConditionType.PROGRESSING
DEGRADED = ConditionType.DEGRADED
# Degraded's reason when a crashing pod's termination message is the runtime's line for a
# record that failed under log-and-fail: the fix is the record or the handler, not the pod.
RECORD_FAILED = "RecordFailed"

Obj = dict[str, Any]


class Conditions:
    """Makes this cycle's conditions from the previous ones (their transition times)."""

    def __init__(self, previous: Sequence[Condition], *, now: str, generation: int | None) -> None:
        self.previous = {c.type: c for c in previous}
        self.now = now
        self.generation = generation

    def make(self, type_: ConditionType, status: bool, reason: str, message: str) -> Condition:
        """A condition; it keeps the previous lastTransitionTime while its status is the same."""
        value = ConditionStatus.TRUE if status else ConditionStatus.FALSE
        before = self.previous.get(type_)
        changed_at = self.now
        if before is not None and before.status == value and before.last_transition_time:
            changed_at = before.last_transition_time
        return Condition(
            type=type_,
            status=value,
            reason=reason,
            message=message,
            lastTransitionTime=changed_at,
            observedGeneration=self.generation,
        )

    def seeded(self, seed: Seed) -> Condition:
        return self.make(seed.type, seed.status, seed.reason, seed.message)

    def is_true(self, type_: ConditionType) -> bool:
        """Whether the previous status held ``type_`` as True."""
        before = self.previous.get(type_)
        return before is not None and before.status == ConditionStatus.TRUE

    def changed(self, new: Condition) -> bool:
        """Whether ``new`` differs from the previous condition of its type in status or reason
        (what warrants an event)."""
        before = self.previous.get(new.type)
        return before is None or before.status != new.status or before.reason != new.reason


@dataclass(frozen=True)
class PodCounts:
    """The app's pods as the conditions see them."""

    live: Sequence[Obj]  # not terminating
    ready: int


@dataclass
class Summary:
    conditions: list[Condition]
    phase: Phase
    events: list[Event] = field(default_factory=list)


def summarize(
    conditions: Conditions,
    app: StreamApp,
    pods: PodCounts,
    *,
    desired_replicas: int,
    published: Membership | None,
    step: RolloutStep,
    off_node: Sequence[str],
    log_node: str | None,
    upgrade: Decision,
    set_aside: Sequence[str] = (),
    lost: Sequence[str] = (),
    members_left: int = 0,
    create_failure: str | None = None,
    scaling_in: Seed | None = None,
    restoring: Seed | None = None,
) -> Summary:
    """Ready, Progressing, Degraded and Upgrading (then ScalingIn, Restoring and Backfilling
    when seeded), and the phase they add up to; read top to bottom. ``lost`` says which pods
    left the membership because their node is lost, and ``members_left`` how many members
    are on live nodes; ``create_failure`` is the StatefulSet controller's FailedCreate message
    (pod_creation.py), which counts only while pods are missing."""
    live, ready_count = pods.live, pods.ready
    if len(live) >= desired_replicas:
        create_failure = None
    events: list[Event] = []
    members_now = {str(p["metadata"]["name"]) for p in live if is_member(p)}
    assigned = set(published.assignment.active) if published is not None else set()
    all_assigned = bool(members_now) and members_now <= assigned
    # A hand-over under way (a pod leaving, or gone without a newer generation yet): the
    # assignment the pods follow is not the settled one.
    handing_over = published is not None and bool(published.assignment.leaving)
    ready = (
        desired_replicas > 0
        and ready_count >= desired_replicas
        and len(live) == desired_replicas
        and all_assigned
        and not handing_over
    )
    counted = f"{ready_count}/{desired_replicas} pods ready"
    if app.spec.suspended:
        why = "spec.suspend is true" if app.spec.suspend else "spec.replicas is 0"
        ready_cond = conditions.make(READY, False, "Suspended", f"{why}: no pods run")
    elif ready:
        ready_cond = conditions.make(READY, True, "AllReplicasReady", counted)
    else:
        waiting = "" if all_assigned or not members_now else "; waiting for the pods' layout"
        if handing_over and published is not None:
            leaving = ", ".join(sorted(published.assignment.leaving))
            waiting += f"; {leaving} handing over"
        ready_cond = conditions.make(READY, False, "ReplicasNotReady", counted + waiting)
    if step.reason:
        progressing = conditions.make(PROGRESSING, True, step.reason, step.message)
    elif len(live) != desired_replicas:
        progressing = conditions.make(
            PROGRESSING, True, "Scaling", f"{len(live)} pods, {desired_replicas} wanted"
        )
    elif not ready and not app.spec.suspended:
        progressing = conditions.make(
            PROGRESSING, True, "Starting", "pods wait for an assignment or restore state"
        )
    else:
        progressing = conditions.make(PROGRESSING, False, "Complete", "every pod is current")
    looping = crash_looping(live)
    degraded = _degraded(
        conditions,
        looping,
        crash_messages={p["metadata"]["name"]: crash_message(p) for p in live},
        off_node=off_node,
        log_node=log_node,
        upgrade=upgrade,
        set_aside=set_aside,
        lost=lost,
        members_left=members_left,
        create_failure=create_failure,
        events=events,
    )
    if app.spec.suspended:
        phase = Phase.SUSPENDED
    elif looping or off_node or lost or create_failure:
        # Degraded, not Progressing: nothing will progress until the node or the pod is gone,
        # so the app is looked at on the settled beat (and when a Lease may expire).
        phase = Phase.DEGRADED
    elif ready and not step.reason:
        phase = Phase.RUNNING
    elif live or desired_replicas:
        phase = Phase.PROGRESSING
    else:
        phase = Phase.PENDING
    if upgrade.upgrading.status:
        phase = Phase.PROGRESSING
    elif upgrade.degraded is not None and phase is Phase.RUNNING:
        phase = Phase.DEGRADED
    made = [ready_cond, progressing, degraded, conditions.seeded(upgrade.upgrading)]
    made.extend(_seeded(conditions, events, scaling_in, restoring))
    if upgrade.backfilling is not None:  # an upgrade's backfill (upgrade.py posts its events)
        made.append(conditions.seeded(upgrade.backfilling))
    return Summary(made, phase, events)


def _seeded(
    conditions: Conditions, events: list[Event], scaling_in: Seed | None, restoring: Seed | None
) -> list[Condition]:
    """ScalingIn (an event when it changes) and Restoring (its Jobs post their own events)."""
    made = []
    if scaling_in is not None:
        scaling = conditions.seeded(scaling_in)
        made.append(scaling)
        if conditions.changed(scaling):
            events.append(Event("Normal", scaling.reason, scaling.message))
    if restoring is not None:
        made.append(conditions.seeded(restoring))
    return made


def _crash_text(looping: Sequence[str], messages: Mapping[str, str | None]) -> str:
    """Which pods crash and why, from their containers' termination messages; pods that
    stopped for the same reason are named together (a missing input topic stops them all)."""
    by_reason: dict[str, list[str]] = {}
    for pod in looping:
        by_reason.setdefault(messages.get(pod) or "", []).append(pod)
    known = [f"{', '.join(pods)}: {reason}" for reason, pods in by_reason.items() if reason]
    text = f"containers keep crashing in {', '.join(looping)}"
    if known:
        return f"{text}; {'; '.join(known)}"
    return f"{text}; see their logs"


def _degraded(
    conditions: Conditions,
    looping: Sequence[str],
    *,
    crash_messages: Mapping[str, str | None],
    off_node: Sequence[str],
    log_node: str | None,
    upgrade: Decision,
    set_aside: Sequence[str],
    events: list[Event],
    lost: Sequence[str] = (),
    members_left: int = 0,
    create_failure: str | None = None,
) -> Condition:
    """Degraded: the first of the log shared across nodes, crash loops, pods the StatefulSet
    controller cannot create, pods on lost nodes, a failed upgrade, stores a pod rebuilt
    because their changelog no longer fitted them."""
    if off_node:
        degraded = conditions.make(
            DEGRADED,
            True,
            "LogSharedAcrossNodes",
            f"pods {', '.join(off_node)} run off the log's node {log_node or '?'}: the "
            "embedded sqlite log cannot be shared across nodes (use a kafka:// log to spread "
            "pods)",
        )
    elif looping:
        record_failed = any(RECORD_FAILURE.search(crash_messages.get(pod) or "") for pod in looping)
        reason = RECORD_FAILED if record_failed else "CrashLoopBackOff"
        degraded = conditions.make(DEGRADED, True, reason, _crash_text(looping, crash_messages))
        if conditions.changed(degraded):
            events.append(Event("Warning", reason, degraded.message))
    elif create_failure is not None:
        degraded = conditions.make(
            DEGRADED,
            True,
            "PodCreateFailed",
            f"the StatefulSet controller cannot create pods: {create_failure}",
        )
        if conditions.changed(degraded):
            events.append(Event("Warning", "PodCreateFailed", degraded.message))
    elif lost:
        # The plan posts the NodeLost warning itself (once per pod and node).
        where = (
            "their tasks run on the other pods"
            if members_left
            else "no pod is left to run their tasks: they wait until pods are rescheduled "
            "or the nodes return"
        )
        degraded = conditions.make(
            DEGRADED,
            True,
            "NodeLost",
            f"pods on lost nodes left the membership: {'; '.join(lost)}; {where}",
        )
    elif upgrade.degraded is not None:
        degraded = conditions.seeded(upgrade.degraded)
        if conditions.changed(degraded):
            events.append(Event("Warning", degraded.reason, degraded.message))
    elif set_aside:
        # The pods run on, but state was lost from the changelog: an operator must look
        # (the old copies are kept; docs/state.md says how to write one back).
        degraded = conditions.make(
            DEGRADED,
            True,
            "StateRebuilt",
            "stores were rebuilt from changelogs that no longer held what they applied; the "
            f"old copies are kept at {'; '.join(set_aside)} (eddyline state republish writes "
            "one back, see docs/state.md)",
        )
        if conditions.changed(degraded):
            events.append(Event("Warning", "StateRebuilt", degraded.message))
    else:
        degraded = conditions.make(DEGRADED, False, "AsExpected", "")
    return degraded


def paused_condition(conditions: Conditions, message: str) -> Condition:
    """Paused, True: reconciliation is paused (``eddyline.dev/pause-reconciliation``)."""
    return conditions.make(ConditionType.PAUSED, True, "ReconciliationPaused", message)


def invalid_spec(conditions: Conditions, problem: str) -> list[Condition]:
    """Ready, Progressing and Degraded for a spec the model refuses (reason InvalidSpec)."""
    return [
        conditions.make(READY, False, "InvalidSpec", "the spec is invalid; see Degraded"),
        conditions.make(PROGRESSING, False, "InvalidSpec", "nothing rolls out until fixed"),
        conditions.make(DEGRADED, True, "InvalidSpec", problem),
    ]


def compose_status(
    status: StreamAppStatus,
    *,
    autoscaling: AutoscalingStatus | None,
    refusals: Sequence[tuple[str, str]] = (),
    previous: Sequence[Condition] = (),
    now: str,
) -> tuple[StreamAppStatus, Event | None]:
    """The status to write: the plan's ``status`` with the autoscaler's ``autoscaling`` and
    Degraded for children that could not be applied. ``refusals`` are (reason, message),
    reason ``NameConflict`` (an object of that name is not this app's) or ``ApplyFailed``
    (the API server refused it); ``previous`` are the conditions status held (their
    transition times). With refusals the phase becomes Degraded (Suspended stays: what is
    wrong is then said by the condition alone); the event is returned when the condition
    is new or its reason or message changed."""
    status = status.model_copy(update={"autoscaling": autoscaling})
    if not refusals:
        return status, None
    conditions = Conditions(previous, now=now, generation=status.observed_generation)
    reason = refusals[0][0]
    message = "; ".join(text for _, text in refusals)
    degraded = conditions.make(DEGRADED, True, reason, message)
    before = conditions.previous.get(DEGRADED)
    changed = conditions.changed(degraded) or (before is not None and before.message != message)
    replaced = [degraded if c.type == DEGRADED else c for c in status.conditions]
    if degraded not in replaced:
        replaced.append(degraded)
    phase = status.phase if status.phase is Phase.SUSPENDED else Phase.DEGRADED
    updated = status.model_copy(update={"conditions": replaced, "phase": phase})
    return updated, Event("Warning", reason, message) if changed else None
