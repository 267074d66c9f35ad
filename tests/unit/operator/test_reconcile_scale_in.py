"""Scaling in: leaving pods hand their tasks over, the StatefulSet shrinks one pod at a time."""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_operator.reconcile import names, objects
from eddyline_operator.reconcile.membership import leaving_members, members, nobody_takes_over
from eddyline_operator.reconcile.plan import Observed, Plan, plan
from eddyline_operator.reconcile.scale_in import plan_scale_in
from eddyline_operator.reconcile.status_record import dump_status
from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.cluster_membership import TERMINATION_GRACE_ENV
from eddyline_runtime.membership import MemberReport, Membership, StoreCopy, StoreRole
from eddyline_runtime.partitions import TaskId
from tests.support.k8s_objects import body, pod, stateful_set, three_zones

Obj = dict[str, Any]
TASKS = frozenset(TaskId(0, p) for p in range(6))


def report(
    member: str, copies: dict[int, tuple[StoreRole, int]], *, leaving: bool = False
) -> MemberReport:
    return MemberReport(
        member=member,
        topology_hash="abc",
        tasks=TASKS,
        stateful=TASKS,
        stores={"counts": {p: StoreCopy(role, lag) for p, (role, lag) in copies.items()}},
        ready=True,
        store_owners={"counts": 0},
        leaving=leaving,
    )


def reports_of(membership: Membership, *, lag: int = 0) -> dict[str, MemberReport]:
    """What the members report for ``membership``: actives, and standbys/warm-ups at ``lag``."""
    found = {}
    for member_id in membership.assignment.active:
        mine = membership.assignment.tasks_of(member_id)
        copies = {t.partition: (StoreRole.ACTIVE, 0) for t in mine.active}
        copies |= {t.partition: (StoreRole.STANDBY, lag) for t in mine.standby | mine.warmup}
        found[member_id] = report(member_id, copies)
    return found


def run(app: Obj, pods: list[Obj], **observed: Any) -> Plan:
    return plan(
        Observed(body=app, pods=pods, nodes=three_zones(), now="2026-11-25T10:00:00Z", **observed)
    )


def hashed_pods(app: Obj, count: int) -> list[Obj]:
    template = stateful_set(run(app, []).objects)["spec"]["template"]
    config_hash = template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
    return [pod(i, config_hash=config_hash) for i in range(count)]


def replicas(result: Plan) -> int:
    return int(stateful_set(result.objects)["spec"]["replicas"])


def condition(result: Plan, type_: str) -> Obj | None:
    for c in result.status.conditions:
        if c.type == type_:
            return c.model_dump(mode="json", by_alias=True)
    return None


def reports_of_or_empty(membership: Membership | None) -> dict[str, MemberReport]:
    if membership is None:
        return {f"wc-{i}": report(f"wc-{i}", {}) for i in range(3)}
    return reports_of(membership)


def three_settled(app: Obj) -> tuple[list[Obj], Membership]:
    pods = hashed_pods(app, 3)
    first = run(app, pods, reports=reports_of_or_empty(None))
    assert first.membership is not None
    membership = first.membership
    for _ in range(10):
        again = run(app, pods, membership=membership, reports=reports_of(membership))
        if again.membership is None:
            return pods, membership
        membership = again.membership
    raise AssertionError("three pods never settled")


