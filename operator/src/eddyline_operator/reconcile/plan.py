"""One reconciliation cycle as a pure function: :func:`plan`.

Input: the StreamApp object as the API server holds it and what the
operator observed (pods, nodes, the published membership, the pods'
reports). Output: a :class:`Plan` - the objects to apply, the membership to
publish, the pods to restart, the whole status, and the events that say what
was done and why. The handlers carry it out through the client wrapper.

A spec the CRD schema cannot catch (anything the pydantic model refuses)
makes the app Degraded with reason InvalidSpec and changes nothing that
runs: no object is applied and no pod restarted. Failover still works: the
membership follows the pods with the last spec that was applied (read back
from the owned ConfigMap).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from eddyline_operator.reconcile import names, objects
from eddyline_operator.reconcile.membership import (
    effective_standbys,
    is_member,
    is_ready,
    layout_from,
    members,
    next_membership,
)
from eddyline_operator.reconcile.status import (
    RolloutStep,
    condition,
    crash_looping,
    is_deleting,
    max_standby_lag,
    pod_hash,
    rollout_step,
    running_revision,
)
from eddyline_operator.reconcile.upgrade import Decision, Event, Topology, UpgradeInput, decide
from eddyline_runtime.membership import MemberReport, Membership
from eddyline_runtime.spec import (
    MAX_NAME_LENGTH,
    ManifestError,
    StreamApp,
    TopologySpec,
    parse_manifest,
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


@dataclass
class Plan:
    app: StreamApp | None
    objects: list[Obj]
    membership: Membership | None
    delete_pods: list[str]
    status: Obj
    events: list[Event]
    # A new upgrade step: status must be written before anything else is done (write-ahead).
    write_ahead: bool = False


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
    document = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": name, "namespace": meta.get("namespace")},
        "spec": body.get("spec", {}),
    }
    return parse_manifest(document, source=f"StreamApp {meta.get('namespace')}/{name}")


def node_is_ready(node: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in node.get("status", {}).get("conditions") or []
    )


def choose_log_node(previous: str | None, nodes: Sequence[Obj]) -> str | None:
    """The node the embedded log is pinned to: the same as before while it exists,
    else the first ready node by name (None: no node seen yet)."""
    existing = {n["metadata"]["name"] for n in nodes}
    if previous is not None and previous in existing:
        return previous
    ready = sorted(n["metadata"]["name"] for n in nodes if node_is_ready(n))
    return ready[0] if ready else None


def plan(observed: Observed) -> Plan:
    """One cycle; see the module docstring."""
    cycle = _Cycle(observed)
    try:
        app = parse_app(observed.body)
    except ManifestError as invalid:
        # Mid-upgrade, the upgrade alone decides the membership: it waits for a valid spec.
        upgrading = bool((observed.body.get("status") or {}).get("upgrade"))
        applied = None if upgrading else _applied_app(observed.applied_manifest)
        membership = cycle.follow_membership(applied)
        return cycle.invalid(invalid, membership)
    upgrade = cycle.upgrade(app)
    running = with_topology(app, upgrade.render)
    # During an upgrade the upgrade decides what is published (a reset, then one assignment
    # where the state is); otherwise the membership follows the pods.
    held = upgrade.hold_membership
    membership = upgrade.membership if held else cycle.follow_membership(running)
    return cycle.valid(app, running, membership, upgrade)


def with_topology(app: StreamApp, topology: Topology) -> StreamApp:
    """``app`` with the given topology ref and revision (what runs, or the upgrade's step)."""
    if topology.same_spec(Topology(app.spec.topology.ref, app.spec.topology.revision)):
        return app
    chosen = TopologySpec.model_validate(
        {
            **app.spec.topology.model_dump(by_alias=True),
            "ref": topology.ref,
            "revision": topology.revision,
        }
    )
    return app.model_copy(update={"spec": app.spec.model_copy(update={"topology": chosen})})


def applied_topology(manifest: str | None) -> Topology | None:
    """The topology in the owned ConfigMap: what was last published to the pods."""
    applied = _applied_app(manifest)
    if applied is None:
        return None
    return Topology(applied.spec.topology.ref, applied.spec.topology.revision)


class _Cycle:
    """The state one :func:`plan` call shares between its steps."""

    def __init__(self, observed: Observed) -> None:
        self.observed = observed
        meta = observed.body.get("metadata", {})
        self.name = str(meta.get("name"))
        self.namespace = str(meta.get("namespace") or "default")
        self.generation: int | None = meta.get("generation")
        self.old_status: Obj = dict(observed.body.get("status") or {})
        self.old_conditions: list[Obj] = list(self.old_status.get("conditions") or [])
        self.owner = objects.owner_reference(name=self.name, uid=str(meta.get("uid", "")))
        self.events: list[Event] = []
        self.notes: list[str] = []
        self.pods = [p for p in observed.pods if _owned_by_app(p, self.name)]
        self.live_pods = [p for p in self.pods if not is_deleting(p)]
        self.ready_count = sum(1 for p in self.live_pods if is_ready(p))

    def cond(self, type_: str, status: bool, reason: str, message: str) -> Obj:
        return condition(
            self.old_conditions,
            type=type_,
            status=status,
            reason=reason,
            message=message,
            now=self.observed.now,
            generation=self.generation,
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
                node_labels={
                    n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in observed.nodes
                },
                now=observed.now,
            )
        )

    def follow_membership(self, app: StreamApp | None) -> Membership | None:
        """The membership to publish for the pods as they are (None: unchanged)."""
        if app is None:
            return None
        observed = self.observed
        node_labels = {
            n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in observed.nodes
        }
        current = members(self.pods, node_labels, app.spec.standby_placement.topology_key)
        requested = app.streams_config().num_standby_replicas
        node = self.old_status.get("logNode")
        template = objects.pod_template(app, default_image=observed.default_image, log_node=node)
        template_hash = template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
        preferred = [p["metadata"]["name"] for p in self.pods if pod_hash(p) == template_hash]
        layout = layout_from(observed.reports, preferred=preferred)
        membership = next_membership(observed.membership, current, layout, requested)
        if membership is not None:
            ids = ", ".join(f"{m.id} ({m.zone or 'no zone'})" for m in current)
            self.events.append(
                Event(
                    "Normal",
                    "MembershipChanged",
                    f"generation {membership.generation}: members {ids}; "
                    f"{len(membership.assignment.tasks)} tasks",
                )
            )
        effective = effective_standbys(requested, app.spec.replicas)
        if effective < requested:
            self.notes.append(
                f"num.standby.replicas {requested} capped at {effective} (replicas - 1 = "
                f"{app.spec.replicas - 1}): a standby needs another pod than its active copy"
            )
        return membership

    def invalid(self, invalid: ManifestError, membership: Membership | None) -> Plan:
        """Degraded, InvalidSpec: nothing applied, no pod restarted."""
        problem = f"{invalid.field}: {invalid.problem}"
        degraded = self.cond("Degraded", True, "InvalidSpec", problem)
        if _condition_changed(self.old_conditions, degraded):
            self.events.append(
                Event("Warning", "InvalidSpec", f"{problem}; nothing running was changed")
            )
        published = membership or self.observed.membership
        status = {
            **self.old_status,
            "observedGeneration": self.generation,
            "phase": "Degraded",
            "replicas": len(self.live_pods),
            "readyReplicas": self.ready_count,
            "selector": names.selector_string(self.name),
            "conditions": [
                self.cond("Ready", False, "InvalidSpec", "the spec is invalid; see Degraded"),
                self.cond("Progressing", False, "InvalidSpec", "nothing rolls out until fixed"),
                degraded,
            ],
            "message": f"invalid spec: {problem}",
            "membershipGeneration": None if published is None else published.generation,
        }
        return Plan(None, [], membership, [], status, self.events)

    def valid(
        self,
        requested: StreamApp,
        app: StreamApp,
        membership: Membership | None,
        upgrade: Decision,
    ) -> Plan:
        """``requested`` is the spec as written; ``app`` the same with the topology that runs
        (or the upgrade step's): objects are rendered from ``app``."""
        spec = app.spec
        embedded = objects.uses_embedded_log(app)
        log_node = (
            choose_log_node(self.old_status.get("logNode"), self.observed.nodes)
            if embedded
            else None
        )
        desired = objects.desired_objects(
            app,
            self.namespace,
            self.owner,
            default_image=self.observed.default_image,
            log_node=log_node,
        )
        if upgrade.replicas is not None and desired[-1]["kind"] == "StatefulSet":
            desired[-1]["spec"]["replicas"] = upgrade.replicas
        template = desired[-1]["spec"]["template"]
        template_hash = template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
        desired_replicas = 0 if spec.suspend else spec.replicas
        if embedded and log_node is None:
            desired = desired[:-1]  # no StatefulSet until its pods can be pinned
            self.notes.append("waiting for a ready node to pin the embedded sqlite log to")
        elif embedded:
            self.notes.append(
                f"development only: the embedded sqlite log pins every pod to node {log_node} "
                "on one shared claim; use a kafka:// log in production"
            )
        if upgrade.active:
            message = upgrade.upgrading[2]
            step = RolloutStep(tuple(upgrade.delete_pods), "TopologyUpgrade", message)
        else:
            step = rollout_step(
                self.pods,
                template_hash=template_hash,
                revision=spec.topology.revision,
                desired_replicas=desired_replicas,
                reports=self.observed.reports,
            )
        if requested.spec.topology != app.spec.topology and not upgrade.active:
            self.notes.append(
                f"spec.topology {requested.spec.topology.ref}@{requested.spec.topology.revision}"
                f" is not running: {app.spec.topology.ref}@{app.spec.topology.revision} runs"
            )
        self.events.extend(upgrade.events)
        delete = (
            list(step.delete) if upgrade.active else ([] if spec.suspend else list(step.delete))
        )
        for pod in [] if upgrade.active else delete:
            self.events.append(
                Event("Normal", step.reason, f"restarting pod {pod} ({step.message})")
            )
        # SQLite's WAL needs every process on one host: a pod elsewhere (the pin moved, or
        # someone edited the StatefulSet) must not open the shared log. It is restarted,
        # and comes back on the pinned node.
        off_node = sorted(
            p["metadata"]["name"]
            for p in self.live_pods
            if embedded
            and log_node is not None
            and p.get("spec", {}).get("nodeName") not in (None, log_node)
        )
        for pod in off_node:
            if pod not in delete:
                delete.append(pod)
                self.events.append(
                    Event(
                        "Warning",
                        "LogSharedAcrossNodes",
                        f"restarting pod {pod}: it runs off node {log_node}, and the embedded "
                        "sqlite log may not be shared across nodes",
                    )
                )
        published = membership or self.observed.membership
        conditions, phase = self.conditions(
            app, desired_replicas, published, step, off_node=off_node, upgrade=upgrade
        )
        previous_message = self.old_status.get("message") or ""
        for note in self.notes:
            if "capped" in note and note not in previous_message:
                self.events.append(Event("Normal", "StandbysCapped", note))
        status: Obj = {
            "observedGeneration": self.generation,
            "phase": phase,
            "replicas": len(self.live_pods),
            "readyReplicas": self.ready_count,
            "revision": running_revision(self.pods, spec.topology.revision),
            "selector": names.selector_string(self.name),
            "conditions": conditions,
            "message": "; ".join(self.notes),
            "maxStandbyLag": max_standby_lag(self.observed.reports.values()),
            "logNode": log_node,
            "membershipGeneration": None if published is None else published.generation,
            "topology": upgrade.topology.to_json(),
            "upgrade": upgrade.upgrade,
            "lastUpgrade": upgrade.last_upgrade,
            "failedTopology": None
            if upgrade.failed_topology is None
            else upgrade.failed_topology.to_json(),
        }
        return Plan(
            app, desired, membership, delete, status, self.events, write_ahead=upgrade.write_ahead
        )

    def conditions(  # noqa: PLR0915 - one decision table, read top to bottom
        self,
        app: StreamApp,
        desired_replicas: int,
        published: Membership | None,
        step: RolloutStep,
        *,
        off_node: Sequence[str] = (),
        upgrade: Decision | None = None,
    ) -> tuple[list[Obj], str]:
        """Ready, Progressing and Degraded, and the phase they add up to."""
        rollout_reason, rollout_message = step.reason, step.message
        live, ready_count = self.live_pods, self.ready_count
        members_now = {p["metadata"]["name"] for p in live if is_member(p)}
        assigned = set(published.assignment.active) if published is not None else set()
        all_assigned = bool(members_now) and members_now <= assigned
        ready = (
            desired_replicas > 0
            and ready_count >= desired_replicas
            and len(live) == desired_replicas
            and all_assigned
        )
        counted = f"{ready_count}/{desired_replicas} pods ready"
        if app.spec.suspend:
            ready_cond = self.cond("Ready", False, "Suspended", "spec.suspend is true: no pods run")
        elif ready:
            ready_cond = self.cond("Ready", True, "AllReplicasReady", counted)
        else:
            waiting = "" if all_assigned or not members_now else "; waiting for the pods' layout"
            ready_cond = self.cond("Ready", False, "ReplicasNotReady", counted + waiting)
        if rollout_reason:
            progressing = self.cond("Progressing", True, rollout_reason, rollout_message)
        elif len(live) != desired_replicas:
            progressing = self.cond(
                "Progressing", True, "Scaling", f"{len(live)} pods, {desired_replicas} wanted"
            )
        elif not ready and not app.spec.suspend:
            progressing = self.cond(
                "Progressing", True, "Starting", "pods wait for an assignment or restore state"
            )
        else:
            progressing = self.cond("Progressing", False, "Complete", "every pod is current")
        looping = crash_looping(live)
        if off_node:
            degraded = self.cond(
                "Degraded",
                True,
                "LogSharedAcrossNodes",
                f"pods {', '.join(off_node)} run off the log's node "
                f"{self.old_status.get('logNode') or '?'}: the embedded sqlite log cannot be "
                "shared across nodes (use a kafka:// log to spread pods)",
            )
        elif looping:
            degraded = self.cond(
                "Degraded",
                True,
                "CrashLoopBackOff",
                f"containers keep crashing in {', '.join(looping)}; see their logs",
            )
            if _condition_changed(self.old_conditions, degraded):
                self.events.append(Event("Warning", "CrashLoopBackOff", degraded["message"]))
        elif upgrade is not None and upgrade.degraded is not None:
            degraded = self.cond("Degraded", True, *upgrade.degraded)
            if _condition_changed(self.old_conditions, degraded):
                self.events.append(Event("Warning", degraded["reason"], degraded["message"]))
        else:
            degraded = self.cond("Degraded", False, "AsExpected", "")
        if app.spec.suspend:
            phase = "Suspended"
        elif looping or off_node:
            phase = "Degraded"
        elif ready and not rollout_reason:
            phase = "Running"
        elif live or desired_replicas:
            phase = "Progressing"
        else:
            phase = "Pending"
        result = [ready_cond, progressing, degraded]
        if upgrade is not None:
            upgrading, reason, message = upgrade.upgrading
            result.append(self.cond("Upgrading", upgrading, reason, message))
            if upgrading:
                phase = "Progressing"
            elif upgrade.degraded is not None and phase == "Running":
                phase = "Degraded"
        return result, phase


def _owned_by_app(pod: Obj, name: str) -> bool:
    labels = pod.get("metadata", {}).get("labels") or {}
    return bool(labels.get(names.LABEL_INSTANCE) == name)


def _applied_app(manifest: str | None) -> StreamApp | None:
    if not manifest:
        return None
    try:
        return parse_manifest(yaml.safe_load(manifest), source="the applied ConfigMap")
    except (ManifestError, yaml.YAMLError):
        return None


def _condition_changed(previous: Sequence[Obj], new: Obj) -> bool:
    before = next((c for c in previous if c.get("type") == new["type"]), None)
    return (
        before is None
        or before.get("status") != new["status"]
        or (before.get("reason") != new["reason"])
    )
