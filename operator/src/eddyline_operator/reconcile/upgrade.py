"""Full-cluster topology upgrades (KIP-816) as a pure state machine over the StreamApp's status.

Sub-topology ordinals shift when a topology gains or loses a sub-topology, so old and new
pods cannot share a consumer group (KIP-816's non-goal: no mixed versions). An upgrade
therefore stops processing on every pod, publishes the new revision, replaces the pods one
at a time, and starts processing again; the pods relocate their state directories at start
(``relocate_state``, active and standby alike) and restore only their changelog tails.
Queries are answered throughout: a pod the membership gives nothing keeps the copies on its
disk open as standbys and serves them (docs/queries.md, "Through a full-cluster topology
upgrade"). This module decides each step; the handlers carry it out.

The state machine. ``status.upgrade`` holds the step; an arrow is taken only on what the
operator observes, and the new step is written to status *before* the operator acts on it
(``Decision.write_ahead``): status is the write-ahead log, so an operator restarted at any
step resumes that step, and never starts an upgrade over::

    (none) --spec.topology differs from status.topology, or a pod reports another
             describe() hash for the same revision--> Stopping
    Stopping   old template, spec replicas; the membership reset to an empty assignment (old
               task ids mean other tasks in the new revision), so every pod commits and
               closes its active tasks and keeps serving its copies as standbys
               --no member pod reports an active or restoring copy--> Publishing, or
                 Backfilling when the upgrade has a backfill (spec.topology.backfill)
    Backfilling  as Stopping (old template, the reset membership: nothing processes, so the
               committed positions hold still); the backfill Job (backfill_job.py, named
               when the upgrade began) builds the new revision's stores from the history up
               to those positions into the restore claim and writes their changelogs
               --its verdict says Succeeded--> Publishing (the pods of the target ingest the
                 build when their tasks open the stores, before they process)
               --the Job failed (its verdict, a killed pod, its deadline)--> Starting,
                 rolling back: nothing of the target was published, so the pods that run are
                 the old revision's; they are given their tasks back where they were
    Publishing ConfigMap and template of the target revision applied (the StatefulSet is
               OnDelete: running pods keep theirs); pods of the old revision deleted
               highest ordinal first, only while every other pod is there and serves
               (reports a copy open), and several together only while the pods that stay
               serve every store partition (at most a quarter of the replicas), so each
               partition keeps a serving copy; the StatefulSet recreates them from the
               target template, and each serves its relocated copies, given nothing,
               before any task is assigned
               --the ConfigMap holds the target, the membership is the reset one and every
                 pod runs the target revision--> Starting
               --a new pod's container exits with an error, or upgradeDeadlineSeconds pass
                 (counted from Publishing)--> Stopping, rolling back
    Starting   spec replicas of the target; once every pod is a member and reported, one
               assignment puts each task where its store's state was (by store name: the
               placement recorded at Stopping), so nothing is restored but tails
               --every pod Ready and assigned, no copy restoring--> (none): done
               --a new pod's container exits with an error (its termination message says
                 why, e.g. relocation refused) or upgradeDeadlineSeconds pass--> Stopping,
                 rolling back: the target becomes the revision that ran before
               --the first report of the target shows a generated store or topic name
                 whose meaning moved (compared with the generated names recorded at
                 Stopping; resource_names.moved_names), checked before any task is
                 assigned--> Stopping, rolling back (reason GeneratedNamesMoved)

Under ``spec.topology.upgradeStrategy: Recreate`` (recorded in ``status.upgrade.strategy``
when the upgrade begins, so a spec change mid-upgrade, or a rollback, keeps it) the steps are
the same but no pod serves in between: Stopping takes the StatefulSet to 0 replicas and
deletes every pod (each commits at SIGTERM) --no pod left--> Publishing (or Backfilling, at 0
replicas) publishes the target at 0 replicas --published--> Starting starts every pod of the
target at once. One pod start instead of one per pod; queries fail from the first stop until
the new pods serve (what every upgrade did before issue 36).

Invariants, each decided from status and observed objects only:

* one upgrade at a time: while ``status.upgrade`` exists, a new spec.topology waits;
* never two revisions processing: pods of the target start only once no pod processes
  (Stopping -> Publishing requires every member to report no active copy under the reset
  membership), and none is assigned a task before every pod runs the target (Starting);
  pods of both revisions serve side by side, read-only. The objects rendered are always
  those of ``status.topology`` (what runs) or the step's revision, never the spec's directly;
* a rolled-back revision is recorded in ``status.failedTopology`` and not tried again until
  spec.topology changes; a rollback that fails too is not rolled back again (Degraded);
* a backfill's history ends at the committed positions the new revision resumes from: no
  pod processes from the end of Stopping until Starting assigns the new revision's tasks,
  so a record before them is in the built stores exactly once and one after them is
  processed by the stream exactly once (docs/backfill.md, "The operator's side").
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eddyline_operator.reconcile import backfill_job
from eddyline_operator.reconcile.events import Event
from eddyline_operator.reconcile.membership import (
    TaskLayout,
    container_status,
    effective_standbys,
    is_member,
    is_ready,
    members,
)
from eddyline_operator.reconcile.seed import Seed
from eddyline_operator.reconcile.status import is_deleting, pod_revision
from eddyline_runtime.assignor import Assignment, Member, assign
from eddyline_runtime.membership import MemberReport, Membership, StoreRole
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.resource_names import moved_names
from eddyline_runtime.spec import (
    BackfillRecord,
    BackfillState,
    ConditionType,
    GeneratedNameRecord,
    LastUpgrade,
    StreamApp,
    StreamAppStatus,
    TopologyRecord,
    UpgradeFailure,
    UpgradeOutcome,
    UpgradeStatus,
    UpgradeStep,
    UpgradeStepRecord,
    UpgradeStrategy,
)

Obj = dict[str, Any]

STOPPING, PUBLISHING, STARTING = UpgradeStep.STOPPING, UpgradeStep.PUBLISHING, UpgradeStep.STARTING
BACKFILLING = UpgradeStep.BACKFILLING
# Exit codes above this are deaths by a signal (128 + n): a kill from outside, not the
# runtime refusing to start, so they do not roll an upgrade back.
_SIGNAL_EXIT_CODES = 128


# A topology as status records it: ref, revision and (once pods run it) its hash.
Topology = TopologyRecord


def topology(ref: str, revision: str, hash_: str | None = None) -> Topology:
    return TopologyRecord(ref=ref, revision=revision, hash=hash_)


@dataclass(frozen=True)
class UpgradeInput:
    """What one cycle observed, as far as upgrades care."""

    app: StreamApp
    status: StreamAppStatus  # the StreamApp's status before this cycle
    pods: Sequence[Obj]  # the app's pods, terminating ones included
    reports: Mapping[str, MemberReport]
    membership: Membership | None  # as published (the membership ConfigMap)
    applied: Topology | None  # the topology in the config ConfigMap (last published)
    node_labels: Mapping[str, Mapping[str, str]]
    now: str
    # The app's backfill Jobs and their pods (backfill_job.selector_string).
    backfill_jobs: Sequence[Obj] = ()
    backfill_job_pods: Sequence[Obj] = ()


# Upgrading while no upgrade is under way.
NO_UPGRADE = Seed(ConditionType.UPGRADING, False, "NoUpgrade", "")


@dataclass
class Decision:
    """What the rest of the cycle does, and what status records."""

    render: Topology  # the topology the owned objects are rendered from
    replicas: int | None  # StatefulSet replicas; None: the spec's
    upgrade: UpgradeStatus | None  # status.upgrade (None: no upgrade under way)
    topology: Topology  # status.topology
    last_upgrade: LastUpgrade | None
    failed_topology: Topology | None
    write_ahead: bool = False  # a new step: write status before acting
    membership: Membership | None = None  # to publish instead of the usual one
    hold_membership: bool = False  # publish nothing but ``membership`` this cycle
    delete_pods: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    upgrading: Seed = NO_UPGRADE
    degraded: Seed | None = None  # a Degraded condition the upgrade asks for
    backfilling: Seed | None = None  # the Backfilling condition (an upgrade with a backfill)
    # The backfill Job to create this cycle (it may exist already: a create meets a 409).
    launch_backfill: BackfillRecord | None = None

    @property
    def active(self) -> bool:
        return self.upgrade is not None


def spec_topology(app: StreamApp) -> Topology:
    return topology(app.spec.topology.ref, app.spec.topology.revision)


def decide(observed: UpgradeInput) -> Decision:
    """The upgrade's next step; see the module docstring."""
    status = observed.status
    wanted = spec_topology(observed.app)
    running = status.topology or observed.applied or wanted
    failed = status.failed_topology
    if failed is not None and not failed.same_spec(wanted):
        failed = None  # the user changed spec.topology: the new one may be tried
    record = status.upgrade
    base = Decision(
        render=running,
        replicas=None,
        upgrade=None,
        topology=running,
        last_upgrade=status.last_upgrade,
        failed_topology=failed,
    )
    last = status.last_upgrade
    if last is not None and last.backfill is not None:
        base.backfilling = backfill_job.condition(last.backfill, rolling_back=False)
    if record is not None:
        return _continue(observed, base, record)
    live_reports = _member_reports(observed)
    hashes = {r.topology_hash for r in live_reports.values()}
    if running.same_spec(wanted) or (failed is not None and failed.same_spec(wanted)):
        if running.hash is not None and hashes - {running.hash}:
            # Same ref and revision, other code (a new image): the pods that run it must not
            # mix with the others. The same full-cluster upgrade, without a way back.
            target = topology(running.ref, running.revision)
            return _begin(observed, base, running, target, "TopologyChanged")
        if running.hash is None and len(hashes) == 1:
            base.topology = topology(running.ref, running.revision, next(iter(hashes)))
        if failed is not None:
            base.degraded = _rolled_back_message(status.last_upgrade, failed)
        return base
    backfill = observed.app.spec.topology.backfill
    running_stores = sorted(
        {store for report in live_reports.values() for store in report.store_owners}
        & set(backfill.stores if backfill is not None else ())
    )
    if running_stores:
        # The backfill replaces a store's changelog; one the running revision has would be
        # lost to it, and to a rollback. Nothing starts: the user renames the store.
        base.degraded = Seed(
            ConditionType.DEGRADED,
            True,
            "BackfillStoreRuns",
            f"spec.topology.backfill names {', '.join(repr(s) for s in running_stores)}, "
            f"which {running} runs already: a backfill builds new stores only (its changelog "
            "is written anew); give the store another name in the new revision, or leave "
            "it out of spec.topology.backfill",
        )
        return base
    return _begin(observed, base, running, wanted, "RevisionChanged")


