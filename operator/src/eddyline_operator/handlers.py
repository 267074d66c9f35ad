"""The kopf handlers: thin. Each observes, asks :func:`~.reconcile.plan.plan`, and carries
out the plan through the client wrapper.

* create / update / resume of a StreamApp: a full cycle (apply owned objects,
  membership, rollout, status, events);
* a daemon per StreamApp repeats the cycle every ``SETTLED_SECONDS`` (the environment's
  ``EDDYLINE_OPERATOR_RESYNC_SECONDS`` overrides it), or every
  ``SETTLING_SECONDS`` while the app is Pending or Progressing: pods that start
  report their layout only once their process is up, and nothing else tells
  the operator when that is (no pod event: they are not ready before they have
  an assignment);
* any change of one of its pods (kopf watches them): the same cycle without
  asking pods for their reports (cached from the last one), so a pod that stops
  running leaves the membership within one watch event.

The daemon is async: it holds no thread while it waits for its next beat, and runs each
cycle (blocking HTTP) on the operator's executor (``CYCLE_WORKERS`` threads, also kopf's
executor for the sync handlers) only for as long as the cycle takes. A sync daemon held one
of kopf's worker threads for the app's whole life, so on a 2-CPU node (``min(32, cpus + 4)``
threads) the 7th StreamApp was never reconciled and pod events stopped being handled for
every app. The number of apps is now bounded by memory.

What a beat costs the API server, with many apps (issue 38): the StreamApp comes from kopf's
watch (``_observed_app``), the membership and manifest ConfigMaps are read only after this
operator wrote one or with the periodic re-apply (``_configs``), the periodic re-apply sends
only children that drifted and comes at each app's own phase of ``REAPPLY_SECONDS`` (``_due``),
and an app without pods whose last cycle had nothing to do is not planned again until what
it observes (the StreamApp, a pod event) changes (``_quiet_key``): such a beat sends nothing.

A lock per StreamApp keeps cycles of the same app from interleaving (the
membership generation must grow by one at a time).

What the operator keeps between cycles (the client, each app's lock, applied hash, cached
reports and autoscaler samples, the Node and Lease lists) is one :class:`Operator`, created
by the startup handler in kopf's operator-level ``memo``: kopf hands every object's handlers
a shallow copy of that memo, so the daemon, the create/update handlers and the pod handler
of an app all reach the same :class:`Operator`, and a test builds its own instead of
patching globals.

The autoscaler's loop is :mod:`.autoscaler`; the cycle calls it and composes the status it
writes once (:func:`~.reconcile.conditions.compose_status`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import datetime
import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from eddyline_operator import autoscaler, metrics, profiling
from eddyline_operator.child_cache import ChildCache
from eddyline_operator.children import (
    APPLY_FAILED,
    NAME_CONFLICT,
    Children,
    EventsSeen,
    FreshRead,
    Outcome,
    Running,
    refused,
    stateful_set_events,
)
from eddyline_operator.client import ApiError, Kube, fetch_reports, membership_in
from eddyline_operator.cluster import ClusterView
from eddyline_operator.reconcile import backfill_job, names, objects, ownership, restore_job
from eddyline_operator.reconcile.conditions import compose_status
from eddyline_operator.reconcile.membership import (
    NODE_GRACE_SECONDS,
    is_leaving,
    is_member,
    lost_nodes,
)
from eddyline_operator.reconcile.plan import Observed, Plan, is_resuming, plan
from eddyline_operator.reconcile.references import withheld
from eddyline_operator.reconcile.status_record import dump_status, read_status, status_differs
from eddyline_runtime.membership import MemberReport, Membership
from eddyline_runtime.spec import (
    GROUP,
    PLURAL,
    VERSION,
    AutoscalingStatus,
    Phase,
    RestoreJobState,
    StreamAppStatus,
)

logger = logging.getLogger(__name__)

# How often a settled StreamApp is reconciled without a trigger: status (readiness, standby
# lags), drift of owned objects.
SETTLED_SECONDS = 2.0
# Overrides SETTLED_SECONDS (seconds, > 0): a platform with many settled apps may want a
# slower beat; pod events still trigger a cycle at once.
RESYNC_ENV = "EDDYLINE_OPERATOR_RESYNC_SECONDS"
# How often while it settles (Pending, Progressing): a starting pod's layout, its
# readiness and the next step of a rollout are noticed within this long.
SETTLING_SECONDS = 0.25
# Owned objects are re-applied at least this often even when the spec did not change
# (someone deleted a Service, say); otherwise only when what we would apply changed. Each
# app has its own phase in this period (_due): apps created together must not all re-apply
# in the same second (a burst of a dozen requests per app, every app's beat slipping).
REAPPLY_SECONDS = 30.0
# Overrides NODE_GRACE_SECONDS (seconds, > 0): how long a node's Lease may go unrenewed (or
# its Ready condition stay other than True) before its pods leave the membership.
NODE_GRACE_ENV = "EDDYLINE_OPERATOR_NODE_GRACE_SECONDS"
# A cycle due because a Lease may pass its grace runs this long after that moment (the
# cycle's clock has whole seconds).
RECHECK_MARGIN_SECONDS = 1.0
# How long a replica's peering keep-alive holds (see configure).
PEERING_LIFETIME_SECONDS = 15
# The image pods run when spec.image is empty.
RUNTIME_IMAGE_ENV = "EDDYLINE_RUNTIME_IMAGE"
# The chart's ClusterRole that restore Jobs with a k8s:// master are bound to.
EXECUTOR_ROLE_ENV = "EDDYLINE_RESTORE_EXECUTOR_ROLE"


# Threads that run cycles (the daemons' beats, and kopf's sync handlers: create, update,
# resume, pod events), each holding at most one connection to the API server. A cycle is
# mostly waiting on the API server and the pods, so more threads than CPUs keep both busy;
# EDDYLINE_OPERATOR_WORKERS overrides it.
CYCLE_WORKERS = 16
WORKERS_ENV = "EDDYLINE_OPERATOR_WORKERS"

# The key of the :class:`Operator` in kopf's memo.
MEMO_KEY = "eddyline"

# The kinds of the apps' children that kopf watches into the operator's ChildCache (kind ->
# group, version, plural), each filtered by the server to the operator's managed-by label:
# every child the drift check reads (objects.desired_objects, restore_job.owned_objects, the
# membership ConfigMap). Jobs and pods are listed, not read one by one.
CHILD_KINDS: dict[str, tuple[str, str, str]] = {
    "ConfigMap": ("", "v1", "configmaps"),
    "Service": ("", "v1", "services"),
    "ServiceAccount": ("", "v1", "serviceaccounts"),
    "PersistentVolumeClaim": ("", "v1", "persistentvolumeclaims"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
    "Role": ("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings"),
}
# The label selector of those watches: only the operator's own objects are streamed, and one
# whose label is taken off arrives as DELETED (the server's rule for a selector it no longer
# matches), so the cache never holds a copy that stopped being the operator's.
CHILD_SELECTOR = f"{names.LABEL_MANAGED_BY}={names.OPERATOR}"


@dataclass
class AppState:
    """What the operator remembers about one StreamApp between cycles (in memory only:
    after a restart everything is observed again)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    applied_hash: str | None = None
    applied_at: float = 0.0
    reports: dict[str, MemberReport] = field(default_factory=dict)
    samples: autoscaler.SampleStore = field(
        default_factory=autoscaler.SampleStore
    )  # spec.autoscaling
    events: EventsSeen = field(default_factory=EventsSeen)
    # kopf's live view of the StreamApp (the daemon's ``body``, kept current by kopf's watch)
    # and the resourceVersion this operator last saw from the server itself (a GET, or the
    # answer to its own status write): the view stands in for a GET only when it holds that
    # version, so a cycle never plans from a view older than what this operator knows.
    watched: Any = None
    known_version: str | None = None
    # The membership and the applied manifest as last read (time.monotonic(), membership,
    # manifest): only this operator writes those ConfigMaps, so they are read again only
    # after it wrote one of them, or every REAPPLY_SECONDS (someone else's edit is noticed
    # as a deleted child is).
    configs: tuple[float, Membership | None, str | None] | None = None
    # The last cycle's plan, and the key of what it observed when it found nothing to do
    # (_quiet_key): a beat that observes the same returns that plan without planning again.
    last_plan: Plan | None = None
    quiet: tuple[Any, ...] | None = None
    # Events of the app's pods from kopf's pod watch so far (pod_changed counts each before
    # its cycle): part of the quiet key, so a quiet beat needs no LIST to know no pod came.
    pod_events: int = 0

    def forget_observed(self) -> None:
        """Read everything from the server at the next cycle (a daemon starts: another
        replica may have acted while this one was paused)."""
        self.known_version, self.configs, self.quiet = None, None, None


