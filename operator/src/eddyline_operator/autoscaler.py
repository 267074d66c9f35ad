"""The autoscaler's loop (``spec.autoscaling``), in the shape of Flink's autoscaler: a
:class:`MetricCollector` scrapes the member pods' ``/metrics`` into a :class:`SampleStore`
(samples, the recommendations the stabilization windows read, the settle clock), the pure
:func:`~.reconcile.autoscale.decide` says what the app needs, and a :class:`ScalingRealizer`
carries a decision out through the scale subresource. :func:`autoscale` runs one round for a
cycle and returns the ``AutoscalingStatus`` the status is composed with
(:func:`~.reconcile.conditions.compose_status`); the handlers only call it.

Nothing is decided while reconciliation is paused, the spec is invalid (the plan has no
app: status keeps what it said), the app is suspended or mid-upgrade (the settle clock
stops), or the membership is changing.

The memory is in the operator's process only: a restarted operator waits one settle and
one metric window again before it decides anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eddyline_operator import metrics
from eddyline_operator.client import ApiError, Kube, fetch_metrics
from eddyline_operator.reconcile import autoscale, names
from eddyline_operator.reconcile.plan import Plan
from eddyline_operator.reconcile.status_record import read_status
from eddyline_runtime.membership import MemberReport, Membership
from eddyline_runtime.spec import AutoscalingStatus, ScalingDecision

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
# Posts an event about the app: (type, reason, message).
Post = Callable[[str, str, str], None]

# The pods' /metrics are read at most this often (on the daemon's cycles, which ask for
# reports anyway).
SCRAPE_SECONDS = 2.0
# Samples kept per pod (the decision reads METRIC_WINDOW_SECONDS of them).
MAX_SAMPLES = 32
# The autoscaler's clock (a test moves it on).
_clock = time.monotonic


@dataclass
class SampleStore:
    """The autoscaler's memory of one app: the pods' metric samples, the recommendations the
    stabilization windows read, and since when the app is settled."""

    samples: dict[str, list[autoscale.PodSample]] = field(default_factory=dict)
    history: list[autoscale.Recommendation] = field(default_factory=list)
    settled_since: float | None = None
    scraped_at: float = float("-inf")

    def forget(self) -> None:
        """Autoscaling was removed from the spec: a later policy starts afresh."""
        self.samples, self.history = {}, []
        self.settled_since, self.scraped_at = None, float("-inf")

    def settle(self, why: str | None, clock: float) -> None:
        """The settle clock: stopped while ``why`` says what is moving, started otherwise."""
        if why is not None:
            self.settled_since = None
        elif self.settled_since is None:
            self.settled_since = clock

    def add(self, pod: str, sample: autoscale.PodSample) -> None:
        self.samples[pod] = [*self.samples.get(pod, []), sample][-MAX_SAMPLES:]

    def keep_only(self, pods: set[str]) -> None:
        """Samples of pods no longer members are dropped (their pods are gone)."""
        self.samples = {pod: s for pod, s in self.samples.items() if pod in pods}

    def remember(self, spec: Any, recommendation: autoscale.Recommendation, clock: float) -> None:
        self.history = autoscale.prune(spec, [*self.history, recommendation], clock)


@dataclass(frozen=True)
class MetricCollector:
    """Reads the member pods' ``/metrics`` into the store, at most every SCRAPE_SECONDS."""

    app: str  # namespace/name, for the log

    def collect(self, store: SampleStore, members: Sequence[Obj], clock: float) -> None:
        if clock - store.scraped_at < SCRAPE_SECONDS:
            return
        store.scraped_at = clock
        for pod, text in fetch_metrics(members, names.QUERY_PORT).items():
            try:
                sample = autoscale.parse_metrics(text, clock)
            except ValueError as error:
                logger.debug("StreamApp %s: %s: %s", self.app, pod, error)
                continue
            store.add(pod, sample)
        store.keep_only({p["metadata"]["name"] for p in members})