def _backfill_record(observed: UpgradeInput, target: Topology) -> BackfillRecord | None:
    """The upgrade's backfill, fixed when it begins: the stores, the Job's name, the build."""
    backfill = observed.app.spec.topology.backfill
    if backfill is None:
        return None
    name = backfill_job.job_name(
        observed.app.metadata.name, str(target), backfill.stores, observed.now
    )
    return BackfillRecord.model_validate(
        {
            "stores": backfill.stores,
            "from": backfill.from_,
            "fromTimestamp": backfill.from_timestamp,
            "job": name,
            "buildId": backfill_job.build_id(name, observed.now),
        }
    )


def _begin(
    observed: UpgradeInput, base: Decision, source: Topology, target: Topology, why: str
) -> Decision:
    """Record the intent (Stopping) with where every store's state is now."""
    # A new revision only: new code under the same revision has no spec to backfill by.
    backfill = _backfill_record(observed, target) if why == "RevisionChanged" else None
    # "from" is a Python keyword: the record is validated from its aliases.
    record = UpgradeStatus.model_validate(
        {
            "from": source,
            "to": target,
            "step": STOPPING,
            "steps": [UpgradeStepRecord(step=STOPPING, startedAt=observed.now)],
            "placement": _placement(observed),
            "generatedNames": _running_generated_names(observed),
            "strategy": observed.app.spec.topology.upgrade_strategy,
            "backfill": backfill,
            "rollback": None,
        }
    )
    stopping = (
        "stopping every pod"
        if record.strategy is UpgradeStrategy.RECREATE
        else "pausing processing on every pod (they keep serving)"
    )
    base.events.append(
        Event(
            "Normal",
            "UpgradeStarted",
            f"topology {source} -> {target} ({why}): a full-cluster upgrade, "
            f"{record.strategy}; {stopping}",
        )
    )
    return _act(observed, base, record, write_ahead=True)


