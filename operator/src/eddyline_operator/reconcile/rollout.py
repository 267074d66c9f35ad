"""Which pods a cycle restarts, and why: a topology upgrade's step, else the rolling restart
of outdated pods (:func:`~.status.rollout_step`); nothing while the app is suspended."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eddyline_operator.reconcile.events import Event
from eddyline_operator.reconcile.status import RolloutStep, rollout_step
from eddyline_operator.reconcile.upgrade import Decision
from eddyline_runtime.membership import MemberReport
from eddyline_runtime.spec import StreamApp

Obj = dict[str, Any]


@dataclass
class Rollout:
    step: RolloutStep  # what the Progressing condition says
    delete: list[str]  # pods to restart this cycle
    events: list[Event] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def plan_rollout(
    requested: StreamApp,
    app: StreamApp,
    pods: Sequence[Obj],
    *,
    template_hash: str,
    desired_replicas: int,
    reports: Mapping[str, MemberReport],
    upgrade: Decision,
) -> Rollout:
    """``requested`` is the spec as written, ``app`` what is rendered (the running topology
    or the upgrade step's)."""
    if upgrade.active:
        # The upgrade deletes the pods of its own step and posts its own events.
        step = RolloutStep(tuple(upgrade.delete_pods), "TopologyUpgrade", upgrade.upgrading.message)
        return Rollout(step, list(step.delete))
    spec = app.spec
    step = rollout_step(
        pods,
        template_hash=template_hash,
        revision=spec.topology.revision,
        desired_replicas=desired_replicas,
        reports=reports,
    )
    result = Rollout(step, [] if spec.suspended else list(step.delete))
    if requested.spec.topology != spec.topology:
        wanted, running = requested.spec.topology, spec.topology
        result.notes.append(
            f"spec.topology {wanted.ref}@{wanted.revision} is not running: "
            f"{running.ref}@{running.revision} runs"
        )
    result.events.extend(
        Event("Normal", step.reason, f"restarting pod {pod} ({step.message})")
        for pod in result.delete
    )
    return result