class Operator:
    """The operator's state between cycles, shared by every handler through kopf's memo."""

    def __init__(self, kube: Kube | None = None, *, workers: int = CYCLE_WORKERS) -> None:
        # Created on first use: loading the cluster's credentials is the cycle's business
        # (a failure there is retried like any failed cycle), not the startup's.
        self._kube = kube
        self._lock = threading.Lock()
        self._apps: dict[tuple[str, str], AppState] = {}
        self.cluster = ClusterView()
        # The apps' children as kopf's watches deliver them (record_child): the drift check
        # reads them from here instead of a GET per child (child_cache.py).
        self.children = ChildCache(CHILD_KINDS)
        # Every cycle runs on one of these threads (configure hands it to kopf for the sync
        # handlers too): the asyncio loop's default executor has min(32, CPUs + 4) threads,
        # 6 on 2 CPUs, and kopf's another 6, together more than the client's 10 pooled
        # connections; with one executor the pool is sized to it.
        self.workers = workers
        self.executor = concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix="eddyline-cycle", initializer=profiling.profile_thread
        )

    @property
    def kube(self) -> Kube:
        with self._lock:
            if self._kube is None:
                # A connection per worker, and one for a thread outside them (the metrics).
                self._kube = Kube(pool_size=self.workers + 1, children=self.children)
            return self._kube

    def app(self, namespace: str, name: str) -> AppState:
        with self._lock:
            return self._apps.setdefault((namespace, name), AppState())

    def pod_event(self, namespace: str, name: str) -> None:
        """Count an event of one of app ``name``'s pods (kopf's pod watch)."""
        with self._lock:
            self._apps.setdefault((namespace, name), AppState()).pod_events += 1