def _continue(observed: UpgradeInput, base: Decision, record: UpgradeStatus) -> Decision:
    step = record.step
    target = record.to_topology
    backfill = record.backfill
    if (
        step == STOPPING
        and _stopped(observed, record)
        and backfill is not None
        and not record.rollback
    ):
        return _advance(
            observed,
            base,
            record,
            BACKFILLING,
            f"no pod processes; backfill Job {backfill.job} builds {', '.join(backfill.stores)} "
            f"of {target} from the history up to the committed positions",
        )
    if step == BACKFILLING and backfill is not None:
        return _backfilling(observed, base, record, backfill)
    if step == STOPPING and _stopped(observed, record):
        return _advance(observed, base, record, PUBLISHING, _publishing_message(record))
    if step == PUBLISHING and _published(observed, target) and _rolled(observed, record):
        return _advance(observed, base, record, STARTING, f"starting the pods of {target}")
    if step == PUBLISHING and not record.rollback:
        failure = _failure(observed, record)
        if failure is not None:
            return _roll_back(observed, base, record, failure)
    if step == STARTING:
        # Before anything else in Starting: no task of the new revision is assigned until
        # its generated names were compared with those that ran.
        moved = None if record.rollback else _moved_names(observed, record)
        if moved is not None:
            return _roll_back(observed, base, record, moved)
        if _started(observed, target):
            return _finish(observed, base, record)
        failure = None if record.rollback else _failure(observed, record)
        if failure is not None:
            return _roll_back(observed, base, record, failure)
    return _act(observed, base, record, write_ahead=False)


