"""One reconciliation cycle as a pure function: :func:`plan`.

Input: the StreamApp object as the API server holds it and what the
operator observed (pods, nodes, the published membership, the pods'
reports). Output: a :class:`Plan` - the objects to apply, the membership to
publish, the pods to restart, the status, and the events that say what was
done and why. The handlers carry it out through the client wrapper, and write
the status :func:`~.conditions.compose_status` makes of the plan's, the
autoscaler's ``status.autoscaling`` and any children the API server refused.

A spec the CRD schema cannot catch (anything the pydantic model refuses)
makes the app Degraded with reason InvalidSpec and changes nothing that
runs: no object is applied and no pod restarted. Failover still works: the
membership follows the pods with the last spec that was applied (read back
from the owned ConfigMap).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from eddyline_operator.reconcile import (
    backfill_job,
    log_node,
    names,
    objects,
    pod_creation,
    prune,
    restore_job,
)
from eddyline_operator.reconcile.conditions import (
    Conditions,
    PodCounts,
    invalid_spec,
    paused_condition,
    summarize,
)
from eddyline_operator.reconcile.events import Event
from eddyline_operator.reconcile.membership import (
    NODE_GRACE_SECONDS,
    effective_standbys,
    is_member,
    is_ready,
    layout_from,
    leaving_members,
    lost_nodes,
    members,
    next_membership,
    next_node_check,
    nobody_takes_over,
    warmup_policy,
    without_lost,
)
from eddyline_operator.reconcile.rollout import plan_rollout
from eddyline_operator.reconcile.scale_in import ScaleIn, plan_scale_in
from eddyline_operator.reconcile.status import (
    is_deleting,
    max_standby_lag,
    oom_kills,
    pod_hash,
    running_revision,
)
from eddyline_operator.reconcile.status_record import read_status
from eddyline_operator.reconcile.upgrade import (
    Decision,
    Topology,
    UpgradeInput,
    decide,
    topology,
)
from eddyline_runtime.membership import MemberReport, Membership
from eddyline_runtime.spec import (
    MAX_NAME_LENGTH,
    MAX_NAME_LENGTH_WITH_RESTORE,
    ConditionType,
    ManifestError,
    Phase,
    StreamApp,
    StreamAppStatus,
    TopologySpec,
    parse_manifest,
    refuse_unknown_cluster_settings,
)

Obj = dict[str, Any]


@dataclass(frozen=True)
class Observed:
    """What the operator saw this cycle."""

    body: Obj  # the StreamApp (metadata, spec, status)
    pods: Sequence[Obj] = ()
    nodes: Sequence[Obj] = ()
    membership: Membership | None = None
    reports: Mapping[str, MemberReport] = field(default_factory=dict)
    # The manifest in the owned ConfigMap: the last spec applied (for InvalidSpec).
    applied_manifest: str | None = None
    now: str = "1970-01-01T00:00:00Z"
    default_image: str = objects.DEFAULT_IMAGE
    # The chart's ClusterRole for restore Jobs' executor pods (spec.restore.master k8s://).
    executor_role: str = restore_job.DEFAULT_EXECUTOR_ROLE
    # The app's restore Jobs and their pods (restore_job.selector_string).
    jobs: Sequence[Obj] = ()
    job_pods: Sequence[Obj] = ()
    # The app's backfill Jobs and their pods (backfill_job.selector_string).
    backfill_jobs: Sequence[Obj] = ()
    backfill_job_pods: Sequence[Obj] = ()
    # The Leases in kube-node-lease (one per node, renewed by its kubelet) and how long one
    # may go unrenewed before the node's pods leave the membership.
    leases: Sequence[Obj] = ()
    node_grace_seconds: float = NODE_GRACE_SECONDS
    # The Events about the app's StatefulSet (pod_creation.field_selector), listed only while
    # pods are missing: FailedCreate says why the controller makes none.
    stateful_set_events: Sequence[Obj] = ()


@dataclass
class Plan:
    app: StreamApp | None
    objects: list[Obj]
    membership: Membership | None
    delete_pods: list[str]
    # The status but for what only carrying the plan out knows: conditions.compose_status
    # adds the autoscaler's status.autoscaling and refused children into the one written.
    status: StreamAppStatus
    events: list[Event]
    # A new upgrade step: status must be written before anything else is done (write-ahead).
    write_ahead: bool = False
    create_jobs: list[Obj] = field(default_factory=list)  # restore and backfill Jobs to launch
    # Run the next cycle within this many seconds: when a member's node Lease would pass
    # its grace (a dead node sends no event). None: no such deadline.
    recheck_seconds: float | None = None
    # eddyline.dev/pause-reconciliation: nothing above is set, status only says so.
    paused: bool = False
    # The kinds whose every wanted child ``objects`` holds: the app's others of these kinds
    # are pruned (prune.py). Empty while paused or with an invalid spec.
    prune_kinds: tuple[str, ...] = ()


def parse_app(body: Obj) -> StreamApp:
    """The StreamApp, validated by the runtime's model; raises ManifestError naming a field."""
    meta = body.get("metadata", {})
    name = str(meta.get("name", ""))
    if len(name) > MAX_NAME_LENGTH:
        raise ManifestError(
            "StreamApp",
            "metadata.name",
            f"{name!r} has {len(name)} characters; at most {MAX_NAME_LENGTH} (pods are named "
            "<name>-<ordinal>, Services <name>-headless and <name>-query)",
        )
    restores = ((body.get("spec") or {}).get("restore") or {}).get("when", "Never") != "Never"
    if restores and len(name) > MAX_NAME_LENGTH_WITH_RESTORE:
        raise ManifestError(
            "StreamApp",
            "metadata.name",
            f"{name!r} has {len(name)} characters; at most {MAX_NAME_LENGTH_WITH_RESTORE} with "
            "spec.restore on (restore Jobs are named <name>-restore-<10 hex characters>, and "
            "their pods' job-name label holds at most 63)",
        )
    document = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": name, "namespace": meta.get("namespace")},
        "spec": body.get("spec", {}),
    }
    source = f"StreamApp {meta.get('namespace')}/{name}"
    app = parse_manifest(document, source=source)
    # The CRD keeps unknown spec.config keys (a client without strict field validation would
    # otherwise lose a typo silently): they are refused here, by name.
    refuse_unknown_cluster_settings(app.spec.config, source=source)
    return app


