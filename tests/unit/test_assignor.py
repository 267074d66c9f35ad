"""The assignor: balanced, sticky and zone-aware; a lost member's standbys take over.

The property tests check each guarantee listed in the module docstring of
``eddyline_runtime.assignor`` on generated groups, including previous
assignments that ``assign`` itself produced through members joining and
leaving. The example tests read as documentation.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eddyline_runtime.assignor import (
    Assignment,
    InvalidAssignmentError,
    InvalidMembersError,
    Member,
    MemberTasks,
    UnknownMemberError,
    UnknownTaskError,
    assign,
)
from eddyline_runtime.errors import ConfigError, EddylineError
from eddyline_runtime.partitions import TaskId
from tests.support.assignor_groups import ZONES, Group, assert_rules_hold, groups, histories, spread

# Enough examples to meet the corner cases (one member, no tasks, one zone,
# more standbys than members) while the file stays within seconds.
EXAMPLES = 150


def moved(before: Assignment, after: Assignment, tasks: Sequence[TaskId]) -> list[TaskId]:
    return [t for t in tasks if before.active_owner(t) != after.active_owner(t)]


# Guarantees 1-5 --------------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None)
@given(groups())
def test_every_task_has_one_active_owner_and_standbys_elsewhere_in_distinct_zones(
    group: Group,
) -> None:
    assert_rules_hold(group, group.members, group.assign())


@settings(max_examples=EXAMPLES, deadline=None)
@given(groups(zones=1))
def test_standby_counts_differ_by_at_most_one_without_zones(group: Group) -> None:
    result = group.assign()
    assert spread([len(ts) for ts in result.standby.values()]) <= 1


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories())
def test_rules_hold_after_members_join_and_leave(
    history: tuple[Group, list[tuple[list[Member], Assignment]]],
) -> None:
    group, steps = history
    for members, result in steps:
        assert_rules_hold(group, members, result)


# Guarantee 6: sticky ---------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories())
def test_an_unchanged_membership_moves_nothing(
    history: tuple[Group, list[tuple[list[Member], Assignment]]],
) -> None:
    group, steps = history
    members, last = steps[-1]
    assert group.assign(members, previous=last) == last


@settings(max_examples=EXAMPLES, deadline=None)
@given(groups(min_members=2), st.data())
def test_losing_a_member_moves_its_tasks_and_at_most_as_many_stateless_ones(
    group: Group, data: st.DataObject
) -> None:
    before = group.assign()
    lost = data.draw(st.sampled_from(group.members))
    survivors = [m for m in group.members if m != lost]
    after = group.assign(survivors, previous=before)

    others = [t for t in group.tasks if before.active_owner(t) != lost.id]
    shuffled = moved(before, after, others)
    # A stateful task of a surviving member moves only in a warm swap: to a
    # member that held its standby. A stateless one moves only to make room on
    # a member that took over one of the lost member's stateful tasks.
    stateful_moves = [t for t in shuffled if t in group.stateful_tasks]
    assert all(after.active_owner(t) in before.standby_owners(t) for t in stateful_moves)
    stateless_moves = [t for t in shuffled if t not in group.stateful_tasks]
    assert len(stateless_moves) <= len(before.active[lost.id] & group.stateful_tasks)


@settings(max_examples=EXAMPLES, deadline=None)
@given(groups(min_members=2, zones=1), st.data())
def test_losing_a_member_leaves_the_other_standbys_mostly_in_place(
    group: Group, data: st.DataObject
) -> None:
    before = group.assign()
    lost = data.draw(st.sampled_from(group.members))
    survivors = [m for m in group.members if m != lost]
    after = group.assign(survivors, previous=before)

    dropped = [
        (task, m.id)
        for m in survivors
        for task in before.standby[m.id]
        if task not in after.standby[m.id] and after.active_owner(task) != m.id
    ]
    # The lost member's standbys and the standbys of its tasks need new homes;
    # evening out the counts never has to move more standbys than that.
    needed = len(before.standby[lost.id]) + len(before.active[lost.id] & group.stateful_tasks)
    assert len(dropped) <= needed


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories(), st.sampled_from(ZONES))
def test_a_joining_member_takes_over_its_share_and_little_else_moves(
    history: tuple[Group, list[tuple[list[Member], Assignment]]], zone: str | None
) -> None:
    group, steps = history
    members, before = steps[-1]
    newcomer = Member("pod-joining", zone)
    after = group.assign([*members, newcomer], previous=before)

    moves = moved(before, after, group.tasks)
    stateful_moves = [t for t in moves if t in group.stateful_tasks]
    assert all(after.active_owner(t) == newcomer.id for t in stateful_moves)
    assert len(after.active[newcomer.id]) <= math.ceil(len(group.tasks) / (len(members) + 1))
    # Stateless tasks move between old members only to fill in for stateful
    # tasks the newcomer took over (stateful tasks are balanced on their own).
    elsewhere = [t for t in moves if after.active_owner(t) != newcomer.id]
    assert len(elsewhere) <= len(stateful_moves)


# Guarantee 7: promotion ------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories(), st.data())
def test_losing_a_member_promotes_standbys_of_its_tasks(
    history: tuple[Group, list[tuple[list[Member], Assignment]]], data: st.DataObject
) -> None:
    group, steps = history
    members, before = steps[-1]
    if len(members) < 2:
        return
    lost = data.draw(st.sampled_from(members))
    after = group.assign([m for m in members if m != lost], previous=before)

    def had_state(member_id: str, task: TaskId) -> bool:
        return task in before.active[member_id] | before.standby[member_id]

    for task in before.active[lost.id]:
        holders = [m for m in before.standby_owners(task) if m != lost.id]
        if not holders or after.active_owner(task) in holders:
            continue
        # Not promoted: then every holder is full of stateful tasks it already
        # had state for (a maximum matching leaves no holder with room).
        for holder in holders:
            taken_cold = [
                t for t in after.active[holder] & group.stateful_tasks if not had_state(holder, t)
            ]
            assert taken_cold == [], (task, holder)


# Guarantee 8 and the published form ------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories(), st.randoms(use_true_random=False))
def test_the_same_inputs_in_any_order_give_the_same_assignment(
    history: tuple[Group, list[tuple[list[Member], Assignment]]], rng: Random
) -> None:
    group, steps = history
    (_, previous), (next_members, expected) = steps[-2], steps[-1]
    tasks, shuffled_members = list(group.tasks), list(next_members)
    rng.shuffle(tasks)
    rng.shuffle(shuffled_members)
    again = assign(
        tasks,
        shuffled_members,
        group.standbys,
        previous=Assignment.from_json(json.loads(json.dumps(previous.to_json()))),
        stateful=None if group.stateful is None else list(group.stateful),
    )
    assert again == expected
    assert json.dumps(again.to_json()) == json.dumps(expected.to_json())


HASH_SEED_PROBE = """
from eddyline_runtime.assignor import Member, assign
from eddyline_runtime.partitions import TaskId
import json
members = [Member(f"pod-{n}", f"zone-{n % 3}") for n in range(7)]
tasks = [TaskId(s, p) for s in range(3) for p in range(6)]
first = assign(tasks, members, 2)
print(json.dumps(assign(tasks, members[1:], 2, previous=first).to_json()))
"""


def test_the_assignment_does_not_depend_on_the_hash_seed() -> None:
    outputs = {
        subprocess.run(
            [sys.executable, "-c", HASH_SEED_PROBE],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outputs) == 1
    assert outputs.pop().startswith('{"version": 1')


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories())
def test_the_published_json_reads_back_as_the_same_assignment(
    history: tuple[Group, list[tuple[list[Member], Assignment]]],
) -> None:
    _, steps = history
    for _, result in steps:
        published = json.dumps(result.to_json())
        assert Assignment.from_json(json.loads(published)) == result


# Examples --------------------------------------------------------------------

A, B, C = Member("a", "zone-1"), Member("b", "zone-2"), Member("c", "zone-3")


def tasks(*names: str) -> frozenset[TaskId]:
    return frozenset(TaskId.parse(name) for name in names)


def test_three_members_in_three_zones_with_one_standby_form_a_ring() -> None:
    result = assign(tasks("0_0", "0_1", "0_2"), [C, B, A], 1)

    assert result.active == {"a": tasks("0_0"), "b": tasks("0_1"), "c": tasks("0_2")}
    assert result.standby == {"a": tasks("0_2"), "b": tasks("0_0"), "c": tasks("0_1")}


def test_a_lost_member_s_task_goes_to_the_member_that_kept_its_standby() -> None:
    before = assign(tasks("0_0", "0_1", "0_2"), [A, B, C], 1)
    assert before.standby_owners(TaskId(0, 2)) == ["a"]

    after = assign(tasks("0_0", "0_1", "0_2"), [A, B], 1, previous=before)

    # a replays the changelog tail of 0_2 it has not seen, not the whole store.
    assert after.active == {"a": tasks("0_0", "0_2"), "b": tasks("0_1")}
    assert after.standby == {"a": tasks("0_1"), "b": tasks("0_0", "0_2")}


def test_a_lost_task_goes_warm_even_when_its_standby_holder_is_full() -> None:
    # Four stateful tasks on three members: 2/1/1. Whichever member is lost,
    # each of its tasks lands on a member holding its state (a swap keeps the
    # counts balanced), so the promotion restores only the changelog tail.
    tasks = [TaskId(1, p) for p in range(4)]
    members = [Member(str(i), zone=f"zone-{i}") for i in range(3)]
    before = assign(tasks, members, 1)
    for lost in members:
        after = assign(tasks, [m for m in members if m != lost], 1, previous=before)
        for task in tasks:
            owner = after.active_owner(task)
            assert owner == before.active_owner(task) or owner in before.standby_owners(task), (
                lost.id,
                task,
            )


def test_a_joining_member_takes_a_task_and_its_former_owner_keeps_a_standby() -> None:
    six = tasks("0_0", "0_1", "0_2", "0_3", "0_4", "0_5")
    before = assign(six, [A, B], 1)
    after = assign(six, [A, B, C], 1, previous=before)

    assert [len(after.active[m]) for m in "abc"] == [2, 2, 2]
    for task in after.active["c"]:
        assert before.active_owner(task) in after.standby_owners(task)


def test_standbys_go_to_another_zone_even_when_it_is_small() -> None:
    members = [Member("a1", "big"), Member("a2", "big"), Member("a3", "big"), Member("b", "small")]
    result = assign(tasks("0_0", "0_1", "0_2", "0_3", "0_4", "0_5", "0_6", "0_7"), members, 1)

    for task in result.active["a1"] | result.active["a2"] | result.active["a3"]:
        assert result.standby_owners(task) == ["b"]


def test_stateless_tasks_get_no_standbys() -> None:
    result = assign(tasks("0_0", "1_0"), [A, B], 1, stateful=tasks("1_0"))

    assert result.standby_owners(TaskId(0, 0)) == []
    assert len(result.standby_owners(TaskId(1, 0))) == 1


def test_standbys_are_capped_by_the_other_members() -> None:
    result = assign(tasks("0_0", "0_1"), [A, B], 3)

    assert result.standby == {"a": tasks("0_1"), "b": tasks("0_0")}


def test_each_sub_topology_is_spread_over_the_members() -> None:
    members = [Member(f"pod-{n}") for n in range(4)]
    result = assign([TaskId(s, p) for s in range(2) for p in range(4)], members, 0)

    for member_tasks in result.active.values():
        assert sorted(t.subtopology for t in member_tasks) == [0, 1]


def test_a_previous_assignment_of_other_members_and_tasks_is_ignored() -> None:
    gone = assign(tasks("0_0", "9_9"), [Member("gone"), Member("also-gone")], 1)

    assert assign(tasks("0_0"), [A], 0, previous=gone) == assign(tasks("0_0"), [A], 0)


def test_an_assignment_answers_who_runs_what() -> None:
    result = assign(tasks("0_0", "0_1"), [Member("a", address="a.app:8080"), B], 1)

    assert result.active_owner(TaskId(0, 0)) == "a"
    assert result.standby_owners(TaskId(0, 0)) == ["b"]
    assert result.tasks_of("b") == MemberTasks(tasks("0_1"), tasks("0_0"))
    assert result.member("a").address == "a.app:8080"
    assert result.tasks == tasks("0_0", "0_1")


def test_the_published_json_uses_task_ids_as_strings() -> None:
    result = assign(tasks("0_0", "0_10", "0_2"), [A], 0)

    assert result.to_json() == {
        "version": 1,
        "members": [{"id": "a", "zone": "zone-1", "address": None}],
        "active": {"a": ["0_0", "0_2", "0_10"]},
        "standby": {"a": []},
    }


# Errors ----------------------------------------------------------------------


def test_no_members_is_refused() -> None:
    with pytest.raises(InvalidMembersError, match="start at least one member"):
        assign(tasks("0_0"), [], 1)


def test_a_member_id_given_twice_is_refused() -> None:
    with pytest.raises(InvalidMembersError, match='member id "a" is given twice'):
        assign(tasks("0_0"), [A, Member("a", "zone-2")], 1)


def test_an_empty_member_id_is_refused() -> None:
    with pytest.raises(InvalidMembersError, match="empty id"):
        assign(tasks("0_0"), [Member("")], 0)


def test_a_negative_standby_count_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r'"num\.standby\.replicas"'):
        assign(tasks("0_0"), [A], -1)


def test_looking_up_an_unknown_task_or_member_says_to_assign_again() -> None:
    result = assign(tasks("0_0"), [A], 0)

    with pytest.raises(UnknownTaskError, match="task 3_1 is not in this assignment"):
        result.active_owner(TaskId(3, 1))
    with pytest.raises(UnknownTaskError, match="assign again"):
        result.standby_owners(TaskId(3, 1))
    with pytest.raises(UnknownMemberError, match='member "z" is not in this assignment'):
        result.tasks_of("z")
    with pytest.raises(UnknownMemberError):
        result.member("z")


def test_an_assignment_that_contradicts_itself_is_refused() -> None:
    with pytest.raises(InvalidAssignmentError, match="active on both"):
        Assignment(active={"a": tasks("0_0"), "b": tasks("0_0")}, standby={})
    with pytest.raises(InvalidAssignmentError, match="both active and standby"):
        Assignment(active={"a": tasks("0_0")}, standby={"a": tasks("0_0")})
    with pytest.raises(InvalidAssignmentError, match="no active copy"):
        Assignment(active={"a": frozenset()}, standby={"a": tasks("0_0")})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"version": 2}, "version 2 is not supported"),
        ({"version": 1, "members": {}}, '"members" must be a list'),
        ({"version": 1, "members": [{"zone": "x"}]}, 'non-empty string "id"'),
        ({"version": 1, "members": [], "active": []}, '"active" must map member ids'),
        (
            {"version": 1, "members": [], "active": {"a": ["x"]}, "standby": {}},
            '"x" is not a task id',
        ),
    ],
)
def test_published_json_that_is_not_an_assignment_is_refused(
    data: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidAssignmentError, match=message):
        Assignment.from_json(data)


def test_assignor_errors_are_eddyline_errors() -> None:
    for error in (InvalidAssignmentError, InvalidMembersError, UnknownTaskError):
        assert issubclass(error, EddylineError)
