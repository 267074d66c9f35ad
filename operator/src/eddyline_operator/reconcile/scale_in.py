"""Scaling in one pod at a time: the StatefulSet's replicas while ``spec.replicas`` drops.

A StatefulSet scaled from 3 to 1 deletes two pods at once, and a PodDisruptionBudget does
not limit a StatefulSet's own scale-down. So the operator never renders the lower count
at once: every pod at an ordinal >= ``spec.replicas`` is *leaving* from the first cycle
(it gets nothing new and hands its active tasks to caught-up copies), and the StatefulSet
loses its highest pod only once that pod's hand-over is done: the published membership
gives it no active task, and no staying member still restores a copy it took over. Then
the next one, once the previous has terminated. Whoever lowered ``spec.replicas``
(``kubectl scale``, the scale subresource, an autoscaler) gets the same.

Suspending (``spec.suspend``, ``replicas: 0``) is not a scale-in: every pod stops at once
(nobody could take a task over).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eddyline_operator.reconcile.seed import Seed
from eddyline_operator.reconcile.status import is_deleting, ordinal
from eddyline_runtime.membership import MemberReport, Membership, StoreRole
from eddyline_runtime.spec import ConditionType

Obj = dict[str, Any]


@dataclass(frozen=True)
class ScaleIn:
    """What a cycle does about pods above ``spec.replicas``."""

    # The StatefulSet's replicas to render this cycle.
    replicas: int
    # Pods a scale-in takes away: leaving members (membership.leaving_members).
    removing: frozenset[str] = frozenset()
    # The pod whose removal is next (or under way), and what it waits for; None: no scale-in.
    draining: str | None = None
    message: str = ""
    # True when this cycle lowers the StatefulSet by one (an event says so).
    lowered: bool = False

    @property
    def active(self) -> bool:
        return self.draining is not None

    def seed(self, desired: int, *, shown: bool) -> Seed | None:
        """The ScalingIn condition: True while a scale-in lasts, False once it is done; none
        when status did not show one (``shown``) and none is under way."""
        if self.active:
            return Seed(ConditionType.SCALING_IN, True, "DrainingPod", self.message)
        if not shown:
            return None
        done = f"scaled in to {desired} pods: every pod removed had handed its tasks over"
        return Seed(ConditionType.SCALING_IN, False, "ScaleInDone", done)


def plan_scale_in(
    desired: int,
    pods: Sequence[Obj],
    published: Membership | None,
    reports: Mapping[str, MemberReport],
) -> ScaleIn:
    """The StatefulSet's replicas for ``desired`` pods, given the app's ``pods`` (by ordinal,
    those being deleted included), the membership the pods follow and their reports."""
    if desired <= 0:
        return ScaleIn(0)
    live = {ordinal(p): p["metadata"]["name"] for p in pods if not is_deleting(p)}
    above = sorted(o for o in live if o >= desired)
    if not above:
        return ScaleIn(desired)
    removing = frozenset(live[o] for o in above)
    top = above[-1]
    pod = live[top]
    keep = top + 1
    terminating = sorted(
        p["metadata"]["name"] for p in pods if is_deleting(p) and ordinal(p) >= desired
    )
    if terminating:
        # One at a time: the previous one has not exited yet (its final commit).
        waiting = f"{', '.join(terminating)} still terminating"
        return ScaleIn(keep, removing, pod, _message(desired, keep, pod, waiting))
    why = hand_over_pending(pod, published, reports, staying=set(live.values()) - removing)
    if why is not None:
        return ScaleIn(keep, removing, pod, _message(desired, keep, pod, why))
    return ScaleIn(
        top,
        removing,
        pod,
        _message(desired, keep, pod, f"its tasks are handed over: removing {pod}"),
        lowered=True,
    )


def hand_over_pending(
    pod: str,
    published: Membership | None,
    reports: Mapping[str, MemberReport],
    *,
    staying: Collection[str],
) -> str | None:
    """Why ``pod`` cannot go yet (None: it can): it still runs an active task in the
    membership the pods follow, or a staying member still restores a copy it took over (a
    report of RESTORING or RESTORE_PENDING)."""
    if published is not None:
        held = published.assignment.active.get(pod, frozenset())
        if held:
            return (
                f"{pod} still runs {len(held)} active task(s) until caught-up copies take "
                "them over (warm-ups: max.warmup.replicas at a time)"
            )
    restoring = sorted(
        member
        for member, report in reports.items()
        if member in staying
        and any(
            copy.role in (StoreRole.RESTORING, StoreRole.RESTORE_PENDING)
            for partitions in report.stores.values()
            for copy in partitions.values()
        )
    )
    if restoring:
        return f"{', '.join(restoring)} still restoring"
    return None


def _message(desired: int, replicas: int, pod: str, state: str) -> str:
    return f"scaling in to {desired} pods, one at a time ({replicas} now): draining {pod}; {state}"