def operator_of(memo: Any) -> Operator:
    """The :class:`Operator` in kopf's memo (put there by :func:`configure`)."""
    found = memo.get(MEMO_KEY) if isinstance(memo, dict) else None
    if not isinstance(found, Operator):
        raise RuntimeError(
            f"kopf's memo holds no eddyline Operator under {MEMO_KEY!r}: the startup handler "
            "eddyline_operator.handlers.configure did not run; start the operator with "
            "`eddyline-operator` (or `kopf run -m eddyline_operator`)"
        )
    return found


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Progress and the diff base live in annotations: status belongs to the CRD's schema.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settled_seconds(os.environ)  # a bad beat stops the operator at start, not every daemon
    node_grace_seconds(os.environ)  # the same for a bad grace
    operator = Operator(workers=cycle_workers(os.environ))
    settings.execution.executor = operator.executor  # kopf's sync handlers: the same threads
    # With replicas (kopf's peering): a replica that dies without a word is taken over from
    # this long after its last keep-alive (kopf's default is 60 s).
    settings.peering.lifetime = PEERING_LIFETIME_SECONDS
    settings.watching.server_timeout = 60
    # The children's watches stream only the operator's objects (CHILD_SELECTOR), not every
    # ConfigMap and Service of the watched namespaces.
    settings.watching.label_selectors[_is_child_kind] = CHILD_SELECTOR
    settings.networking.request_timeout = 90
    # Startup handlers run before any object is watched, so every object's memo (a shallow
    # copy of this one) holds the same Operator.
    memo[MEMO_KEY] = operator