def _backfilling(
    observed: UpgradeInput, base: Decision, record: UpgradeStatus, backfill: BackfillRecord
) -> Decision:
    """Backfilling: the Job as observed decides; its verdict lands in status.upgrade.backfill."""
    seen = backfill_job.observe(backfill.job, observed.backfill_jobs, observed.backfill_job_pods)
    if seen is None or seen.state is BackfillState.RUNNING:
        message = seen.message if seen is not None else f"Job {backfill.job} being created"
        started = backfill.started_at or observed.now
        state = BackfillState.RUNNING if seen is not None else backfill.state
        update = {"state": state, "message": message, "started_at": started}
        record = record.model_copy(update={"backfill": backfill.model_copy(update=update)})
        return _act(observed, base, record, write_ahead=False)
    verdict = seen.verdict
    done = backfill.model_copy(
        update={
            "state": seen.state,
            "message": seen.message,
            "records": verdict.records if verdict is not None else None,
            "end_offsets": dict(verdict.end_offsets) if verdict is not None else {},
            "started_at": backfill.started_at or observed.now,
            "finished_at": observed.now,
        }
    )
    record = record.model_copy(update={"backfill": done})
    if seen.state is BackfillState.SUCCEEDED:
        base.events.append(Event("Normal", "BackfillSucceeded", seen.message))
        return _advance(
            observed,
            base,
            record,
            PUBLISHING,
            f"backfill done; {_publishing_message(record)} (they ingest the built stores "
            "before they process)",
        )
    base.events.append(Event("Warning", "BackfillFailed", seen.message))
    failure = UpgradeFailure(reason="BackfillFailed", pod=backfill.job, message=seen.message)
    # Nothing of the target was published: the pods run the old revision still, and are
    # given their tasks back (Starting) instead of being replaced.
    return _roll_back(observed, base, record, failure, step=STARTING)


def _advance(
    observed: UpgradeInput, base: Decision, record: UpgradeStatus, step: UpgradeStep, message: str
) -> Decision:
    entered = UpgradeStepRecord(step=_step_name(record, step), startedAt=observed.now)
    record = record.model_copy(update={"step": step, "steps": [*record.steps, entered]})
    base.events.append(Event("Normal", f"Upgrade{_step_name(record, step)}", message))
    return _act(observed, base, record, write_ahead=True)


def _act(
    observed: UpgradeInput, base: Decision, record: UpgradeStatus, *, write_ahead: bool
) -> Decision:
    """What the step does while it lasts (every cycle, and again after a restart)."""
    step = record.step
    source, target = record.from_topology, record.to_topology
    base.upgrade, base.write_ahead = record, write_ahead
    base.hold_membership = True
    if record.backfill is not None:
        base.backfilling = backfill_job.condition(
            record.backfill, rolling_back=record.rollback is not None
        )
    recreate = record.strategy is UpgradeStrategy.RECREATE
    if step == BACKFILLING:
        # As in Stopping: nothing processes (the positions the history ends at hold still),
        # the old revision's pods serve (Rolling); the Job is created until it is seen.
        base.render, base.replicas = source, 0 if recreate else None
        base.membership = _reset(observed)
        assert record.backfill is not None
        if backfill_job.observe(record.backfill.job, observed.backfill_jobs, ()) is None:
            base.launch_backfill = record.backfill
        waiting = record.backfill.message or f"Job {record.backfill.job} being created"
    elif step == STOPPING and recreate:
        # Every pod stops at once (its final commit on SIGTERM); nobody takes a task over.
        base.render, base.replicas = source, 0
        base.delete_pods = sorted(
            p["metadata"]["name"] for p in observed.pods if not is_deleting(p)
        )
        waiting = f"{len(observed.pods)} pods of {source} still stopping"
    elif step == STOPPING:
        # Processing stops, serving does not: every pod, given nothing, commits and closes
        # its active tasks and keeps its copies open as standbys, which it serves.
        base.render, base.replicas = source, None
        base.membership = _reset(observed)
        waiting = f"{len(_processing(observed))} pods of {source} still processing"
    elif step == PUBLISHING and recreate:
        # No pod runs: the target is published before any of its pods starts.
        base.render, base.replicas = target, 0
        base.membership = _reset(observed)
        waiting = f"publishing {target}"
    elif step == PUBLISHING:
        base.render, base.replicas = target, None
        base.membership = _reset(observed)
        if _published(observed, target):
            base.delete_pods = _next_to_replace(observed, record)
        waiting = f"publishing {target}; {_rolling_message(observed, record)}"
    else:
        base.render, base.replicas = target, None
        base.membership = _first_assignment(observed, record)
        base.hold_membership = not _assigned(observed)
        waiting = _starting_message(observed)
    verb = "rolling back" if record.rollback else "upgrading"
    name = _step_name(record, step)
    base.upgrading = _upgrading(True, name, f"{verb} {source} -> {target}: {name}; {waiting}")
    if record.rollback is not None:
        # A rollback's record is the upgrade turned round: "from" is the revision that
        # failed, "to" the one that ran before.
        base.degraded = Seed(
            ConditionType.DEGRADED,
            True,
            "UpgradeRollingBack",
            _failure_text(source, target, record.rollback),
        )
    return base


