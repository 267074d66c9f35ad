"""Generated groups for the assignor's property tests, and the checks those tests share.

``tests/unit/test_assignor.py`` (the balanced, sticky, zone-aware target),
``tests/unit/test_assignor_warmups.py`` (warm before moving) and
``tests/unit/test_assignor_leaving.py`` (scale in) draw groups of tasks and members, histories
of membership changes, and reported lags from the strategies here, and check the guarantees
of ``eddyline_runtime.assignor``'s docstring with :func:`assert_rules_hold` and
:func:`caught_up`; their convergence tests play probing rebalances with :class:`Probing`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from eddyline_runtime.assignor import Assignment, Member, WarmupPolicy, assign
from eddyline_runtime.partitions import TaskId

ZONES = (None, "eu-west-1a", "eu-west-1b", "eu-west-1c")


@dataclass(frozen=True)
class Group:
    """One application's tasks and the members that run them."""

    tasks: tuple[TaskId, ...]
    stateful: frozenset[TaskId] | None
    members: tuple[Member, ...]
    standbys: int

    @property
    def stateful_tasks(self) -> frozenset[TaskId]:
        return frozenset(self.tasks) if self.stateful is None else self.stateful

    def assign(
        self, members: Sequence[Member] | None = None, previous: Assignment | None = None
    ) -> Assignment:
        return assign(
            self.tasks,
            self.members if members is None else members,
            self.standbys,
            previous=previous,
            stateful=self.stateful,
        )


def member_lists(
    min_size: int = 1, max_size: int = 12, zones: int = 4
) -> st.SearchStrategy[list[Member]]:
    """Members with unique pod names, their zones drawn from a few of ZONES."""

    @st.composite
    def build(draw: st.DrawFn) -> list[Member]:
        palette = draw(st.lists(st.sampled_from(ZONES), min_size=1, max_size=zones, unique=True))
        ordinals = draw(
            st.lists(st.integers(0, 99), min_size=min_size, max_size=max_size, unique=True)
        )
        return [
            Member(f"pod-{n}", draw(st.sampled_from(palette)), f"pod-{n}.app:8080")
            for n in ordinals
        ]

    return build()


@st.composite
def groups(draw: st.DrawFn, min_members: int = 1, zones: int = 4) -> Group:
    subtopologies = draw(st.integers(1, 4))
    tasks = tuple(
        TaskId(s, p) for s in range(subtopologies) for p in range(draw(st.integers(0, 8)))
    )
    kind = draw(st.sampled_from(["all stateful", "stateful sub-topologies", "mixed"]))
    stateful: frozenset[TaskId] | None = None
    if kind == "stateful sub-topologies":
        chosen = draw(st.sets(st.integers(0, subtopologies - 1)))
        stateful = frozenset(t for t in tasks if t.subtopology in chosen)
    elif kind == "mixed":
        stateful = frozenset(t for t in tasks if draw(st.booleans()))
    members = draw(member_lists(min_size=min_members, zones=zones))
    return Group(tasks, stateful, tuple(members), draw(st.integers(0, 3)))


@st.composite
def histories(draw: st.DrawFn) -> tuple[Group, list[tuple[list[Member], Assignment]]]:
    """A group and the assignments of up to four membership changes, each from the last."""
    group = draw(groups())
    members = list(group.members)
    steps = [(members, group.assign())]
    for _ in range(draw(st.integers(1, 4))):
        change = draw(st.sampled_from(["join", "leave", "replace"]))
        members = list(members)
        if change in ("leave", "replace") and len(members) > 1:
            members.remove(draw(st.sampled_from(members)))
        if change in ("join", "replace") and len(members) < 12:
            free = sorted({f"pod-{n}" for n in range(100, 112)} - {m.id for m in members})
            members.append(Member(draw(st.sampled_from(free)), draw(st.sampled_from(ZONES))))
        steps.append((members, group.assign(members, previous=steps[-1][1])))
    return group, steps


def zones_of(members: Sequence[Member]) -> int:
    return len({m.zone for m in members})


def spread(counts: Sequence[int]) -> int:
    return max(counts) - min(counts)


