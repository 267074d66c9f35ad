"""The assignor: which member runs which task, as the active copy and as standbys.

Why a pure function: the operator (members are pods) and the local runner
(members are processes) must hand out tasks identically, and a function of
(tasks, members, ``num.standby.replicas``, previous assignment) can be tested
without either. The caller publishes the result (:meth:`Assignment.to_json`)
and every member reads its own share from it.

Guarantees of :func:`assign` (each is a property test in
``tests/unit/test_assignor.py``); ``N`` is the number of members, ``r`` is
``min(num_standby_replicas, N - 1)`` and ``Z`` the number of distinct zones
among the members (members without a zone share one unnamed zone):

1. Every task has exactly one active owner.
2. Balance: active task counts of any two members differ by at most one, and
   so do their counts of stateful active tasks (the heavy ones; stateless
   tasks then even out the totals, as Kafka Streams places them last).
3. Every stateful task has exactly ``r`` standbys, on ``r`` distinct members
   none of which holds its active copy; a stateless task has none.
4. Zones: the active copy and the standbys of a task span ``min(r + 1, Z)``
   distinct zones, the most any placement can (Kafka Streams'
   ``rack.aware.assignment.tags``), whatever the cost in balance.
5. Standby balance: standby counts of any two members differ by at most one
   when zones do not constrain (``Z == 1``). With more zones point 4 comes
   first, and the same search for chains of moves evens out what it finds.
6. Sticky, when ``previous`` was computed by :func:`assign` for the same
   tasks: with unchanged members nothing moves. When a member leaves, a
   stateful task of another member moves only to a member holding its
   standby, in a swap that lets a lost task go to its standby holder too
   (point 7), and at most as many of their stateless tasks move as the lost
   member had stateful tasks (to make room on members that took those over).
   When a member joins, every stateful task that moves goes to it, and
   stateless tasks move between the other members at most once per stateful
   task it took over. Standbys stay where they are
   unless points 4 and 5 need them elsewhere (without zones, a lost member
   costs the others at most as many standbys as it had standbys and stateful
   tasks), and a task that moves prefers its former member, which has its
   state, for a standby.
7. Promotion: a task whose member left goes preferably to a member that held
   it as a standby, which then restores only the changelog tail it has not
   yet replayed instead of the whole store. Promotions form a maximum
   matching into the room balance leaves, after each member kept its own
   tasks: if such a task still goes to a member without its state, then
   every surviving standby holder of it runs only stateful tasks whose state
   it already had. Then, with counts unchanged, a task placed where its state
   is not is swapped with a task of its standby holder whose standby the
   first member holds, so both restore only their tails.
8. Deterministic: the result depends only on the inputs' values, not on
   their order, on hash seeds or on anything random.

Warm before moving (KIP-441), when :func:`assign` is given a
:class:`WarmupPolicy` with the lags the members reported: points 1 to 8
describe the *target*, and the result approaches it in steps (each a
probing rebalance, triggered when warm-ups report being caught up), so that
no stateful task pauses to restore a whole store. A member's copy of a task
is *caught up* when its lag is within ``acceptable.recovery.lag`` and it
knows how current it is (it reached its changelog's end once since it opened,
or reopened after a clean close: docs/queries.md); the task's previous active
owner always is (it is processing it). The second condition is eddyline's, not
KIP-441's: the previous holders may drop their copies when the task moves, and
a new owner that cannot tell its staleness while it restores the tail would
leave no copy of the partition to answer a query bounded in time. When no copy
of a task knows its staleness (nobody runs it: a reset membership, its owner
lost), the lag alone decides, as in KIP-441. Then (each a
property test in ``tests/unit/test_assignor_warmups.py``):

9. No stateful task is active on a member whose copy is not caught up while
   another member's copy is: the task stays on its previous owner (or goes
   to the caught-up member with the least lag) instead of moving cold.
10. The member the target wants for such a task gets it as a *warm-up
    replica* (it replays the changelog like a standby and reports its lag),
    unless it already keeps a standby of it; at most ``max.warmup.replicas``
    warm-ups exist across the group. Standbys (point 3) are unchanged in
    number: warm-ups come on top.
11. Every warm-up becomes active (once caught up, when the target still
    wants it there), a standby, or is dropped: once balance holds (the
    result equals the target) there is none left, and reporting warm-ups
    as caught up reaches that in a bounded number of rebalances.

Without a policy (``warmups=None``) the result is the target itself.

Scale in (a pod being deleted, evicted, drained or scaled away), when
:func:`assign` is told which members are ``leaving``: the target is computed
over the members that stay, so a leaving member is given nothing, and with a
policy its stateful tasks are handed over as above (each a property test in
``tests/unit/test_assignor_leaving.py``):

12. A leaving member gets no task it did not run actively before: no new
    active task, no standby, no warm-up. It keeps an active task only while
    no staying member's copy of it is caught up; then the staying member
    whose target wants the task warms up (point 10), and the task moves once
    that or any other staying copy is caught up. It never moves from the
    leaving member to a copy that is not caught up.
13. A leaving member that holds no active task in the result is done: it may
    commit and exit. If every member is leaving, nobody can take over and
    they are treated as staying.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, NotRequired, TypedDict

from eddyline_runtime.errors import ConfigError, EddylineError
from eddyline_runtime.partitions import TaskId

__all__ = [
    "Assignment",
    "AssignmentJson",
    "InvalidAssignmentError",
    "InvalidMembersError",
    "Member",
    "MemberJson",
    "MemberTasks",
    "UnknownMemberError",
    "UnknownTaskError",
    "WarmupPolicy",
    "assign",
]

# The version of the published JSON; a reader refuses versions it does not know.
_JSON_VERSION = 1


class InvalidMembersError(EddylineError, ValueError):
    """The members given to :func:`assign` cannot all receive tasks (none, or ids repeated)."""


class InvalidAssignmentError(EddylineError, ValueError):
    """An assignment that contradicts itself, or published JSON that is not one."""


class UnknownTaskError(EddylineError, LookupError):
    """A task that the assignment does not hand out."""


class UnknownMemberError(EddylineError, LookupError):
    """A member id that is not part of the assignment."""


@dataclass(frozen=True, order=True)
class Member:
    """One member of the group: a pod of the StatefulSet, or a process of the local runner.

    ``zone`` is where it runs (a Kubernetes ``topology.kubernetes.io/zone``);
    standbys go to other zones than their active copy. ``address`` is the
    ``host:port`` where the member answers interactive queries
    (``application.server``), published with the assignment for routing.
    """

    id: str
    zone: str | None = None
    address: str | None = None


class MemberTasks(NamedTuple):
    """The tasks one member runs; a warm-up is replayed like a standby (point 10)."""

    active: frozenset[TaskId]
    standby: frozenset[TaskId]
    warmup: frozenset[TaskId] = frozenset()


class MemberJson(TypedDict):
    id: str
    zone: str | None
    address: str | None


class AssignmentJson(TypedDict):
    """The published form: task ids as strings (``"1_3"``), lists sorted, keys in member order.

    ``warmup`` was added within version 1 and is written only when there is a warm-up: a
    reader that does not know it ignores it (its member then simply does not warm up), and
    one that does reads its absence as none; an assignment without warm-ups is published
    exactly as before. ``leaving`` (points 12 and 13) likewise: written only when a member
    is leaving.
    """

    version: int
    members: list[MemberJson]
    active: dict[str, list[str]]
    standby: dict[str, list[str]]
    warmup: NotRequired[dict[str, list[str]]]
    leaving: NotRequired[list[str]]


@dataclass(frozen=True)
class Assignment:
    """Active and standby tasks per member id; every member is a key of both, maybe empty.

    ``members`` carries each member's zone and address (interactive queries
    route with it); a member id without one gets ``Member(id)``. The
    constructor refuses contradictions: a task active on two members, or a
    standby without an active copy or on the member that holds the active one.
    ``warmup`` holds warm-up replicas (point 10), refused likewise and also
    where the member keeps a standby of the same task. ``leaving`` names the
    members on their way out (points 12 and 13): one with no active task may
    exit, and so may all of them when every member is leaving (nobody can
    take over).
    """

    active: Mapping[str, frozenset[TaskId]]
    standby: Mapping[str, frozenset[TaskId]]
    members: tuple[Member, ...] = ()
    warmup: Mapping[str, frozenset[TaskId]] = field(default_factory=dict)
    leaving: frozenset[str] = frozenset()
    _active_owner: dict[TaskId, str] = field(init=False, repr=False, compare=False)
    _standby_owners: dict[TaskId, list[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id: dict[str, Member] = {}
        for member in self.members:
            if member.id in by_id:
                raise InvalidAssignmentError(
                    f'member "{member.id}" is listed twice in the assignment; '
                    "each member appears once"
                )
            by_id[member.id] = member
        ids = sorted(set(self.active) | set(self.standby) | set(self.warmup) | set(by_id))
        active = {m: frozenset(self.active.get(m, ())) for m in ids}
        standby = {m: frozenset(self.standby.get(m, ())) for m in ids}
        warmup = {m: frozenset(self.warmup.get(m, ())) for m in ids}
        active_owner: dict[TaskId, str] = {}
        for member_id, tasks in active.items():
            for task in tasks:
                if task in active_owner:
                    raise InvalidAssignmentError(
                        f'task {task} is active on both "{active_owner[task]}" and '
                        f'"{member_id}"; a task has exactly one active copy'
                    )
                active_owner[task] = member_id
        standby_owners: dict[TaskId, list[str]] = {}
        for member_id, tasks in standby.items():
            for task in sorted(tasks):
                owner = active_owner.get(task)
                if owner is None:
                    raise InvalidAssignmentError(
                        f'task {task} has a standby on "{member_id}" but no active copy; '
                        "assign every task that has standbys"
                    )
                if owner == member_id:
                    raise InvalidAssignmentError(
                        f'task {task} is both active and standby on "{member_id}"; '
                        "a standby belongs on another member"
                    )
                standby_owners.setdefault(task, []).append(member_id)
        for member_id, tasks in warmup.items():
            for task in sorted(tasks):
                if task not in active_owner:
                    raise InvalidAssignmentError(
                        f'task {task} has a warm-up on "{member_id}" but no active copy; '
                        "assign every task that has warm-ups"
                    )
                if active_owner[task] == member_id or task in standby[member_id]:
                    raise InvalidAssignmentError(
                        f'task {task} is both a warm-up and active or standby on "{member_id}"; '
                        "a warm-up goes to a member that holds no other copy of the task"
                    )
        unknown = sorted(set(self.leaving) - set(ids))
        if unknown:
            raise InvalidAssignmentError(
                f"leaving member(s) {', '.join(unknown)} are not members of the assignment; "
                "only a member can be leaving"
            )
        object.__setattr__(self, "active", active)
        object.__setattr__(self, "standby", standby)
        object.__setattr__(self, "warmup", warmup)
        object.__setattr__(self, "leaving", frozenset(self.leaving))
        object.__setattr__(self, "members", tuple(by_id.get(m, Member(m)) for m in ids))
        object.__setattr__(self, "_active_owner", active_owner)
        object.__setattr__(self, "_standby_owners", standby_owners)

    @property
    def tasks(self) -> frozenset[TaskId]:
        """Every task this assignment hands out."""
        return frozenset(self._active_owner)

    def active_owner(self, task: TaskId) -> str:
        """The id of the member that runs ``task`` actively."""
        try:
            return self._active_owner[task]
        except KeyError:
            raise self._unknown(task) from None

    def standby_owners(self, task: TaskId) -> list[str]:
        """Ids of the members that keep a standby of ``task``, sorted; empty if it has none."""
        if task not in self._active_owner:
            raise self._unknown(task)
        return list(self._standby_owners.get(task, ()))

    def tasks_of(self, member_id: str) -> MemberTasks:
        """What ``member_id`` runs: its active and its standby tasks."""
        if member_id not in self.active:
            raise self._unknown_member(member_id)
        return MemberTasks(self.active[member_id], self.standby[member_id], self.warmup[member_id])

    @property
    def warmup_count(self) -> int:
        """How many warm-up replicas the group runs (at most ``max.warmup.replicas``)."""
        return sum(len(tasks) for tasks in self.warmup.values())

    def member(self, member_id: str) -> Member:
        """The member with this id, with its zone and query address."""
        for member in self.members:
            if member.id == member_id:
                return member
        raise self._unknown_member(member_id)

    def to_json(self) -> AssignmentJson:
        """The form the operator and the local runner publish; stable for equal assignments."""
        published: AssignmentJson = {
            "version": _JSON_VERSION,
            "members": [{"id": m.id, "zone": m.zone, "address": m.address} for m in self.members],
            "active": {m: [str(t) for t in sorted(ts)] for m, ts in self.active.items()},
            "standby": {m: [str(t) for t in sorted(ts)] for m, ts in self.standby.items()},
        }
        if self.warmup_count:
            published["warmup"] = {m: [str(t) for t in sorted(ts)] for m, ts in self.warmup.items()}
        if self.leaving:
            published["leaving"] = sorted(self.leaving)
        return published

    def handed_over(self, member_id: str) -> bool:
        """Whether ``member_id`` may exit now: it holds no active task here, or it is leaving
        and so is every member (nobody could take its tasks over: a suspend or a delete)."""
        if not self.active.get(member_id):
            return True
        return member_id in self.leaving and self.leaving >= set(self.active)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Assignment:
        """Read what :meth:`to_json` wrote (after ``json.loads``); refuses anything else."""
        if not isinstance(data, Mapping):
            raise InvalidAssignmentError(
                f"an assignment is a JSON object, not {type(data).__name__}"
            )
        version = data.get("version")
        if version != _JSON_VERSION:
            raise InvalidAssignmentError(
                f"assignment version {version!r} is not supported (this eddyline reads "
                f"version {_JSON_VERSION}); run the same eddyline version as the publisher"
            )
        raw_members = data.get("members")
        if not isinstance(raw_members, list):
            raise InvalidAssignmentError('assignment "members" must be a list of members')
        members = [_member_from_json(item) for item in raw_members]
        return cls(
            active=_tasks_from_json(data, "active"),
            standby=_tasks_from_json(data, "standby"),
            members=tuple(members),
            # Absent from what an eddyline without warm-ups published: none.
            warmup=_tasks_from_json(data, "warmup") if "warmup" in data else {},
            leaving=_leaving_from_json(data.get("leaving", [])),
        )

    def _unknown(self, task: TaskId) -> UnknownTaskError:
        return UnknownTaskError(
            f"task {task} is not in this assignment ({len(self._active_owner)} tasks); "
            "the topology or the partition count changed since it was computed: assign again"
        )

    def _unknown_member(self, member_id: str) -> UnknownMemberError:
        return UnknownMemberError(
            f'member "{member_id}" is not in this assignment (members: '
            f"{', '.join(repr(m) for m in self.active) or 'none'}); "
            "it joined after the assignment was computed: assign again"
        )


def _member_from_json(item: object) -> Member:
    if not isinstance(item, Mapping):
        raise InvalidAssignmentError(f"a member is a JSON object, not {item!r}")
    member_id, zone, address = item.get("id"), item.get("zone"), item.get("address")
    if not isinstance(member_id, str) or not member_id:
        raise InvalidAssignmentError(f'member {item!r} needs a non-empty string "id"')
    for key, value in (("zone", zone), ("address", address)):
        if value is not None and not isinstance(value, str):
            raise InvalidAssignmentError(
                f'member "{member_id}": "{key}" must be a string or null, not {value!r}'
            )
    return Member(member_id, _str_or_none(zone), _str_or_none(address))


def _leaving_from_json(raw: object) -> frozenset[str]:
    if not isinstance(raw, list) or not all(isinstance(m, str) for m in raw):
        raise InvalidAssignmentError(
            f'assignment "leaving" must be a list of member ids, not {raw!r}'
        )
    return frozenset(raw)


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _tasks_from_json(data: Mapping[str, object], key: str) -> dict[str, frozenset[TaskId]]:
    raw = data.get(key)
    if not isinstance(raw, Mapping):
        raise InvalidAssignmentError(
            f'assignment "{key}" must map member ids to lists of task ids like "1_3"'
        )
    result: dict[str, frozenset[TaskId]] = {}
    for member_id, tasks in raw.items():
        if not isinstance(member_id, str) or not isinstance(tasks, list):
            raise InvalidAssignmentError(
                f'assignment "{key}" must map member ids to lists of task ids, '
                f"not {member_id!r}: {tasks!r}"
            )
        try:
            result[member_id] = frozenset(TaskId.parse(str(text)) for text in tasks)
        except ValueError as error:
            raise InvalidAssignmentError(f'assignment "{key}" of "{member_id}": {error}') from None
    return result


# Kafka Streams' defaults (KIP-441).
DEFAULT_ACCEPTABLE_RECOVERY_LAG = 10_000
DEFAULT_MAX_WARMUP_REPLICAS = 2


@dataclass(frozen=True)
class WarmupPolicy:
    """What :func:`assign` needs to warm before moving (points 9 to 11).

    ``lags`` maps a member id to the tasks it holds a local copy of and how
    many changelog records that copy trails (the most over the task's
    stores); a task it does not name it has no copy of. ``staleness_unknown``
    maps a member id to the tasks whose copy there cannot tell how current it
    is (a copy built from nothing that has not yet reached its changelog's
    end, one reopened after a crash: ``MemberReport.tasks_of_unknown_staleness``);
    such a copy is not caught up, whatever its lag. The previous active owner
    of a task counts as caught up whatever it reports.
    """

    lags: Mapping[str, Mapping[TaskId, int]]
    acceptable_recovery_lag: int = DEFAULT_ACCEPTABLE_RECOVERY_LAG
    max_warmup_replicas: int = DEFAULT_MAX_WARMUP_REPLICAS
    staleness_unknown: Mapping[str, Collection[TaskId]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.acceptable_recovery_lag < 0:
            raise ConfigError(
                "acceptable.recovery.lag",
                self.acceptable_recovery_lag,
                "integers >= 0",
                hint=f"the default is {DEFAULT_ACCEPTABLE_RECOVERY_LAG} records",
            )
        if self.max_warmup_replicas < 1:
            raise ConfigError(
                "max.warmup.replicas",
                self.max_warmup_replicas,
                "integers >= 1",
                hint="a task moves only to a warm member, so at least one warm-up must run",
            )

    def lag(self, member_id: str, task: TaskId) -> int | None:
        """Records ``member_id``'s copy of ``task`` trails; None when it has no copy."""
        return self.lags.get(member_id, {}).get(task)

    def within_lag(self, member_id: str, task: TaskId) -> bool:
        """KIP-441's rule: ``member_id`` holds a copy of ``task`` within
        ``acceptable.recovery.lag``."""
        behind = self.lag(member_id, task)
        return behind is not None and behind <= self.acceptable_recovery_lag

    def knows_staleness(self, member_id: str, task: TaskId) -> bool:
        """``member_id``'s copy of ``task`` can tell how current it is (or its runtime does
        not say: judged by its lag alone)."""
        return task not in self.staleness_unknown.get(member_id, ())