def _finish(observed: UpgradeInput, base: Decision, record: UpgradeStatus) -> Decision:
    source, target = record.from_topology, record.to_topology
    hashes = {r.topology_hash for r in _member_reports(observed).values()}
    ran = topology(target.ref, target.revision, next(iter(hashes)) if len(hashes) == 1 else None)
    rollback = record.rollback
    outcome = UpgradeOutcome.ROLLED_BACK if rollback else UpgradeOutcome.SUCCEEDED
    base.topology = base.render = ran
    base.upgrade, base.write_ahead = None, True
    if record.backfill is not None:
        base.backfilling = backfill_job.condition(record.backfill, rolling_back=False)
    base.last_upgrade = LastUpgrade.model_validate(
        {
            "from": source,
            "to": ran,
            "outcome": outcome,
            "steps": record.steps,
            "finishedAt": observed.now,
            "strategy": record.strategy,
            "backfill": record.backfill,
            "rollback": rollback,
        }
    )
    if rollback:
        base.failed_topology = source
        base.degraded = _rolled_back_message(base.last_upgrade, source)
        base.events.append(
            Event("Warning", "UpgradeRolledBack", f"{ran} runs again; {source} was rolled back")
        )
        base.upgrading = _upgrading(False, "RolledBack", f"{source} was rolled back to {ran}")
    else:
        base.events.append(
            Event(
                "Normal", "UpgradeSucceeded", f"{ran} runs on every pod; upgrade from {source} done"
            )
        )
        base.upgrading = _upgrading(False, "Succeeded", f"upgraded from {source} to {ran}")
    return base


def _roll_back(
    observed: UpgradeInput,
    base: Decision,
    record: UpgradeStatus,
    failure: UpgradeFailure,
    *,
    step: UpgradeStep = STOPPING,
) -> Decision:
    source, target = record.from_topology, record.to_topology
    swapped = record.model_copy(
        update={
            "from_topology": target,
            "to_topology": source,
            "step": step,
            "rollback": failure,
        }
    )
    entered = UpgradeStepRecord(step=_step_name(swapped, step), startedAt=observed.now)
    swapped = swapped.model_copy(update={"steps": [*record.steps, entered]})
    base.failed_topology = target
    base.events.append(Event("Warning", "UpgradeFailed", _failure_text(target, source, failure)))
    return _act(observed, base, swapped, write_ahead=True)


def _step_name(record: UpgradeStatus, step: UpgradeStep) -> str:
    return f"RollBack{step}" if record.rollback else step


def _failure(observed: UpgradeInput, record: UpgradeStatus) -> UpgradeFailure | None:
    """Why the new revision failed: a container that exited with an error on its own (the
    runtime refusing to start says why in its termination message), or the deadline."""
    for pod in sorted(observed.pods, key=lambda p: str(p["metadata"]["name"])):
        container = container_status(pod) or {}
        for key in ("state", "lastState"):
            ended = (container.get(key) or {}).get("terminated") or {}
            code = int(ended.get("exitCode") or 0)
            if 0 < code < _SIGNAL_EXIT_CODES:
                return UpgradeFailure(
                    reason="PodFailed",
                    pod=pod["metadata"]["name"],
                    message=str(ended.get("message") or f"exit code {code}").strip(),
                )
    # The deadline runs from the first step that starts pods of the new revision.
    started = next(
        (s.started_at for s in reversed(record.steps) if s.step in (PUBLISHING, STARTING)), None
    )
    deadline = observed.app.spec.topology.upgrade_deadline_seconds
    if started is not None and _seconds_between(started, observed.now) > deadline:
        waiting = sorted(p["metadata"]["name"] for p in observed.pods if not is_ready(p)) or [
            "(pods missing)"
        ]
        return UpgradeFailure(
            reason="DeadlineExceeded",
            pod=waiting[0],
            message=f"pods {', '.join(waiting)} not ready within upgradeDeadlineSeconds "
            f"({deadline} s)",
        )
    return None


def _running_generated_names(observed: UpgradeInput) -> list[GeneratedNameRecord]:
    """The generated names of the revision that runs, as its pods report them (every pod
    runs one topology: the first report that has any speaks for all)."""
    for _, report in sorted(_member_reports(observed).items()):
        if report.generated_names:
            return [GeneratedNameRecord.of(name) for name in report.generated_names]
    return []