def assert_rules_hold(group: Group, members: Sequence[Member], result: Assignment) -> None:
    """Guarantees 1 to 4 of the module docstring, and 5 where no zones constrain."""
    ids = sorted(m.id for m in members)
    zone = {m.id: m.zone for m in members}
    assert sorted(result.active) == sorted(result.standby) == ids
    owners = Counter(t for m in ids for t in result.active[m])
    assert sorted(owners) == sorted(group.tasks)
    assert set(owners.values()) <= {1}
    assert spread([len(result.active[m]) for m in ids]) <= 1
    assert spread([len(result.active[m] & group.stateful_tasks) for m in ids]) <= 1
    replicas = min(group.standbys, len(ids) - 1)
    for task in group.tasks:
        holders = result.standby_owners(task)
        if task not in group.stateful_tasks:
            assert holders == []
            continue
        active = result.active_owner(task)
        assert len(set(holders)) == len(holders) == replicas
        assert active not in holders
        copies = [active, *holders]
        assert len({zone[m] for m in copies}) == min(replicas + 1, zones_of(members))
    if zones_of(members) == 1:
        assert spread([len(result.standby[m]) for m in ids]) <= 1


# Warm before moving and scale in (points 9 to 13) -------------------------------------

ACCEPTABLE = 100

Lags = dict[str, dict[TaskId, int]]


def caught_up(
    member_id: str, task: TaskId, lags: Mapping[str, Mapping[TaskId, int]], previous: Assignment
) -> bool:
    """The assignor's rule: the previous owner is caught up; others by their reported lag."""
    if task in previous.active.get(member_id, ()):
        return True
    lag = lags.get(member_id, {}).get(task)
    return lag is not None and lag <= ACCEPTABLE


def assign_warm(
    group: Group,
    members: Sequence[Member],
    previous: Assignment,
    lags: Lags,
    max_warmups: int,
    *,
    leaving: Collection[str] = (),
) -> Assignment:
    """The group's next assignment with warm-ups (``ACCEPTABLE`` lag) and ``leaving``."""
    return assign(
        group.tasks,
        members,
        group.standbys,
        previous=previous,
        stateful=group.stateful,
        warmups=WarmupPolicy(lags, ACCEPTABLE, max_warmups),
        leaving=leaving,
    )


@st.composite
def reported_lags(draw: st.DrawFn, group: Group, members: Sequence[Member]) -> Lags:
    """Per member, a lag for some stateful tasks: caught up, just behind, or far behind."""
    lags: Lags = {}
    for member in members:
        for task in sorted(group.stateful_tasks):
            kind = draw(st.sampled_from(["none", "none", "caught up", "behind"]))
            if kind == "caught up":
                lags.setdefault(member.id, {})[task] = draw(st.integers(0, ACCEPTABLE))
            elif kind == "behind":
                lags.setdefault(member.id, {})[task] = draw(st.integers(ACCEPTABLE + 1, 10**6))
    return lags


class Probing:
    """The probing rebalances of a convergence test: before each, every standby of the
    previous assignment reports caught up, and a warm-up only once it ran for a rebalance or
    two (drawn), far behind before, so warm-ups are seen behind too."""

    def __init__(self, data: st.DataObject, ids: Collection[str]) -> None:
        self.data = data
        self.ids = ids
        # Rebalances each warm-up (member, task) has run for; a new one is absent (none yet).
        self.age: dict[tuple[str, TaskId], int] = {}

    def lags(self, previous: Assignment) -> Lags:
        """What the copies of ``previous`` report before the next rebalance."""
        lags: Lags = {}
        for member_id in self.ids:
            for task in previous.standby.get(member_id, ()):
                lags.setdefault(member_id, {})[task] = 0
            for task in previous.warmup.get(member_id, ()):
                ready_after = self.data.draw(st.integers(1, 2), label="rebalances to catch up")
                caught = self.age.get((member_id, task), 0) + 1 >= ready_after
                lags.setdefault(member_id, {})[task] = 0 if caught else 10 * ACCEPTABLE
        return lags

    def rebalanced(self, previous: Assignment, result: Assignment) -> None:
        """``result`` followed ``previous``: a warm-up it kept ran for one more rebalance."""
        self.age = {
            (m, t): self.age.get((m, t), 0) + 1
            for m in self.ids
            for t in result.warmup.get(m, ())
            if t in previous.warmup.get(m, ())
        }