def assign(
    tasks: Iterable[TaskId],
    members: Iterable[Member],
    num_standby_replicas: int,
    *,
    previous: Assignment | None = None,
    stateful: Collection[TaskId] | None = None,
    warmups: WarmupPolicy | None = None,
    leaving: Collection[str] = (),
) -> Assignment:
    """Hand out ``tasks`` to ``members``: one active copy each, standbys for stateful ones.

    ``stateful`` names the tasks with state stores (``None``: all of them);
    only those get standbys, and tasks in it that are not in ``tasks`` are
    ignored. ``previous`` is the assignment in force: tasks stay where it put
    them as far as balance allows, and members or tasks it names that are no
    longer given are ignored. With ``warmups``, a stateful task moves only to
    a caught-up copy and the target's member warms up first. ``leaving`` names
    members (of ``members``) on their way out: they get nothing new and hand
    their tasks over (points 12 and 13). The module docstring lists what the
    result guarantees.
    """
    if num_standby_replicas < 0:
        raise ConfigError(
            "num.standby.replicas",
            num_standby_replicas,
            "integers >= 0",
            hint="0 runs no standby replicas",
        )
    everyone = _validated_members(members)
    announced = frozenset(m.id for m in everyone if m.id in set(leaving))
    going = set(announced)
    # Nobody to hand over to: everyone keeps its tasks (and, told so by ``leaving``, may
    # exit: Assignment.handed_over).
    roster = tuple(m for m in everyone if m.id not in going) or everyone
    if len(roster) == len(everyone):
        going = set()
    ids = [m.id for m in roster]
    all_tasks = sorted(set(tasks))
    stateful_tasks = set(all_tasks) if stateful is None else set(stateful) & set(all_tasks)
    history = _History.of(previous, set(ids))

    heavy = [t for t in all_tasks if t in stateful_tasks]
    light = [t for t in all_tasks if t not in stateful_tasks]
    # Stateful tasks first, balanced on their own; stateless ones then fill up
    # each member to an even total.
    light_own = Counter(history.owner[t] for t in light if t in history.owner)
    active = _place_tier(
        heavy, ids, earlier_load=dict.fromkeys(ids, 0), later_own=light_own, history=history
    )
    _swap_cold_tasks_to_warm_members(active, history)
    heavy_load = {m: len(active[m]) for m in ids}
    no_later_tier = dict.fromkeys(ids, 0)
    light_active = _place_tier(
        light, ids, earlier_load=heavy_load, later_own=no_later_tier, history=history
    )
    for member_id, placed in light_active.items():
        active[member_id].extend(placed)

    owner = {task: member_id for member_id, placed in active.items() for task in placed}
    replicas = min(num_standby_replicas, len(ids) - 1)
    if warmups is None:
        standby = _place_standbys(heavy, roster, owner, replicas, history)
        return Assignment(
            active={m: frozenset(active[m]) for m in ids},
            standby={m: frozenset(standby.get(m, ())) for m in ids},
            members=everyone,
            leaving=announced,
        )
    return _warm_before_moving(
        heavy,
        everyone,
        owner,
        replicas=replicas,
        history=history,
        policy=warmups,
        leaving=going,
        processing=_History.of(previous, {m.id for m in everyone}).owner,
        announced=announced,
    )