@dataclass(frozen=True)
class ScalingRealizer:
    """The one place a scaling decision is carried out: spec.replicas through the scale
    subresource (what `kubectl scale` and an HPA write), an event, a log line, the
    operator's decision counter."""

    kube: Kube
    namespace: str
    name: str
    post: Post

    def realize(self, decision: ScalingDecision) -> bool:
        """False when the API server refused it (a Warning event says why; the next cycle
        decides again)."""
        namespace, name = self.namespace, self.name
        patch = {"spec": {"replicas": decision.to_replicas}}
        try:
            self.kube.merge_patch("StreamApp", namespace, name, patch, sub="scale")
        except ApiError as error:
            if not 400 <= error.status < 500:
                raise
            message = (
                f"{decision.from_replicas} -> {decision.to_replicas} replicas refused: {error}; "
                "the operator needs patch on streamapps/scale (the chart's role grants it)"
            )
            logger.warning("StreamApp %s/%s: %s", namespace, name, message)
            self.post("Warning", "ScaleFailed", message)
            return False
        out = decision.to_replicas > decision.from_replicas
        message = f"{decision.from_replicas} -> {decision.to_replicas} replicas: {decision.reason}"
        logger.info("StreamApp %s/%s: %s", namespace, name, message)
        self.post("Normal", "ScaledOut" if out else "ScaledIn", message)
        metrics.record_scaling_decision(namespace, name, "up" if out else "down")
        return True


@dataclass(frozen=True)
class Observed:
    """What the cycle saw that the autoscaler reads."""

    body: Obj  # the StreamApp as read this cycle (its status: the autoscaling kept)
    pods: Sequence[Obj]
    members: Sequence[Obj]  # the pods asked for reports (not on a lost node)
    membership: Membership | None  # as published
    reports: Mapping[str, MemberReport]
    scrape: bool  # a cycle that asks the pods (the daemon's), not a pod event's
    now: str  # the cycle's time (a decision's)


def autoscale_app(
    store: SampleStore, realizer: ScalingRealizer, result: Plan, observed: Observed
) -> AutoscalingStatus | None:
    """One round: the status.autoscaling to write with ``result``'s status."""
    app = result.app
    if app is None:  # paused, or an invalid spec: status keeps what it said
        return result.status.autoscaling
    spec = app.spec.autoscaling
    if spec is None:  # autoscaling removed: forget it
        store.forget()
        return None
    kept = read_status(observed.body.get("status"))[0].autoscaling or AutoscalingStatus()
    current = app.spec.replicas
    if app.spec.suspended or result.status.upgrade is not None:
        store.settled_since = None
        return kept.model_copy(update={"current_replicas": current})
    clock = _clock()
    why = (
        "the membership is changing"
        if result.membership is not None
        else autoscale.settled(current, observed.pods, observed.membership)
    )
    store.settle(why, clock)
    if observed.scrape:
        MetricCollector(f"{realizer.namespace}/{realizer.name}").collect(
            store, observed.members, clock
        )
    outcome = autoscale.decide(
        autoscale.AutoscaleInput(
            spec=spec,
            current=current,
            tasks=autoscale.tasks_of(observed.reports),
            samples=store.samples,
            history=store.history,
            now=clock,
            settled_since=store.settled_since,
            unsettled_reason=why or "",
        )
    )
    if outcome.recommendation is not None:
        store.remember(spec, outcome.recommendation, clock)
    status = kept.model_copy(
        update={"current_replicas": current, "desired_replicas": outcome.desired}
    )
    if not outcome.scales(current):
        return status
    decision = ScalingDecision(
        time=observed.now, fromReplicas=current, toReplicas=outcome.desired, reason=outcome.reason
    )
    if not realizer.realize(decision):
        return status
    store.settled_since = None  # the step starts: nothing more until it settles
    return status.model_copy(update={"last_decision": decision})