# Where the pod's service-account files are when not at the fixed in-cluster path
# /var/run/secrets/kubernetes.io/serviceaccount: a kubelet without mount namespaces (the
# tests' stand-in) gives each pod a directory of its own and names it here.
SERVICE_ACCOUNT_DIR_ENV = "EDDYLINE_SERVICE_ACCOUNT_DIR"


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account from ``EDDYLINE_SERVICE_ACCOUNT_DIR`` when set; otherwise
    kopf's own login through the ``kubernetes`` client (in-cluster, then kubeconfig), which
    is what kopf does when no login handler is registered."""
    directory = os.environ.get(SERVICE_ACCOUNT_DIR_ENV)
    if not directory:
        return kopf.login_via_client(**kwargs)
    return service_account_login(directory, os.environ)


def service_account_login(directory: str, environ: Mapping[str, str]) -> kopf.ConnectionInfo:
    """In-cluster credentials read from ``directory`` (token, ca.crt, namespace)."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise kopf.LoginError(
            f"{SERVICE_ACCOUNT_DIR_ENV}={directory} is set but KUBERNETES_SERVICE_HOST/PORT "
            "are not: run the operator in a pod, or unset it to use a kubeconfig"
        )
    files = {}
    for name in ("token", "ca.crt"):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise kopf.LoginError(
                f"no {name} in {directory} ({SERVICE_ACCOUNT_DIR_ENV}): the kubelet did not "
                "mount the pod's service-account token; check automountServiceAccountToken"
            )
        files[name] = path
    with open(files["token"], encoding="utf-8") as token:
        bearer = token.read().strip()
    namespace_file = os.path.join(directory, "namespace")
    namespace = None
    if os.path.isfile(namespace_file):
        with open(namespace_file, encoding="utf-8") as found:
            namespace = found.read().strip() or None
    server_host = f"[{host}]" if ":" in host else host  # an IPv6 address
    return kopf.ConnectionInfo(
        server=f"https://{server_host}:{port}",
        ca_path=files["ca.crt"],
        token=bearer,
        default_namespace=namespace,
    )


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile_app(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    run_cycle(operator_of(memo), namespace or "default", name, fetch=True, force_apply=True)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0)
async def follow_app(
    namespace: str | None,
    name: str,
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    operator = operator_of(memo)
    settled = settled_seconds(os.environ)
    state = operator.app(namespace or "default", name)
    state.forget_observed()
    state.watched = body
    metrics.METRICS.app_started(namespace or "default", name)
    try:
        while not stopped.is_set():
            # The cycle blocks (HTTP); it borrows a thread only while it runs. It runs in a
            # copy of this task's context, as asyncio.to_thread would: kopf.event finds
            # kopf's settings there.
            cycle = functools.partial(refresh_app, operator, namespace, name, settled)
            delay = await asyncio.get_running_loop().run_in_executor(
                operator.executor, contextvars.copy_context().run, cycle
            )
            await stopped.wait(delay)
    finally:
        state.watched = None
        metrics.METRICS.app_stopped(namespace or "default", name)


def settled_seconds(environ: Mapping[str, str]) -> float:
    """The beat of a settled app: ``EDDYLINE_OPERATOR_RESYNC_SECONDS`` or SETTLED_SECONDS."""
    return _seconds(environ, RESYNC_ENV, SETTLED_SECONDS, "such as 2 or 60")


def cycle_workers(environ: Mapping[str, str]) -> int:
    """The threads cycles run on: ``EDDYLINE_OPERATOR_WORKERS`` or CYCLE_WORKERS."""
    raw = environ.get(WORKERS_ENV, "").strip()
    if not raw:
        return CYCLE_WORKERS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(
            f"{WORKERS_ENV}={raw!r}: expected a whole number of threads above 0, such as "
            f"{CYCLE_WORKERS}"
        )
    return value


def node_grace_seconds(environ: Mapping[str, str]) -> float:
    """How long a node may be silent before its pods leave the membership:
    ``EDDYLINE_OPERATOR_NODE_GRACE_SECONDS`` or NODE_GRACE_SECONDS."""
    # Kubelets renew their Lease every 10 s: a shorter grace drops healthy pods.
    example = (
        "such as 15 (kubelets renew their Lease every 10 s: less than that drops healthy pods)"
    )
    return _seconds(environ, NODE_GRACE_ENV, NODE_GRACE_SECONDS, example)


def _seconds(environ: Mapping[str, str], name: str, default: float, example: str) -> float:
    """Seconds above 0 from the environment variable ``name``; ``default`` when unset."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds above 0, {example}")
    return value


def refresh_app(
    operator: Operator, namespace: str | None, name: str, settled: float = SETTLED_SECONDS
) -> float:
    """One cycle that also asks pods for their reports; returns when to run again."""
    started = time.monotonic()
    try:
        result = run_cycle(operator, namespace or "default", name, fetch=True, force_apply=False)
    except Exception:
        metrics.METRICS.record_cycle(
            namespace or "default", name, metrics.FAILED, time.monotonic() - started
        )
        # The API server restarting, a conflict, a bug: the loop must outlive it (create
        # and update handlers are retried by kopf; this daemon retries at its next beat).
        logger.exception("StreamApp %s/%s: the cycle failed; retrying", namespace, name)
        return min(settled, SETTLED_SECONDS)
    outcome = metrics.GONE if result is None else metrics.PAUSED if result.paused else metrics.OK
    metrics.METRICS.record_cycle(namespace or "default", name, outcome, time.monotonic() - started)
    if result is None or result.paused:  # paused: nothing moves, so no hurry
        return settled
    if result.status.phase in (Phase.PENDING, Phase.PROGRESSING):
        return SETTLING_SECONDS
    if result is not None and result.recheck_seconds is not None:
        # A member's node Lease may pass its grace before the next beat: look then.
        return min(settled, max(SETTLING_SECONDS, result.recheck_seconds + RECHECK_MARGIN_SECONDS))
    return settled


@kopf.on.event("", "v1", "pods", labels={names.LABEL_MANAGED_BY: names.OPERATOR})
def pod_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    labels = body.get("metadata", {}).get("labels") or {}
    app, namespace = labels.get(names.LABEL_INSTANCE), body.get("metadata", {}).get("namespace")
    if app and namespace:
        operator = operator_of(memo)
        operator.pod_event(str(namespace), str(app))  # before the cycle: it LISTs the pods
        run_cycle(operator, str(namespace), str(app), fetch=False, force_apply=False)


def _is_child_kind(resource: kopf.Resource) -> bool:
    """Whether kopf's ``resource`` is one of CHILD_KINDS (its watch takes CHILD_SELECTOR)."""
    return (resource.group, resource.version, resource.plural) in CHILD_KINDS.values()


def _child_recorder(kind: str) -> Any:
    """kopf's event handler for the watch of ``kind``: record each event in the cache."""

    async def record_child(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        # Async: a dictionary write under a lock, on kopf's loop, borrows no cycle thread.
        found = event.get("object") or {}
        labels = (found.get("metadata") or {}).get("labels") or {}
        children = operator_of(memo).children
        if labels.get(names.LABEL_MANAGED_BY) == names.OPERATOR:
            children.record(kind, event.get("type"), found)
        else:  # the server filters on the label; should one come through, it is not ours
            children.forget(kind, found)

    return record_child


for _kind, (_group, _version, _plural) in CHILD_KINDS.items():
    kopf.on.event(_group, _version, _plural, id=f"record-{_plural}")(_child_recorder(_kind))


def run_cycle(
    operator: Operator, namespace: str, name: str, *, fetch: bool, force_apply: bool
) -> Plan | None:
    """Observe, plan, act; returns the plan (None when the StreamApp is gone)."""
    state = operator.app(namespace, name)
    with state.lock:
        kube = operator.kube
        body = _observed_app(kube, state, namespace, name)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return None
        # The last cycle had nothing to do and saw no pod; no pod event since (read before
        # the LIST below, so an event during this cycle is a difference next time) and the
        # same StreamApp: the same nothing again, without a request.
        quiet = _quiet_key(state, body, namespace, name)
        if quiet is not None and quiet == state.quiet and not force_apply:
            return state.last_plan
        pods = kube.list("Pod", namespace, selector=names.selector_string(name))
        if pods:
            quiet = None
        wanted = {p.get("spec", {}).get("nodeName") for p in pods} - {None}
        nodes = operator.cluster.nodes(kube, wanted)
        leases = operator.cluster.leases(kube)
        now, grace = _now(), node_grace_seconds(os.environ)
        # Pods on a lost node are not asked for a report (a partitioned one would cost a
        # timeout each); the plan leaves them out of the membership.
        lost = lost_nodes(nodes, leases, now=now, grace=grace)
        members = [p for p in pods if is_member(p, lost)]
        # Leaving pods (deleted, container still running) report too: they are members
        # until they exit, and when every pod is leaving (a suspend, replicas 0) their
        # reports are the only layout there is to publish "nobody takes over" from;
        # without it each would wait out its hand-over bound.
        reporting = members + [p for p in pods if is_leaving(p, lost)]
        if fetch or not state.reports:
            state.reports = fetch_reports(reporting, names.QUERY_PORT)
        else:
            alive = {p["metadata"]["name"] for p in reporting}
            state.reports = {m: r for m, r in state.reports.items() if m in alive}
        if is_resuming(body):
            # A pause is for repairs by hand (docs/operator.md, "Pausing reconciliation"),
            # the membership's too: plan from what the ConfigMaps hold now, not from a read
            # made before the pause (a generation published by hand meanwhile would be
            # published again under the same number, which the pods ignore).
            state.configs = None
        membership, manifest, membership_map = _configs(kube, state, namespace, name)
        observed = Observed(
            body=body,
            pods=pods,
            nodes=nodes,
            membership=membership,
            reports=state.reports,
            applied_manifest=manifest,
            now=now,
            default_image=os.environ.get(RUNTIME_IMAGE_ENV, objects.DEFAULT_IMAGE),
            executor_role=os.environ.get(EXECUTOR_ROLE_ENV, restore_job.DEFAULT_EXECUTOR_ROLE),
            **_restore_jobs(kube, body, namespace, name),
            **_backfill_jobs(kube, body, namespace, name),
            leases=leases,
            node_grace_seconds=grace,
            stateful_set_events=stateful_set_events(kube, body, pods, state.events),
        )
        result = plan(observed)
        meta = body["metadata"]
        scaling = autoscaler.autoscale_app(
            state.samples,
            autoscaler.ScalingRealizer(
                kube, meta["namespace"], meta["name"], lambda *event: post_event(body, *event)
            ),
            result,
            autoscaler.Observed(
                body, pods, members, observed.membership, state.reports, scrape=fetch, now=now
            ),
        )
        running = Running(pods, observed.jobs)
        acted = _carry_out(
            kube, state, body, result, scaling,
            force_apply=force_apply, running=running, membership_map=membership_map,
        )  # fmt: skip
        state.last_plan = result
        state.quiet = quiet if quiet is not None and not acted and _at_rest(result) else None
        return result


def _quiet_key(state: AppState, body: Any, namespace: str, name: str) -> tuple[Any, ...] | None:
    """What a cycle of an app that wants no pods (suspended, or 0 replicas) plans from, as
    a key, as long as it has none (the caller drops the key when its LIST finds a pod); None
    when there is more to observe (restore Jobs, an autoscaler), or its ConfigMaps or the
    re-apply of its children are due.

    Without pods nothing outside the StreamApp and its two ConfigMaps can change what a cycle
    decides (no reports, no nodes, no leases), and a pod that appears is a pod event, counted
    in the key: a cycle that sees the same StreamApp version, the same ConfigMap read and no
    pod event since the last one, which had nothing to do and no pod, would decide the same
    nothing again. Such a beat sends no request (it was a LIST of pods per beat, half of the
    API server's requests at 200 apps); the children are still re-applied once per
    REAPPLY_SECONDS, the ConfigMaps read in the same cycle. With many idle apps (suspended
    ones) this is most of the operator's beats. A pod of the app's labels that lacks the
    managed-by label (no pod event: kopf's watch filters on it; the StatefulSet's pods all
    carry it) is seen at the next re-apply."""
    if state.configs is None or _due(state.configs[0], namespace, name):
        return None
    if _due(state.applied_at, namespace, name):
        return None
    spec = body.get("spec") or {}
    if not spec.get("suspend") and spec.get("replicas", 1) != 0:
        return None  # pods wanted and none there: the StatefulSet's Events are watched
    if spec.get("autoscaling") or (spec.get("restore") or {}).get("when", "Never") != "Never":
        return None
    if (body.get("status") or {}).get("restoreJobs"):
        return None
    version = body.get("metadata", {}).get("resourceVersion")
    return (version, state.configs[0], state.applied_hash, state.pod_events)


def _due(done_at: float, namespace: str, name: str) -> bool:
    """Whether what was last done at ``done_at`` (time.monotonic()) is due again: once per
    REAPPLY_SECONDS, at the app's own phase in that period (from a digest of its name, so
    many apps spread over it), at most REAPPLY_SECONDS after it was done."""
    if REAPPLY_SECONDS <= 0:
        return True
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
    phase = int.from_bytes(digest[:4], "big") / 2**32 * REAPPLY_SECONDS

    def period(at: float) -> int:
        return int((at + phase) // REAPPLY_SECONDS)

    return period(time.monotonic()) != period(done_at)


def _at_rest(result: Plan) -> bool:
    """Whether a plan asks for nothing but what is already so (and no early next cycle)."""
    return not (
        result.write_ahead
        or result.delete_pods
        or result.create_jobs
        or result.events
        or result.membership is not None
        or result.recheck_seconds is not None
        or result.status.phase in (Phase.PENDING, Phase.PROGRESSING)
    )


def _observed_app(kube: Kube, state: AppState, namespace: str, name: str) -> Any:
    """The StreamApp: kopf's watched view when it holds the version this operator last saw
    from the server (the daemon's beat then costs the API server no GET), else a GET."""
    watched = state.watched
    if watched is not None:
        # kopf replaces the view's contents as watch events arrive: one copy, read once
        # (through JSON: copy.deepcopy of a StreamApp, kopf's annotations and managed
        # fields included, cost more than the GET it saves).
        snapshot = json.loads(json.dumps(dict(watched)))
        version = (snapshot.get("metadata") or {}).get("resourceVersion")
        if version is not None and version == state.known_version:
            return snapshot
    found = kube.get_streamapp(namespace, name)
    state.known_version = None if found is None else found["metadata"].get("resourceVersion")
    return found


def _configs(
    kube: Kube, state: AppState, namespace: str, name: str
) -> tuple[Membership | None, str | None, FreshRead | None]:
    """The published membership and the applied manifest (AppState.configs says when they
    are read again: in the cycle that re-applies the children, as both are due at the same
    moments, or after a write), and the membership ConfigMap itself when this cycle read it
    (None when both came from an earlier read): the drift check looks at its owner from that
    read instead of a second GET of it (issue 38)."""
    if state.configs is not None and not _due(state.configs[0], namespace, name):
        return state.configs[1], state.configs[2], None
    read_at = time.monotonic()
    found = kube.get("ConfigMap", namespace, names.membership_map(name))
    membership = membership_in(found)
    manifest = kube.read_config_value(namespace, names.config_map(name), names.MANIFEST_KEY)
    state.configs = (read_at, membership, manifest)
    return membership, manifest, FreshRead(found)


def _carry_out(
    kube: Kube,
    state: AppState,
    body: Any,
    result: Plan,
    scaling: AutoscalingStatus | None,
    *,
    force_apply: bool,
    running: Running,
    membership_map: FreshRead | None,
) -> bool:
    """Carry ``result`` out and write the status composed from it, the autoscaler's
    ``scaling`` and the children the API server refused. Returns whether status was written
    or anything was refused (an apply or a publish also reads the ConfigMaps again, which
    tells _quiet_key)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    stored = body.get("status")
    if result.write_ahead:
        # An upgrade's new step: status is its write-ahead log, so the step is recorded
        # before anything acts on it. A conflict raises: nothing is done this cycle, and the
        # next one decides again from what status then says.
        ahead, _ = compose_status(result.status, autoscaling=scaling, now=_now())
        written = _record_status(kube, state, namespace, name, ahead)
        _count_recorded(namespace, name, stored, ahead)
        stored = written
        body = {**body, "status": stored}
    # Children that could not be applied, (reason, message): each object is tried on its
    # own, and status still says what happened (a refused child must never stop the cycle
    # before status is written).
    outcome = _apply_children(
        kube, state, body, result,
        force_apply=force_apply, running=running, membership_map=membership_map,
    )  # fmt: skip
    refusals = outcome.refusals
    for pod in result.delete_pods:
        kube.delete("Pod", namespace, pod)
    for job in result.create_jobs:
        stopped = withheld(job, outcome.unavailable)
        if stopped is not None:
            refusals.append((NAME_CONFLICT, stopped.message))
            continue
        try:
            kube.create(job)
        except ApiError as error:
            if error.status == 409:  # launched by an earlier cycle whose status was lost
                continue
            if not 400 <= error.status < 500:
                raise
            refusals.append((APPLY_FAILED, refused(f"Job {job['metadata']['name']}", error)))
    for event in result.events:
        post_event(body, event.type, event.reason, event.message)
    status, warning = compose_status(
        result.status,
        autoscaling=scaling,
        refusals=refusals,
        previous=read_status(stored)[0].conditions,
        now=_now(),
    )
    for reason, message in refusals:
        logger.warning("StreamApp %s/%s: %s: %s", namespace, name, reason, message)
    if warning is not None:
        post_event(body, warning.type, warning.reason, warning.message)
    if not status_differs(stored, status):
        return bool(refusals) or warning is not None
    try:
        _record_status(kube, state, namespace, name, status)
    except ApiError as error:
        if error.status != 409:
            raise
        # Someone wrote in between: the daemon's next cycle writes again.
        return True
    _count_recorded(namespace, name, stored, status)
    return True


def _count_recorded(namespace: str, name: str, before: Any, after: StreamAppStatus) -> None:
    """Count what a status write that landed records for the first time: an upgrade's
    rollback started (``status.upgrade`` gains its ``rollback``), restore Jobs failed (their
    state becomes Failed). Only after the write landed: a cycle whose write conflicted
    decides the same again from the status as it was, and is counted then, once."""
    previous, _ = read_status(before)
    was, now = previous.upgrade, after.upgrade
    if now is not None and now.rollback is not None and (was is None or was.rollback is None):
        metrics.METRICS.record_upgrade_rollback(namespace, name)
    failed = RestoreJobState.FAILED
    seen = {job.name for job in previous.restore_jobs or [] if job.state is failed}
    newly = {job.name for job in after.restore_jobs or [] if job.state is failed} - seen
    if newly:
        metrics.METRICS.record_restore_job_failed(namespace, name, len(newly))


def _apply_children(
    kube: Kube,
    state: AppState,
    body: Any,
    result: Plan,
    *,
    force_apply: bool,
    running: Running,
    membership_map: FreshRead | None,
) -> Outcome:
    """Apply the owned objects (withholding those that name another owner's object), prune
    the ones no longer wanted, publish the membership, each on its own (children.py);
    returns the refusals and what no child may name. A server or network failure (5xx, no
    answer) raises: the whole cycle is retried. ``membership_map``: the membership ConfigMap
    as this cycle read it (_configs), None when it did not."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    children = Children(
        kube,
        namespace=namespace,
        app=name,
        uid=meta["uid"],
        announce=lambda reason, message: post_event(body, "Normal", reason, message),
    )
    outcome = Outcome()
    digest = hashlib.sha256(json.dumps(result.objects, sort_keys=True).encode()).hexdigest()
    changed = force_apply or digest != state.applied_hash
    if result.objects and (changed or _due(state.applied_at, namespace, name)):
        children.membership_conflict(outcome, read=membership_map)
        # Unchanged since the last apply: only the objects that drifted are sent again (a
        # server-side apply per child per app every REAPPLY_SECONDS was most of the API
        # server's work with many apps).
        children.apply(result.objects, outcome, unless_same=not changed)
        if changed or outcome.changed or outcome.refusals:
            # The ConfigMaps may have changed (or be pruned): read them again next cycle.
            # After a drift check that sent nothing, this cycle's read still holds.
            state.configs = None
        if changed and result.prune_kinds:  # what is wanted changes only with the spec
            children.prune(result.objects, result.prune_kinds)
        if not outcome.refusals:  # otherwise every object is tried again next cycle
            state.applied_hash, state.applied_at = digest, time.monotonic()
    if result.membership is not None:
        owner = objects.owner_reference(name=name, uid=meta["uid"])
        data = json.dumps(result.membership.to_json())
        state.configs = None
        try:
            kube.publish_membership(
                objects.membership_config_map(name, namespace, owner, data),
                check=children.check("ConfigMap"),
            )
        except ownership.NameConflictError as conflict:
            children.conflict(outcome, conflict)
    if outcome.unavailable:  # nothing running may go on naming another owner's object
        children.remove_naming(running.pods, "Pod", outcome.unavailable)
        children.remove_naming(running.jobs, "Job", outcome.unavailable)
    return outcome


def _record_status(
    kube: Kube, state: AppState, namespace: str, name: str, status: StreamAppStatus
) -> Any:
    """The one place status is written: the typed status dumped whole (a merge patch, so the
    fields it holds as None are cleared). Returns what was sent."""
    patch = dump_status(status)
    # The answer's version is the app as this write left it: the watched view stands in
    # for a GET again once it shows that version.
    state.known_version = kube.patch_streamapp_status(namespace, name, patch)
    return patch


def _restore_jobs(kube: Kube, body: Any, namespace: str, name: str) -> dict[str, list[Any]]:
    """The app's Spark restore Jobs and their pods; not listed while spec.restore is Never
    and none was ever recorded (two requests per cycle saved for most apps)."""
    spec_restore = (body.get("spec") or {}).get("restore") or {}
    recorded = (body.get("status") or {}).get("restoreJobs")
    if spec_restore.get("when", "Never") == "Never" and not recorded:
        return {"jobs": [], "job_pods": []}
    selector = restore_job.selector_string(name)
    jobs = kube.list("Job", namespace, selector=selector)
    pods = kube.list("Pod", namespace, selector=selector) if jobs else []
    return {"jobs": jobs, "job_pods": pods}


def _backfill_jobs(kube: Kube, body: Any, namespace: str, name: str) -> dict[str, list[Any]]:
    """The app's backfill Jobs and their pods; listed only while an upgrade with a backfill
    runs (its Backfilling step observes them)."""
    upgrade = (body.get("status") or {}).get("upgrade") or {}
    if not upgrade.get("backfill"):
        return {"backfill_jobs": [], "backfill_job_pods": []}
    selector = backfill_job.selector_string(name)
    jobs = kube.list("Job", namespace, selector=selector)
    pods = kube.list("Pod", namespace, selector=selector) if jobs else []
    return {"backfill_jobs": jobs, "backfill_job_pods": pods}


def post_event(body: Any, type_: str, reason: str, message: str) -> None:
    """An Event about the StreamApp (kopf posts it in the background)."""
    kopf.event(body, type=type_, reason=reason, message=message)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
