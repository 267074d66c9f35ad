"""The autoscaler's loop (autoscaler.py) around the pure decision: what it keeps between
cycles, and the status.autoscaling it hands the cycle when it decides nothing. The scaling
itself runs through the handlers in test_handlers.py."""

from __future__ import annotations

from typing import Any

from eddyline_operator import autoscaler
from eddyline_operator.reconcile import autoscale
from eddyline_operator.reconcile.plan import Observed, plan
from eddyline_operator.reconcile.status_record import dump_status
from eddyline_runtime.spec import AutoscalingStatus, StreamAppStatus
from tests.support.k8s_objects import body, three_zones
from tests.unit.operator.conftest import MemoryKube

Obj = dict[str, Any]
NOW = "2026-11-27T10:00:00Z"
POLICY = {"minReplicas": 1, "maxReplicas": 6, "maxLagRecords": 10_000}


def sample(at: float) -> autoscale.PodSample:
    return autoscale.PodSample(time=at, process_ratio=0.5, process_rate=10.0)


def run(store: autoscaler.SampleStore, app: Obj) -> AutoscalingStatus | None:
    result = plan(Observed(body=app, nodes=three_zones(), now=NOW))
    realizer = autoscaler.ScalingRealizer(
        MemoryKube(),  # type: ignore[arg-type]
        "apps",
        "wc",
        lambda *event: None,
    )
    seen = autoscaler.Observed(app, [], [], None, {}, scrape=False, now=NOW)
    return autoscaler.autoscale_app(store, realizer, result, seen)


def with_status(app: Obj, scaling: AutoscalingStatus) -> Obj:
    app["status"] = dump_status(StreamAppStatus(autoscaling=scaling))
    return app


def test_the_store_keeps_the_newest_samples_of_member_pods_only() -> None:
    store = autoscaler.SampleStore()
    for at in range(autoscaler.MAX_SAMPLES + 5):
        store.add("wc-0", sample(float(at)))
    store.add("wc-1", sample(0.0))
    assert len(store.samples["wc-0"]) == autoscaler.MAX_SAMPLES
    assert store.samples["wc-0"][0].time == 5.0
    store.keep_only({"wc-0"})
    assert list(store.samples) == ["wc-0"]


def test_while_paused_status_keeps_what_it_said_and_the_memory_stays() -> None:
    kept = AutoscalingStatus(currentReplicas=3, desiredReplicas=4)
    app = with_status(body(autoscaling=POLICY), kept)
    app["metadata"]["annotations"] = {"eddyline.dev/pause-reconciliation": "true"}
    store = autoscaler.SampleStore(samples={"wc-0": [sample(1.0)]}, settled_since=5.0)
    assert run(store, app) == kept
    assert store.samples and store.settled_since == 5.0


def test_removing_autoscaling_clears_its_status_and_forgets_the_samples() -> None:
    app = with_status(body(), AutoscalingStatus(currentReplicas=3, desiredReplicas=4))
    store = autoscaler.SampleStore(samples={"wc-0": [sample(1.0)]}, settled_since=5.0)
    assert run(store, app) is None
    assert store == autoscaler.SampleStore()


def test_a_suspended_app_reports_its_replicas_and_stops_the_settle_clock() -> None:
    kept = AutoscalingStatus(currentReplicas=3, desiredReplicas=4)
    app = with_status(body(autoscaling=POLICY, suspend=True), kept)
    store = autoscaler.SampleStore(settled_since=5.0)
    assert run(store, app) == kept
    assert store.settled_since is None