def _warm_before_moving(
    heavy: Sequence[TaskId],
    roster: Sequence[Member],
    target: Mapping[TaskId, str],
    *,
    replicas: int,
    history: _History,
    policy: WarmupPolicy,
    leaving: Collection[str] = frozenset(),
    processing: Mapping[TaskId, str] | None = None,
    announced: frozenset[str] = frozenset(),
) -> Assignment:
    """Points 9 to 12: keep tasks on caught-up copies, and warm up the target's members.

    ``roster`` holds every member, ``leaving`` those the target gave nothing;
    ``processing`` is each task's previous active owner among all of them
    (``history`` knows only the staying members)."""
    ids = [m.id for m in roster]
    staying = [m for m in roster if m.id not in leaving]
    running = history.owner if processing is None else processing

    def lag(member_id: str, task: TaskId) -> int | None:
        if running.get(task) == member_id:
            return 0  # it is processing the task: nothing to catch up
        if member_id in leaving:
            return None  # a leaving member takes no task it does not run (point 12)
        return policy.lag(member_id, task)

    def within_lag(member_id: str, task: TaskId) -> bool:
        if running.get(task) == member_id:
            return True  # it is processing the task: nothing to catch up
        if member_id in leaving:
            return False  # a leaving member takes no task it does not run (point 12)
        return policy.within_lag(member_id, task)

    def caught_up(member_id: str, task: TaskId) -> bool:
        return within_lag(member_id, task) and (
            running.get(task) == member_id or policy.knows_staleness(member_id, task)
        )

    owner = dict(target)
    load = Counter(owner.values())
    # Tasks held back from the member the target wants them on.
    wanted: dict[TaskId, str] = {}
    for task in heavy:
        goal = target[task]
        if caught_up(goal, task):
            continue
        warm = [m for m in ids if caught_up(m, task)]
        if not warm:
            # No copy knows its staleness (none runs the task: a reset membership, its
            # owner lost): then the lag alone says where the state is, as in KIP-441.
            if within_lag(goal, task):
                continue
            warm = [m for m in ids if within_lag(m, task)]
        if not warm:
            continue  # nobody is caught up: moving costs nothing extra, follow the target
        # A staying copy first (a leaving member hands over to any caught-up one), then
        # the member processing it; else the copy with the least to replay.
        keeper = min(warm, key=lambda m: (m in leaving, lag(m, task) or 0, load[m], m))
        owner[task] = keeper
        load[goal] -= 1
        load[keeper] += 1
        wanted[task] = goal

    standby = _place_standbys(heavy, staying, owner, replicas, history, zones=roster)
    standby_holders: defaultdict[TaskId, set[str]] = defaultdict(set)
    for member_id, held in standby.items():
        for task in held:
            standby_holders[task].add(member_id)

    def warmup_rank(item: tuple[TaskId, str]) -> tuple[bool, int, TaskId]:
        task, goal = item
        behind = policy.lag(goal, task)
        # Warm-ups under way keep their slot first, then the ones closest to caught up.
        return (
            goal not in history.warmup_holders.get(task, ()),
            _NO_COPY if behind is None else behind,
            task,
        )

    candidates = [(t, g) for t, g in wanted.items() if g not in standby_holders[t]]
    warmup: dict[str, list[TaskId]] = defaultdict(list)
    for task, goal in sorted(candidates, key=warmup_rank)[: policy.max_warmup_replicas]:
        warmup[goal].append(task)

    active: dict[str, list[TaskId]] = {m: [] for m in ids}
    for task, member_id in owner.items():
        active[member_id].append(task)
    return Assignment(
        active={m: frozenset(active[m]) for m in ids},
        standby={m: frozenset(standby.get(m, ())) for m in ids},
        members=tuple(roster),
        warmup={m: frozenset(warmup.get(m, ())) for m in ids},
        leaving=announced,
    )