def test_spec_replicas_lowered_keeps_the_stateful_set_until_the_top_pod_handed_over() -> None:
    pods, membership = three_settled(body())
    assert membership.assignment.active["wc-2"], "the pod to remove runs tasks"
    smaller = body(replicas=1)

    # Cycle 1: wc-1 and wc-2 are leaving; their tasks move to caught-up standbys on wc-0
    # where there are some; the StatefulSet keeps 3 pods meanwhile.
    first = run(smaller, pods, membership=membership, reports=reports_of(membership, lag=10**6))
    assert replicas(first) == 3
    assert first.membership is not None
    assert first.membership.assignment.leaving == {"wc-1", "wc-2"}
    ours = first.membership.assignment
    for leaving in ("wc-1", "wc-2"):
        assert ours.active[leaving] <= membership.assignment.active[leaving]
        assert not ours.standby[leaving] and not ours.warmup[leaving]
    scaling = condition(first, "ScalingIn")
    assert scaling is not None and scaling["status"] == "True", first.status
    assert "draining wc-2" in scaling["message"]
    assert any(e.reason == "DrainingPod" for e in first.events)

    # Not Ready while the membership the pods follow still has leaving members.
    handing = run(smaller, pods, membership=first.membership, reports=reports_of(membership))
    ready = condition(handing, "Ready")
    assert ready is not None and ready["status"] == "False"
    assert "wc-1, wc-2 handing over" in ready["message"]

    # Warm-ups and standbys report caught up: the tasks move, then wc-2 goes.
    published = first.membership
    for _ in range(10):
        result = run(smaller, pods, membership=published, reports=reports_of(published))
        if result.membership is None:
            break
        published = result.membership
    assert not published.assignment.active["wc-2"]
    assert not published.assignment.active["wc-1"]
    assert published.assignment.active["wc-0"] == TASKS
    assert replicas(result) == 2, "the highest pod first, one at a time"
    assert any(e.reason == "PodHandedOver" for e in result.events)

    # wc-2 terminating: wc-1 waits for it, then goes too.
    config_hash = pods[2]["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
    pods[2] = pod(2, deleting=True, config_hash=config_hash)
    waiting = run(smaller, pods, membership=published, reports=reports_of(published))
    assert replicas(waiting) == 2
    assert "wc-2 still terminating" in waiting.status.message
    gone = run(smaller, pods[:2], membership=published, reports=reports_of(published))
    assert replicas(gone) == 1
    # Once nothing is above spec.replicas, ScalingIn turns False.
    done = run(
        {**smaller, "status": dump_status(gone.status)},
        pods[:1],
        membership=published,
        reports=reports_of(published),
    )
    assert replicas(done) == 1
    scaled = condition(done, "ScalingIn")
    assert scaled is not None and scaled["status"] == "False" and scaled["reason"] == "ScaleInDone"


def test_a_task_without_a_caught_up_copy_stays_on_the_leaving_pod_and_warms_up_elsewhere() -> None:
    app = body(config={"processing.guarantee": "exactly_once_v2", "num.standby.replicas": 0})
    pods, membership = three_settled(app)
    held = membership.assignment.active["wc-2"]
    smaller = {**app, "spec": {**app["spec"], "replicas": 2}}
    result = run(smaller, pods, membership=membership, reports=reports_of(membership))
    assert result.membership is not None
    assignment = result.membership.assignment
    # No standbys: nobody is caught up, so wc-2 keeps its tasks and warm-ups start.
    assert assignment.active["wc-2"] == held
    assert assignment.warmup_count == min(len(held), 2)
    assert replicas(result) == 3
    assert "still runs" in result.status.message


def test_the_one_at_a_time_plan() -> None:
    pods = [pod(i) for i in range(4)]
    tasks = [TaskId(0, p) for p in range(4)]
    everything_on_0 = Membership(
        4,
        Assignment(
            active={"wc-0": frozenset(tasks), "wc-1": frozenset(), "wc-2": frozenset()},
            standby={},
        ),
    )
    # Nothing above spec.replicas: spec.replicas as it is.
    assert plan_scale_in(4, pods, None, {}).replicas == 4
    assert not plan_scale_in(4, pods, None, {}).active
    assert plan_scale_in(6, pods, None, {}).replicas == 6
    # Suspending is no scale-in: every pod goes at once.
    assert plan_scale_in(0, pods, None, {}).replicas == 0
    # wc-3 holds nothing (not even in the membership): it goes at once; wc-1, wc-2 leave.
    step = plan_scale_in(1, pods, everything_on_0, {})
    assert (step.replicas, step.draining, step.lowered) == (3, "wc-3", True)
    assert step.removing == {"wc-1", "wc-2", "wc-3"}
    # wc-3 still terminating: the next waits.
    pods[3] = pod(3, deleting=True)
    step = plan_scale_in(1, pods, everything_on_0, {})
    assert (step.replicas, step.draining, step.lowered) == (3, "wc-2", False)
    assert "wc-3 still terminating" in step.message
    # Gone; but wc-0 still restores a copy it took over.
    restoring = {"wc-0": report("wc-0", {0: (StoreRole.RESTORING, 500)})}
    step = plan_scale_in(1, pods[:3], everything_on_0, restoring)
    assert (step.replicas, step.lowered) == (3, False)
    assert "wc-0 still restoring" in step.message
    step = plan_scale_in(1, pods[:3], everything_on_0, {})
    assert (step.replicas, step.draining, step.lowered) == (2, "wc-2", True)
    # A pod that still runs a task is not removed.
    busy = Membership(
        5,
        Assignment(active={"wc-0": frozenset(tasks[:3]), "wc-1": frozenset(tasks[3:])}, standby={}),
    )
    step = plan_scale_in(1, pods[:2], busy, {})
    assert (step.replicas, step.draining, step.lowered) == (2, "wc-1", False)
    assert "wc-1 still runs 1 active task" in step.message


def test_a_pod_being_deleted_is_a_leaving_member_while_its_container_runs() -> None:
    pods = [pod(0), pod(1, deleting=True), pod(2, deleting=True, running=False)]
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in three_zones()}
    zone = "topology.kubernetes.io/zone"
    assert [m.id for m in members(pods, labels, zone)] == ["wc-0"]
    assert [m.id for m in members(pods, labels, zone, leaving=True)] == ["wc-0", "wc-1"]
    said_so = {"wc-0": report("wc-0", {}, leaving=True)}
    assert leaving_members(pods, {}) == {"wc-1"}
    assert leaving_members(pods, said_so, removing={"wc-4"}) == {"wc-0", "wc-1", "wc-4"}
    # On a lost node it is no member at all.
    assert leaving_members(pods, {}, lost={"node-1"}) == frozenset()


def test_a_held_membership_tells_stopping_pods_that_nobody_takes_over() -> None:
    assignment = Assignment(
        active={"wc-0": frozenset({TaskId(0, 0)}), "wc-1": frozenset({TaskId(0, 1)})},
        standby={},
        members=(Member("wc-0"), Member("wc-1")),
    )
    previous = Membership(7, assignment)
    assert nobody_takes_over(previous, [pod(0), pod(1)]) is None
    told = nobody_takes_over(previous, [pod(0, deleting=True), pod(1)])
    assert told is not None and told.generation == 8
    assert told.assignment.leaving == {"wc-0", "wc-1"}
    assert told.assignment.handed_over("wc-0") and told.assignment.handed_over("wc-1")
    assert nobody_takes_over(told, [pod(0, deleting=True)]) is None


@pytest.mark.parametrize("replicas_", [1, 3])
def test_pods_learn_their_grace_period_and_the_pdb_selects_them(replicas_: int) -> None:
    result = run(body(replicas=replicas_), [])
    sts = stateful_set(result.objects)
    pod_spec = sts["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod_spec["containers"][0]["env"]}
    assert env[TERMINATION_GRACE_ENV] == str(pod_spec["terminationGracePeriodSeconds"])
    assert objects.TERMINATION_GRACE_ENV == TERMINATION_GRACE_ENV
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    pdb = next(o for o in result.objects if o["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())
