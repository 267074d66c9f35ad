"""The autoscaler's decision (reconcile/autoscale.py): HPA's rule per target, the bounds,
the stabilization windows, waiting for settled pods, and the pods' metrics parsed."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline_operator.reconcile.autoscale import (
    RATIO_SETTLE_SECONDS,
    AutoscaleInput,
    PodSample,
    Recommendation,
    decide,
    parse_metrics,
    prune,
    settled,
    upper_bound,
)
from eddyline_runtime.assignor import Assignment
from eddyline_runtime.membership import Membership
from eddyline_runtime.metrics import MetricName
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.query.prometheus import render_prometheus
from eddyline_runtime.spec import AutoscalingSpec, ManifestError, parse_manifest

# Settled long enough ago that process-ratio is usable.
SETTLED = 0.0
NOW = SETTLED + RATIO_SETTLE_SECONDS + 30.0


def spec(**fields: object) -> AutoscalingSpec:
    return AutoscalingSpec.model_validate({"minReplicas": 1, "maxReplicas": 6, **fields})


def samples(
    pods: int, *, ratio: float = 0.5, rate: float = 1000.0, lag: float = 0.0, time: float = NOW
) -> dict[str, list[PodSample]]:
    """``pods`` pods reporting the same figures; ``lag`` is the app's total, spread evenly."""
    return {
        f"app-{i}": [PodSample(time, ratio, rate, {f"in/{i}": lag / pods})] for i in range(pods)
    }


def given_input(
    autoscaling: AutoscalingSpec,
    current: int,
    pods: dict[str, list[PodSample]],
    *,
    tasks: int = 12,
    history: tuple[Recommendation, ...] = (),
    now: float = NOW,
    settled_since: float | None = SETTLED,
) -> AutoscaleInput:
    return AutoscaleInput(autoscaling, current, tasks, pods, history, now, settled_since)


def test_the_busy_share_scales_as_hpa_computes_it() -> None:
    autoscaling = spec(targetProcessRatio=0.5)
    outcome = decide(given_input(autoscaling, 2, samples(2, ratio=0.9)))
    assert outcome.desired == math.ceil(2 * 0.9 / 0.5) == 4
    assert "process-ratio 0.9 over 2 pods (target 0.5) asks for 4" in outcome.reason
    assert outcome.recommendation == Recommendation(NOW, 4)


def test_within_the_tolerance_nothing_changes() -> None:
    outcome = decide(given_input(spec(targetProcessRatio=0.5), 3, samples(3, ratio=0.54)))
    assert outcome.desired == 3


def test_lag_in_records_and_in_seconds_and_the_larger_wins() -> None:
    autoscaling = spec(targetProcessRatio=0.5, maxLagRecords=10_000, maxLagSeconds=30)
    # Busy share asks for 2 (0.5 at 2 pods); 25,000 records of lag ask for ceil(2 * 2.5) = 5;
    # 25,000 records at 2 x 1,000 records/s = 12.5 s ask for ceil(2 * 12.5 / 30) = 1.
    outcome = decide(given_input(autoscaling, 2, samples(2, ratio=0.5, rate=1000, lag=25_000)))
    assert outcome.desired == 5
    assert "input lag 25000 records (max 10000) asks for 5" in outcome.reason
    assert "input lag 12.5 s (25000 records at 2000 records/s; max 30 s) asks for 1" in (
        outcome.reason
    )


def test_lag_in_seconds_with_no_processing_is_unknown_not_infinite() -> None:
    outcome = decide(given_input(spec(maxLagSeconds=10), 2, samples(2, rate=0.0, lag=500)))
    assert outcome.desired == 2 and outcome.recommendation is None
    assert "unknown" in outcome.reason


def test_clamped_to_max_replicas_and_to_the_tasks() -> None:
    hot = samples(3, ratio=1.0)
    assert decide(given_input(spec(targetProcessRatio=0.1), 3, hot, tasks=100)).desired == 6
    outcome = decide(given_input(spec(targetProcessRatio=0.1), 3, hot, tasks=4))
    assert outcome.desired == 4
    assert "clamped to 4 by [1 (minReplicas), 4 (the app's 4 tasks)]" in outcome.reason


