"""The handlers' glue, called directly (as kopf would) over an in-memory object store in
place of the API server (``conftest.MemoryKube``): one cycle applies, publishes, restarts
and writes status."""

from __future__ import annotations

import collections
import copy
import json
from typing import Any

import kopf
import pytest

from eddyline_operator import autoscaler, handlers, metrics
from eddyline_operator.client import ApiError
from eddyline_operator.reconcile import autoscale, names
from eddyline_operator.reconcile.status_record import dump_status
from eddyline_runtime.membership import (
    MEMBERSHIP_FILE,
    RESTORE_PENDING,
    MemberReport,
    Membership,
    StoreCopy,
)
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.restore.job_result import JobState
from tests.support.k8s_objects import body, node, pod, three_zones
from tests.unit.operator.conftest import MemoryKube
from tests.unit.operator.test_reconcile_restore_job import (
    RESTORE,
    finished_job,
    job_pod,
    report,
    run,
    verdict,
)
from tests.unit.operator.test_reconcile_upgrade import Driver, run_to_starting

Obj = dict[str, Any]


def operator(memo: kopf.Memo) -> handlers.Operator:
    return handlers.operator_of(memo)


def layout_reports(pods: list[Obj], port: int) -> dict[str, MemberReport]:
    tasks = frozenset(TaskId(0, p) for p in range(4))
    return {
        p["metadata"]["name"]: MemberReport(
            p["metadata"]["name"], "h", tasks, tasks, {"counts": {0: StoreCopy("active", 0)}}, True
        )
        for p in pods
    }


