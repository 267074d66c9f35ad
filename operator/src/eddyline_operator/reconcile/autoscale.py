"""Lag-driven autoscaling as a pure decision: :func:`decide`.

Input: ``spec.autoscaling``, the replicas the app runs now, the tasks it can use, a window
of metric samples per pod (what each pod's ``GET /metrics`` said: ``process-ratio``,
``process-rate``, per-partition ``records-lag``), the recommendations of earlier cycles and
since when the app has been settled. Output: the replicas to set and why, with the figures.

As the HorizontalPodAutoscaler computes it:

* each target gives a recommendation, ``ceil(current * value / target)``: the pods' mean
  busy share against ``targetProcessRatio``, the total input lag against
  ``maxLagRecords``, the lag in seconds (lag / process rate) against ``maxLagSeconds``;
  within ``TOLERANCE`` of a target it asks for the current count; the largest wins;
* clamped to ``[minReplicas, min(maxReplicas, tasks)]`` (a pod beyond the app's tasks
  would get none; ``minReplicas`` wins over that bound, as the user's floor), never 0;
* stabilized over the recommendation history: up to the lowest recommendation of the
  last ``scaleUpStabilizationSeconds``, down to the highest of the last
  ``scaleDownStabilizationSeconds``, so a load that comes and goes within the windows
  moves nothing (no flapping);
* no decision while the pods are not all reporting, or while the previous step has not
  settled (every pod ready, a member, no warm-up pending) for a whole metric window
  (``METRIC_WINDOW_SECONDS``): metrics from a moving app, and the lag its moved tasks
  gathered while moving, say little about the next size.

``process-ratio`` is a windowed rate in the pods (Kafka's two samples of 30 s), so after a
step it still counts busy time from before it: the busy share is read only from samples
taken ``RATIO_SETTLE_SECONDS`` after the app settled (lag is instantaneous and is read at
once). Without a usable figure the cycle decides nothing and records nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eddyline_operator.reconcile.membership import is_member, is_ready
from eddyline_runtime.membership import MemberReport, Membership
from eddyline_runtime.metrics import DEFAULT_SAMPLE_SECONDS, DEFAULT_SAMPLES
from eddyline_runtime.spec import AutoscalingSpec

Obj = dict[str, Any]

# spec.replicas' maximum: no recommendation goes above it.
_MOST_REPLICAS = 1000
# HPA's default tolerance: a figure within 10 % of its target asks for no change.
TOLERANCE = 0.1
# Samples older than this are not used (a few scrapes' worth: one slow scrape is smoothed).
METRIC_WINDOW_SECONDS = 15.0
# The pods' process-ratio covers up to this long (metrics.sample.window.ms x num.samples).
RATIO_SETTLE_SECONDS = DEFAULT_SAMPLE_SECONDS * DEFAULT_SAMPLES

# The Prometheus families the pods export (query/prometheus.py names them after Kafka's
# group and name).
RATIO_FAMILY = "eddyline_stream_thread_metrics_process_ratio"
RATE_FAMILY = "eddyline_stream_thread_metrics_process_rate"
LAG_FAMILY = "eddyline_consumer_fetch_manager_metrics_records_lag"


@dataclass(frozen=True)
class PodSample:
    """One scrape of one pod."""

    time: float  # the operator's monotonic clock, seconds
    process_ratio: float  # the mean busy share of the pod's stream threads, 0 to 1
    process_rate: float  # records/s, summed over the pod's threads
    records_lag: Mapping[str, float] = field(default_factory=dict)  # "topic/partition" -> lag


@dataclass(frozen=True)
class Recommendation:
    time: float
    replicas: int


@dataclass(frozen=True)
class AutoscaleInput:
    spec: AutoscalingSpec
    current: int  # spec.replicas
    tasks: int  # the tasks the app's topology has (0: not known yet)
    samples: Mapping[str, Sequence[PodSample]]  # by pod name
    history: Sequence[Recommendation]
    now: float
    settled_since: float | None  # None: the previous step has not settled (see settled())
    unsettled_reason: str = ""


@dataclass(frozen=True)
class Outcome:
    desired: int  # == current: no change
    reason: str
    recommendation: Recommendation | None = None  # to add to the history (None: waiting)

    def scales(self, current: int) -> bool:
        return self.desired != current


def upper_bound(spec: AutoscalingSpec, tasks: int) -> int:
    """The most replicas the autoscaler sets: maxReplicas, and no more than the tasks (when
    known), but never below minReplicas."""
    bound = spec.max_replicas if tasks <= 0 else min(spec.max_replicas, tasks)
    return max(spec.min_replicas, bound)


def decide(given: AutoscaleInput) -> Outcome:
    """The replicas to run and why (see the module docstring)."""
    spec, current = given.spec, given.current
    low, high = spec.min_replicas, upper_bound(spec, given.tasks)
    bounds = _bounds_text(spec, given.tasks)
    if current < low or current > high:
        # Out of bounds (someone scaled by hand, or the bounds changed): back within them
        # at once, as HPA does, whatever the metrics say.
        desired = min(max(current, low), high)
        return Outcome(desired, f"{current} replicas is outside {bounds}: set to {desired}")
    if given.settled_since is None:
        return Outcome(current, f"waiting: {given.unsettled_reason or 'not settled'}")
    settled_for = given.now - given.settled_since
    if settled_for < METRIC_WINDOW_SECONDS:
        # A step moves tasks: the lag they gathered while moving drains in the first moments
        # after it settles, and must not read as load (it scaled out again right after a
        # scale in on the real control plane). Decide on a whole window after the step.
        return Outcome(
            current,
            f"waiting: settled {settled_for:.0f} s ago; deciding on a whole "
            f"{METRIC_WINDOW_SECONDS:.0f} s metric window after the step",
        )
    since = max(given.now - METRIC_WINDOW_SECONDS, given.settled_since)
    recent = {
        pod: [s for s in samples if since <= s.time <= given.now]
        for pod, samples in given.samples.items()
    }
    recent = {pod: samples for pod, samples in recent.items() if samples}
    if len(recent) < current:
        return Outcome(
            current, f"waiting: {len(recent)} of {current} pods reported metrics since settling"
        )
    figures, recommendations, complete = _recommendations(given, recent)
    if not recommendations:
        return Outcome(current, "waiting: " + "; ".join(figures))
    raw = max(recommendations)
    if not complete and raw < current:
        # A target whose figure is not known yet may still want these pods: scale in only
        # on every figure (scaling out on lag alone is safe).
        raw = current
        figures.append(f"no scale in until every target's figure is known: holding {current}")
    clamped = min(max(raw, low), high)
    recommendation = Recommendation(given.now, clamped)
    desired = stabilize(spec, current, recommendation, given.history)
    text = "; ".join(figures)
    if clamped != raw:
        text += f"; clamped to {clamped} by {bounds}"
    if desired != clamped:
        window = (
            spec.scale_up_stabilization_seconds
            if clamped > current
            else spec.scale_down_stabilization_seconds
        )
        text += (
            f"; held at {desired} by the {'up' if clamped > current else 'down'} "
            f"stabilization window ({window} s)"
        )
    return Outcome(desired, text, recommendation)


def stabilize(
    spec: AutoscalingSpec,
    current: int,
    recommendation: Recommendation,
    history: Sequence[Recommendation],
) -> int:
    """HPA's behaviour: up only to the lowest recommendation of the up window, down only to
    the highest of the down window (the new one included in both)."""
    up_since = recommendation.time - spec.scale_up_stabilization_seconds
    down_since = recommendation.time - spec.scale_down_stabilization_seconds
    up = down = recommendation.replicas
    for earlier in history:
        if earlier.time > up_since:
            up = min(up, earlier.replicas)
        if earlier.time > down_since:
            down = max(down, earlier.replicas)
    return min(max(current, up), down)


def prune(
    spec: AutoscalingSpec, history: Sequence[Recommendation], now: float
) -> list[Recommendation]:
    """The recommendations a later decision may still read."""
    keep = max(spec.scale_up_stabilization_seconds, spec.scale_down_stabilization_seconds)
    return [r for r in history if r.time > now - keep]


def _recommendations(
    given: AutoscaleInput, recent: Mapping[str, Sequence[PodSample]]
) -> tuple[list[str], list[int], bool]:
    """The figures (words), each target's recommendation (a target whose figure is not known
    yet gives none) and whether every target gave one."""
    spec, current = given.spec, given.current
    figures: list[str] = []
    found: list[int] = []
    if spec.target_process_ratio is not None:
        ready_at = (given.settled_since or 0.0) + RATIO_SETTLE_SECONDS
        ratios = [
            _mean([s.process_ratio for s in samples if s.time >= ready_at])
            for samples in recent.values()
        ]
        known = [r for r in ratios if r is not None]
        if len(known) < current:
            left = max(0.0, ready_at - given.now)
            figures.append(
                f"process-ratio not used for {left:.0f} s more (the pods' metric window "
                f"still covers time before the last step)"
            )
        else:
            ratio = sum(known) / len(known)
            wanted = _proportional(current, ratio, spec.target_process_ratio)
            found.append(wanted)
            figures.append(
                f"process-ratio {ratio:.3g} over {len(known)} pods "
                f"(target {spec.target_process_ratio:.3g}) asks for {wanted}"
            )
    lag = _total_lag(recent)
    if spec.max_lag_records is not None:
        wanted = _proportional(current, lag, spec.max_lag_records)
        found.append(wanted)
        figures.append(
            f"input lag {lag:.0f} records (max {spec.max_lag_records}) asks for {wanted}"
        )
    if spec.max_lag_seconds is not None:
        rate = sum(_mean([s.process_rate for s in samples]) or 0.0 for samples in recent.values())
        if rate > 0 or lag == 0:
            seconds = lag / rate if rate > 0 else 0.0
            wanted = _proportional(current, seconds, spec.max_lag_seconds)
            found.append(wanted)
            figures.append(
                f"input lag {seconds:.1f} s ({lag:.0f} records at {rate:.0f} records/s; "
                f"max {spec.max_lag_seconds:g} s) asks for {wanted}"
            )
        else:
            figures.append(f"lag in seconds unknown: {lag:.0f} records and no processing yet")
    targets = [spec.target_process_ratio, spec.max_lag_records, spec.max_lag_seconds]
    return figures, found, len(found) == sum(t is not None for t in targets)


def _proportional(current: int, value: float, target: float) -> int:
    """HPA's rule: ``ceil(current * value / target)``; the current count within the
    tolerance."""
    usage = value / target
    if abs(usage - 1.0) <= TOLERANCE:
        return current
    # The tiny epsilon keeps float noise (0.7 / 0.7 * 3 = 3.0000000000000004) from adding a pod.
    wanted = current * usage - 1e-9
    # A figure far above its target (a tiny rate) asks for the most there can be, not for
    # an integer too large to hold; the bounds clamp it anyway.
    return max(0, math.ceil(min(wanted, float(_MOST_REPLICAS))))


def _total_lag(recent: Mapping[str, Sequence[PodSample]]) -> float:
    """Per partition the mean lag over the window of the pod that reports it (the most, when
    a task moving between pods shows on two), summed."""
    per_partition: dict[str, float] = {}
    for samples in recent.values():
        partitions = {p for s in samples for p in s.records_lag}
        for partition in partitions:
            mean = _mean([s.records_lag[partition] for s in samples if partition in s.records_lag])
            if mean is not None:
                per_partition[partition] = max(per_partition.get(partition, 0.0), mean)
    return sum(per_partition.values())


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _bounds_text(spec: AutoscalingSpec, tasks: int) -> str:
    high = upper_bound(spec, tasks)
    why = "maxReplicas" if high == spec.max_replicas else f"the app's {tasks} tasks"
    if high == spec.min_replicas and high != spec.max_replicas and tasks < spec.min_replicas:
        why = "minReplicas"
    return f"[{spec.min_replicas} (minReplicas), {high} ({why})]"


def tasks_of(reports: Mapping[str, MemberReport]) -> int:
    """The tasks the app's topology has (what its pods report; 0 before any reports)."""
    tasks: set[Any] = set()
    for report in reports.values():
        tasks |= report.tasks
    return len(tasks)