# Ranks a member without a copy behind every member with one.
_NO_COPY = 2**62


def _validated_members(members: Iterable[Member]) -> tuple[Member, ...]:
    roster = sorted(members, key=lambda m: m.id)
    if not roster:
        raise InvalidMembersError(
            "cannot assign tasks to no members: start at least one member "
            "(scale the StreamApp to replicas >= 1, or run a local process)"
        )
    seen: set[str] = set()
    for member in roster:
        if not member.id:
            raise InvalidMembersError(
                f"member {member!r} has an empty id; give every member its pod or process name"
            )
        if member.id in seen:
            raise InvalidMembersError(
                f'member id "{member.id}" is given twice; every member needs a unique id '
                "(its pod name, or a distinct name per local process)"
            )
        seen.add(member.id)
    return tuple(roster)


@dataclass(frozen=True)
class _History:
    """What the previous assignment says about the members still present."""

    owner: Mapping[TaskId, str]
    # Members holding a copy besides the active one: standbys and warm-ups alike, since
    # a warm-up replays like a standby (and is meant to be promoted like one).
    standby_holders: Mapping[TaskId, frozenset[str]]
    warmup_holders: Mapping[TaskId, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, previous: Assignment | None, present: set[str]) -> _History:
        if previous is None:
            return cls({}, {})
        owner = {
            task: member_id
            for member_id, tasks in previous.active.items()
            if member_id in present
            for task in tasks
        }
        holders: defaultdict[TaskId, set[str]] = defaultdict(set)
        warming: defaultdict[TaskId, set[str]] = defaultdict(set)
        for member_id, tasks in previous.standby.items():
            if member_id in present:
                for task in tasks:
                    holders[task].add(member_id)
        for member_id, tasks in previous.warmup.items():
            if member_id in present:
                for task in tasks:
                    holders[task].add(member_id)
                    warming[task].add(member_id)
        return cls(
            owner,
            {task: frozenset(ms) for task, ms in holders.items()},
            {task: frozenset(ms) for task, ms in warming.items()},
        )

    def warmed_elsewhere(self, member_id: str) -> frozenset[TaskId]:
        """Tasks some other member warms up: the ones ``member_id`` should give away first."""
        return frozenset(task for task, ms in self.warmup_holders.items() if ms - {member_id})