def plan(observed: Observed) -> Plan:
    """One cycle; see the module docstring."""
    cycle = _Cycle(observed)
    if is_paused(observed.body):
        return cycle.paused()
    result = _reconcile(cycle, observed)
    if cycle.conditions.is_true(ConditionType.PAUSED):
        result.events.append(
            Event(
                "Normal",
                "ReconciliationResumed",
                f'{names.ANNOTATION_PAUSE} is no longer "true": reconciling again',
            )
        )
    return result


def is_paused(body: Obj) -> bool:
    """Whether the app carries ``eddyline.dev/pause-reconciliation: "true"``."""
    annotations = body.get("metadata", {}).get("annotations") or {}
    return str(annotations.get(names.ANNOTATION_PAUSE, "")).strip().lower() == "true"


def is_resuming(body: Obj) -> bool:
    """Whether a cycle of ``body`` ends a pause: not paused, and its status still says
    ``Paused=True`` (the cycle that plans again writes it False)."""
    if is_paused(body):
        return False
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == ConditionType.PAUSED and c.get("status") == "True" for c in conditions
    )


def _reconcile(cycle: _Cycle, observed: Observed) -> Plan:
    try:
        app = parse_app(observed.body)
    except ManifestError as invalid:
        # Mid-upgrade, the upgrade alone decides the membership: it waits for a valid spec.
        upgrading = cycle.old_status.upgrade is not None
        applied = None if upgrading else _applied_app(observed.applied_manifest)
        membership = cycle.follow_membership(applied)
        return cycle.invalid(invalid, membership)
    upgrade = cycle.upgrade(app)
    running = with_topology(app, upgrade.render)
    # During an upgrade the upgrade decides what is published (a reset, then one assignment
    # where the state is); otherwise the membership follows the pods.
    held = upgrade.hold_membership
    if held:
        # Nobody takes a stopping pod's tasks over mid-upgrade: it need not wait for that.
        membership = upgrade.membership or nobody_takes_over(observed.membership, cycle.pods)
    else:
        if upgrade.replicas is None:
            desired = 0 if running.spec.suspended else running.spec.replicas
            cycle.scale_in = plan_scale_in(
                desired, cycle.pods, observed.membership, observed.reports
            )
        membership = cycle.follow_membership(running)
    return cycle.valid(app, running, membership, upgrade)