def settled(current: int, pods: Sequence[Obj], membership: Membership | None) -> str | None:
    """None when the app runs ``current`` pods, every one ready and a member of the published
    membership with no warm-up pending; otherwise why not."""
    live = [p for p in pods if not p.get("metadata", {}).get("deletionTimestamp")]
    if len(pods) != current or len(live) != current:
        return f"{len(live)} pods running, {current} wanted"
    unready = sorted(p["metadata"]["name"] for p in live if not (is_member(p) and is_ready(p)))
    if unready:
        return f"{', '.join(unready)} not ready"
    if membership is None:
        return "no membership published yet"
    assigned = set(membership.assignment.active)
    missing = sorted(p["metadata"]["name"] for p in live if p["metadata"]["name"] not in assigned)
    if missing:
        return f"{', '.join(missing)} not in the membership yet"
    warming = sum(len(tasks) for tasks in membership.assignment.warmup.values())
    if warming:
        return f"{warming} warm-up replicas still catching up"
    return None


_SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str, time: float) -> PodSample:
    """A pod's ``GET /metrics`` (Prometheus text) as a sample: the mean process-ratio of its
    threads, their summed process-rate, and records-lag per input partition (-1, not
    fetched yet, left out). Raises ValueError when the text holds no process-ratio (not an
    eddyline pod's metrics)."""
    ratios: list[float] = []
    rate = 0.0
    lags: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = _SAMPLE_LINE.match(line)
        if found is None:
            continue
        family, _, labels_text, raw = found.groups()
        if family not in (RATIO_FAMILY, RATE_FAMILY, LAG_FAMILY):
            continue
        value = float(raw)
        if math.isnan(value):
            continue
        if family == RATIO_FAMILY:
            ratios.append(value)
        elif family == RATE_FAMILY:
            rate += value
        else:
            labels = dict(_LABEL.findall(labels_text or ""))
            if value >= 0 and "topic" in labels and "partition" in labels:
                key = f"{labels['topic']}/{labels['partition']}"
                lags[key] = lags.get(key, 0.0) + value
    if not ratios:
        raise ValueError(f"no {RATIO_FAMILY} in the metrics: not an eddyline pod's /metrics?")
    return PodSample(time, sum(ratios) / len(ratios), rate, lags)
