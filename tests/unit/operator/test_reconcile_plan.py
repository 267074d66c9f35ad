"""One reconciliation cycle, without a server: membership, rollout, conditions, events."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from eddyline_operator.reconcile import names
from eddyline_operator.reconcile.membership import is_member, members
from eddyline_operator.reconcile.plan import Observed, Plan, plan
from eddyline_operator.reconcile.status import ROLL_MAX_STANDBY_LAG
from eddyline_operator.reconcile.status_record import dump_status
from eddyline_runtime.membership import MemberReport, Membership, StoreCopy
from eddyline_runtime.partitions import TaskId
from tests.support.k8s_objects import body, node, pod, stateful_set, three_zones

Obj = dict[str, Any]
TASKS = frozenset(TaskId(0, p) for p in range(4))


@pytest.fixture
def nodes() -> list[Obj]:
    return three_zones()


def report(member: str, *, roles: dict[int, tuple[str, int]] | None = None) -> MemberReport:
    return MemberReport(
        member=member,
        topology_hash="abc",
        tasks=TASKS,
        stateful=TASKS,
        stores={"counts": {p: StoreCopy(r, lag) for p, (r, lag) in (roles or {}).items()}},
        ready=True,
    )


def reports(count: int = 3) -> dict[str, MemberReport]:
    return {f"wc-{i}": report(f"wc-{i}") for i in range(count)}


def run(app: Obj, pods: list[Obj], nodes: list[Obj], **observed: Any) -> Plan:
    return plan(Observed(body=app, pods=pods, nodes=nodes, now="2026-11-23T10:00:00Z", **observed))


def conditions(result: Plan) -> list[Obj]:
    """The conditions as the API server would store them."""
    return [c.model_dump(mode="json", by_alias=True) for c in result.status.conditions]


def condition(result: Plan, type_: str) -> Obj:
    return next(c for c in conditions(result) if c["type"] == type_)


def current_hash(app: Obj, nodes: list[Obj]) -> str:
    template = stateful_set(run(app, [], nodes).objects)["spec"]["template"]
    return str(template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH])


def settled(app: Obj, nodes: list[Obj], count: int = 3) -> tuple[list[Obj], Membership]:
    """Pods running the current template, and the membership they were given."""
    config_hash = current_hash(app, nodes)
    pods = [pod(i, config_hash=config_hash) for i in range(count)]
    first = run(app, pods, nodes, reports=reports(count))
    assert first.membership is not None
    return pods, first.membership


def test_a_new_app_gets_its_objects_and_no_membership_before_pods_report(nodes: list[Obj]) -> None:
    result = run(body(), [], nodes)
    assert [o["kind"] for o in result.objects][-1] == "StatefulSet"
    assert result.membership is None
    assert result.status.observed_generation == 3
    assert result.status.phase == "Progressing"
    assert condition(result, "Ready")["status"] == "False"
    assert result.status.selector == (
        "app.kubernetes.io/instance=wc,app.kubernetes.io/name=eddyline"
    )


def test_members_are_running_started_pods_with_their_nodes_zone(nodes: list[Obj]) -> None:
    pods = [pod(0), pod(1, ready=False), pod(2, running=False), pod(3, deleting=True)]
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    found = members(pods, labels, "topology.kubernetes.io/zone")
    # Readiness never decides membership: wc-1 is not ready yet and is a member.
    assert [(m.id, m.zone, m.address) for m in found] == [
        ("wc-0", "zone-a", "127.0.0.10:7070"),
        ("wc-1", "zone-b", "127.0.0.11:7070"),
    ]
    assert not is_member(pod(4, waiting="CrashLoopBackOff"))


def test_the_assignment_uses_the_pods_layout_and_spreads_standbys_over_zones(
    nodes: list[Obj],
) -> None:
    _, membership = settled(body(), nodes)
    assignment = membership.assignment
    assert membership.generation == 1
    assert assignment.tasks == TASKS
    zone = {m.id: m.zone for m in assignment.members}
    for task in TASKS:
        (standby,) = assignment.standby_owners(task)
        assert zone[standby] != zone[assignment.active_owner(task)]


def test_an_unchanged_group_publishes_nothing_new(nodes: list[Obj]) -> None:
    app = body()
    pods, membership = settled(app, nodes)
    again = run(app, pods, nodes, reports=reports(), membership=membership)
    assert again.membership is None
    assert again.status.membership_generation == 1
    assert not [e for e in again.events if e.reason == "MembershipChanged"]


def test_a_pod_that_stops_running_is_dropped_and_its_standbys_promoted(nodes: list[Obj]) -> None:
    app = body()
    pods, membership = settled(app, nodes)
    lost = membership.assignment.tasks_of("wc-0").active
    pods[0] = pod(
        0,
        running=False,
        config_hash=pods[0]["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH],
    )
    result = run(app, pods, nodes, reports=reports(), membership=membership)
    assert result.membership is not None
    assert result.membership.generation == 2
    after = result.membership.assignment
    assert "wc-0" not in after.active
    for task in lost:
        assert after.active_owner(task) in membership.assignment.standby_owners(task)
    assert any(e.reason == "MembershipChanged" for e in result.events)


def test_with_every_pod_gone_the_last_assignment_stays(nodes: list[Obj]) -> None:
    app = body()
    _, membership = settled(app, nodes)
    result = run(app, [pod(i, running=False) for i in range(3)], nodes, membership=membership)
    assert result.membership is None
    assert result.status.membership_generation == 1


def test_ready_when_every_pod_is_ready_and_assigned(nodes: list[Obj]) -> None:
    app = body()
    pods, membership = settled(app, nodes)
    result = run(app, pods, nodes, reports=reports(), membership=membership)
    assert condition(result, "Ready") | {"lastTransitionTime": None} == {
        "type": "Ready",
        "status": "True",
        "reason": "AllReplicasReady",
        "message": "3/3 pods ready",
        "lastTransitionTime": None,
        "observedGeneration": 3,
    }
    assert result.status.phase == "Running"
    assert result.status.ready_replicas == 3
    assert result.status.revision == "1"
    assert condition(result, "Progressing")["status"] == "False"
    assert condition(result, "Degraded")["status"] == "False"


def test_last_transition_time_changes_only_with_the_status(nodes: list[Obj]) -> None:
    app = body()
    pods, membership = settled(app, nodes)
    first = run(app, pods, nodes, reports=reports(), membership=membership)
    app["status"] = dump_status(first.status)
    later = plan(
        Observed(
            body=app,
            pods=pods,
            nodes=nodes,
            reports=reports(),
            membership=membership,
            now="2026-11-23T11:00:00Z",
        )
    )
    assert condition(later, "Ready")["lastTransitionTime"] == "2026-11-23T10:00:00Z"
    app["status"] = dump_status(later.status)
    pods[1] = copy.deepcopy(pods[1])
    pods[1]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    flipped = plan(
        Observed(
            body=app,
            pods=pods,
            nodes=nodes,
            reports=reports(),
            membership=membership,
            now="2026-11-23T12:00:00Z",
        )
    )
    assert condition(flipped, "Ready")["status"] == "False"
    assert condition(flipped, "Ready")["lastTransitionTime"] == "2026-11-23T12:00:00Z"
    assert condition(flipped, "Degraded")["lastTransitionTime"] == "2026-11-23T10:00:00Z"


def test_standbys_beyond_replicas_minus_one_are_capped_without_degrading(
    nodes: list[Obj],
) -> None:
    app = body(replicas=2, config={"num.standby.replicas": 3})
    result = run(app, [], nodes)
    assert "num.standby.replicas 3 capped at 1" in result.status.message
    assert [e.reason for e in result.events] == ["StandbysCapped"]
    assert condition(result, "Degraded")["status"] == "False"
    app["status"] = dump_status(result.status)
    assert not [e for e in run(app, [], nodes).events if e.reason == "StandbysCapped"]


def test_an_invalid_spec_degrades_names_the_field_and_changes_nothing(nodes: list[Obj]) -> None:
    app = body()
    pods, membership = settled(app, nodes)
    app["spec"]["config"] = {"default.state.isolation.level": "SNAPSHOT"}
    result = run(app, pods, nodes, reports=reports(), membership=membership)
    degraded = condition(result, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert 'spec.config."default.state.isolation.level"' in degraded["message"]
    assert "READ_COMMITTED" in degraded["message"]
    assert result.objects == []
    assert result.delete_pods == []
    assert result.status.phase == "Degraded"
    assert result.status.observed_generation == 3
    assert [e.reason for e in result.events] == ["InvalidSpec"]


def test_a_config_typo_degrades_naming_the_key_and_the_known_ones(nodes: list[Obj]) -> None:
    """Issue 23 item 11: the CRD keeps an unknown spec.config key; the operator refuses it."""
    app = body()
    pods, membership = settled(app, nodes)
    app["spec"]["config"] = {"num.standby.replica": 1}
    result = run(app, pods, nodes, reports=reports(), membership=membership)
    degraded = condition(result, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert 'spec.config."num.standby.replica"' in degraded["message"]
    assert 'did you mean "num.standby.replicas"?' in degraded["message"]
    assert "'processing.guarantee'" in degraded["message"]  # the known ones are listed
    assert result.objects == []
    assert result.delete_pods == []


def test_failover_still_works_while_the_spec_is_invalid(nodes: list[Obj]) -> None:
    app = body()
    pods, membership = settled(app, nodes)
    applied = run(app, pods, nodes).objects[3]["data"][names.MANIFEST_KEY]
    app["spec"]["replicas"] = -1  # refused by the model (minimum 0)
    pods[2] = pod(2, running=False)
    result = run(
        app, pods, nodes, reports=reports(), membership=membership, applied_manifest=applied
    )
    assert condition(result, "Degraded")["reason"] == "InvalidSpec"
    assert "spec.replicas" in condition(result, "Degraded")["message"]
    assert result.membership is not None
    assert "wc-2" not in result.membership.assignment.active


def test_a_name_too_long_for_pod_names_is_an_invalid_spec(nodes: list[Obj]) -> None:
    app = body()
    app["metadata"]["name"] = "a" * 48
    result = run(app, [], nodes)
    assert "metadata.name" in condition(result, "Degraded")["message"]


def test_a_config_change_restarts_one_pod_at_a_time_when_all_are_ready(nodes: list[Obj]) -> None:
    app = body()
    pods, membership = settled(app, nodes)
    app["spec"]["config"] = {"num.standby.replicas": 1, "commit.interval.ms": 50}
    result = run(app, pods, nodes, reports=reports(), membership=membership)
    assert result.delete_pods == ["wc-2"]
    assert condition(result, "Progressing")["reason"] == "RollingUpdate"
    pods[2] = pod(2, deleting=True, config_hash="old")
    waiting = run(app, pods, nodes, reports=reports(), membership=membership)
    assert waiting.delete_pods == []
    pods[2] = pod(2, ready=False, config_hash=current_hash(app, nodes))
    assert run(app, pods, nodes, reports=reports(), membership=membership).delete_pods == []


def test_the_rollout_waits_for_restores_and_for_standbys_to_catch_up(nodes: list[Obj]) -> None:
    app = body()
    pods, membership = settled(app, nodes)
    app["spec"]["image"] = "example/wordcount:2"
    restoring = {**reports(), "wc-1": report("wc-1", roles={0: ("restoring", 50)})}
    result = run(app, pods, nodes, reports=restoring, membership=membership)
    assert result.delete_pods == []
    assert "wc-1 to restore" in condition(result, "Progressing")["message"]
    lagging = {
        **reports(),
        "wc-0": report("wc-0", roles={1: ("standby", ROLL_MAX_STANDBY_LAG + 1)}),
    }
    result = run(app, pods, nodes, reports=lagging, membership=membership)
    assert result.delete_pods == []
    assert result.status.max_standby_lag == ROLL_MAX_STANDBY_LAG + 1


def test_a_new_topology_revision_restarts_every_pod_together(nodes: list[Obj]) -> None:
    app = body()
    pods, membership = settled(app, nodes)
    app["spec"]["topology"] = {"ref": "wordcount:topology", "revision": "2"}
    result = run(app, pods, nodes, reports=reports(), membership=membership)
    assert sorted(result.delete_pods) == ["wc-0", "wc-1", "wc-2"]
    assert condition(result, "Progressing")["reason"] == "TopologyUpgrade"
    assert result.status.revision == "1"  # still what runs


def test_suspend_scales_to_zero_and_restarts_nothing(nodes: list[Obj]) -> None:
    app = body(suspend=True)
    pods, membership = settled(body(), nodes)
    app["spec"]["image"] = "example/wordcount:2"
    result = run(app, pods, nodes, reports=reports(), membership=membership)
    assert stateful_set(result.objects)["spec"]["replicas"] == 0
    assert result.delete_pods == []
    assert result.status.phase == "Suspended"
    assert condition(result, "Ready")["reason"] == "Suspended"


def test_replicas_scaled_to_zero_is_a_suspension(nodes: list[Obj]) -> None:
    """Issue 23, item 11: `kubectl scale --replicas=0` (or an HPA/KEDA) suspends the app."""
    pods, membership = settled(body(), nodes)
    app = body(replicas=0)
    app["spec"]["image"] = "example/wordcount:2"
    result = run(app, pods, nodes, reports=reports(), membership=membership)
    assert stateful_set(result.objects)["spec"]["replicas"] == 0
    assert result.delete_pods == []  # no rollout of pods that are going away
    assert result.status.phase == "Suspended"
    ready = condition(result, "Ready")
    assert ready["reason"] == "Suspended" and "spec.replicas is 0" in ready["message"]
    assert condition(result, "Degraded")["status"] == "False"


def test_the_embedded_log_is_pinned_to_one_node_and_stays_there() -> None:
    app = body(log={"url": "sqlite:///log.db"})
    nodes = [node("node-b", "zone-b"), node("node-a", "zone-a", ready=False), node("node-c", "c")]
    result = run(app, [], nodes)
    assert result.status.log_node == "node-b"
    assert "development only" in result.status.message
    app["status"] = {"logNode": "node-c"}
    assert run(app, [], nodes).status.log_node == "node-c"


def test_without_a_node_the_embedded_log_waits_and_no_pods_are_made() -> None:
    result = run(body(log={"url": "sqlite:///log.db"}), [], [])
    assert "StatefulSet" not in [o["kind"] for o in result.objects]
    assert "waiting for a ready node" in result.status.message


def test_crash_looping_pods_degrade_the_app(nodes: list[Obj]) -> None:
    app = body()
    pods, membership = settled(app, nodes)
    pods[1] = pod(1, waiting="CrashLoopBackOff")
    result = run(app, pods, nodes, reports=reports(), membership=membership)
    assert condition(result, "Degraded")["reason"] == "CrashLoopBackOff"
    assert result.status.phase == "Degraded"
    assert any(e.type == "Warning" for e in result.events)


def test_pods_of_other_apps_are_ignored(nodes: list[Obj]) -> None:
    result = run(body(), [pod(0, app="other")], nodes, reports={})
    assert result.status.replicas == 0


def test_the_embedded_log_is_never_shared_across_nodes(nodes: list[Obj]) -> None:
    app = body(log={"url": "sqlite:///log.db"})
    app["status"] = {"logNode": "node-0"}
    config_hash = current_hash(app, nodes)
    pods = [pod(i, node_name="node-0", config_hash=config_hash) for i in range(3)]
    pods[1] = pod(1, node_name="node-2", config_hash=config_hash)
    result = run(app, pods, nodes, reports=reports())
    assert result.delete_pods == ["wc-1"]
    degraded = condition(result, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "LogSharedAcrossNodes")
    assert "node-0" in degraded["message"]
    assert any(e.reason == "LogSharedAcrossNodes" for e in result.events)
    pods[1] = pod(1, node_name="node-0", config_hash=config_hash)
    assert run(app, pods, nodes, reports=reports()).delete_pods == []


def test_a_deleted_membership_continues_from_the_last_generation(nodes: list[Obj]) -> None:
    """Issue 23, item 11: a membership ConfigMap deleted by hand comes back at the next
    generation (status.membershipGeneration), not at 1."""
    app = body()
    app["status"] = {"membershipGeneration": 7}
    config_hash = current_hash(app, nodes)
    pods = [pod(i, config_hash=config_hash) for i in range(3)]
    result = run(app, pods, nodes, reports=reports(3), membership=None)
    assert result.membership is not None and result.membership.generation == 8
    assert result.status.membership_generation == 8


def test_a_pod_that_rebuilt_a_store_makes_the_app_degraded_naming_the_kept_copy(
    nodes: list[Obj],
) -> None:
    """Issue 22: a rebuild that lost state from the changelog is loud on a cluster too."""
    app = body()
    pods, membership = settled(app, nodes)
    kept = "/var/lib/eddyline/state/.quarantine/1_0-counts-20261125T120000Z-ahead"
    rebuilt = reports()
    rebuilt["wc-1"] = replace(rebuilt["wc-1"], stores_set_aside=(kept,))
    result = run(app, pods, nodes, reports=rebuilt, membership=membership)
    [degraded] = [c for c in result.status.conditions if c.type == "Degraded"]
    assert (degraded.status.value, degraded.reason) == ("True", "StateRebuilt")
    assert f"wc-1: {kept}" in degraded.message and "republish" in degraded.message
    assert any(e.reason == "StateRebuilt" and e.type == "Warning" for e in result.events)
    calm = run(app, pods, nodes, reports=reports(), membership=membership)
    [after] = [c for c in calm.status.conditions if c.type == "Degraded"]
    assert after.reason == "AsExpected"


def lag_report(member: str, lags: dict[int, tuple[str, int]]) -> MemberReport:
    """A report whose store names its sub-topology, so its copies count as warm-up lags."""
    return replace(report(member, roles=lags), store_owners={"counts": 0})


def test_scaling_out_warms_the_new_pod_before_moving_tasks_to_it(nodes: list[Obj]) -> None:
    app = body(replicas=4)
    config_hash = current_hash(app, nodes)
    pods = [pod(i, config_hash=config_hash) for i in range(3)]
    before = run(app, pods, nodes, reports=reports(3)).membership
    assert before is not None
    owner = {t: before.assignment.active_owner(t) for t in TASKS}
    # Each pod reports its own copies (active or standby) as caught up.
    old = {}
    for member in ("wc-0", "wc-1", "wc-2"):
        mine = before.assignment.tasks_of(member)
        roles = {t.partition: ("active", 0) for t in mine.active}
        roles.update({t.partition: ("standby", 0) for t in mine.standby})
        old[member] = lag_report(member, roles)
    pods.append(pod(3, config_hash=config_hash))
    # wc-3 runs but holds nothing yet: no stateful task may move to it cold.
    step = run(app, pods, nodes, reports={**old, "wc-3": lag_report("wc-3", {})}, membership=before)
    assert step.membership is not None
    warming = step.membership.assignment
    assert {warming.active_owner(t) for t in TASKS} == {owner[t] for t in TASKS} - {"wc-3"}
    assert all(warming.active_owner(t) == owner[t] for t in TASKS)
    assert 1 <= warming.warmup_count <= 2  # max.warmup.replicas' default
    warm = warming.tasks_of("wc-3").warmup
    assert warm
    (changed,) = [e for e in step.events if e.reason == "MembershipChanged"]
    assert f"{warming.warmup_count} warming up before they move" in changed.message
    # Its warm-ups still trail by more than acceptable.recovery.lag: nothing moves.
    behind = lag_report("wc-3", {t.partition: ("standby", 10_001) for t in warm})
    again = run(app, pods, nodes, reports={**old, "wc-3": behind}, membership=step.membership)
    assert again.membership is None
    # Caught up: the next cycle moves them (the lags are the trigger, no timer).
    caught_up = lag_report("wc-3", {t.partition: ("standby", 10_000) for t in warm})
    moved = run(app, pods, nodes, reports={**old, "wc-3": caught_up}, membership=step.membership)
    assert moved.membership is not None
    assert moved.membership.generation == step.membership.generation + 1
    assert moved.membership.assignment.tasks_of("wc-3").active & warm


def test_the_apps_config_bounds_the_warm_ups(nodes: list[Obj]) -> None:
    config = {"num.standby.replicas": 0, "max.warmup.replicas": 1, "acceptable.recovery.lag": 5}
    app = body(replicas=2, config=config)
    config_hash = current_hash(app, nodes)
    pods = [pod(0, config_hash=config_hash)]
    before = run(app, pods, nodes, reports=reports(1)).membership
    assert before is not None
    old = {"wc-0": lag_report("wc-0", {t.partition: ("active", 0) for t in TASKS})}
    pods.append(pod(1, config_hash=config_hash))
    step = run(app, pods, nodes, reports={**old, "wc-1": lag_report("wc-1", {})}, membership=before)
    assert step.membership is not None
    assert step.membership.assignment.warmup_count == 1
    assert step.membership.assignment.tasks_of("wc-1").active == frozenset()
    (warm,) = step.membership.assignment.tasks_of("wc-1").warmup
    # 6 records behind is more than acceptable.recovery.lag 5: it stays a warm-up.
    six = {"wc-1": lag_report("wc-1", {warm.partition: ("standby", 6)})}
    assert (
        run(app, pods, nodes, reports={**old, **six}, membership=step.membership).membership is None
    )


def paused(app: Obj, value: str = "true") -> Obj:
    app["metadata"] = {**app["metadata"], "annotations": {names.ANNOTATION_PAUSE: value}}
    return app


def test_a_paused_app_records_paused_and_changes_nothing(nodes: list[Obj]) -> None:
    app = body()
    pods, membership = settled(app, nodes)
    running = run(app, pods, nodes, reports=reports(), membership=membership)
    app["status"] = dump_status(running.status)
    # While paused: a spec change, an outdated pod and a pod that stopped (a failover) would
    # each make the operator act; none does.
    paused(app)
    app["spec"]["replicas"] = 5
    pods[0] = pod(0, running=False, config_hash="outdated")
    result = run(app, pods, nodes, reports=reports(), membership=membership)
    assert result.paused
    assert (result.objects, result.membership, result.delete_pods, result.create_jobs) == (
        [],
        None,
        [],
        [],
    )
    assert not result.write_ahead
    stopped = condition(result, "Paused")
    assert (stopped["status"], stopped["reason"]) == ("True", "ReconciliationPaused")
    assert names.ANNOTATION_PAUSE in stopped["message"]
    assert f"kubectl annotate streamapp wc {names.ANNOTATION_PAUSE}-" in stopped["message"]
    # Everything else in status is what it was.
    before = running.status.model_dump(exclude={"conditions"})
    assert result.status.model_dump(exclude={"conditions"}) == before
    assert [e.reason for e in result.events] == ["ReconciliationPaused"]
    # The next paused cycle has nothing new to say.
    app["status"] = dump_status(result.status)
    again = run(app, pods, nodes, reports=reports(), membership=membership)
    assert again.events == [] and again.status == result.status


def test_removing_the_annotation_resumes(nodes: list[Obj]) -> None:
    app = body()
    pods, membership = settled(app, nodes)
    app["status"] = dump_status(run(paused(app), pods, nodes, reports=reports()).status)
    del app["metadata"]["annotations"][names.ANNOTATION_PAUSE]
    pods[0] = pod(
        0,
        running=False,
        config_hash=pods[0]["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH],
    )
    resumed = run(app, pods, nodes, reports=reports(), membership=membership)
    assert not resumed.paused
    assert resumed.objects and resumed.membership is not None  # the failover happens now
    assert "Paused" not in {c["type"] for c in conditions(resumed)}
    assert "ReconciliationResumed" in {e.reason for e in resumed.events}


@pytest.mark.parametrize("value", ["false", "", "yes"])
def test_only_true_pauses(nodes: list[Obj], value: str) -> None:
    result = run(paused(body(), value), [], nodes)
    assert not result.paused and result.objects
    assert "Paused" not in {c["type"] for c in conditions(result)}