def test_never_below_min_replicas_and_never_zero() -> None:
    idle = samples(3, ratio=0.0, lag=0.0)
    assert decide(given_input(spec(targetProcessRatio=0.5, minReplicas=2), 3, idle)).desired == 2
    lag_only = spec(maxLagRecords=10, scaleDownStabilizationSeconds=0)
    assert decide(given_input(lag_only, 3, idle)).desired == 1
    assert decide(given_input(spec(maxLagRecords=10), 1, samples(1, lag=0.0))).desired == 1


def test_out_of_bounds_is_corrected_at_once_without_metrics() -> None:
    outcome = decide(given_input(spec(maxLagRecords=10), 9, {}, settled_since=None))
    assert outcome.desired == 6
    assert "9 replicas is outside [1 (minReplicas), 6 (maxReplicas)]" in outcome.reason


def test_no_decision_until_settled_and_every_pod_reports() -> None:
    hot = spec(targetProcessRatio=0.1)
    waiting = decide(
        AutoscaleInput(hot, 3, 12, samples(3, ratio=1.0), (), NOW, None, "app-2 not ready")
    )
    assert (waiting.desired, waiting.recommendation) == (3, None)
    assert waiting.reason == "waiting: app-2 not ready"
    two_of_three = samples(2, ratio=1.0)
    outcome = decide(given_input(hot, 3, two_of_three))
    assert outcome.desired == 3 and "2 of 3 pods reported" in outcome.reason
    # Not within a metric window of settling (the moved tasks' lag drains then) ...
    early = decide(given_input(hot, 3, samples(3, ratio=1.0, time=12.0), now=12.0, settled_since=0))
    assert early.recommendation is None and "settled 12 s ago" in early.reason
    # ... and samples from before the app settled do not count.
    stale = decide(
        given_input(hot, 3, samples(3, ratio=1.0, time=19.0), now=30.0, settled_since=20)
    )
    assert stale.desired == 3 and stale.recommendation is None


def test_the_busy_share_waits_for_the_pods_metric_window_lag_does_not() -> None:
    autoscaling = spec(targetProcessRatio=0.5, maxLagRecords=1000)
    now = RATIO_SETTLE_SECONDS / 2
    outcome = decide(
        given_input(autoscaling, 2, samples(2, ratio=1.0, lag=3000, time=now), now=now)
    )
    assert outcome.desired == 6  # from lag alone: ceil(2 * 3)
    assert "process-ratio not used for 30 s more" in outcome.reason
    # Lag alone never scales in while the busy share is unknown: it may want these pods.
    quiet = decide(given_input(autoscaling, 2, samples(2, ratio=0.0, lag=0, time=now), now=now))
    assert quiet.desired == 2 and quiet.recommendation == Recommendation(now, 2)
    assert "no scale in until every target's figure is known" in quiet.reason


def test_the_down_window_holds_the_highest_recommendation() -> None:
    autoscaling = spec(targetProcessRatio=0.5, scaleDownStabilizationSeconds=60)
    history = (Recommendation(NOW - 50, 4), Recommendation(NOW - 20, 2))
    idle = samples(4, ratio=0.1)
    held = decide(given_input(autoscaling, 4, idle, history=history))
    assert held.desired == 4 and "held at 4 by the down stabilization window (60 s)" in held.reason
    later = decide(given_input(autoscaling, 4, idle, history=history, now=NOW + 15))
    assert later.desired == 2  # 4 left the window; the highest since is 2


def test_the_up_window_holds_the_lowest_recommendation() -> None:
    autoscaling = spec(targetProcessRatio=0.5, scaleUpStabilizationSeconds=30)
    history = (Recommendation(NOW - 20, 2), Recommendation(NOW - 10, 5))
    assert decide(given_input(autoscaling, 2, samples(2, ratio=1.0), history=history)).desired == 2
    history = (Recommendation(NOW - 20, 3), Recommendation(NOW - 10, 5))
    assert decide(given_input(autoscaling, 2, samples(2, ratio=1.0), history=history)).desired == 3


def test_prune_keeps_what_the_longer_window_reads() -> None:
    autoscaling = spec(targetProcessRatio=0.5, scaleDownStabilizationSeconds=60)
    history = [Recommendation(t, 2) for t in (10.0, 50.0, 100.0)]
    assert prune(autoscaling, history, 105.0) == history[1:]