def _place_tier(
    tasks: Sequence[TaskId],
    ids: Sequence[str],
    *,
    earlier_load: Mapping[str, int],
    later_own: Mapping[str, int],
    history: _History,
) -> dict[str, list[TaskId]]:
    """Place one tier's ``tasks`` (sorted) so that ``earlier_load`` + this tier is balanced.

    ``later_own`` counts, per member, its own tasks of the tier placed next.

    Order of preference for each task: stay on its previous member, go to a
    member holding its standby (a maximum matching), go to the member with
    the fewest tasks of its sub-topology (spreading each sub-topology's load).
    """
    own: dict[str, list[TaskId]] = {m: [] for m in ids}
    for task in tasks:
        previous_owner = history.owner.get(task)
        if previous_owner is not None:
            own[previous_owner].append(task)
    homeless = [t for t in tasks if t not in history.owner]
    capacity = _capacities(
        len(tasks),
        ids,
        earlier_load=earlier_load,
        later_own=later_own,
        own=own,
        homeless=homeless,
        history=history,
    )

    placed = {
        m: _keep(own[m], capacity[m], warm_elsewhere=history.warmed_elsewhere(m)) for m in ids
    }
    kept = {t for ts in placed.values() for t in ts}
    unplaced = [t for t in tasks if t not in kept]
    room = {m: capacity[m] - len(placed[m]) for m in ids}

    for task, member_id in _promotions(unplaced, room, history).items():
        placed[member_id].append(task)
        room[member_id] -= 1
    promoted = {t for ts in placed.values() for t in ts}

    same_subtopology = {m: Counter(t.subtopology for t in placed[m]) for m in ids}
    for task in unplaced:
        if task in promoted:
            continue
        member_id = min(
            (m for m in ids if room[m] > 0),
            key=lambda m: (same_subtopology[m][task.subtopology], -room[m], m),
        )
        placed[member_id].append(task)
        room[member_id] -= 1
        same_subtopology[member_id][task.subtopology] += 1
    return placed


