"""Issue 23, item 11: a deleted membership ConfigMap comes back sticky, seeded from where
the pods' reports say their stores are (and at the next generation)."""

from __future__ import annotations

from typing import Any

from eddyline_operator.reconcile import names
from eddyline_operator.reconcile.membership import (
    TaskLayout,
    assignment_from_reports,
    next_membership,
)
from eddyline_operator.reconcile.plan import Observed, Plan, plan
from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.membership import MemberReport, Membership, StoreCopy, StoreRole
from eddyline_runtime.partitions import TaskId
from tests.support.k8s_objects import body, pod, stateful_set, three_zones

Obj = dict[str, Any]
TASKS = frozenset(TaskId(0, p) for p in range(4))
ACTIVE, STANDBY = StoreRole.ACTIVE, StoreRole.STANDBY
# Where the state is: not where a fresh assignment would put it.
HELD: dict[str, dict[int, StoreRole]] = {
    "wc-0": {1: ACTIVE, 3: STANDBY},
    "wc-1": {2: ACTIVE, 0: STANDBY},
    "wc-2": {0: ACTIVE, 3: ACTIVE, 1: STANDBY, 2: STANDBY},
}


def report(member: str, held: dict[int, StoreRole]) -> MemberReport:
    return MemberReport(
        member=member,
        topology_hash="abc",
        tasks=TASKS,
        stateful=TASKS,
        stores={"counts": {p: StoreCopy(role, 0) for p, role in held.items()}},
        ready=True,
        store_owners={"counts": 0},
    )


def run(app: Obj, reports: dict[str, MemberReport]) -> Plan:
    template = stateful_set(plan(Observed(body=app, nodes=three_zones())).objects)["spec"]
    config_hash = template["template"]["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
    pods = [pod(i, config_hash=config_hash) for i in range(3)]
    return plan(
        Observed(
            body=app,
            pods=pods,
            nodes=three_zones(),
            now="2026-11-23T10:00:00Z",
            reports=reports,
            membership=None,  # the ConfigMap was deleted
        )
    )


def test_the_seed_is_where_the_stores_are() -> None:
    reports = {m: report(m, held) for m, held in HELD.items()}
    seed = assignment_from_reports(reports, TaskLayout("abc", TASKS, TASKS))
    assert seed is not None
    assert seed.active == {
        "wc-0": {TaskId(0, 1)},
        "wc-1": {TaskId(0, 2)},
        "wc-2": {TaskId(0, 0), TaskId(0, 3)},
    }
    assert seed.standby_owners(TaskId(0, 3)) == ["wc-0"]
    # Another topology's stores, or none: nothing to seed from.
    assert assignment_from_reports(reports, TaskLayout("other", TASKS, TASKS)) is None


def test_a_deleted_membership_comes_back_sticky_at_the_next_generation() -> None:
    app = body()
    app["status"] = {"membershipGeneration": 7}
    result = run(app, {m: report(m, held) for m, held in HELD.items()})
    assert result.membership is not None and result.membership.generation == 8
    assignment = result.membership.assignment
    for member, held in HELD.items():
        for partition, role in held.items():
            if role is ACTIVE:
                assert assignment.active_owner(TaskId(0, partition)) == member
    # Without reports of stores, the same cycle assigns afresh: elsewhere (the test's point).
    fresh = run(app, {m: report(m, {}) for m in HELD})
    assert fresh.membership is not None
    assert fresh.membership.assignment.active != assignment.active


def test_two_members_claiming_a_task_active_do_not_break_the_seed() -> None:
    reports = {
        "wc-0": report("wc-0", {0: ACTIVE}),
        "wc-1": report("wc-1", {0: ACTIVE, 1: STANDBY}),  # 1 has no active copy anywhere
    }
    seed = assignment_from_reports(reports, TaskLayout("abc", TASKS, TASKS))
    assert seed is not None
    assert seed.active_owner(TaskId(0, 0)) == "wc-0"
    assert seed.standby == {"wc-0": frozenset(), "wc-1": frozenset()}


def test_a_published_assignment_without_tasks_seeds_from_the_reports_too() -> None:
    """An upgrade's reset membership lists the members (for query routing) but hands out no
    task: like a deleted one, it gives nothing to stay with, so the next assignment starts
    where the stores are (a status that lost its upgrade record must not rebuild them)."""
    reports = {m: report(m, held) for m, held in HELD.items()}
    listed = Assignment(active={}, standby={}, members=tuple(Member(m) for m in sorted(HELD)))
    following = next_membership(
        Membership(5, listed),
        [Member(m, zone=f"z{i}") for i, m in enumerate(sorted(HELD))],
        TaskLayout("abc", TASKS, TASKS),
        0,
        reports=reports,
    )
    assert following is not None and following.generation == 6
    for member, held in HELD.items():
        for partition, role in held.items():
            if role is ACTIVE:
                assert following.assignment.active_owner(TaskId(0, partition)) == member