def test_the_model_refuses_bounds_out_of_order_and_no_target() -> None:
    def manifest(autoscaling: dict[str, object]) -> dict[str, object]:
        return {
            "apiVersion": "eddyline.dev/v1alpha1",
            "kind": "StreamApp",
            "metadata": {"name": "wc"},
            "spec": {"topology": "m:f", "autoscaling": autoscaling},
        }

    with pytest.raises(ManifestError, match="minReplicas 4 is above maxReplicas 2"):
        parse_manifest(manifest({"minReplicas": 4, "maxReplicas": 2, "maxLagRecords": 5}))
    with pytest.raises(ManifestError, match="at least one target: targetProcessRatio"):
        parse_manifest(manifest({"maxReplicas": 2}))
    with pytest.raises(ManifestError, match="minReplicas"):
        parse_manifest(manifest({"minReplicas": 0, "maxReplicas": 2, "maxLagRecords": 5}))
    with pytest.raises(ManifestError, match="targetProcessRatio"):
        parse_manifest(manifest({"maxReplicas": 2, "targetProcessRatio": 1.5}))


def pod(name: str, *, ready: bool = True, deleting: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "eddyline", "started": True, "state": {"running": {}}}],
        },
    }


def test_settled_needs_every_pod_ready_assigned_and_no_warm_up() -> None:
    task = TaskId(0, 0)
    both = Membership(3, Assignment({"a-0": frozenset({task}), "a-1": frozenset()}, {}))
    assert settled(2, [pod("a-0"), pod("a-1")], both) is None
    assert settled(3, [pod("a-0"), pod("a-1")], both) == "2 pods running, 3 wanted"
    assert settled(2, [pod("a-0"), pod("a-1", ready=False)], both) == "a-1 not ready"
    assert settled(2, [pod("a-0"), pod("a-1", deleting=True)], both) == "1 pods running, 2 wanted"
    one = Membership(2, Assignment({"a-0": frozenset({task})}, {}))
    assert settled(2, [pod("a-0"), pod("a-1")], one) == "a-1 not in the membership yet"
    warming = Membership(
        4,
        Assignment({"a-0": frozenset({task}), "a-1": frozenset()}, {}, warmup={"a-1": {task}}),
    )
    assert settled(2, [pod("a-0"), pod("a-1")], warming) == "1 warm-up replicas still catching up"


def test_parse_metrics_reads_what_the_pods_export() -> None:
    def name(group: str, metric: str, **tags: str) -> MetricName:
        return MetricName.of(group, metric, {k.replace("_", "-"): v for k, v in tags.items()})

    text = render_prometheus(
        {
            name("stream-thread-metrics", "process-ratio", thread_id="t1"): 0.2,
            name("stream-thread-metrics", "process-ratio", thread_id="t2"): 0.6,
            name("stream-thread-metrics", "process-rate", thread_id="t1"): 100.0,
            name("stream-thread-metrics", "process-rate", thread_id="t2"): 50.0,
            name("stream-thread-metrics", "process-total", thread_id="t1"): 7.0,
            name(
                "consumer-fetch-manager-metrics",
                "records-lag",
                thread_id="t1",
                task_id="0_1",
                topic="lines",
                partition="1",
            ): 40.0,
            name(
                "consumer-fetch-manager-metrics",
                "records-lag",
                thread_id="t2",
                task_id="0_2",
                topic="lines",
                partition="2",
            ): -1.0,
        },
        # The HELP lines a pod serves too: the parser skips them.
        {("stream-thread-metrics", "process-ratio"): "The fraction of time spent processing"},
    )
    sample = parse_metrics(text, 5.0)
    assert sample == PodSample(5.0, pytest.approx(0.4), 150.0, {"lines/1": 40.0})
    with pytest.raises(ValueError, match="process_ratio"):
        parse_metrics("# nothing\n", 1.0)


# -- properties -------------------------------------------------------------------------

specs = st.builds(
    lambda low, extra, ratio, lag, seconds, up, down: AutoscalingSpec.model_validate(
        {
            "minReplicas": low,
            "maxReplicas": low + extra,
            "targetProcessRatio": ratio,
            "maxLagRecords": lag,
            "maxLagSeconds": seconds,
            "scaleUpStabilizationSeconds": up,
            "scaleDownStabilizationSeconds": down,
        }
    ),
    st.integers(1, 5),
    st.integers(0, 8),
    st.one_of(st.none(), st.floats(0.05, 1.0)),
    st.integers(1, 100_000),
    st.one_of(st.none(), st.floats(0.5, 120.0)),
    st.integers(0, 120),
    st.integers(0, 600),
)
loads = st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 500_000.0), st.floats(0.0, 50_000.0))


