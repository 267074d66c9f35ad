"""The kopf handlers: thin. Each observes, asks :func:`~.reconcile.plan.plan`, and carries
out the plan through the client wrapper.

* create / update / resume of a StreamApp: a full cycle (apply owned objects,
  membership, rollout, status, events);
* a daemon per StreamApp repeats the cycle every ``SETTLED_SECONDS``, or every
  ``SETTLING_SECONDS`` while the app is Pending or Progressing: pods that start
  report their layout only once their process is up, and nothing else tells
  the operator when that is (no pod event: they are not ready before they have
  an assignment);
* any change of one of its pods (kopf watches them): the same cycle without
  asking pods for their reports (cached from the last one), so a pod that stops
  running leaves the membership within one watch event.

A lock per StreamApp keeps cycles of the same app from interleaving (the
membership generation must grow by one at a time).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import kopf

from eddyline_operator.client import ApiError, Kube, fetch_reports
from eddyline_operator.reconcile import names, objects
from eddyline_operator.reconcile.membership import is_member
from eddyline_operator.reconcile.plan import Observed, Plan, plan
from eddyline_runtime.membership import MemberReport
from eddyline_runtime.spec import GROUP, PLURAL, VERSION

logger = logging.getLogger(__name__)

# How often a settled StreamApp is reconciled without a trigger: status (readiness, standby
# lags), drift of owned objects.
SETTLED_SECONDS = 2.0
# How often while it settles (Pending, Progressing): a starting pod's layout, its
# readiness and the next step of a rollout are noticed within this long.
SETTLING_SECONDS = 0.25
# Owned objects are re-applied at least this often even when the spec did not change
# (someone deleted a Service, say); otherwise only when what we would apply changed.
REAPPLY_SECONDS = 30.0
# Nodes are listed again at least this often (readiness for the log's pin, new labels).
NODES_SECONDS = 10.0
# The image pods run when spec.image is empty.
RUNTIME_IMAGE_ENV = "EDDYLINE_RUNTIME_IMAGE"


@dataclass
class _AppState:
    """What the operator remembers about one StreamApp between cycles (in memory only:
    after a restart everything is observed again)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    applied_hash: str | None = None
    applied_at: float = 0.0
    reports: dict[str, MemberReport] = field(default_factory=dict)


_apps: dict[tuple[str, str], _AppState] = {}
_apps_lock = threading.Lock()
_kube: Kube | None = None
# Nodes as last listed: (time.monotonic() of the list, the Node objects).
_nodes_cache: tuple[float, list[Any]] = (float("-inf"), [])
_nodes_lock = threading.Lock()


def _client() -> Kube:
    global _kube  # noqa: PLW0603 - one client per process, created on first use
    if _kube is None:
        _kube = Kube()
    return _kube


def _state(namespace: str, name: str) -> _AppState:
    with _apps_lock:
        return _apps.setdefault((namespace, name), _AppState())


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Progress and the diff base live in annotations: status belongs to the CRD's schema.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 60
    settings.networking.request_timeout = 90


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile_app(namespace: str | None, name: str, **_: Any) -> None:
    run_cycle(namespace or "default", name, fetch=True, force_apply=True)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0)