def _capacities(
    count: int,
    ids: Sequence[str],
    *,
    earlier_load: Mapping[str, int],
    later_own: Mapping[str, int],
    own: Mapping[str, Sequence[TaskId]],
    homeless: Sequence[TaskId],
    history: _History,
) -> dict[str, int]:
    """How many of this tier's ``count`` tasks each member takes, for balanced totals.

    Totals are ``base`` or ``base + 1``; the ``extra`` members with ``base + 1``
    are, in order: those the earlier tier already put above ``base`` (needed
    for feasibility), those that keep one more of their own tasks with it
    (stickiness), those that can take one more task they hold as a standby
    (promotion), those with fewer own tasks in the next tier (which then
    keep them), then by id.
    """
    base, extra = divmod(count + sum(earlier_load.values()), len(ids))
    wanted_as_standby = Counter(m for t in homeless for m in history.standby_holders.get(t, ()))

    def priority(member_id: str) -> tuple[bool, bool, bool, int, str]:
        room = base - earlier_load[member_id]
        free_room = max(0, room - len(own[member_id]))
        return (
            not earlier_load[member_id] > base,
            not len(own[member_id]) > room,
            not wanted_as_standby[member_id] > free_room,
            later_own[member_id],
            member_id,
        )

    # The earlier tier is balanced, so at most ``extra`` members exceed ``base``
    # (if base equals its per-member floor, its own extra count is <= extra).
    favoured = set(sorted(ids, key=priority)[:extra])
    return {m: base - earlier_load[m] + (m in favoured) for m in ids}


