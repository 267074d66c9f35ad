"""Warm before moving: points 9 to 11 of ``eddyline_runtime.assignor``'s docstring.

Lags are generated per member and task (some copies caught up, some behind,
most absent); the convergence tests then play probing rebalances: after each
one, every standby and warm-up reports the lag the test decides, and the next
assignment starts from the last.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline_runtime.assignor import (
    Assignment,
    InvalidAssignmentError,
    Member,
    WarmupPolicy,
    assign,
)
from eddyline_runtime.errors import ConfigError
from eddyline_runtime.partitions import TaskId
from tests.support.assignor_groups import (
    ACCEPTABLE,
    ZONES,
    Group,
    Lags,
    Probing,
    assert_rules_hold,
    assign_warm,
    caught_up,
    groups,
    histories,
    reported_lags,
)

EXAMPLES = 120


def check_invariants(  # noqa: PLR0917 (the scenario, then what came of it)
    group: Group,
    members: Sequence[Member],
    previous: Assignment,
    lags: Lags,
    result: Assignment,
    max_warmups: int,
) -> None:
    ids = sorted(m.id for m in members)
    # Point 1 still: one active owner each; point 3: standbys as many as ever.
    assert sorted(t for m in ids for t in result.active[m]) == sorted(group.tasks)
    replicas = min(group.standbys, len(ids) - 1)
    for task in group.stateful_tasks:
        owner = result.active_owner(task)
        assert len(result.standby_owners(task)) == replicas
        # Point 9: never active on a copy that is behind while a caught-up one exists.
        if not caught_up(owner, task, lags, previous):
            assert not [m for m in ids if caught_up(m, task, lags, previous)], (
                f"{task} active on {owner} (behind) though a caught-up copy exists"
            )
    # Point 10: bounded, and only for stateful tasks on members with no other copy.
    assert result.warmup_count <= max_warmups
    for member_id, warming in result.warmup.items():
        assert warming <= group.stateful_tasks
        for task in warming:
            assert result.active_owner(task) != member_id
            assert member_id not in result.standby_owners(task)


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories(), st.integers(1, 4), st.data())
def test_no_task_is_active_on_a_copy_behind_while_a_caught_up_one_exists(
    history: tuple[Group, list[tuple[list[Member], Assignment]]],
    max_warmups: int,
    data: st.DataObject,
) -> None:
    group, steps = history
    (_, previous), (members, _) = steps[-2], steps[-1]
    lags = data.draw(reported_lags(group, members))

    result = assign_warm(group, members, previous, lags, max_warmups)

    check_invariants(group, members, previous, lags, result, max_warmups)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    histories(),
    st.integers(1, 3),
    st.sampled_from(["join", "leave", "replace"]),
    st.sampled_from(ZONES),
    st.data(),
)
def test_warm_ups_become_active_or_standbys_or_go_and_balance_is_reached(
    history: tuple[Group, list[tuple[list[Member], Assignment]]],
    max_warmups: int,
    change: str,
    zone: str | None,
    data: st.DataObject,
) -> None:
    """Probing rebalances from a balanced assignment after a membership change.

    Standbys report being caught up; a warm-up reports caught up only after
    it ran for a rebalance or two (drawn), so warm-ups are seen behind too.
    """
    group, steps = history
    members, previous = steps[-1]
    members = list(members)
    if change in ("leave", "replace") and len(members) > 1:
        members.remove(data.draw(st.sampled_from(members)))
    if change in ("join", "replace"):
        members.append(Member("pod-new", zone))
    ids = {m.id for m in members}
    probing = Probing(data, ids)
    stateful_count = len(group.stateful_tasks)
    # Each round with warm-ups promotes or drops at least one once they are caught up
    # (two rounds at most); the bound is generous on top.
    rounds = 3 * (stateful_count + 2)
    for _ in range(rounds):
        lags = probing.lags(previous)
        result = assign_warm(group, members, previous, lags, max_warmups)
        check_invariants(group, members, previous, lags, result, max_warmups)
        # Point 11: a warm-up of the last round is now active, a standby, still
        # warming (not yet caught up), or gone; no copy is ever left in two roles.
        probing.rebalanced(previous, result)
        if result.warmup_count == 0 and result == previous:
            break
        previous = result
    else:
        pytest.fail(f"no balance after {rounds} probing rebalances: {previous}")
    # Balance holds: no warm-up left and the target's guarantees (points 1-5).
    assert result.warmup_count == 0
    assert_rules_hold(group, members, result)


@settings(max_examples=EXAMPLES, deadline=None)
@given(groups(), st.data())
def test_without_lags_reported_the_target_is_the_result(group: Group, data: st.DataObject) -> None:
    """A first assignment (nobody holds anything) is the plain balanced one."""
    plain = group.assign()
    warm = assign(
        group.tasks,
        group.members,
        group.standbys,
        stateful=group.stateful,
        warmups=WarmupPolicy({}, ACCEPTABLE, data.draw(st.integers(1, 3))),
    )
    assert warm == plain


def test_a_joining_member_warms_up_before_it_takes_a_task() -> None:
    tasks = [TaskId(0, p) for p in range(4)]
    a, b, c = Member("a"), Member("b"), Member("c")
    before = assign(tasks, [a, b], 0)
    policy = WarmupPolicy({}, acceptable_recovery_lag=ACCEPTABLE, max_warmup_replicas=1)

    first = assign(tasks, [a, b, c], 0, previous=before, warmups=policy)

    assert first.active == {**before.active, "c": frozenset()}
    assert first.warmup_count == 1
    (warming,) = first.warmup["c"]
    # Still behind: it stays where it is and keeps warming.
    behind = WarmupPolicy({"c": {warming: ACCEPTABLE + 1}}, ACCEPTABLE, 1)
    assert assign(tasks, [a, b, c], 0, previous=first, warmups=behind) == first
    # Caught up: the probing rebalance hands it over, and balance holds.
    ready = WarmupPolicy({"c": {warming: ACCEPTABLE}}, ACCEPTABLE, 1)
    second = assign(tasks, [a, b, c], 0, previous=first, warmups=ready)
    assert second.active["c"] == frozenset({warming})
    assert second.warmup_count == 0
    assert sorted(len(ts) for ts in second.active.values()) == [1, 1, 2]


def test_a_warm_up_published_reads_back_and_old_json_reads_as_none() -> None:
    result = Assignment(
        active={"a": frozenset({TaskId(0, 0)})},
        standby={},
        warmup={"b": frozenset({TaskId(0, 0)})},
    )
    published = result.to_json()
    assert published["warmup"] == {"a": [], "b": ["0_0"]}
    assert Assignment.from_json(dict(published)) == result
    del published["warmup"]
    assert Assignment.from_json(dict(published)).warmup_count == 0


def test_a_warm_up_where_the_task_is_active_is_refused() -> None:
    with pytest.raises(InvalidAssignmentError, match="both a warm-up and active"):
        Assignment(
            active={"a": frozenset({TaskId(0, 0)})},
            standby={},
            warmup={"a": frozenset({TaskId(0, 0)})},
        )


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"acceptable_recovery_lag": -1}, "acceptable.recovery.lag"),
        ({"max_warmup_replicas": 0}, "max.warmup.replicas"),
    ],
)
def test_bad_warm_up_settings_name_the_setting(kwargs: dict[str, int], setting: str) -> None:
    with pytest.raises(ConfigError, match=setting):
        WarmupPolicy({}, **kwargs)


def test_a_warm_up_within_the_lag_that_cannot_tell_its_staleness_is_not_caught_up() -> None:
    """A copy built from nothing knows no staleness until it first reaches its changelog's
    end. Handed the task then (KIP-441's lag rule alone), it restored the tail while the
    previous holders had dropped theirs: no copy could answer a bounded query (one failed
    query at scale out in ``make bench-queries``). It keeps warming until it can tell."""
    tasks = [TaskId(0, p) for p in range(4)]
    a, b, c = Member("a"), Member("b"), Member("c")
    before = assign(tasks, [a, b], 1)
    first = assign(tasks, [a, b, c], 1, previous=before, warmups=WarmupPolicy({}, ACCEPTABLE, 1))
    (warming,) = first.warmup["c"]
    lags = {"c": {warming: 10}}
    building = WarmupPolicy(lags, ACCEPTABLE, 1, staleness_unknown={"c": {warming}})
    assert assign(tasks, [a, b, c], 1, previous=first, warmups=building) == first
    # Once it reached the end (it reports an as-of time), it takes the task over.
    knows = WarmupPolicy(lags, ACCEPTABLE, 1, staleness_unknown={"c": set()})
    second = assign(tasks, [a, b, c], 1, previous=first, warmups=knows)
    assert warming in second.active["c"]
    # A copy of the previous owner counts as caught up whatever it reports.
    owner = first.active_owner(warming)
    unsure_owner = WarmupPolicy(
        {owner: {warming: 0}}, ACCEPTABLE, 1, staleness_unknown={owner: {warming}}
    )
    assert assign(tasks, [a, b], 1, previous=before, warmups=unsure_owner) == before


def test_when_no_copy_can_tell_its_staleness_the_lag_alone_decides() -> None:
    """A reset membership (nobody runs the task): the task goes where its state is, even if
    no copy knows how current it is (reopened after a crash), rather than to a cold member."""
    tasks = [TaskId(0, p) for p in range(2)]
    a, b = Member("a"), Member("b")
    target = assign(tasks, [a, b], 0)
    task = TaskId(0, 0)
    elsewhere = "b" if target.active_owner(task) == "a" else "a"
    policy = WarmupPolicy(
        {elsewhere: {task: 5}}, ACCEPTABLE, 1, staleness_unknown={elsewhere: {task}}
    )
    result = assign(tasks, [a, b], 0, warmups=policy)
    assert result.active_owner(task) == elsewhere


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories(), st.integers(1, 4), st.data())
def test_a_task_moves_only_to_a_copy_that_knows_its_staleness_when_one_does(
    history: tuple[Group, list[tuple[list[Member], Assignment]]],
    max_warmups: int,
    data: st.DataObject,
) -> None:
    """Point 9 with staleness: a stateful task whose previous owner is still a member goes
    to that owner or to a copy within the lag that knows its staleness, never to one that
    cannot tell (it would restore with no copy left that answers a bounded query)."""
    group, steps = history
    (_, previous), (members, _) = steps[-2], steps[-1]
    lags = data.draw(reported_lags(group, members))
    unknown = {
        member_id: {t for t in tasks if data.draw(st.booleans())}
        for member_id, tasks in lags.items()
    }
    result = assign(
        group.tasks,
        members,
        group.standbys,
        previous=previous,
        stateful=group.stateful,
        warmups=WarmupPolicy(lags, ACCEPTABLE, max_warmups, staleness_unknown=unknown),
    )
    check_invariants(group, members, previous, lags, result, max_warmups)
    present = {m.id for m in members}
    for task in group.stateful_tasks:
        was = next((m for m, ts in previous.active.items() if task in ts), None)
        owner = result.active_owner(task)
        if was not in present or owner == was:
            continue
        assert caught_up(owner, task, lags, previous), f"{task} moved to {owner}, behind"
        assert task not in unknown.get(owner, set()), (
            f"{task} moved from {was} to {owner}, whose copy cannot tell its staleness"
        )