def follow_app(namespace: str | None, name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
    while not stopped.is_set():
        stopped.wait(refresh_app(namespace, name))


def refresh_app(namespace: str | None, name: str, **_: Any) -> float:
    """One cycle that also asks pods for their reports; returns when to run again."""
    try:
        result = run_cycle(namespace or "default", name, fetch=True, force_apply=False)
    except Exception:
        # The API server restarting, a conflict, a bug: the loop must outlive it (create
        # and update handlers are retried by kopf; this daemon retries at its next beat).
        logger.exception("StreamApp %s/%s: the cycle failed; retrying", namespace, name)
        return SETTLED_SECONDS
    if result is not None and result.status.get("phase") in ("Pending", "Progressing"):
        return SETTLING_SECONDS
    return SETTLED_SECONDS


@kopf.on.event("", "v1", "pods", labels={names.LABEL_MANAGED_BY: names.OPERATOR})
def pod_changed(body: kopf.Body, **_: Any) -> None:
    labels = body.get("metadata", {}).get("labels") or {}
    app, namespace = labels.get(names.LABEL_INSTANCE), body.get("metadata", {}).get("namespace")
    if app and namespace:
        run_cycle(str(namespace), str(app), fetch=False, force_apply=False)


def run_cycle(namespace: str, name: str, *, fetch: bool, force_apply: bool) -> Plan | None:
    """Observe, plan, act; returns the plan (None when the StreamApp is gone)."""
    state = _state(namespace, name)
    with state.lock:
        kube = _client()
        body = kube.get_streamapp(namespace, name)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return None
        pods = kube.list("Pod", namespace, selector=names.selector_string(name))
        members = [p for p in pods if is_member(p)]
        if fetch or not state.reports:
            state.reports = fetch_reports(members, names.QUERY_PORT)
        else:
            alive = {p["metadata"]["name"] for p in members}
            state.reports = {m: r for m, r in state.reports.items() if m in alive}
        observed = Observed(
            body=body,
            pods=pods,
            nodes=_nodes(kube, {p.get("spec", {}).get("nodeName") for p in pods} - {None}),
            membership=kube.read_membership(namespace, names.membership_map(name)),
            reports=state.reports,
            applied_manifest=kube.read_config_value(
                namespace, names.config_map(name), names.MANIFEST_KEY
            ),
            now=_now(),
            default_image=os.environ.get(RUNTIME_IMAGE_ENV, objects.DEFAULT_IMAGE),
        )
        result = plan(observed)
        _carry_out(kube, state, body, result, force_apply=force_apply)
        return result


def _carry_out(kube: Kube, state: _AppState, body: Any, result: Plan, *, force_apply: bool) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    if result.write_ahead:
        # An upgrade's new step: status is its write-ahead log, so the step is recorded
        # before anything acts on it. A conflict raises: nothing is done this cycle, and the
        # next one decides again from what status then says.
        kube.patch_streamapp_status(namespace, name, result.status)
        body = {**body, "status": {**(body.get("status") or {}), **result.status}}
    digest = hashlib.sha256(json.dumps(result.objects, sort_keys=True).encode()).hexdigest()
    due = time.monotonic() - state.applied_at > REAPPLY_SECONDS
    if result.objects and (force_apply or due or digest != state.applied_hash):
        for obj in result.objects:
            outcome = kube.apply(obj)
            if outcome != "unchanged":
                post_event(
                    body,
                    "Normal",
                    outcome.capitalize(),
                    f"{outcome} {obj['kind']} {obj['metadata']['name']}",
                )
        state.applied_hash, state.applied_at = digest, time.monotonic()
    if result.membership is not None:
        owner = objects.owner_reference(name=name, uid=meta["uid"])
        data = json.dumps(result.membership.to_json())
        kube.publish_membership(objects.membership_config_map(name, namespace, owner, data))
    for pod in result.delete_pods:
        kube.delete("Pod", namespace, pod)
    for event in result.events:
        post_event(body, event.type, event.reason, event.message)
    if _status_differs(body.get("status") or {}, result.status):
        try:
            kube.patch_streamapp_status(namespace, name, result.status)
        except ApiError as error:
            if error.status != 409:
                raise
            # Someone wrote in between: the daemon's next cycle writes again.


def post_event(body: Any, type_: str, reason: str, message: str) -> None:
    """An Event about the StreamApp (kopf posts it in the background)."""
    kopf.event(body, type=type_, reason=reason, message=message)


def _nodes(kube: Kube, wanted: set[Any]) -> list[Any]:
    """The cluster's Nodes, listed again only when a pod runs on one not seen yet, or every
    NODES_SECONDS: a node's zone label does not change, and a big cluster's Node list is
    too heavy for every cycle of every app."""
    global _nodes_cache  # noqa: PLW0603 - one cache per process, shared by every app
    with _nodes_lock:
        listed_at, nodes = _nodes_cache
        known = {n.get("metadata", {}).get("name") for n in nodes}
        if time.monotonic() - listed_at < NODES_SECONDS and wanted <= known:
            return nodes
        try:
            nodes = kube.list("Node", None)
        except ApiError as error:
            if error.status != 403:
                raise
            logger.warning("cannot list Nodes (RBAC): zones unknown; grant nodes get/list/watch")
            nodes = []
        _nodes_cache = (time.monotonic(), nodes)
        return nodes


def _status_differs(current: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return any(current.get(k) != v for k, v in wanted.items())


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
