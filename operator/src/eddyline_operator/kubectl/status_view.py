"""One StreamApp as ``kubectl eddyline status`` shows it: a pure view of what was read.

Three sources, each authoritative for one thing: the StreamApp's status (what the operator
decided and recorded: revision, conditions, upgrades, restore Jobs, autoscaling), the
membership ConfigMap (where each task's active, standby and warm-up copies are assigned,
and each member's zone), and the pods' own ``/v1/layout`` reports (what each copy is doing
now: restoring or waiting for a restore build, how far it trails its changelog, and its
bytes on disk). The view joins them per task and per pod; a pod that did not answer still
appears, with why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from eddyline_operator.reconcile.autoscale import PodSample

# The operator's own rule for the pause annotation (its value, any case), not a copy.
from eddyline_operator.reconcile.plan import is_paused
from eddyline_operator.reconcile.status_record import read_status
from eddyline_runtime.membership import MemberReport, Membership, StoreRole
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.spec import StreamAppStatus

Obj = dict[str, Any]

# A copy's role as the view names it: the assignment's words, refined by the pod's report.
ACTIVE, STANDBY, WARMUP = "active", "standby", "warmup"

# How to draw the topology that runs. `eddyline describe` reads the StreamApp's YAML and
# imports the topology's module beside it: both are on the user's machine, not in the
# cluster, so the command names the manifest and the user supplies it; `--hash` on the same
# file prints the describe hash status shows when it is the topology that runs.
DRAW_COMMAND = "eddyline describe MANIFEST --format svg > {app}.svg"


@dataclass(frozen=True)
class Copy:
    """One copy of a task on one pod. ``lag``: records its stores trail their changelogs by
    (the most over the task's stores); None for a stateless task or a silent pod.
    ``disk_bytes``: what its stores take on the pod's volume (the sum over the task's stores
    that report one); None when none does (stateless, in memory, a silent or older pod)."""

    pod: str
    zone: str | None
    role: str
    lag: int | None
    disk_bytes: int | None = None


@dataclass(frozen=True)
class TaskRow:
    task: str
    active: Copy | None
    standbys: tuple[Copy, ...]
    warmups: tuple[Copy, ...]


@dataclass(frozen=True)
class PodRow:
    name: str
    zone: str | None
    node: str | None
    phase: str
    ready: bool
    member: bool
    active: int
    standby: int
    topology_hash: str | None
    # Why the pod's /v1/layout is missing (starting, refused, ...); None when it answered.
    layout_error: str | None
    # From the pod's /metrics (None when it did not answer): the mean busy share of its
    # stream threads (0 to 1), records processed per second, and the records its consumers
    # trail their input partitions by (the autoscaler's inputs).
    busy: float | None = None
    rate: float | None = None
    input_lag: int | None = None
    # Bytes on disk of every store copy the pod reports (what its volume holds of state);
    # None when it reports no size.
    store_bytes: int | None = None


@dataclass(frozen=True)
class AppView:
    name: str
    namespace: str
    generation: int | None
    paused: bool
    spec_topology: str
    status: StreamAppStatus
    membership_generation: int | None
    pods: tuple[PodRow, ...]
    tasks: tuple[TaskRow, ...]
    # Store name -> the sub-topology that owns it, as the pods report it.
    stores: dict[str, int]
    # The describe() hash of the topology that runs (running_hash), None before any pod or
    # the operator has one; and the command that draws it.
    topology_hash: str | None = None
    draw_command: str = ""

    def to_json(self) -> Obj:
        """The view for scripts (``-o json``): the status as the API holds it, the rest as
        the text shows it."""
        return {
            "name": self.name,
            "namespace": self.namespace,
            "generation": self.generation,
            "paused": self.paused,
            "specTopology": self.spec_topology,
            "status": self.status.model_dump(mode="json", by_alias=True, exclude_none=True),
            "membershipGeneration": self.membership_generation,
            "stores": self.stores,
            "topologyHash": self.topology_hash,
            "drawCommand": self.draw_command,
            "pods": [camel_case(asdict(pod)) for pod in self.pods],
            "tasks": [camel_case(asdict(task)) for task in self.tasks],
        }


def camel_case(value: Any) -> Any:
    """``value`` with every dict key in the API's camelCase (``layout_error`` ->
    ``layoutError``), so one JSON document never mixes the two."""
    if isinstance(value, dict):
        return {_camel(str(k)): camel_case(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [camel_case(v) for v in value]
    return value


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(word.title() for word in rest)


def app_view(
    app: Obj,
    pods: list[Obj],
    membership: Membership | None,
    reports: dict[str, MemberReport],
    layout_errors: dict[str, str],
    *,
    samples: Mapping[str, PodSample] | None = None,
) -> AppView:
    """The view of ``app`` from its pods, its published membership, the pods' reports
    (``layout_errors``: why a pod has no report) and their metrics (``samples``)."""
    samples = samples or {}
    meta = app.get("metadata") or {}
    status, _ = read_status(app.get("status"))
    topology = (app.get("spec") or {}).get("topology") or {}
    assignment = membership.assignment if membership is not None else None
    zones = {m.id: m.zone for m in assignment.members} if assignment is not None else {}
    stores: dict[str, int] = {}
    for report in reports.values():
        stores.update(report.store_owners)

    def copy(pod: str, task: TaskId, assigned: str) -> Copy:
        report = reports.get(pod)
        role, lag, size = assigned, None, None
        if report is not None:
            lags = [
                held
                for store, sub in report.store_owners.items()
                if sub == task.subtopology
                and (held := report.stores.get(store, {}).get(task.partition)) is not None
            ]
            if lags:
                lag = max(c.lag for c in lags)
                size = _total(c.disk_bytes for c in lags)
                # What the pod says it is doing with the copy beats what it was assigned.
                roles = {c.role for c in lags}
                for doing in (StoreRole.RESTORE_PENDING, StoreRole.RESTORING):
                    if doing in roles:
                        role = doing.value
                        break
        return Copy(pod, zones.get(pod), role, lag, size)

    rows: list[TaskRow] = []
    if assignment is not None:
        for task in sorted(assignment.tasks):
            owner = assignment.active_owner(task)
            rows.append(
                TaskRow(
                    task=str(task),
                    active=copy(owner, task, ACTIVE),
                    standbys=tuple(
                        copy(m, task, STANDBY) for m in sorted(assignment.standby_owners(task))
                    ),
                    warmups=tuple(
                        copy(m, task, WARMUP)
                        for m, tasks in sorted(assignment.warmup.items())
                        if task in tasks
                    ),
                )
            )

    pod_rows = []
    for pod in sorted(pods, key=_ordinal):
        name = pod["metadata"]["name"]
        pod_status = pod.get("status") or {}
        held = assignment.tasks_of(name) if assignment and name in assignment.active else None
        answered = reports.get(name)
        sample = samples.get(name)
        pod_rows.append(
            PodRow(
                name=name,
                zone=zones.get(name),
                node=(pod.get("spec") or {}).get("nodeName"),
                phase="Terminating"
                if pod["metadata"].get("deletionTimestamp")
                else str(pod_status.get("phase") or "Unknown"),
                ready=_ready(pod_status),
                member=held is not None,
                active=len(held.active) if held else 0,
                standby=len(held.standby) if held else 0,
                topology_hash=answered.topology_hash if answered else None,
                layout_error=None if answered else layout_errors.get(name, "not asked"),
                busy=round(sample.process_ratio, 3) if sample else None,
                rate=round(sample.process_rate, 1) if sample else None,
                input_lag=round(sum(sample.records_lag.values())) if sample else None,
                store_bytes=_total(
                    c.disk_bytes for copies in answered.stores.values() for c in copies.values()
                )
                if answered
                else None,
            )
        )
    return AppView(
        name=str(meta.get("name")),
        namespace=str(meta.get("namespace")),
        generation=meta.get("generation"),
        paused=is_paused(app),
        spec_topology=f"{topology.get('ref')}@{topology.get('revision', '1')}",
        status=status,
        membership_generation=membership.generation if membership else None,
        pods=tuple(pod_rows),
        tasks=tuple(rows),
        stores=dict(sorted(stores.items())),
        topology_hash=running_hash(status, reports),
        draw_command=DRAW_COMMAND.format(app=meta.get("name")),
    )


def running_hash(status: StreamAppStatus, reports: Mapping[str, MemberReport]) -> str | None:
    """The describe() hash of what runs: the one hash every pod that answered reports (what
    runs now, even before the operator records it); otherwise (no pod answered, or pods of
    two revisions mid-upgrade) the hash the operator recorded in ``status.topology``."""
    reported = {report.topology_hash for report in reports.values()}
    if len(reported) == 1:
        return reported.pop()
    return status.topology.hash if status.topology is not None else None


def _total(sizes: Iterable[int | None]) -> int | None:
    """The sum of the sizes known; None when none is."""
    known = [size for size in sizes if size is not None]
    return sum(known) if known else None


def _ready(pod_status: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod_status.get("conditions") or []
    )


def _ordinal(pod: Obj) -> tuple[int, str]:
    """StatefulSet pods in ordinal order (app-2 before app-10)."""
    name = str(pod["metadata"]["name"])
    _, _, tail = name.rpartition("-")
    return (int(tail), name) if tail.isdigit() else (-1, name)