def _moved_names(observed: UpgradeInput, record: UpgradeStatus) -> UpgradeFailure | None:
    """The upgrade refused when a generated name's meaning moved between the revision that
    ran (recorded at Stopping) and the new one (its pods' reports): relocating state by
    that name would put it under the wrong operation, or orphan it
    (:func:`eddyline_runtime.resource_names.moved_names` is the rule). Decided on the first
    report of the new revision, before any of its tasks is assigned."""
    reports = _member_reports(observed)
    if not reports:
        return None
    pod, report = min(reports.items())
    before = [name.generated_name() for name in record.generated_names]
    kept = {*report.store_owners, *report.internal_topics}
    problems = moved_names(before, report.generated_names, still_named=kept)
    if not problems:
        return None
    return UpgradeFailure(
        reason="GeneratedNamesMoved",
        pod=pod,
        message="state is relocated by store and topic name, and generated names moved: "
        + "; ".join(problems)
        + ". Name them explicitly (or keep the old numbering); see docs/operator.md, "
        "'Generated names across an upgrade'",
    )


def _failure_text(failed: Topology, back_to: Topology, failure: UpgradeFailure) -> str:
    where = f" (pod {failure.pod})" if failure.pod else ""
    return (
        f"topology {failed} failed{where}: {failure.reason}: {failure.message}; "
        f"rolling back to {back_to}"
    )


def _upgrading(status: bool, reason: str, message: str) -> Seed:
    return Seed(ConditionType.UPGRADING, status, reason, message)


def _rolled_back_message(last: LastUpgrade | None, failed: Topology) -> Seed:
    failure = (last.rollback if last is not None else None) or UpgradeFailure(reason="?")
    where = f" in pod {failure.pod}" if failure.pod else ""
    return Seed(
        ConditionType.DEGRADED,
        True,
        "UpgradeRolledBack",
        f"topology {failed} was rolled back ({failure.reason}{where}: "
        f"{failure.message}); change spec.topology to try again",
    )


def _member_reports(observed: UpgradeInput) -> dict[str, MemberReport]:
    live = {p["metadata"]["name"] for p in observed.pods if is_member(p)}
    return {m: r for m, r in observed.reports.items() if m in live}


def _processing(observed: UpgradeInput) -> list[str]:
    """The member pods that still report an active (or restoring active) copy."""
    return sorted(
        member
        for member, report in _member_reports(observed).items()
        if any(
            copy.role is not StoreRole.STANDBY
            for partitions in report.stores.values()
            for copy in partitions.values()
        )
    )


def _stopped(observed: UpgradeInput, record: UpgradeStatus) -> bool:
    """Stopping is over: no pod processes (Rolling, :func:`_paused`), or none is left
    (Recreate)."""
    if record.strategy is UpgradeStrategy.RECREATE:
        return not observed.pods
    return _paused(observed)


def _publishing_message(record: UpgradeStatus) -> str:
    if record.strategy is UpgradeStrategy.RECREATE:
        return f"every pod is gone; publishing {record.to_topology}"
    return (
        f"no pod processes; publishing {record.to_topology} and replacing the pods while the "
        "others serve"
    )


def _paused(observed: UpgradeInput) -> bool:
    """The reset membership is published and no pod processes: each committed and closed
    its active tasks (their copies stay open, as standbys, and answer queries)."""
    membership = observed.membership
    reset = membership is None or not membership.assignment.tasks
    return reset and not _processing(observed)


def _of_target(pod: Obj, report: MemberReport | None, record: UpgradeStatus) -> bool:
    """Whether ``pod`` runs the template the step moves to: created since this direction's
    Publishing began (the template was applied then; a pod made before it has the template
    of before, other settings too, as a rollback's pods that were never replaced), and of
    the target revision: its revision label, or, for new code under the same revision, a
    report of another topology hash than the source's."""
    source, target = record.from_topology, record.to_topology
    since = _publishing_since(record)
    created = pod["metadata"].get("creationTimestamp")
    if since is not None and created is not None and _seconds_between(since, created) < 0:
        return False
    if source.revision != target.revision:
        return pod_revision(pod) == target.revision
    return report is not None and source.hash is not None and report.topology_hash != source.hash


def _publishing_since(record: UpgradeStatus) -> str | None:
    """When this direction's Publishing began (RollBackPublishing while rolling back)."""
    name = _step_name(record, PUBLISHING)
    return next((s.started_at for s in reversed(record.steps) if s.step == name), None)


def _serving(pod: Obj, reports: Mapping[str, MemberReport]) -> bool:
    """A pod that reported its layout with at least one copy open: it answers queries."""
    report = reports.get(pod["metadata"]["name"])
    return report is not None and any(partitions for partitions in report.stores.values())