@settings(max_examples=300, deadline=None)
@given(specs, st.integers(1, 15), st.integers(0, 20), loads, st.lists(st.integers(1, 15)))
def test_never_out_of_bounds_and_never_zero(
    autoscaling: AutoscalingSpec,
    current: int,
    tasks: int,
    load: tuple[float, float, float],
    earlier: list[int],
) -> None:
    ratio, lag, rate = load
    history = tuple(Recommendation(NOW - 1 - i, r) for i, r in enumerate(earlier))
    outcome = decide(
        given_input(
            autoscaling, current, samples(current, ratio=ratio, lag=lag, rate=rate),
            tasks=tasks, history=history,
        )
    )  # fmt: skip
    high = upper_bound(autoscaling, tasks)
    assert outcome.desired >= 1
    if autoscaling.min_replicas <= current <= high:
        # Within the bounds it moves only within them; any move is toward the recommendation.
        assert autoscaling.min_replicas <= outcome.desired <= high
    else:
        assert outcome.desired == min(max(current, autoscaling.min_replicas), high)
    assert outcome.desired <= max(autoscaling.min_replicas, min(autoscaling.max_replicas, 15))
    if tasks > 0 and current <= tasks:
        assert outcome.desired <= max(tasks, autoscaling.min_replicas)


@settings(max_examples=300, deadline=None)
@given(specs, st.integers(1, 8), loads, loads, st.lists(st.integers(1, 8), max_size=6))
def test_monotone_in_load(
    autoscaling: AutoscalingSpec,
    current: int,
    one: tuple[float, float, float],
    other: tuple[float, float, float],
    earlier: list[int],
) -> None:
    """More busy share and more lag (at the same process rate) never ask for fewer pods."""
    rate = one[2]
    low = (min(one[0], other[0]), min(one[1], other[1]))
    high = (max(one[0], other[0]), max(one[1], other[1]))
    history = tuple(Recommendation(NOW - 1 - i, r) for i, r in enumerate(earlier))

    def desired(ratio: float, lag: float) -> int:
        pods = samples(current, ratio=ratio, lag=lag, rate=rate)
        return decide(given_input(autoscaling, current, pods, history=history)).desired

    assert desired(*low) <= desired(*high)


@settings(max_examples=200, deadline=None)
@given(
    specs,
    st.integers(1, 6),
    st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 500_000.0)), min_size=2, max_size=40),
    st.floats(1.0, 20.0),
)
def test_no_flapping_within_the_windows(
    autoscaling: AutoscalingSpec,
    start: int,
    loads_over_time: list[tuple[float, float]],
    step: float,
) -> None:
    """Driven cycle by cycle with any load: after a scale out, nothing scales in within the
    down window; after a scale in, nothing scales out within the up window, and a scale in
    happens only once every recommendation of the down window allowed it."""
    current = min(max(start, autoscaling.min_replicas), upper_bound(autoscaling, 12))
    history: list[Recommendation] = []
    changes: list[tuple[float, int, int]] = []  # (time, from, to)
    now = NOW
    for ratio, lag in loads_over_time:
        outcome = decide(
            given_input(
                autoscaling, current, samples(current, ratio=ratio, lag=lag, rate=1000.0),
                history=tuple(history), now=now,
            )
        )  # fmt: skip
        if outcome.recommendation is not None:
            history.append(outcome.recommendation)
        if outcome.desired != current:
            if outcome.desired < current:
                window = [
                    r
                    for r in history
                    if r.time > now - autoscaling.scale_down_stabilization_seconds
                ]
                assert all(r.replicas <= outcome.desired for r in window)  # fmt: skip
            else:
                window = [
                    r for r in history if r.time > now - autoscaling.scale_up_stabilization_seconds
                ]
                assert all(r.replicas >= outcome.desired for r in window)  # fmt: skip
            changes.append((now, current, outcome.desired))
            current = outcome.desired
        now += step
    for (t1, a1, b1), (t2, a2, b2) in itertools.pairwise(changes):
        if b1 > a1 and b2 < a2:  # out, then in
            assert t2 - t1 >= autoscaling.scale_down_stabilization_seconds
        if b1 < a1 and b2 > a2:  # in, then out
            assert t2 - t1 >= autoscaling.scale_up_stabilization_seconds