def test_a_cycle_creates_the_owned_objects_and_writes_status(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    kube.put(body())
    for each in three_zones():
        kube.put({"kind": "Node", **each})
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    kinds = sorted(k for k, _, _ in kube.objects)
    assert kinds.count("Service") == 2
    assert "StatefulSet" in kinds
    status = kube.objects["StreamApp", "apps", "wc"]["status"]
    assert status["observedGeneration"] == 3
    assert status["phase"] == "Progressing"
    assert ("Normal", "Created", "created StatefulSet wc") in kube.events  # type: ignore[attr-defined]


def three_running_pods(kube: MemoryKube, memo: kopf.Memo) -> str:
    """The app's first cycle, then its three pods running the rendered template and one
    cycle that asks them for reports; returns the template's config hash."""
    kube.put(body())
    for each in three_zones():
        kube.put({"kind": "Node", **each})
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    template = kube.objects["StatefulSet", "apps", "wc"]["spec"]["template"]
    config_hash: str = template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
    for i in range(3):
        kube.put({"kind": "Pod", **pod(i, config_hash=config_hash)})
    handlers.refresh_app(operator(memo), "apps", "wc")
    return config_hash


def test_pods_reporting_a_layout_get_a_published_membership(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handlers, "fetch_reports", layout_reports)
    config_hash = three_running_pods(kube, memo)
    membership = kube.read_membership("apps", "wc-membership")
    assert membership is not None and membership.generation == 1
    assert sorted(membership.assignment.active) == ["wc-0", "wc-1", "wc-2"]
    # A pod stops running: the pod event alone republishes without it.
    kube.put({"kind": "Pod", **pod(1, running=False, config_hash=config_hash)})
    # The pod's own memo: kopf's shallow copy of the operator's, so the same Operator.
    handlers.pod_changed(body=kube.get("Pod", "apps", "wc-1"), memo=copy.copy(memo))
    after = kube.read_membership("apps", "wc-membership")
    assert after is not None and after.generation == 2
    assert "wc-1" not in after.assignment.active
    assert kube.deleted == []


def test_a_suspend_tells_every_stopping_pod_at_once_that_nobody_takes_over(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Suspending deletes every pod at once; each, leaving, waits until the membership
    hands its tasks over or says nobody will. Only the leaving pods can report the layout
    that membership is computed from: without their reports each waited its whole bound."""
    monkeypatch.setattr(handlers, "fetch_reports", layout_reports)
    config_hash = three_running_pods(kube, memo)
    kube.put(body(suspend=True))
    handlers.refresh_app(operator(memo), "apps", "wc")
    assert kube.objects["StatefulSet", "apps", "wc"]["spec"]["replicas"] == 0
    # The StatefulSet controller deletes the pods; their containers still run.
    for i in range(3):
        kube.put({"kind": "Pod", **pod(i, deleting=True, config_hash=config_hash)})
    for i in range(3):
        handlers.pod_changed(body=kube.get("Pod", "apps", f"wc-{i}"), memo=copy.copy(memo))
    told = kube.read_membership("apps", "wc-membership")
    assert told is not None and told.assignment.leaving == {"wc-0", "wc-1", "wc-2"}
    assert all(told.assignment.handed_over(f"wc-{i}") for i in range(3))


def test_the_first_cycle_after_a_pause_plans_from_the_membership_published_meanwhile(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pause is for repairs by hand, a membership published by hand among them: the cycle
    that resumes reads the ConfigMaps again and continues from that generation. Planned from
    the read before the pause, it published the same generation number again, which every
    pod ignores as a replay (so the operator's assignment and the pods' differed)."""
    monkeypatch.setattr(handlers, "fetch_reports", layout_reports)
    config_hash = three_running_pods(kube, memo)
    app = kube.objects["StreamApp", "apps", "wc"]
    app["metadata"]["annotations"] = {names.ANNOTATION_PAUSE: "true"}
    handlers.refresh_app(operator(memo), "apps", "wc")
    before = kube.read_membership("apps", "wc-membership")
    assert before is not None and before.generation == 1
    by_hand = Membership(2, before.assignment)
    kube.put(
        {
            **kube.objects["ConfigMap", "apps", "wc-membership"],
            "data": {MEMBERSHIP_FILE: json.dumps(by_hand.to_json())},
        }
    )
    del app["metadata"]["annotations"][names.ANNOTATION_PAUSE]
    kube.put({"kind": "Pod", **pod(1, running=False, config_hash=config_hash)})
    handlers.refresh_app(operator(memo), "apps", "wc")
    after = kube.read_membership("apps", "wc-membership")
    assert after is not None and after.generation == 3
    assert "wc-1" not in after.assignment.active


def test_a_deleted_app_is_left_alone(kube: MemoryKube, memo: kopf.Memo) -> None:
    assert handlers.run_cycle(operator(memo), "apps", "gone", fetch=True, force_apply=True) is None
    assert kube.objects == {}


def test_nodes_are_listed_again_only_for_a_node_not_seen_yet(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    listed = []
    original = kube.list

    def counting(kind: str, namespace: str | None, **query: str | None) -> list[Obj]:
        if kind == "Node":
            listed.append(kind)
        return original(kind, namespace, **query)

    kube.list = counting  # type: ignore[method-assign]
    for each in three_zones():
        kube.put({"kind": "Node", **each})
    kube.put(body())
    kube.put({"kind": "Pod", **pod(0, node_name="node-0")})
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=False, force_apply=False)
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=False, force_apply=False)
    assert len(listed) == 1
    kube.put({"kind": "Node", **node("node-9", "zone-z")})
    kube.put({"kind": "Pod", **pod(1, node_name="node-9")})
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=False, force_apply=False)
    assert len(listed) == 2


def test_a_memo_without_the_operator_names_the_startup_handler() -> None:
    with pytest.raises(RuntimeError, match=r"handlers\.configure did not run"):
        handlers.reconcile_app(namespace="apps", name="wc", memo=kopf.Memo())