def _next_to_replace(observed: UpgradeInput, record: UpgradeStatus) -> list[str]:
    """The pods of the old revision to delete now (the StatefulSet recreates them from the
    new template). A pod that serves nothing (failing, as a rollback's pods of the revision
    that failed, or holding no copy) goes first, alone: deleting it takes no answer away.
    Pods that serve go only while every other pod is there and serving, highest ordinal
    first, as a StatefulSet rolls: one, and with it more of them while the pods that stay
    still serve every store partition any pod serves (:func:`_copies_kept`), up to a
    quarter of the replicas (:func:`_replaced_at_once`). With one standby on 3 pods that
    is one at a time; on more pods, several whose copies lie elsewhere roll together."""
    wanted = 0 if observed.app.spec.suspended else observed.app.spec.replicas
    reports = _member_reports(observed)
    live = [p for p in observed.pods if not is_deleting(p)]
    if len(live) != len(observed.pods) or len(live) < wanted:
        return []  # a pod is on its way out or not created yet
    old = [p for p in live if not _of_target(p, reports.get(p["metadata"]["name"]), record)]
    idle = [p for p in old if not _serving(p, reports)]
    if idle:
        return [max((p["metadata"]["name"] for p in idle), key=_ordinal)]
    if not old or not all(_serving(p, reports) for p in live):
        return []
    held = {p["metadata"]["name"]: _copies(reports.get(p["metadata"]["name"])) for p in live}
    order = sorted((p["metadata"]["name"] for p in old), key=_ordinal, reverse=True)
    batch = [order[0]]  # the first goes even when its copies are the only ones (0 standbys)
    for name in order[1:]:
        if len(batch) == _replaced_at_once(wanted):
            break
        if _copies_kept(held, [*batch, name]):
            batch.append(name)
    return batch