def _swap_cold_tasks_to_warm_members(placed: dict[str, list[TaskId]], history: _History) -> None:
    """Swap tasks so that fewer land where their state is not (a cold start).

    Balance can leave a lost member's task on a member without its state
    while the member holding its standby is full of its own tasks. If that
    member also runs a task whose standby the cold member holds, swapping the
    two makes both warm: each restores only its changelog tail. Counts per
    member do not change; every swap adds a warm placement, so this ends.
    """

    def warm(member_id: str, task: TaskId) -> bool:
        return history.owner.get(task) == member_id or member_id in history.standby_holders.get(
            task, ()
        )

    swapped = True
    while swapped:
        swapped = False
        for cold_member in sorted(placed):
            for task in sorted(placed[cold_member]):
                if warm(cold_member, task):
                    continue
                for holder in sorted(history.standby_holders.get(task, ())):
                    partner = next(
                        (
                            other
                            for other in sorted(placed.get(holder, ()))
                            if warm(cold_member, other)
                        ),
                        None,
                    )
                    if holder == cold_member or partner is None:
                        continue
                    placed[cold_member].remove(task)
                    placed[holder].remove(partner)
                    placed[cold_member].append(partner)
                    placed[holder].append(task)
                    swapped = True
                    break
                if swapped:
                    break
            if swapped:
                break


def _keep(
    own: Sequence[TaskId], capacity: int, *, warm_elsewhere: Collection[TaskId] = ()
) -> list[TaskId]:
    """The tasks a member keeps when it has more than ``capacity`` of its own.

    Tasks in ``warm_elsewhere`` (another member warmed up for them) go first: a
    probing rebalance then moves the tasks whose new member is ready, and the
    steps towards balance move the same tasks the first one chose.
    """
    kept = list(own)
    while len(kept) > capacity:
        # Give away the sub-topology it holds most of (its highest partition),
        # so what stays is spread over sub-topologies.
        counts = Counter(t.subtopology for t in kept)
        kept.remove(
            max(
                kept,
                key=lambda t: (
                    t in warm_elsewhere,
                    counts[t.subtopology],
                    t.subtopology,
                    t.partition,
                ),
            )
        )
    return kept


def _promotions(
    unplaced: Sequence[TaskId], room: Mapping[str, int], history: _History
) -> dict[TaskId, str]:
    """A maximum matching of tasks to members with room that hold them as standbys.

    Kuhn's augmenting paths with capacities: a task may take a slot from
    another task that can move to another of its standby holders.
    """
    holders = {
        t: sorted(m for m in history.standby_holders.get(t, ()) if room.get(m, 0) > 0)
        for t in unplaced
    }
    taken: dict[str, list[TaskId]] = defaultdict(list)
    match: dict[TaskId, str] = {}

    def augment(task: TaskId, visited: set[str]) -> bool:
        for member_id in holders[task]:
            if member_id in visited:
                continue
            visited.add(member_id)
            if len(taken[member_id]) < room[member_id]:
                taken[member_id].append(task)
                match[task] = member_id
                return True
            for other in list(taken[member_id]):
                if augment(other, visited):
                    taken[member_id].remove(other)
                    taken[member_id].append(task)
                    match[task] = member_id
                    return True
        return False

    for task in unplaced:
        if holders[task]:
            augment(task, set())
    return match


def _place_standbys(
    tasks: Sequence[TaskId],
    roster: Sequence[Member],
    owner: Mapping[TaskId, str],
    replicas: int,
    history: _History,
    *,
    zones: Sequence[Member] = (),
) -> dict[str, list[TaskId]]:
    """``replicas`` standbys for each of ``tasks`` (sorted, stateful), per member id, on
    ``roster``'s members; ``zones`` adds the zones of owners outside it (leaving ones)."""
    if replicas == 0 or not tasks:
        return {}
    zone = {m.id: m.zone for m in (*zones, *roster)}
    ids = [m.id for m in roster]
    # Copies of a task (active + standbys) that may share a zone with another
    # copy: only those beyond one per zone.
    # The zones standbys can use: the roster's (a leaving owner's zone holds no standby).
    zone_count = len({m.zone for m in roster})
    shared_zone_budget = max(0, replicas + 1 - zone_count)
    chosen: dict[TaskId, list[str]] = {t: [] for t in tasks}
    load = dict.fromkeys(ids, 0)
    # Standbys on member m of tasks active on member a: spreading them means a
    # lost member's tasks are promoted on several members, not piled on one.
    pairs: Counter[tuple[str, str]] = Counter()
    sticky: set[tuple[TaskId, str]] = set()

    def choose(task: TaskId, member_id: str) -> None:
        chosen[task].append(member_id)
        load[member_id] += 1
        pairs[owner[task], member_id] += 1

    def shares_zone(task: TaskId, member_id: str) -> bool:
        return zone[member_id] in {zone[owner[task]], *(zone[m] for m in chosen[task])}

    def shared_copies(task: TaskId) -> int:
        copies = [owner[task], *chosen[task]]
        return len(copies) - len({zone[m] for m in copies})

    # Stay where the state already is: on the previous standbys, and on the
    # previous active member if the task moved away from it.
    for task in tasks:
        with_state = sorted(history.standby_holders.get(task, frozenset()) - {owner[task]})
        previous_owner = history.owner.get(task)
        if previous_owner is not None and previous_owner != owner[task]:
            with_state.insert(0, previous_owner)
        for member_id in with_state:
            if len(chosen[task]) < replicas and not shares_zone(task, member_id):
                choose(task, member_id)
                sticky.add((task, member_id))
        for member_id in with_state:
            if (
                len(chosen[task]) < replicas
                and member_id not in chosen[task]
                and shared_copies(task) < shared_zone_budget
            ):
                choose(task, member_id)
                sticky.add((task, member_id))

    for task in tasks:
        while len(chosen[task]) < replicas:
            candidates = [m for m in ids if m != owner[task] and m not in chosen[task]]
            if shared_copies(task) >= shared_zone_budget:
                candidates = [m for m in candidates if not shares_zone(task, m)]
            choose(
                task,
                min(
                    candidates,
                    key=lambda m: (shares_zone(task, m), load[m], pairs[owner[task], m], m),
                ),
            )

    need_zones = min(replicas + 1, zone_count)
    _even_out_standbys(chosen, ids, owner=owner, zone=zone, need_zones=need_zones, sticky=sticky)
    standby: dict[str, list[TaskId]] = defaultdict(list)
    for task in tasks:
        for member_id in chosen[task]:
            standby[member_id].append(task)
    return standby