def with_topology(app: StreamApp, chosen_topology: Topology) -> StreamApp:
    """``app`` with the given topology ref and revision (what runs, or the upgrade's step).
    Without spec.topology.backfill: it instructs an upgrade (upgrade.py reads it from the
    spec), the pods never read it, and in their manifest its change alone would restart
    them."""
    same = chosen_topology.same_spec(topology(app.spec.topology.ref, app.spec.topology.revision))
    if same and app.spec.topology.backfill is None:
        return app
    chosen = TopologySpec.model_validate(
        {
            **app.spec.topology.model_dump(by_alias=True),
            "ref": chosen_topology.ref,
            "revision": chosen_topology.revision,
            "backfill": None,
        }
    )
    return app.model_copy(update={"spec": app.spec.model_copy(update={"topology": chosen})})


def applied_topology(manifest: str | None) -> Topology | None:
    """The topology in the owned ConfigMap: what was last published to the pods."""
    applied = _applied_app(manifest)
    if applied is None:
        return None
    return topology(applied.spec.topology.ref, applied.spec.topology.revision)


class _Cycle:
    """The state one :func:`plan` call shares between its steps."""

    def __init__(self, observed: Observed) -> None:
        self.observed = observed
        meta = observed.body.get("metadata", {})
        self.name = str(meta.get("name"))
        self.namespace = str(meta.get("namespace") or "default")
        self.generation: int | None = meta.get("generation")
        self.old_status, unreadable = read_status(observed.body.get("status"))
        self.conditions = Conditions(
            self.old_status.conditions, now=observed.now, generation=self.generation
        )
        self.owner = objects.owner_reference(name=self.name, uid=str(meta.get("uid", "")))
        self.events: list[Event] = []
        self.notes: list[str] = []  # status.message, joined
        self.lost_pods: list[str] = []  # pods out of the membership: their node is lost
        self.lost_names: list[str] = []  # the same, by name
        self.capped: str | None = None  # the note on standbys capped by replicas, if any
        # Pods above spec.replicas and the StatefulSet's size while they hand over (None:
        # the StatefulSet is not rendered from spec.replicas this cycle, an upgrade is).
        self.scale_in: ScaleIn | None = None
        if unreadable:
            self.notes.append(f"status fields {', '.join(unreadable)} were unreadable; recomputed")
        self.pods = [p for p in observed.pods if _owned_by_app(p, self.name)]
        self.live_pods = [p for p in self.pods if not is_deleting(p)]
        self.ready_count = sum(1 for p in self.live_pods if is_ready(p))
        self.node_labels = {
            n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in observed.nodes
        }
        grace = observed.node_grace_seconds
        self.lost = lost_nodes(observed.nodes, observed.leases, now=observed.now, grace=grace)
        self.recheck = next_node_check(
            {p.get("spec", {}).get("nodeName") for p in self.live_pods if is_member(p)} - {None},
            observed.leases,
            now=observed.now,
            grace=grace,
        )

    def upgrade(self, app: StreamApp) -> Decision:
        observed = self.observed
        return decide(
            UpgradeInput(
                app=app,
                status=self.old_status,
                pods=self.pods,
                reports=observed.reports,
                membership=observed.membership,
                applied=applied_topology(observed.applied_manifest),
                node_labels=self.node_labels,
                now=observed.now,
                backfill_jobs=observed.backfill_jobs,
                backfill_job_pods=observed.backfill_job_pods,
            )
        )

    def follow_membership(self, app: StreamApp | None) -> Membership | None:
        """The membership to publish for the pods as they are (None: unchanged)."""
        if app is None:
            return None
        observed = self.observed
        # Pods being deleted stay members while they run, as leaving ones (hand-over).
        current = members(
            self.pods,
            self.node_labels,
            app.spec.standby_placement.topology_key,
            self.lost,
            leaving=True,
        )
        leaving = leaving_members(
            self.pods,
            observed.reports,
            removing=self.scale_in.removing if self.scale_in is not None else (),
            lost=self.lost,
        )
        self.note_lost_pods()
        requested = app.settings.num_standby_replicas
        template = objects.pod_template(
            app, default_image=observed.default_image, log_node=self.old_status.log_node
        )
        template_hash = template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
        preferred = [p["metadata"]["name"] for p in self.pods if pod_hash(p) == template_hash]
        layout = layout_from(observed.reports, preferred=preferred)
        membership = next_membership(
            observed.membership,
            current,
            layout,
            requested,
            last_generation=self.old_status.membership_generation,
            reports={m: r for m, r in observed.reports.items() if m in {c.id for c in current}},
            warmups=warmup_policy(app.settings, observed.reports, current),
            leaving=leaving,
        )
        if membership is None and not current:
            membership = without_lost(observed.membership, self.lost_names)
        if membership is not None:
            ids = (
                ", ".join(
                    f"{m.id} ({m.zone or 'no zone'}"
                    + (", leaving" if m.id in membership.assignment.leaving else "")
                    + ")"
                    for m in current
                )
                or "nobody (every pod is on a lost node)"
            )
            warming = membership.assignment.warmup_count
            self.events.append(
                Event(
                    "Normal",
                    "MembershipChanged",
                    f"generation {membership.generation}: members {ids}; "
                    f"{len(membership.assignment.tasks)} tasks"
                    + (f"; {warming} warming up before they move" if warming else ""),
                )
            )
        effective = effective_standbys(requested, app.spec.replicas)
        if effective < requested and app.spec.replicas > 0:
            self.capped = (
                f"num.standby.replicas {requested} capped at {effective} (replicas - 1 = "
                f"{app.spec.replicas - 1}): a standby needs another pod than its active copy"
            )
            self.notes.append(self.capped)
        return membership

    @property
    def members_left(self) -> int:
        """Members on nodes that are not lost."""
        return sum(1 for p in self.live_pods if is_member(p, self.lost))

    def note_lost_pods(self) -> None:
        """Say which pods left the membership because their node is lost (status message;
        a Warning event when the previous status did not say it yet)."""
        moved = (
            "its tasks move to the other pods"
            if self.members_left
            else "no pod is left to take its tasks over"
        )
        for pod in self.live_pods:
            node = pod.get("spec", {}).get("nodeName")
            if node not in self.lost or not is_member(pod):
                continue
            note = f"pod {pod['metadata']['name']} left the membership: node {node} is lost"
            self.notes.append(f"{note} ({self.lost[node]})")
            self.lost_pods.append(f"{pod['metadata']['name']} (node {node})")
            self.lost_names.append(str(pod["metadata"]["name"]))
            if note not in (self.old_status.message or ""):
                self.events.append(
                    Event(
                        "Warning",
                        "NodeLost",
                        f"{note} ({self.lost[node]}); {moved}",
                    )
                )

    def note_oom_kills(self) -> None:
        """Say which pods the kernel killed at their memory limit (status message; a
        Warning event OOMKilled for each kill the previous status did not say yet)."""
        for note in oom_kills(self.live_pods):
            self.notes.append(note)
            if note not in (self.old_status.message or ""):
                self.events.append(Event("Warning", "OOMKilled", note))

    def paused(self) -> Plan:
        """Paused: the previous status with a Paused condition; nothing applied, published,
        restarted or launched (not even a failover: the pods keep the last assignment)."""
        message = (
            f'the annotation {names.ANNOTATION_PAUSE}="true" pauses reconciliation: nothing '
            "is applied, published, restarted or launched; to resume, remove it (kubectl "
            f"annotate streamapp {self.name} {names.ANNOTATION_PAUSE}-)"
        )
        paused = paused_condition(self.conditions, message)
        if self.conditions.changed(paused):
            self.events.append(Event("Normal", "ReconciliationPaused", message))
        kept = [c for c in self.old_status.conditions if c.type != ConditionType.PAUSED]
        status = self.old_status.model_copy(update={"conditions": [*kept, paused]})
        return Plan(None, [], None, [], status, self.events, paused=True)

    def invalid(self, invalid: ManifestError, membership: Membership | None) -> Plan:
        """Degraded, InvalidSpec: nothing applied, no pod restarted."""
        problem = f"{invalid.field}: {invalid.problem}"
        made = invalid_spec(self.conditions, problem)  # Ready, Progressing, Degraded
        if self.conditions.changed(made[-1]):
            self.events.append(
                Event("Warning", "InvalidSpec", f"{problem}; nothing running was changed")
            )
        published = membership or self.observed.membership
        status = self.old_status.model_copy(
            update={
                "observed_generation": self.generation,
                "phase": Phase.DEGRADED,
                "replicas": len(self.live_pods),
                "ready_replicas": self.ready_count,
                "selector": names.selector_string(self.name),
                "conditions": made,
                "message": f"invalid spec: {problem}",
                "membership_generation": None if published is None else published.generation,
            }
        )
        return Plan(None, [], membership, [], status, self.events, recheck_seconds=self.recheck)

    def valid(
        self,
        requested: StreamApp,
        app: StreamApp,
        membership: Membership | None,
        upgrade: Decision,
    ) -> Plan:
        """``requested`` is the spec as written; ``app`` the same with the topology that runs
        (or the upgrade step's): objects are rendered from ``app``."""
        spec, observed = app.spec, self.observed
        pinned = log_node.pin(
            embedded=objects.uses_embedded_log(app),
            previous=self.old_status.log_node,
            nodes=observed.nodes,
        )
        self.notes.extend(pinned.notes)
        desired, template_hash = self.render(app, pinned, upgrade)
        desired_replicas = 0 if spec.suspended else spec.replicas
        rollout = plan_rollout(
            requested,
            app,
            self.pods,
            template_hash=template_hash,
            desired_replicas=desired_replicas,
            reports=observed.reports,
            upgrade=upgrade,
        )
        self.notes.extend(rollout.notes)
        self.events.extend(upgrade.events)
        self.events.extend(rollout.events)
        delete = rollout.delete
        self.events.extend(log_node.restart_off_node(pinned, self.live_pods, delete))
        published = membership or observed.membership
        scale = self.scale_in
        shown = ConditionType.SCALING_IN in self.conditions.previous
        scaling = None if scale is None else scale.seed(spec.replicas, shown=shown)
        restores = self.restores(app, pinned)
        summary = summarize(
            self.conditions,
            app,
            PodCounts(self.live_pods, self.ready_count),
            desired_replicas=desired_replicas,
            published=published,
            step=rollout.step,
            off_node=pinned.off_node,
            log_node=self.old_status.log_node,
            upgrade=upgrade,
            set_aside=[
                f"{pod}: {path}"
                for pod, report in sorted(observed.reports.items())
                for path in report.stores_set_aside
            ],
            lost=self.lost_pods,
            members_left=self.members_left,
            create_failure=pod_creation.failure(observed.stateful_set_events),
            scaling_in=scaling,
            restoring=restores.condition,
        )
        self.events.extend(summary.events)
        self.note_oom_kills()
        if scale is not None and scale.active:
            self.notes.append(scale.message)
        if scale is not None and scale.lowered:
            self.events.append(Event("Normal", "PodHandedOver", scale.message))
        self.events.extend(Event(*event) for event in restores.events)
        if self.capped is not None and self.capped not in (self.old_status.message or ""):
            self.events.append(Event("Normal", "StandbysCapped", self.capped))
        status = StreamAppStatus(
            observedGeneration=self.generation,
            phase=summary.phase,
            replicas=len(self.live_pods),
            readyReplicas=self.ready_count,
            revision=running_revision(self.pods, spec.topology.revision),
            selector=names.selector_string(self.name),
            conditions=summary.conditions,
            message="; ".join(self.notes),
            maxStandbyLag=max_standby_lag(observed.reports.values()),
            logNode=pinned.node,
            membershipGeneration=None if published is None else published.generation,
            restoreJobs=restores.jobs or None,
            topology=upgrade.topology,
            upgrade=upgrade.upgrade,
            lastUpgrade=upgrade.last_upgrade,
            failedTopology=upgrade.failed_topology,
        )
        return Plan(
            app,
            desired,
            membership,
            delete,
            status,
            self.events,
            write_ahead=upgrade.write_ahead,
            create_jobs=[*restores.create, *self.backfill(app, pinned, upgrade)],
            recheck_seconds=self.recheck,
            prune_kinds=prune.kinds(app),
        )

    def render(
        self, app: StreamApp, pinned: log_node.LogPin, upgrade: Decision
    ) -> tuple[list[Obj], str]:
        """The objects to apply (the StatefulSet last, at the upgrade step's size; none while
        the embedded log waits for a node), and the pod template's hash."""
        desired = objects.owned_objects(
            app,
            self.namespace,
            self.owner,
            executor_role=self.observed.executor_role,
            upgrading=upgrade.upgrade is not None,
        )
        stateful_set = objects.stateful_set(
            app,
            self.namespace,
            self.owner,
            default_image=self.observed.default_image,
            log_node=pinned.node,
        )
        if upgrade.replicas is not None:
            stateful_set["spec"]["replicas"] = upgrade.replicas
        elif self.scale_in is not None:
            # One pod at a time, each after its hand-over (scale_in.py).
            stateful_set["spec"]["replicas"] = self.scale_in.replicas
        if not pinned.waiting:
            desired.append(stateful_set)
        template = stateful_set["spec"]["template"]
        return desired, str(template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH])

    def backfill(self, app: StreamApp, pinned: log_node.LogPin, upgrade: Decision) -> list[Obj]:
        """The upgrade's backfill Job, while its Backfilling step wants it created."""
        record, running = upgrade.launch_backfill, upgrade.upgrade
        if record is None or running is None:
            return []
        return [
            backfill_job.job(
                app,
                self.namespace,
                self.owner,
                record=record,
                target_ref=running.to_topology.ref,
                image=app.spec.image or self.observed.default_image,
                log_node=pinned.node,
                embedded_log=objects.uses_embedded_log(app),
                log_url=objects.pod_log_url(app),
            )
        ]

    def restores(self, app: StreamApp, pinned: log_node.LogPin) -> restore_job.RestorePlan:
        observed = self.observed
        return restore_job.plan_restores(
            app,
            self.namespace,
            self.owner,
            reports=observed.reports,
            jobs=observed.jobs,
            job_pods=observed.job_pods,
            previous=self.old_status.restore_jobs or [],
            image=app.spec.image or observed.default_image,
            log_node=pinned.node,
            embedded_log=objects.uses_embedded_log(app),
            log_url=objects.pod_log_url(app),
            now=observed.now,
        )


def _owned_by_app(pod: Obj, name: str) -> bool:
    labels = pod.get("metadata", {}).get("labels") or {}
    return bool(labels.get(names.LABEL_INSTANCE) == name)


def _applied_app(manifest: str | None) -> StreamApp | None:
    if not manifest:
        return None
    return _parsed_manifest(manifest)


# Every cycle reads the applied manifest, and it changes only with the spec: parsing its
# YAML each time was the largest part of a settled cycle's CPU with many apps (issue 38).
# The parsed app is only read (a change is a model_copy), so one copy serves every cycle.
@functools.lru_cache(maxsize=1024)
def _parsed_manifest(manifest: str) -> StreamApp | None:
    try:
        return parse_manifest(yaml.safe_load(manifest), source="the applied ConfigMap")
    except (ManifestError, yaml.YAMLError):
        return None