def _replaced_at_once(replicas: int) -> int:
    """At most a quarter of the replicas (at least one) roll together: a Deployment's
    default maxUnavailable. The pods that stay answer every query meanwhile, and the node
    starts that many pods at once."""
    return max(1, -(-replicas // 4))


def _copies(report: MemberReport | None) -> frozenset[tuple[str, int]]:
    """The store partitions a pod serves, by its last report."""
    if report is None:
        return frozenset()
    return frozenset((store, p) for store, copies in report.stores.items() for p in copies)


def _copies_kept(held: Mapping[str, frozenset[tuple[str, int]]], leaving: list[str]) -> bool:
    """Whether the pods not in ``leaving`` serve every store partition that some pod serves
    now: deleting ``leaving`` together leaves no key unanswered."""
    served = frozenset().union(*held.values())
    staying = [copies for name, copies in held.items() if name not in leaving]
    return served <= frozenset().union(*staying)


def _rolled(observed: UpgradeInput, record: UpgradeStatus) -> bool:
    """Every pod runs the new revision (reported by the new ones); under Recreate none runs
    until Starting."""
    if record.strategy is UpgradeStrategy.RECREATE:
        return True
    reports = _member_reports(observed)
    live = [p for p in observed.pods if not is_deleting(p)]
    return len(live) == len(observed.pods) and all(
        _of_target(p, reports.get(p["metadata"]["name"]), record) for p in live
    )


def _rolling_message(observed: UpgradeInput, record: UpgradeStatus) -> str:
    reports = _member_reports(observed)
    new = sum(
        1
        for p in observed.pods
        if not is_deleting(p) and _of_target(p, reports.get(p["metadata"]["name"]), record)
    )
    return f"{new}/{observed.app.spec.replicas} pods replaced"


def _ordinal(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _published(observed: UpgradeInput, target: Topology) -> bool:
    membership = observed.membership
    reset = membership is None or not membership.assignment.tasks
    return bool(observed.applied is not None and observed.applied.same_spec(target) and reset)


def _reset(observed: UpgradeInput) -> Membership | None:
    """An empty assignment (a new generation): old task ids name other tasks now. It lists
    the member pods with their query addresses, and is published again when they change
    (a pod replaced gets a new address): a pod names the members it knows to a query
    router (``member_hosts``), which asks them for the copies they serve; with only
    itself named, a router that reached a pod on its way out found no other copy (2
    queries of 1,083 failed in ``make bench-queries``' upgrade). None: already published."""
    previous = observed.membership
    listed = tuple(_all_members(observed))
    if (
        previous is not None
        and not previous.assignment.tasks
        and tuple(previous.assignment.members) == listed
    ):
        return None
    generation = previous.generation + 1 if previous is not None else 1
    return Membership(generation, Assignment(active={}, standby={}, members=listed))


def _layout(reports: Mapping[str, MemberReport]) -> TaskLayout | None:
    if not reports or len({r.topology_hash for r in reports.values()}) != 1:
        return None
    report = next(iter(reports.values()))
    return TaskLayout(report.topology_hash, report.tasks, report.stateful)


def _assigned(observed: UpgradeInput) -> bool:
    """Whether the published assignment is already one of the new layout's tasks (after that,
    the membership follows the pods as usual)."""
    layout = _layout(_member_reports(observed))
    membership = observed.membership
    return bool(
        layout is not None
        and membership is not None
        and membership.assignment.tasks
        and membership.assignment.tasks == layout.tasks
    )


def _all_members(observed: UpgradeInput) -> list[Member]:
    """The member pods, with their zones and query addresses."""
    zone_key = observed.app.spec.standby_placement.topology_key
    return members(observed.pods, observed.node_labels, zone_key)


def _first_assignment(observed: UpgradeInput, record: UpgradeStatus) -> Membership | None:
    """Once every pod of the new revision is a member and reported: tasks where their state
    is (the placement recorded at Stopping, translated by store name to the new ordinals)."""
    reports = _member_reports(observed)
    wanted = 0 if observed.app.spec.suspended else observed.app.spec.replicas
    current = _all_members(observed)
    if len(current) < wanted or set(reports) != {m.id for m in current}:
        return None
    layout = _layout(reports)
    if layout is None or _assigned(observed):
        return None
    owners: dict[str, int] = {}
    for report in reports.values():
        owners.update(report.store_owners)
    previous = translate_placement(record.placement, owners, {m.id for m in current})
    requested = observed.app.settings.num_standby_replicas
    assignment = assign(
        layout.tasks,
        current,
        effective_standbys(requested, len(current)),
        previous=previous,
        stateful=layout.stateful,
    )
    generation = observed.membership.generation + 1 if observed.membership is not None else 1
    return Membership(generation, assignment)


def translate_placement(
    placement: Mapping[str, Mapping[str, Sequence[str]]],
    owners: Mapping[str, int],
    present: set[str],
) -> Assignment | None:
    """The recorded placement (store -> partition -> pods, active first) as an assignment of
    the new topology's tasks (``owners``: store -> its sub-topology now), over the pods that
    are members again. A task's active copy goes to its first present holder."""
    active: dict[str, set[TaskId]] = {}
    standby: dict[str, set[TaskId]] = {}
    taken: dict[TaskId, str] = {}
    for store, partitions in sorted(placement.items()):
        owner = owners.get(store)
        if owner is None:
            continue
        for partition, holders in sorted(partitions.items()):
            task = TaskId(owner, int(partition))
            here = [h for h in holders if h in present]
            if not here:
                continue
            first = taken.setdefault(task, here[0])
            active.setdefault(first, set()).add(task)
            for holder in here:
                if holder != first:
                    standby.setdefault(holder, set()).add(task)
    if not active:
        return None
    return Assignment(
        active={m: frozenset(t) for m, t in active.items()},
        standby={m: frozenset(t) for m, t in standby.items()},
    )


def _placement(observed: UpgradeInput) -> dict[str, dict[str, list[str]]]:
    """Where each store's state is now: store -> partition -> pods, active first (from the
    published assignment and the pods' store owners)."""
    membership = observed.membership
    owners: dict[str, int] = {}
    for report in observed.reports.values():
        owners.update(report.store_owners)
    if membership is None or not owners:
        return {}
    by_subtopology: dict[int, list[str]] = {}
    for store, sub in owners.items():
        by_subtopology.setdefault(sub, []).append(store)
    placement: dict[str, dict[str, list[str]]] = {}
    assignment = membership.assignment
    for role in (assignment.active, assignment.standby):
        for member, tasks in sorted(role.items()):
            for task in sorted(tasks):
                for store in by_subtopology.get(task.subtopology, []):
                    placement.setdefault(store, {}).setdefault(str(task.partition), []).append(
                        member
                    )
    return placement


def _started(observed: UpgradeInput, target: Topology) -> bool:
    wanted = 0 if observed.app.spec.suspended else observed.app.spec.replicas
    live = [p for p in observed.pods if not is_deleting(p)]
    if len(live) != wanted or len(observed.pods) != wanted:
        return False
    if wanted == 0:
        return True
    if not all(is_ready(p) and is_member(p) for p in live):
        return False
    if not _assigned(observed):
        return False
    membership = observed.membership
    assert membership is not None
    names = {p["metadata"]["name"] for p in live}
    if not names <= set(membership.assignment.active):
        return False
    reports = _member_reports(observed)
    if set(reports) != names:
        return False
    return not any(
        copy.role is StoreRole.RESTORING
        for report in reports.values()
        for partitions in report.stores.values()
        for copy in partitions.values()
    )


def _starting_message(observed: UpgradeInput) -> str:
    wanted = observed.app.spec.replicas
    ready = sum(1 for p in observed.pods if is_ready(p))
    return f"{ready}/{wanted} pods ready"


def _seconds_between(start: str, end: str) -> float:
    def parse(text: str) -> datetime.datetime:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)

    try:
        return (parse(end) - parse(start)).total_seconds()
    except ValueError:
        return 0.0