def test_a_field_the_plan_empties_is_sent_as_null_to_clear_it(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    """Status is written whole: a field the plan leaves empty is sent as null, which a merge
    patch needs to remove it (here a rolled-back topology the spec no longer asks for)."""
    app = body()
    app["status"] = {"failedTopology": {"ref": "wordcount:topology", "revision": "9"}}
    kube.put(app)
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    (patch,) = kube.status_patches
    assert "failedTopology" in patch and patch["failedTopology"] is None
    assert patch["phase"] == "Progressing"


def test_an_object_of_the_same_name_that_is_not_the_apps_is_left_alone_and_reported(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    """Issue 23, item 4: an existing object is never adopted by name; issue 38: nor is what
    names it applied (test_handlers_children.py has one case per kind of reference)."""
    theirs = {
        "kind": "ServiceAccount",
        "metadata": {
            "name": "wc-runtime",
            "namespace": "apps",
            "labels": {names.LABEL_MANAGED_BY: "Helm"},
        },
    }
    kube.put(theirs)
    kube.put(body())
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    assert kube.objects["ServiceAccount", "apps", "wc-runtime"] == theirs  # untouched
    assert ("Service", "apps", "wc-query") in kube.objects  # what does not name it is applied
    assert ("StatefulSet", "apps", "wc") not in kube.objects  # its pods would run as it
    status = kube.objects["StreamApp", "apps", "wc"]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "NameConflict"
    assert "ServiceAccount wc-runtime" in degraded["message"]
    assert degraded["observedGeneration"] == 3 and status["phase"] == "Degraded"
    warnings = [e for e in kube.events if e[0] == "Warning"]  # type: ignore[attr-defined]
    assert [w[1] for w in warnings] == ["NameConflict"]
    # Another cycle with the same conflict posts no second event.
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    assert len([e for e in kube.events if e[0] == "Warning"]) == 1  # type: ignore[attr-defined]


def test_a_child_the_api_server_refuses_degrades_the_app_and_status_is_still_written(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    """Issue 23, item 8: a refused child is caught per object; status says so."""
    kube.refuse["Service/wc-query"] = ApiError(
        422,
        'Service "wc-query" is invalid: metadata.name: a DNS-1035 label must start with a letter',
    )
    kube.put(body())
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    assert ("StatefulSet", "apps", "wc") in kube.objects  # the objects after it were applied
    status = kube.objects["StreamApp", "apps", "wc"]["status"]
    assert status["observedGeneration"] == 3
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ApplyFailed"
    assert "Service wc-query was refused by the API server" in degraded["message"]
    assert "must start with a letter" in degraded["message"]
    assert ("Warning", "ApplyFailed") in [
        (t, r)
        for t, r, _ in kube.events  # type: ignore[attr-defined]
    ]
    # Fixed: the next cycle applies it and Degraded clears.
    del kube.refuse["Service/wc-query"]
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    status = kube.objects["StreamApp", "apps", "wc"]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False"


def test_the_beat_of_a_settled_app_comes_from_the_environment() -> None:
    assert handlers.settled_seconds({}) == handlers.SETTLED_SECONDS
    assert handlers.settled_seconds({handlers.RESYNC_ENV: "60"}) == 60.0
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ValueError, match="EDDYLINE_OPERATOR_RESYNC_SECONDS"):
            handlers.settled_seconds({handlers.RESYNC_ENV: bad})


def test_the_daemon_is_async_so_it_holds_no_worker_thread_between_cycles() -> None:
    """Issue 23, item 1: a sync daemon held one of kopf's threads for the app's whole life."""
    import inspect

    assert inspect.iscoroutinefunction(handlers.follow_app)


def test_login_reads_the_service_account_from_the_directory_the_kubelet_names(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("the-token\n", encoding="utf-8")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n", encoding="utf-8")
    (tmp_path / "namespace").write_text("team-a", encoding="utf-8")
    monkeypatch.setenv(handlers.SERVICE_ACCOUNT_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    info = handlers.login()
    assert info is not None
    assert info.server == "https://127.0.0.1:6443"
    assert info.token == "the-token"
    assert info.ca_path == str(tmp_path / "ca.crt")
    assert info.default_namespace == "team-a"


def test_login_names_the_missing_token_and_the_way_out(tmp_path: Any) -> None:
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    with pytest.raises(kopf.LoginError, match=r"no token in .*automountServiceAccountToken"):
        handlers.service_account_login(str(tmp_path), environ)
    with pytest.raises(kopf.LoginError, match="KUBERNETES_SERVICE_HOST"):
        handlers.service_account_login(str(tmp_path), {})


def test_a_paused_app_gets_no_children_only_its_paused_status_at_the_settled_beat(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    app = body()
    app["metadata"]["annotations"] = {names.ANNOTATION_PAUSE: "true"}
    kube.put(app)
    # A new app would be Progressing (the fast beat); paused, nothing moves, so no hurry.
    assert handlers.refresh_app(operator(memo), "apps", "wc", 7.0) == 7.0
    assert sorted(k for k, _, _ in kube.objects) == ["StreamApp"]
    status = kube.objects["StreamApp", "apps", "wc"]["status"]
    assert [c["type"] for c in status["conditions"]] == ["Paused"]
    assert [r for _, r, _ in kube.events] == ["ReconciliationPaused"]  # type: ignore[attr-defined]
    del app["metadata"]["annotations"][names.ANNOTATION_PAUSE]
    kube.put(app)
    assert handlers.refresh_app(operator(memo), "apps", "wc", 7.0) == handlers.SETTLING_SECONDS
    assert "StatefulSet" in {k for k, _, _ in kube.objects}


def lagging_metrics(pods: list[Obj], port: int) -> dict[str, str]:
    """Each pod busy 50 % of the time with 5,000 records of lag on one partition of its own."""
    return {
        p["metadata"]["name"]: (
            "# TYPE eddyline_stream_thread_metrics_process_ratio gauge\n"
            'eddyline_stream_thread_metrics_process_ratio{thread_id="t"} 0.5\n'
            'eddyline_stream_thread_metrics_process_rate{thread_id="t"} 100.0\n'
            'eddyline_consumer_fetch_manager_metrics_records_lag{partition="'
            f'{i}",task_id="0_{i}",thread_id="t",topic="in"}} 5000.0\n'
        )
        for i, p in enumerate(pods)
    }


def test_the_autoscaler_scales_out_through_the_scale_subresource_once_settled(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handlers, "fetch_reports", layout_reports)
    monkeypatch.setattr(autoscaler, "fetch_metrics", lagging_metrics)
    monkeypatch.setattr(autoscaler, "SCRAPE_SECONDS", 0.0)
    clock = [1000.0]
    monkeypatch.setattr(autoscaler, "_clock", lambda: clock[0])
    policy = {"minReplicas": 1, "maxReplicas": 6, "maxLagRecords": 10_000}
    decisions_before = _scaling_decisions("apps", "wc", "up")
    kube.put(body(autoscaling=policy))
    for each in three_zones():
        kube.put({"kind": "Node", **each})
    handlers.reconcile_app(namespace="apps", name="wc", memo=memo)
    template = kube.objects["StatefulSet", "apps", "wc"]["spec"]["template"]
    config_hash = template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
    for i in range(3):
        kube.put({"kind": "Pod", **pod(i, config_hash=config_hash)})
    # This cycle publishes the first membership: not settled, no decision.
    handlers.refresh_app(operator(memo), "apps", "wc")
    assert not getattr(kube, "scaled", [])
    status = kube.objects["StreamApp", "apps", "wc"]["status"]["autoscaling"]
    assert status["currentReplicas"] == 3 and status["desiredReplicas"] == 3
    # Settled, and a whole metric window later: 15,000 records of lag against 10,000 ask for
    # ceil(3 * 1.5) = 5; the app has 4 tasks (layout_reports), so 4.
    handlers.refresh_app(operator(memo), "apps", "wc")  # settles
    assert not getattr(kube, "scaled", [])
    clock[0] += autoscale.METRIC_WINDOW_SECONDS
    handlers.refresh_app(operator(memo), "apps", "wc")
    assert kube.scaled == [4]  # type: ignore[attr-defined]
    app = kube.objects["StreamApp", "apps", "wc"]
    assert app["spec"]["replicas"] == 4
    decision = app["status"]["autoscaling"]["lastDecision"]
    assert (decision["fromReplicas"], decision["toReplicas"]) == (3, 4)
    assert "input lag 15000 records (max 10000) asks for 5" in decision["reason"]
    assert "clamped to 4 by [1 (minReplicas), 4 (the app's 4 tasks)]" in decision["reason"]
    scaled = [(t, m) for t, r, m in kube.events if r == "ScaledOut"]  # type: ignore[attr-defined]
    assert scaled == [("Normal", f"3 -> 4 replicas: {decision['reason']}")]
    # ... and the operator's metrics count it (the dashboard's scaling-decisions panel).
    counted = 'eddyline_operator_scaling_decisions_total{namespace="apps",app="wc",direction="up"}'
    assert f"{counted} {decisions_before + 1}" in metrics.METRICS.render()
    # The step has not settled (3 pods of 4): no further decision, the record stays.
    clock[0] += autoscale.METRIC_WINDOW_SECONDS
    handlers.refresh_app(operator(memo), "apps", "wc")
    assert kube.scaled == [4]  # type: ignore[attr-defined]
    assert kube.objects["StreamApp", "apps", "wc"]["status"]["autoscaling"]["lastDecision"] == (
        decision
    )


def test_a_suspended_or_paused_app_is_not_autoscaled(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handlers, "fetch_reports", layout_reports)
    monkeypatch.setattr(autoscaler, "fetch_metrics", lagging_metrics)
    monkeypatch.setattr(autoscaler, "SCRAPE_SECONDS", 0.0)
    policy = {"minReplicas": 1, "maxReplicas": 6, "maxLagRecords": 10}
    kube.put(body(autoscaling=policy, suspend=True))
    for each in three_zones():
        kube.put({"kind": "Node", **each})
    for i in range(3):
        kube.put({"kind": "Pod", **pod(i)})
    clock = [1000.0]
    monkeypatch.setattr(autoscaler, "_clock", lambda: clock[0])
    for _ in range(3):
        handlers.refresh_app(operator(memo), "apps", "wc")
        clock[0] += autoscale.METRIC_WINDOW_SECONDS
    assert not getattr(kube, "scaled", [])
    app = body(autoscaling=policy)
    app["metadata"]["annotations"] = {names.ANNOTATION_PAUSE: "true"}
    kube.put(app)
    for _ in range(3):
        handlers.refresh_app(operator(memo), "apps", "wc")
        clock[0] += autoscale.METRIC_WINDOW_SECONDS
    assert not getattr(kube, "scaled", [])


def _scaling_decisions(namespace: str, app: str, direction: str) -> int:
    """The operator's scaling-decision counter now (the registry is one per process)."""
    series = (
        "eddyline_operator_scaling_decisions_total"
        f'{{namespace="{namespace}",app="{app}",direction="{direction}"}} '
    )
    for line in metrics.METRICS.render().splitlines():
        if line.startswith(series):
            return int(float(line[len(series) :]))
    return 0


def counting_lists(kube: MemoryKube) -> list[str]:
    """The kind of every LIST the cycles send from now on."""
    lists: list[str] = []
    original = kube.list

    def list_(kind: str, namespace: str | None, **kwargs: Any) -> list[Obj]:
        lists.append(kind)
        return original(kind, namespace, **kwargs)

    kube.list = list_  # type: ignore[method-assign]
    return lists


def counting_reads(kube: MemoryKube) -> list[tuple[str, str]]:
    """The (kind, name) of every GET the cycles send from now on."""
    reads: list[tuple[str, str]] = []
    original = kube.get

    def get(kind: str, namespace: str | None, name: str) -> Obj | None:
        reads.append((kind, name))
        return original(kind, namespace, name)

    kube.get = get  # type: ignore[method-assign]
    return reads


def test_a_beat_takes_the_app_from_the_watch_when_it_holds_the_version_last_seen(
    kube: MemoryKube, memo: kopf.Memo
) -> None:
    """kopf's watched view of the StreamApp stands in for a GET once it shows the version
    this operator last saw (its own status write included); a view at any other version
    (someone else's write not yet seen by a GET, or the view behind this operator's own
    write) is not trusted."""
    kube.put({**body(suspend=True), "metadata": {**body()["metadata"], "resourceVersion": "7"}})
    state = operator(memo).app("apps", "wc")
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=True)
    stored = kube.objects["StreamApp", "apps", "wc"]
    assert state.known_version == stored["metadata"]["resourceVersion"] != "7"  # status written
    reads = counting_reads(kube)
    state.watched = kopf.Body(copy.deepcopy({**stored, "metadata": {**stored["metadata"]}}))
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=False)
    assert ("StreamApp", "wc") not in reads
    behind = copy.deepcopy(stored)
    behind["metadata"]["resourceVersion"] = "7"  # the view before this operator's write
    state.watched = kopf.Body(behind)
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=False)
    assert reads.count(("StreamApp", "wc")) == 1


def test_the_membership_and_manifest_are_read_again_only_after_a_write_or_a_while(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the operator writes the membership and config ConfigMaps: a settled app's beat
    reads them again after it applied or published, or every REAPPLY_SECONDS."""
    kube.put(body(suspend=True))
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=True)
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=False)
    reads = counting_reads(kube)
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=False)
    assert ("ConfigMap", "wc-membership") not in reads and ("ConfigMap", "wc-config") not in reads
    monkeypatch.setattr(handlers, "REAPPLY_SECONDS", 0.0)
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=False)
    assert ("ConfigMap", "wc-config") in reads


def test_the_re_apply_of_unchanged_children_sends_only_what_drifted(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube.put(body(suspend=True))
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=True)
    applies = kube.applies
    assert applies and not any(unless_same for _, unless_same in applies)
    applies.clear()
    monkeypatch.setattr(handlers, "REAPPLY_SECONDS", 0.0)
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=False)
    assert applies and all(unless_same for _, unless_same in applies)


def test_the_number_of_cycle_threads_comes_from_the_environment() -> None:
    assert handlers.cycle_workers({}) == handlers.CYCLE_WORKERS
    assert handlers.cycle_workers({handlers.WORKERS_ENV: "4"}) == 4
    with pytest.raises(ValueError, match=r"EDDYLINE_OPERATOR_WORKERS=.0.*whole number"):
        handlers.cycle_workers({handlers.WORKERS_ENV: "0"})


def test_kopfs_sync_handlers_run_on_the_operators_sized_executor() -> None:
    settings, memo = kopf.OperatorSettings(), kopf.Memo()
    handlers.configure(settings=settings, memo=memo)
    assert settings.execution.executor is handlers.operator_of(memo).executor


def test_an_app_without_pods_that_had_nothing_to_do_is_not_planned_again_until_it_changes(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suspended app's beat, once a cycle found nothing to do, plans again only when the
    StreamApp's version, a pod event or the ConfigMaps' read changes: its other beats send
    no request but the StreamApp's GET (none with kopf's watched view)."""
    planned: list[str] = []
    original = handlers.plan

    def counting(observed: Any) -> Any:
        planned.append(observed.body["metadata"].get("resourceVersion"))
        return original(observed)

    monkeypatch.setattr(handlers, "plan", counting)
    kube.put({**body(suspend=True), "metadata": {**body()["metadata"], "resourceVersion": "7"}})
    first = handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=True)
    for _ in range(3):
        handlers.refresh_app(operator(memo), "apps", "wc")
    settled = len(planned)
    assert first is not None and first.status.phase == "Suspended"
    reads, lists = counting_reads(kube), counting_lists(kube)
    patches = len(kube.status_patches)
    assert handlers.refresh_app(operator(memo), "apps", "wc") == handlers.SETTLED_SECONDS
    assert len(planned) == settled and len(kube.status_patches) == patches
    assert reads == [("StreamApp", "wc")]  # no watched view here: a GET stands in for it
    assert lists == []  # no pod event since a LIST found none: no LIST
    # The spec changes: a new version, planned again.
    stored = kube.objects["StreamApp", "apps", "wc"]
    stored["metadata"]["resourceVersion"] = "100"
    stored["spec"]["replicas"] = 5
    handlers.refresh_app(operator(memo), "apps", "wc")
    assert len(planned) == settled + 1
    # A pod appears: planned at every beat while it exists.
    kube.put({"kind": "Pod", **pod(0)})
    handlers.refresh_app(operator(memo), "apps", "wc")
    handlers.refresh_app(operator(memo), "apps", "wc")
    assert len(planned) == settled + 3


def test_a_forced_cycle_is_always_planned(kube: MemoryKube, memo: kopf.Memo) -> None:
    kube.put(body(suspend=True))
    for _ in range(3):
        handlers.refresh_app(operator(memo), "apps", "wc")
    patches = len(kube.status_patches)
    kube.objects["StreamApp", "apps", "wc"]["status"] = {}  # status lost: a forced cycle sees
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=True)
    assert len(kube.status_patches) == patches + 1


def test_an_app_that_wants_pods_and_has_none_is_planned_at_every_beat(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its StatefulSet's Events (a quota refusing the pods) are read by the plan's cycle."""
    planned: list[int] = []
    original = handlers.plan
    monkeypatch.setattr(handlers, "plan", lambda observed: planned.append(1) or original(observed))
    kube.put(body())
    for _ in range(4):
        handlers.refresh_app(operator(memo), "apps", "wc")
    assert len(planned) == 4


def rollbacks_of(app: str) -> float:
    """The process registry's upgrade rollbacks of apps/<app>, 0 when it has no sample."""
    prefix = f'{metrics.UPGRADE_ROLLBACKS}{{namespace="apps",app="{app}"}} '
    for line in metrics.METRICS.render().splitlines():
        if line.startswith(prefix):
            return float(line.removeprefix(prefix))
    return 0.0


def test_a_rolled_back_upgrade_is_counted_once_when_its_rollback_is_written(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cycle that finds the new revision's pod refusing to start writes the rollback
    ahead: that write, and only it, counts (the cycles after it continue the rollback)."""
    upgrade = Driver()
    upgrade.settle()
    run_to_starting(upgrade)
    upgrade.start_pods("2")
    refused = "state stores are misplaced; set automatic.state.relocation"
    upgrade.pods[1]["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 1, "reason": "Error", "message": refused}
    }
    kube.put(upgrade.app)
    for each in three_zones():
        kube.put({"kind": "Node", **each})
    for running in upgrade.pods:
        kube.put({"kind": "Pod", **running})
    monkeypatch.setattr(handlers, "fetch_reports", lambda pods, port: upgrade.reports())
    before = rollbacks_of("wc")

    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=False)
    stored = kube.objects["StreamApp", "apps", "wc"]["status"]["upgrade"]
    assert stored["rollback"]["reason"] == "PodFailed" and stored["step"] == "Stopping"
    assert rollbacks_of("wc") == before + 1
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=False)
    assert rollbacks_of("wc") == before + 1


def test_a_rollback_whose_write_conflicts_is_counted_by_the_cycle_that_writes_it(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    upgrade = Driver()
    upgrade.settle()
    run_to_starting(upgrade)
    upgrade.start_pods("2")
    upgrade.pods[0]["status"]["containerStatuses"][0]["state"] = {
        "terminated": {"exitCode": 1, "reason": "Error", "message": "refused"}
    }
    kube.put(upgrade.app)
    for running in upgrade.pods:
        kube.put({"kind": "Pod", **running})
    monkeypatch.setattr(handlers, "fetch_reports", lambda pods, port: upgrade.reports())
    before = rollbacks_of("wc")
    original = kube.patch_streamapp_status

    def conflict(namespace: str, name: str, patch: Obj) -> str | None:
        raise ApiError(409, "the object has been modified")

    kube.patch_streamapp_status = conflict  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=False)
    assert rollbacks_of("wc") == before
    kube.patch_streamapp_status = original  # type: ignore[method-assign]
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=False)
    assert rollbacks_of("wc") == before + 1


def test_a_restore_job_seen_failed_is_counted_once(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = {"wc-0": report("wc-0", {0: (RESTORE_PENDING, 5000), 1: (RESTORE_PENDING, 5000)})}
    first = run(body(restore=RESTORE), reports=reports)
    (job,) = first.create_jobs
    app = body(restore=RESTORE)
    app["status"] = dump_status(first.status)
    kube.put(app)
    failed = finished_job(job, complete=False)
    kube.put({"kind": "Job", **failed})
    its_pod = job_pod(failed, verdict(JobState.FAILED, {}, (0, 1)), exit_code=1)
    kube.put({"kind": "Pod", **its_pod, "metadata": {**its_pod["metadata"], "namespace": "apps"}})
    monkeypatch.setattr(handlers, "fetch_reports", lambda pods, port: reports)
    counted = f'{metrics.RESTORE_JOBS_FAILED}{{namespace="apps",app="wc"}}'

    def failures() -> float:
        lines = metrics.METRICS.render().splitlines()
        return next((float(line.split()[-1]) for line in lines if line.startswith(counted)), 0.0)

    before = failures()
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=False)
    recorded = kube.objects["StreamApp", "apps", "wc"]["status"]["restoreJobs"]
    assert [j["state"] for j in recorded] == ["Failed"]
    assert failures() == before + 1
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=False)
    assert failures() == before + 1


def test_a_pod_event_ends_a_quiet_beat_and_the_pod_is_listed_and_planned(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quiet beat trusts kopf's pod watch: a pod that appears is a pod event, whose cycle
    LISTs the pods and plans; every beat after it plans too while the pod exists."""
    planned: list[int] = []
    original = handlers.plan
    monkeypatch.setattr(handlers, "plan", lambda observed: planned.append(1) or original(observed))
    kube.put(body(suspend=True))
    handlers.run_cycle(operator(memo), "apps", "wc", fetch=True, force_apply=True)
    for _ in range(3):
        handlers.refresh_app(operator(memo), "apps", "wc")
    settled, lists = len(planned), counting_lists(kube)
    handlers.refresh_app(operator(memo), "apps", "wc")
    assert len(planned) == settled and lists == []
    stray = {"kind": "Pod", **pod(0)}
    kube.put(stray)
    handlers.pod_changed(body=kopf.Body(copy.deepcopy(stray)), memo=memo)
    assert len(planned) == settled + 1 and lists.count("Pod") == 1
    handlers.refresh_app(operator(memo), "apps", "wc")
    handlers.refresh_app(operator(memo), "apps", "wc")
    assert len(planned) == settled + 3 and lists.count("Pod") == 3


class Clock:
    """time.monotonic() for the handlers, moved by the test."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


def test_a_re_apply_that_changed_nothing_keeps_the_config_maps_read(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-apply and the ConfigMaps' read fall due in the same cycle; when every child
    was as it would be applied, the next beats do not read the ConfigMaps again."""
    clock = Clock()
    monkeypatch.setattr(handlers, "time", clock)
    kube.put(body(suspend=True))
    for _ in range(3):
        handlers.refresh_app(operator(memo), "apps", "wc")
    clock.now += handlers.REAPPLY_SECONDS  # the next period: re-apply and reads are due
    reads = counting_reads(kube)
    kube.applies.clear()
    handlers.refresh_app(operator(memo), "apps", "wc")
    assert ("ConfigMap", "wc-config") in reads
    assert kube.applies and all(unless_same for _, unless_same in kube.applies)  # drift check
    reads.clear()
    for _ in range(3):
        clock.now += 1.0
        handlers.refresh_app(operator(memo), "apps", "wc")
    assert ("ConfigMap", "wc-config") not in reads and ("ConfigMap", "wc-membership") not in reads


def test_a_drift_check_reads_the_membership_config_map_once(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cycle that re-applies the children reads the published membership and looks at
    the membership ConfigMap's owner before it applies: one GET serves both. A suspended
    app has no membership ConfigMap, and a 404 is never cached (a foreign unlabelled object
    must be seen), so each look was a GET of its own. Still one per cycle: the next drift
    check asks the server again."""
    clock = Clock()
    monkeypatch.setattr(handlers, "time", clock)
    kube.put(body(suspend=True))
    for _ in range(3):
        handlers.refresh_app(operator(memo), "apps", "wc")
    assert ("ConfigMap", "apps", "wc-membership") not in kube.objects
    reads = counting_reads(kube)
    for _ in range(2):
        clock.now += handlers.REAPPLY_SECONDS  # the next period: re-apply and reads are due
        kube.applies.clear()
        reads.clear()
        handlers.refresh_app(operator(memo), "apps", "wc")
        assert kube.applies and all(unless_same for _, unless_same in kube.applies)
        assert reads.count(("ConfigMap", "wc-membership")) == 1, reads


def test_a_foreign_membership_config_map_made_between_drift_checks_is_seen_by_the_next(
    kube: MemoryKube, memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one read per drift check is the server's answer of that cycle: a ConfigMap of the
    membership's name that someone else made since the last check is refused by the next,
    and nothing that names it is applied."""
    clock = Clock()
    monkeypatch.setattr(handlers, "time", clock)
    kube.put(body(suspend=True))
    for _ in range(3):
        handlers.refresh_app(operator(memo), "apps", "wc")
    theirs = {
        "kind": "ConfigMap",
        "metadata": {"name": "wc-membership", "namespace": "apps"},
        "data": {"owner": "someone else"},
    }
    kube.put(theirs)
    clock.now += handlers.REAPPLY_SECONDS
    handlers.refresh_app(operator(memo), "apps", "wc")
    assert kube.objects["ConfigMap", "apps", "wc-membership"] == theirs  # untouched
    degraded = operator(memo).kube.get("StreamApp", "apps", "wc")["status"]
    assert "ConfigMap wc-membership" in json.dumps(degraded), degraded


def test_apps_applied_at_once_re_apply_spread_over_the_period_each_within_it() -> None:
    """Each app re-applies at its own phase of REAPPLY_SECONDS: 200 apps created in the same
    second do not all send their drift checks in the same second again, and none waits
    longer than the period."""
    period, done = handlers.REAPPLY_SECONDS, 1000.0
    due_after: list[float] = []
    for app in (f"app-{i}" for i in range(200)):
        waited = 0.0
        with pytest.MonkeyPatch.context() as patch:
            clock = Clock(done)
            patch.setattr(handlers, "time", clock)
            while not handlers._due(done, "apps", app):
                clock.now += 0.5
                waited += 0.5
        due_after.append(waited)
    assert max(due_after) <= period
    per_second = collections.Counter(int(d) for d in due_after)
    assert max(per_second.values()) <= 30  # 200 apps at once would be 200
    assert len(per_second) >= period * 0.8