def _even_out_standbys(
    chosen: dict[TaskId, list[str]],
    ids: Sequence[str],
    *,
    owner: Mapping[TaskId, str],
    zone: Mapping[str, str | None],
    need_zones: int,
    sticky: set[tuple[TaskId, str]],
) -> None:
    """Move standbys along chains of members until no chain evens out two loads.

    A chain moves a standby from member ``x`` to ``y``, one from ``y`` to
    ``z``, ... and ends at a member with at least two standbys fewer than
    ``x``: each chain lowers the sum of squared loads, so this ends. Every
    move keeps the task's copies on distinct members and in ``need_zones``
    zones; standbys placed in this round move before those that stayed.
    Without zones this is the augmenting-path search of a balanced
    b-matching; with zones (where balance may be impossible anyway) it evens
    out what it finds.
    """
    holding: dict[str, list[TaskId]] = {m: [] for m in ids}
    for task in sorted(chosen):
        for member_id in chosen[task]:
            holding[member_id].append(task)
    by_zone: dict[str | None, list[str]] = defaultdict(list)
    for member_id in ids:
        by_zone[zone[member_id]].append(member_id)
    # Two moves of one task in a chain are each valid alone but could together
    # leave too few zones; without a zone rule they are always valid together.
    zones_matter = need_zones > 1

    def target_zones(task: TaskId, source: str) -> list[str | None]:
        others = {zone[owner[task]], *(zone[m] for m in chosen[task] if m != source)}
        if len(others) >= need_zones:
            return list(by_zone)
        if len(others) + 1 < need_zones:
            return []
        return [z for z in by_zone if z not in others]

    def search(source: str) -> tuple[list[tuple[str, str, TaskId]] | None, set[str]]:
        """A chain from ``source`` (breadth first), and the members it reached."""
        start_load = len(holding[source])
        parent: dict[str, tuple[str, TaskId] | None] = {source: None}
        unvisited = {
            z: dict.fromkeys(m for m in members if m != source) for z, members in by_zone.items()
        }
        queue = deque([source])
        while queue:
            current = queue.popleft()
            on_path = _tasks_on_path(parent, current) if zones_matter else set()
            for task in sorted(holding[current], key=lambda t: ((t, current) in sticky, t)):
                if task in on_path:
                    continue
                for target_zone in target_zones(task, current):
                    pool = unvisited[target_zone]
                    for target in [m for m in pool if m != owner[task] and m not in chosen[task]]:
                        del pool[target]
                        parent[target] = (current, task)
                        if len(holding[target]) <= start_load - 2:
                            return _unwind(parent, target), set(parent)
                        queue.append(target)
        return None, set(parent)

    while True:
        load = {m: len(holding[m]) for m in ids}
        lightest = min(load.values())
        # A member reached by a failed search cannot start a chain either: what
        # it reaches, the failed start reached too, and it is no heavier (exact
        # without zones; with them, paths that avoid reusing a task may differ).
        exhausted: set[str] = set()
        for source in sorted(ids, key=lambda m: (-load[m], m)):
            if load[source] - lightest < 2:
                return
            if source in exhausted:
                continue
            chain, reached = search(source)
            if chain is None:
                exhausted |= reached
                continue
            for from_member, to_member, task in chain:
                chosen[task][chosen[task].index(from_member)] = to_member
                holding[from_member].remove(task)
                holding[to_member].append(task)
            break
        else:
            return


def _tasks_on_path(parent: Mapping[str, tuple[str, TaskId] | None], member_id: str) -> set[TaskId]:
    tasks: set[TaskId] = set()
    step = parent[member_id]
    while step is not None:
        tasks.add(step[1])
        step = parent[step[0]]
    return tasks


def _unwind(
    parent: Mapping[str, tuple[str, TaskId] | None], target: str
) -> list[tuple[str, str, TaskId]]:
    """The moves of the chain that ends at ``target``, as (from, to, task)."""
    chain: list[tuple[str, str, TaskId]] = []
    step = parent[target]
    while step is not None:
        source, task = step
        chain.append((source, target, task))
        target = source
        step = parent[source]
    return chain
