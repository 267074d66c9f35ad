"""The published membership: who is in the group and which tasks each member runs.

One writer publishes it (the local group's supervisor locally, the operator on
a cluster) and every member follows it. It is a generation number and an
:class:`~eddyline_runtime.assignor.Assignment`; members act on a generation
they have not seen yet. Safety never rests on members reading it in time:
taking a task over fences its previous owner's transactional producer.
"""

from __future__ import annotations

import enum
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eddyline_runtime.assignor import Assignment, WarmupPolicy
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.resource_names import GeneratedName

# The file name a local group publishes under its state.dir.
MEMBERSHIP_FILE = "membership.json"


@dataclass(frozen=True)
class Membership:
    """What the membership file holds: a generation number and the assignment."""

    generation: int
    assignment: Assignment

    @classmethod
    def read(cls, path: Path) -> Membership | None:
        """The published membership, or None when there is none (yet)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return cls.from_json(data)

    def write(self, path: Path) -> None:
        """Replace the file atomically: readers see the old or the new one, never half."""
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(
            json.dumps(self.to_json()),
            encoding="utf-8",
        )
        os.replace(temporary, path)

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "assignment": self.assignment.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Membership:
        return cls(int(data["generation"]), Assignment.from_json(data["assignment"]))


# Before the first generation an authority publishes (both number theirs from 1): no tasks.
NOTHING_ASSIGNED = Membership(0, Assignment(active={}, standby={}))


class MembershipSource(Protocol):
    """Who decides which tasks a member runs, and how the member hears of a change.

    Every member starts and follows the same way (``runner.run_member``); only
    the source differs: a single process decides alone (:class:`SoleMember`), a
    local group's replica follows the file its supervisor writes
    (:class:`MembershipFile`), a pod follows the ConfigMap the operator writes
    (``cluster_membership.ConfigMapMembership``).
    """

    # How often the member asks current(): a file read, or a memory read.
    poll_seconds: float

    def start(self, member_id: str) -> Membership | None:
        """Begin following; the membership to start from. None: this member decides
        alone and runs every task (the instance assigns them once it knows the topics)."""
        ...

    def current(self) -> Membership | None:
        """The newest published membership (None while there is none); the member acts
        on each generation it has not seen."""
        ...

    def stop(self) -> None:
        """Stop following: the member is closing."""
        ...


class SoleMember:
    """A single process: nobody else to agree with, so no membership to follow."""

    poll_seconds = 0.05

    def start(self, member_id: str) -> Membership | None:
        return None

    def current(self) -> Membership | None:
        return None

    def stop(self) -> None:
        pass


class MembershipFile:
    """A local group's replica: follows the file the group's supervisor publishes.

    A replica starts once the file names it (the supervisor writes the file
    before it spawns replicas, and again when one joins), or fails after
    ``timeout`` seconds saying how replicas are meant to start.
    """

    poll_seconds = 0.1

    def __init__(self, path: Path, *, timeout: float = 30.0) -> None:
        self.path = path
        self.timeout = timeout

    def start(self, member_id: str) -> Membership:
        deadline = time.monotonic() + self.timeout
        while True:
            membership = self.current()
            if membership is not None and member_id in membership.assignment.active:
                return membership
            if time.monotonic() > deadline:
                raise EddylineError(
                    f"replica {member_id} is not in {self.path} after {self.timeout:.0f} s; "
                    "start replicas through `eddyline run` (which writes that file)"
                )
            time.sleep(self.poll_seconds)

    def current(self) -> Membership | None:
        try:
            return Membership.read(self.path)
        except (ValueError, KeyError, TypeError, OSError) as error:
            raise EddylineError(
                f'member file "{self.path}" is not a membership eddyline wrote '
                f"({type(error).__name__}: {error}); start replicas through `eddyline run` "
                "(which writes it), or remove the file"
            ) from None

    def stop(self) -> None:
        pass


# A member's report: what a pod tells the membership authority over its query port
# (GET /v1/layout). The operator never imports user code, so the task layout comes
# from the pods that run it.


class StoreRole(enum.StrEnum):
    """What a copy of a store partition is to its member; the value is the report's word.

    An instance's own view (:class:`~eddyline_runtime.engine.queryable.LocalStorePartition`)
    holds only ACTIVE and STANDBY copies, with ``running`` telling a restoring active copy;
    a report spells that RESTORING.
    """

    ACTIVE = "active"
    STANDBY = "standby"
    # An active copy still replaying its changelog.
    RESTORING = "restoring"
    # A copy (active, standby or warm-up) whose store is missing, waiting for a Spark restore
    # build (its lag is the changelog a replay would read).
    RESTORE_PENDING = "restorePending"


STORE_ROLES = tuple(role.value for role in StoreRole)
RESTORE_PENDING = StoreRole.RESTORE_PENDING


@dataclass(frozen=True)
class StoreCopy:
    """One store partition a member holds: its role, how far it trails its changelog, and
    the bytes it takes on disk (None: an in-memory store, a copy waiting for a restore build
    that holds nothing yet, or a report from a runtime before sizes were reported).

    ``as_of_ms`` and ``staleness_ms`` say how current the copy's committed data is when
    the report is made (query/staleness.py defines both; None: the copy cannot tell, or a
    runtime that did not report them). They change with every report, so they take no
    part in a copy's equality: two reports of the same layout compare equal.
    ``reports_staleness`` tells the two Nones apart: True when the member reported them
    (null meaning the copy cannot tell), False for a runtime from before staleness.
    """

    role: StoreRole
    lag: int
    disk_bytes: int | None = None
    as_of_ms: int | None = field(default=None, compare=False)
    staleness_ms: int | None = field(default=None, compare=False)
    reports_staleness: bool = field(default=False, compare=False)

    @property
    def staleness_unknown(self) -> bool:
        """The member said this copy cannot tell how current it is (docs/queries.md)."""
        return self.reports_staleness and self.as_of_ms is None

    def __post_init__(self) -> None:
        # A report read from JSON (or written by hand) names the role by its word.
        if not isinstance(self.role, StoreRole):
            object.__setattr__(self, "role", _store_role(self.role))


def _store_role(word: Any) -> StoreRole:
    try:
        return StoreRole(word)
    except ValueError:
        raise ValueError(
            f"unknown store role {word!r}; a member reports one of {', '.join(STORE_ROLES)}"
        ) from None


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _copy_json(copy: StoreCopy) -> dict[str, Any]:
    # No size is written as none: a copy without one reads back the same (from_json).
    document: dict[str, Any] = {"role": copy.role.value, "lag": copy.lag}
    if copy.disk_bytes is not None:
        document["disk_bytes"] = copy.disk_bytes
    if copy.role is not StoreRole.RESTORE_PENDING and (
        copy.reports_staleness or copy.as_of_ms is not None
    ):
        # Written even when unknown (null), so a reader tells "cannot tell" from a runtime
        # that did not report staleness (the router asks the latter's copies anyway, and
        # the assignor judges them by lag alone); a copy built without it reads back so.
        # A copy waiting for a build holds nothing and has no staleness to report.
        document["as_of_ms"] = copy.as_of_ms
        document["staleness_ms"] = copy.staleness_ms
    return document


@dataclass(frozen=True)
class GlobalStoreCopy:
    """A global store on a member: the topic it holds whole, whether its bootstrap is
    over (the member is not ready before), and how many of the topic's records it has
    not applied yet. Global stores have no task, so they take no part in assignment."""

    topic: str
    bootstrapped: bool
    lag: int


@dataclass(frozen=True)
class MemberReport:
    """A member's task layout and the store partitions it holds.

    ``topology_hash`` is a hash of the topology's ``describe()``: members whose
    hashes differ run different topologies (an upgrade under way), and the
    authority assigns only the tasks of one. ``tasks`` are sub-topologies x
    partitions; ``stateful`` those that get standbys. ``ready`` is the
    member's own /readyz.
    """

    member: str
    topology_hash: str
    tasks: frozenset[TaskId]
    stateful: frozenset[TaskId]
    stores: dict[str, dict[int, StoreCopy]]
    ready: bool
    # Which sub-topology owns each persistent store (KIP-816: store names survive a topology
    # change, ordinals do not); an upgrade assigns new tasks where their state is with it.
    store_owners: dict[str, int] = field(default_factory=dict)
    # Store copies this member set aside in its quarantine since it started, because their
    # changelog no longer fitted them (rebuilt from the changelog; the operator reports it).
    stores_set_aside: tuple[str, ...] = ()
    # The member is on its way out (SIGTERM on a cluster): it keeps processing until the
    # published membership gives it no active task, and must be given nothing new.
    leaving: bool = False
    # Global stores held here (every member holds each whole): store -> its copy.
    global_stores: dict[str, GlobalStoreCopy] = field(default_factory=dict)
    # The stores and internal topics its topology named itself, with what each means: an
    # upgrade compares them across revisions (eddyline_runtime.resource_names.moved_names).
    generated_names: tuple[GeneratedName, ...] = ()
    # Its topology's internal (repartition) topics, as the topology names them (without the
    # application.id): with store_owners, every name an upgrade may find kept.
    internal_topics: tuple[str, ...] = ()

    def max_standby_lag(self) -> int | None:
        """The largest lag of a standby copy held here; None when it holds none."""
        lags = [
            copy.lag
            for partitions in self.stores.values()
            for copy in partitions.values()
            if copy.role is StoreRole.STANDBY
        ]
        return max(lags) if lags else None

    def task_lags(self) -> dict[TaskId, int]:
        """Per task this member holds a copy of, how far the copy trails: the most over the
        task's stores (the assignor's warm-up input, ``assignor.WarmupPolicy.lags``).

        A store is a task's through ``store_owners`` (its sub-topology) and its partition.
        A copy waiting for a Spark build holds nothing yet and is left out.
        """
        lags: dict[TaskId, int] = {}
        for store, partitions in self.stores.items():
            subtopology = self.store_owners.get(store)
            if subtopology is None:
                continue
            for partition, copy in partitions.items():
                if copy.role is StoreRole.RESTORE_PENDING:
                    continue
                task = TaskId(subtopology, partition)
                lags[task] = max(lags.get(task, 0), copy.lag)
        return lags

    def tasks_of_unknown_staleness(self) -> frozenset[TaskId]:
        """The tasks of which some store copy here cannot tell how current it is (restoring
        or replaying from nothing, reopened after a crash): not caught up for the assignor
        (``assignor.WarmupPolicy.staleness_unknown``), whatever their lag. A copy of a
        runtime that does not report staleness is judged by its lag alone, as before."""
        return self.tasks_with(
            lambda copy: copy.role is not StoreRole.RESTORE_PENDING and copy.staleness_unknown
        )

    def tasks_with(self, matches: Callable[[StoreCopy], bool]) -> frozenset[TaskId]:
        """The tasks of which some store copy named here ``matches``."""
        tasks: set[TaskId] = set()
        for store, partitions in self.stores.items():
            subtopology = self.store_owners.get(store)
            if subtopology is None:
                continue
            for partition, copy in partitions.items():
                if matches(copy):
                    tasks.add(TaskId(subtopology, partition))
        return frozenset(tasks)

    def to_json(self) -> dict[str, Any]:
        return {
            "member": self.member,
            "topology_hash": self.topology_hash,
            "tasks": [str(t) for t in sorted(self.tasks)],
            "stateful_tasks": [str(t) for t in sorted(self.stateful)],
            "stores": {
                store: {
                    str(partition): _copy_json(copy)
                    for partition, copy in sorted(partitions.items())
                }
                for store, partitions in sorted(self.stores.items())
            },
            "ready": self.ready,
            "store_owners": dict(sorted(self.store_owners.items())),
            "stores_set_aside": list(self.stores_set_aside),
            "leaving": self.leaving,
            "global_stores": {
                name: {"topic": copy.topic, "bootstrapped": copy.bootstrapped, "lag": copy.lag}
                for name, copy in sorted(self.global_stores.items())
            },
            "generated_names": [name.to_json() for name in self.generated_names],
            "internal_topics": list(self.internal_topics),
        }

    @classmethod
    def from_json(cls, data: Any) -> MemberReport:
        """Read what :meth:`to_json` wrote; a malformed report raises ValueError naming why."""
        try:
            stores = {
                str(store): {
                    int(partition): StoreCopy(
                        _store_role(copy["role"]),
                        int(copy["lag"]),
                        # Absent from an older runtime's report: its size is not known.
                        None if copy.get("disk_bytes") is None else int(copy["disk_bytes"]),
                        # Absent from an older runtime's report, null when the copy cannot
                        # tell: unknown either way; reports_staleness tells which.
                        as_of_ms=_optional_int(copy.get("as_of_ms")),
                        staleness_ms=_optional_int(copy.get("staleness_ms")),
                        reports_staleness="as_of_ms" in copy,
                    )
                    for partition, copy in partitions.items()
                }
                for store, partitions in data["stores"].items()
            }
            return cls(
                member=str(data["member"]),
                topology_hash=str(data["topology_hash"]),
                tasks=frozenset(TaskId.parse(t) for t in data["tasks"]),
                stateful=frozenset(TaskId.parse(t) for t in data["stateful_tasks"]),
                stores=stores,
                ready=bool(data["ready"]),
                store_owners={str(k): int(v) for k, v in (data.get("store_owners") or {}).items()},
                stores_set_aside=tuple(str(p) for p in data.get("stores_set_aside") or ()),
                # Absent from an older runtime's report: it does not hand over, it just exits.
                leaving=bool(data.get("leaving", False)),
                # Absent from an older runtime's report: it had no global stores.
                global_stores={
                    str(name): GlobalStoreCopy(
                        str(copy["topic"]), bool(copy["bootstrapped"]), int(copy["lag"])
                    )
                    for name, copy in (data.get("global_stores") or {}).items()
                },
                # Absent from an older runtime's report: its generated names are not known,
                # and an upgrade from it compares none.
                generated_names=tuple(
                    GeneratedName.from_json(name) for name in data.get("generated_names") or ()
                ),
                internal_topics=tuple(str(t) for t in data.get("internal_topics") or ()),
            )
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"not a member report ({error!r}): {str(data)[:200]}") from None


def warmup_policy(
    reports: Mapping[str, MemberReport], *, acceptable_recovery_lag: int, max_warmup_replicas: int
) -> WarmupPolicy:
    """What the assignor judges warm-ups by (KIP-441), from what each member last reported:
    its copies' lags, and which cannot tell their staleness (those are not caught up, point 9
    of the assignor). The operator and the local runner both assign with it."""
    return WarmupPolicy(
        {member: report.task_lags() for member, report in reports.items()},
        acceptable_recovery_lag=acceptable_recovery_lag,
        max_warmup_replicas=max_warmup_replicas,
        staleness_unknown={
            member: report.tasks_of_unknown_staleness() for member, report in reports.items()
        },
    )
