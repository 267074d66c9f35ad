"""Scale in: points 12 and 13 of ``eddyline_runtime.assignor``'s docstring.

A leaving member (a pod being deleted, evicted, drained or scaled away) hands
its active tasks over only to caught-up copies and gets nothing new; the
convergence test plays probing rebalances until it holds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline_runtime.assignor import Assignment, Member, WarmupPolicy, assign
from eddyline_runtime.partitions import TaskId
from tests.support.assignor_groups import (
    ACCEPTABLE,
    Group,
    Lags,
    Probing,
    assert_rules_hold,
    assign_warm,
    caught_up,
    histories,
    reported_lags,
)

EXAMPLES = 60


def check_hand_over(  # noqa: PLR0917 (the scenario, then what came of it)
    group: Group,
    members: Sequence[Member],
    previous: Assignment,
    lags: Lags,
    leaving: set[str],
    result: Assignment,
    max_warmups: int,
) -> None:
    ids = sorted(m.id for m in members)
    staying = [m for m in ids if m not in leaving]
    assert sorted(result.active) == ids, "a leaving member stays listed until it is gone"
    assert sorted(t for m in ids for t in result.active[m]) == sorted(group.tasks)
    replicas = min(group.standbys, len(staying) - 1)
    for member_id in leaving:
        # Point 12: nothing new, no standby, no warm-up; only stateful tasks it ran.
        assert result.active[member_id] <= previous.active.get(member_id, frozenset())
        assert result.active[member_id] <= group.stateful_tasks
        assert not result.standby[member_id]
        assert not result.warmup[member_id]
    for task in group.stateful_tasks:
        owner = result.active_owner(task)
        assert len(result.standby_owners(task)) == replicas
        before = previous.active_owner(task) if task in previous.tasks else None
        if owner in leaving:
            # It keeps the task only while no staying copy is caught up.
            assert not [m for m in staying if caught_up(m, task, lags, previous)], (
                f"{task} stays on leaving {owner} though a staying copy is caught up"
            )
        elif before in leaving:
            # Handed over: only to a caught-up copy.
            assert caught_up(owner, task, lags, previous), (
                f"{task} moved from leaving {before} to {owner}, whose copy is not caught up"
            )
    assert result.warmup_count <= max_warmups


@st.composite
def leavers(draw: st.DrawFn, members: Sequence[Member]) -> set[str]:
    """Some of the members, never all (then nobody could take over)."""
    ids = sorted(m.id for m in members)
    if len(ids) < 2:
        return set()
    return set(draw(st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids) - 1)))


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories(), st.integers(1, 4), st.data())
def test_a_leaving_member_hands_over_only_to_caught_up_copies_and_gets_nothing_new(
    history: tuple[Group, list[tuple[list[Member], Assignment]]],
    max_warmups: int,
    data: st.DataObject,
) -> None:
    group, steps = history
    members, previous = steps[-1]
    leaving = data.draw(leavers(members))
    lags = data.draw(reported_lags(group, members))

    result = assign_warm(group, members, previous, lags, max_warmups, leaving=leaving)

    check_hand_over(group, members, previous, lags, leaving, result, max_warmups)


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories(), st.integers(1, 3), st.data())
def test_leaving_members_end_with_nothing_and_the_rest_is_balanced(
    history: tuple[Group, list[tuple[list[Member], Assignment]]],
    max_warmups: int,
    data: st.DataObject,
) -> None:
    """Probing rebalances: standbys report caught up, a warm-up after a rebalance or two."""
    group, steps = history
    members, previous = steps[-1]
    leaving = data.draw(leavers(members))
    ids = {m.id for m in members}
    probing = Probing(data, ids)
    rounds = 3 * (len(group.stateful_tasks) + 2)
    result = previous
    for _ in range(rounds):
        lags = probing.lags(previous)
        result = assign_warm(group, members, previous, lags, max_warmups, leaving=leaving)
        check_hand_over(group, members, previous, lags, leaving, result, max_warmups)
        probing.rebalanced(previous, result)
        if result.warmup_count == 0 and result == previous:
            break
        previous = result
    else:
        raise AssertionError(f"leaving members still hold tasks after {rounds} rebalances")
    # Point 13: every leaving member is done; the others hold the balanced target.
    assert not any(result.active[m] for m in leaving)
    staying = [m for m in members if m.id not in leaving]
    kept = {m.id for m in staying}
    assert_rules_hold(
        group,
        staying,
        Assignment(
            active={m: ts for m, ts in result.active.items() if m in kept},
            standby={m: ts for m, ts in result.standby.items() if m in kept},
            members=tuple(staying),
        ),
    )


def test_a_leaving_pod_keeps_its_task_until_a_warm_up_is_caught_up() -> None:
    tasks = [TaskId(0, p) for p in range(2)]
    a, b = Member("a"), Member("b")
    # No standbys: b has no copy of a's task.
    first = assign(tasks, [a, b], 0)
    task = next(iter(first.active["a"]))
    policy = WarmupPolicy({}, ACCEPTABLE, 2)

    holding = assign(tasks, [a, b], 0, previous=first, warmups=policy, leaving={"a"})
    assert holding.active["a"] == {task}, "nobody is caught up: it stays"
    assert holding.warmup["b"] == {task}, "and the staying pod warms up"

    behind = WarmupPolicy({"b": {task: ACCEPTABLE + 1}}, ACCEPTABLE, 2)
    assert assign(tasks, [a, b], 0, previous=holding, warmups=behind, leaving={"a"}) == holding

    ready = WarmupPolicy({"b": {task: ACCEPTABLE}}, ACCEPTABLE, 2)
    moved = assign(tasks, [a, b], 0, previous=holding, warmups=ready, leaving={"a"})
    assert moved.active["a"] == frozenset()
    assert moved.active["b"] == frozenset(tasks)
    assert moved.warmup_count == 0


def test_a_leaving_pods_task_goes_to_its_caught_up_standby_at_once() -> None:
    tasks = [TaskId(0, p) for p in range(3)]
    members = [Member("a"), Member("b"), Member("c")]
    first = assign(tasks, members, 1)
    lags = {m: dict.fromkeys(first.standby[m], 0) for m in first.standby}
    result = assign(
        tasks,
        members,
        1,
        previous=first,
        warmups=WarmupPolicy(lags, ACCEPTABLE, 2),
        leaving={"c"},
    )
    assert result.active["c"] == frozenset()
    for task in first.active["c"]:
        assert result.active_owner(task) in first.standby_owners(task)


def test_when_every_member_is_leaving_they_keep_their_tasks() -> None:
    tasks = [TaskId(0, p) for p in range(2)]
    members = [Member("a"), Member("b")]
    first = assign(tasks, members, 1)
    result = assign(
        tasks,
        members,
        1,
        previous=first,
        warmups=WarmupPolicy({}, ACCEPTABLE, 2),
        leaving={"a", "b"},
    )
    assert result.active == first.active
    # ...and may exit at once: nobody could take them over (a suspend, a delete).
    assert result.leaving == {"a", "b"}
    assert result.handed_over("a") and result.handed_over("b")


def test_leaving_is_published_and_reads_back() -> None:
    tasks = [TaskId(0, p) for p in range(2)]
    members = [Member("a"), Member("b")]
    first = assign(tasks, members, 0)
    result = assign(
        tasks, members, 0, previous=first, warmups=WarmupPolicy({}, ACCEPTABLE, 2), leaving={"b"}
    )
    published = result.to_json()
    assert published["leaving"] == ["b"]
    assert Assignment.from_json(published) == result
    assert "leaving" not in first.to_json()
    assert not result.handed_over("b") or not first.active["b"]
    assert result.handed_over("a") is (not result.active["a"])
