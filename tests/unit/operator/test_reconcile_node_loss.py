"""Issue 23, item 2: a pod on a lost node leaves the membership after a short grace, not
when the node lifecycle controller evicts it (about 5 minutes later)."""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_operator.handlers import node_grace_seconds
from eddyline_operator.reconcile import names
from eddyline_operator.reconcile.membership import lost_nodes, next_node_check
from eddyline_operator.reconcile.plan import Observed, Plan, plan
from eddyline_runtime.membership import MemberReport, Membership
from eddyline_runtime.partitions import TaskId
from tests.support.k8s_objects import body, pod, stateful_set, three_zones

Obj = dict[str, Any]
TASKS = frozenset(TaskId(0, p) for p in range(4))
NOW = "2026-11-23T10:00:00Z"


def lease(node: str, renewed: str) -> Obj:
    return {
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"renewTime": renewed},
    }


def fresh_leases() -> list[Obj]:
    return [lease(f"node-{i}", "2026-11-23T09:59:55.123456Z") for i in range(3)]


def reports() -> dict[str, MemberReport]:
    return {
        f"wc-{i}": MemberReport(
            member=f"wc-{i}",
            topology_hash="abc",
            tasks=TASKS,
            stateful=TASKS,
            stores={},
            ready=True,
        )
        for i in range(3)
    }


def run(pods: list[Obj], **observed: Any) -> Plan:
    return plan(Observed(body=body(), pods=pods, nodes=three_zones(), now=NOW, **observed))


def settled() -> tuple[list[Obj], Membership]:
    template = stateful_set(run([]).objects)["spec"]["template"]
    config_hash = template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
    pods = [pod(i, config_hash=config_hash) for i in range(3)]
    first = run(pods, reports=reports(), leases=fresh_leases())
    assert first.membership is not None
    assert {m.id for m in first.membership.assignment.members} == {"wc-0", "wc-1", "wc-2"}
    return pods, first.membership


def test_a_lease_unrenewed_beyond_the_grace_loses_the_node() -> None:
    leases = [
        lease("node-0", "2026-11-23T09:59:44.000000Z"),  # 16 s ago
        lease("node-1", "2026-11-23T09:59:46.000000Z"),  # 14 s ago
    ]
    lost = lost_nodes(three_zones(), leases, now=NOW, grace=15)
    assert list(lost) == ["node-0"]
    assert "2026-11-23T09:59:44.000000Z" in lost["node-0"]
    assert lost_nodes(three_zones(), leases, now=NOW, grace=20) == {}


def test_a_node_not_ready_beyond_the_grace_is_lost_even_without_a_lease() -> None:
    nodes = three_zones()
    nodes[2]["status"]["conditions"] = [
        {"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-11-23T09:59:30Z"}
    ]
    nodes[1]["status"]["conditions"] = [
        {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-23T09:59:55Z"}
    ]
    lost = lost_nodes(nodes, [], now=NOW, grace=15)
    assert list(lost) == ["node-2"]
    assert "Unknown since 2026-11-23T09:59:30Z" in lost["node-2"]


def test_the_pods_of_a_lost_node_leave_the_membership_and_their_tasks_move() -> None:
    pods, membership = settled()
    moved = membership.assignment.tasks_of("wc-1").active
    leases = fresh_leases()
    leases[1] = lease("node-1", "2026-11-23T09:59:40.000000Z")  # wc-1's node, 20 s ago
    # The pod still looks Running and started: its kubelet died before saying otherwise.
    result = run(pods, reports=reports(), membership=membership, leases=leases)
    assert result.membership is not None and result.membership.generation == 2
    after = result.membership.assignment
    assert {m.id for m in after.members} == {"wc-0", "wc-2"}
    for task in moved:
        assert after.active_owner(task) in membership.assignment.standby_owners(task)
    assert "wc-1 left the membership: node node-1 is lost" in (result.status.message or "")
    assert [e.reason for e in result.events if e.type == "Warning"] == ["NodeLost"]
    # Degraded (not Progressing: nothing progresses until the node or the pod is gone).
    conditions = {c.type: c for c in result.status.conditions}
    assert result.status.phase == "Degraded"
    assert conditions["Degraded"].reason == "NodeLost"
    assert "wc-1 (node node-1)" in conditions["Degraded"].message
    assert conditions["Ready"].status == "False"
    # The next cycle sees the same: no new membership, no second warning (status says it).
    status = result.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    again = plan(
        Observed(
            body={**body(), "status": status},
            pods=pods,
            nodes=three_zones(),
            now="2026-11-23T10:00:02Z",
            reports=reports(),
            membership=result.membership,
            leases=leases,
        )
    )
    assert again.membership is None
    assert not [e for e in again.events if e.reason == "NodeLost"]


def test_a_lease_within_the_grace_keeps_the_pods_and_says_when_to_look_again() -> None:
    pods, membership = settled()
    leases = fresh_leases()
    leases[0] = lease("node-0", "2026-11-23T09:59:48.000000Z")  # 12 s ago
    result = run(
        pods, reports=reports(), membership=membership, leases=leases, node_grace_seconds=15
    )
    assert result.membership is None  # unchanged
    # node-0's Lease passes its grace in 3 s: the daemon must run a cycle then.
    assert result.recheck_seconds == pytest.approx(3.0)
    assert next_node_check(["node-1"], leases, now=NOW, grace=15) == pytest.approx(10.123456)
    assert next_node_check(["node-9"], leases, now=NOW, grace=15) is None


def test_the_grace_comes_from_the_environment_and_a_bad_one_is_refused() -> None:
    assert node_grace_seconds({}) == 15.0
    assert node_grace_seconds({"EDDYLINE_OPERATOR_NODE_GRACE_SECONDS": "20"}) == 20.0
    with pytest.raises(ValueError, match="EDDYLINE_OPERATOR_NODE_GRACE_SECONDS='0'"):
        node_grace_seconds({"EDDYLINE_OPERATOR_NODE_GRACE_SECONDS": "0"})


def test_when_every_pod_is_on_a_lost_node_nobody_is_published_and_status_says_so() -> None:
    """Issue 38: the message said the tasks ran on the other pods when there were none, and
    the published membership still listed the three lost pods."""
    pods, membership = settled()
    stale = [lease(f"node-{i}", "2026-11-23T09:59:40.000000Z") for i in range(3)]
    result = run(pods, reports=reports(), membership=membership, leases=stale)
    assert result.membership is not None and result.membership.generation == 2
    assert not result.membership.assignment.active
    assert not result.membership.assignment.members
    degraded = next(c for c in result.status.conditions if c.type == "Degraded")
    assert degraded.reason == "NodeLost"
    assert "no pod is left to run their tasks" in degraded.message
    assert "run on the other pods" not in degraded.message
    warnings = [e.message for e in result.events if e.reason == "NodeLost"]
    assert len(warnings) == 3
    assert all("no pod is left to take its tasks over" in w for w in warnings)
    assert result.status.membership_generation == 2
    # The nodes return: the pods are members again, assigned from where their stores are.
    back = run(pods, reports=reports(), membership=result.membership, leases=fresh_leases())
    assert back.membership is not None and back.membership.generation == 3
    assert {m.id for m in back.membership.assignment.members} == {"wc-0", "wc-1", "wc-2"}
