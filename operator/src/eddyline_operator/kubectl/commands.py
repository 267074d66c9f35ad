"""What each ``kubectl eddyline`` subcommand reads and writes, all through the API server.

Pods are reached only through the API server's pod proxy (``Kube.pod_proxy_get``): a user's
machine cannot route to pod addresses, and the API server checks the caller's right to
``get`` ``pods/proxy`` there. Writes are merge patches of the StreamApp the operator already
honours: the pause annotation and ``spec.topology``; the operator does the rest.
"""

from __future__ import annotations

import datetime
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar

from pydantic import ValidationError

from eddyline_operator.client import ApiError, Kube
from eddyline_operator.kubectl.render import Style
from eddyline_operator.kubectl.status_view import AppView, app_view
from eddyline_operator.reconcile import names
from eddyline_operator.reconcile.autoscale import PodSample, parse_metrics
from eddyline_operator.reconcile.plan import is_paused
from eddyline_operator.reconcile.status_record import read_status
from eddyline_runtime.membership import MemberReport, Membership
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.progress import ProgressLine
from eddyline_runtime.spec import ConditionType, StreamAppStatus, TopologyRecord, TopologySpec

Obj = dict[str, Any]
T = TypeVar("T")

DOCS = 'docs/operator.md, section "kubectl eddyline"'
# How often a waiting command reads the StreamApp again: the operator's cycles take about
# a second; a user watching an upgrade sees each step within one.
_POLL_SECONDS = 1.0


class PluginError(Exception):
    """A failure the user can act on; the message names the thing and the way out."""


@dataclass(frozen=True)
class Host:
    pod: str | None
    zone: str | None
    address: str


@dataclass(frozen=True)
class KeyPlace:
    """Where a key lives: its partition, the task that owns it, and the copies serving it."""

    app: str
    store: str
    key: str
    partition: int
    task: str | None
    active: Host | None
    standbys: tuple[Host, ...]


def get_app(kube: Kube, namespace: str, app: str) -> Obj:
    found = _api(lambda: kube.get("StreamApp", namespace, app), f'read StreamApp "{app}"')
    if found is None:
        raise PluginError(
            f'no StreamApp "{app}" in namespace "{namespace}"; list them with '
            f"`kubectl get streamapps -n {namespace}` (or give -n NAMESPACE)"
        )
    return found


def read_view(kube: Kube, namespace: str, app: str) -> AppView:
    obj = get_app(kube, namespace, app)
    pods = _pods(kube, namespace, app)
    membership = _api(
        lambda: kube.read_membership(namespace, names.membership_map(app)),
        f'read the membership ConfigMap "{names.membership_map(app)}"',
    )
    reports, errors = read_reports(kube, namespace, pods)
    return app_view(
        obj, pods, membership, reports, errors, samples=read_samples(kube, namespace, reports)
    )


def read_samples(
    kube: Kube, namespace: str, reports: dict[str, MemberReport]
) -> dict[str, PodSample]:
    """The ``/metrics`` of each pod that reported its layout, through the pod proxy, as the
    autoscaler reads them; a pod whose metrics do not parse is left out."""
    samples = {}
    for name in reports:
        try:
            text = kube.pod_proxy_text(namespace, name, names.QUERY_PORT, "/metrics")
        except ApiError:
            continue
        if text is None:
            continue
        try:
            samples[name] = parse_metrics(text, 0.0)
        except ValueError:
            continue
    return samples


def read_reports(
    kube: Kube, namespace: str, pods: list[Obj]
) -> tuple[dict[str, MemberReport], dict[str, str]]:
    """Each running pod's ``/v1/layout`` through the pod proxy; for the others, why not."""
    reports: dict[str, MemberReport] = {}
    errors: dict[str, str] = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        if not (pod.get("status") or {}).get("podIP"):
            errors[name] = "no address yet"
            continue
        try:
            body = _proxy(kube, namespace, name, "/v1/layout")
        except ApiError as error:
            # The API server's or the pod's reason: "503 ..." while it starts, "400 address
            # not allowed" for a pod IP the proxy refuses (loopback, link-local).
            reason = str(error).rpartition(f": {error.status} ")[2] if error.status else ""
            errors[name] = f"no layout: {error.status or 'unreachable'} {reason[:80]}".rstrip()
            continue
        if body is None:
            errors[name] = "no layout (404)"
            continue
        try:
            reports[name] = MemberReport.from_json(body)
        except ValueError:
            errors[name] = "layout unreadable"
    return reports, errors


def where(kube: Kube, namespace: str, app: str, key: str, store: str | None) -> KeyPlace:
    """The partition of ``key`` in ``store`` and the pods that serve it, as a pod's query
    server computes it (the store's own key serde and partitioner)."""
    get_app(kube, namespace, app)
    pods = [p for p in _pods(kube, namespace, app) if (p.get("status") or {}).get("podIP")]
    reports, _ = read_reports(kube, namespace, pods)
    owners: dict[str, int] = {}
    for report in reports.values():
        owners.update(report.store_owners)
    if not reports:
        raise PluginError(
            f'no pod of "{app}" answers yet; see `kubectl eddyline status {app}` and retry '
            "once a pod is ready"
        )
    if store is None:
        if len(owners) != 1:
            listed = ", ".join(sorted(owners)) or "none"
            raise PluginError(f'"{app}" has {len(owners)} stores ({listed}); name one: --store')
        (store,) = owners
    elif store not in owners:
        listed = ", ".join(sorted(owners)) or "none"
        raise PluginError(f'"{app}" has no store "{store}"; its stores: {listed}')
    path = f"/v1/stores/{urllib.parse.quote(store, safe='')}/metadata/"
    path += urllib.parse.quote(key, safe="")
    last: ApiError | None = None
    for name in reports:
        try:
            metadata = _proxy(kube, namespace, name, path)
        except ApiError as error:  # 503 while it starts or closes: ask the next pod
            last = error
            continue
        if metadata is None:
            continue
        return _place(
            kube, namespace, app=app, store=store, key=key, metadata=metadata, owners=owners
        )
    raise PluginError(f'no pod of "{app}" could locate the key ({last}); retry shortly')


def _place(
    kube: Kube,
    namespace: str,
    *,
    app: str,
    store: str,
    key: str,
    metadata: Obj,
    owners: dict[str, int],
) -> KeyPlace:
    membership: Membership | None = kube.read_membership(namespace, names.membership_map(app))
    members = membership.assignment.members if membership else ()
    by_address = {m.address: m for m in members if m.address}

    def host(address: str) -> Host:
        member = by_address.get(address)
        return Host(member.id if member else None, member.zone if member else None, address)

    partition = int(metadata["partition"])
    active = metadata.get("active_host")
    return KeyPlace(
        app=app,
        store=store,
        key=key,
        partition=partition,
        task=str(TaskId(owners[store], partition)) if store in owners else None,
        active=host(str(active)) if active else None,
        standbys=tuple(host(str(a)) for a in metadata.get("standby_hosts") or ()),
    )


def set_paused(
    kube: Kube, namespace: str, app: str, *, paused: bool, wait_seconds: float
) -> StreamAppStatus:
    """Set (or remove) the pause annotation the operator honours, then wait until the
    operator says so in the Paused condition (it may be busy or stopped: say which)."""
    obj = get_app(kube, namespace, app)
    if is_paused(obj) != paused:
        patch = {"metadata": {"annotations": {names.ANNOTATION_PAUSE: "true" if paused else None}}}
        _api(
            lambda: kube.merge_patch("StreamApp", namespace, app, patch),
            f'annotate StreamApp "{app}"',
        )
    deadline = time.monotonic() + wait_seconds
    while True:
        status, _ = read_status(get_app(kube, namespace, app).get("status"))
        recorded = any(
            c.type == ConditionType.PAUSED and c.status.value == "True" for c in status.conditions
        )
        if recorded == paused:
            return status
        if time.monotonic() >= deadline:
            state = "paused" if paused else "resumed"
            raise PluginError(
                f"the annotation {names.ANNOTATION_PAUSE} is {'set' if paused else 'removed'}, "
                f'but the operator has not recorded "{app}" as {state} within '
                f"{wait_seconds:.0f} s: is an eddyline operator running and watching namespace "
                f'"{namespace}"? (`kubectl eddyline status {app}` shows what it last recorded)'
            )
        time.sleep(_POLL_SECONDS)


def upgrade(
    kube: Kube,
    namespace: str,
    app: str,
    *,
    ref: str,
    revision: str | None,
    wait_seconds: float | None,
    out: TextIO,
    style: Style,
    progress: bool,
) -> bool:
    """Ask for ``ref`` at ``revision`` (default: the spec's revision plus one) and, unless
    ``wait_seconds`` is None, follow the operator's steps until the new revision runs (True)
    or was rolled back (False)."""
    obj = get_app(kube, namespace, app)
    status, _ = read_status(obj.get("status"))
    if status.upgrade is not None:
        under_way = status.upgrade
        raise PluginError(
            f'an upgrade of "{app}" from {under_way.from_topology} to {under_way.to_topology} '
            f"is under way (step {under_way.step}); wait for it to end "
            f"(`kubectl eddyline status {app}`)"
        )
    current = (obj.get("spec") or {}).get("topology") or {}
    current_revision = str(current.get("revision", "1"))
    if revision is None:
        if not current_revision.isdigit():
            raise PluginError(
                f'the current revision "{current_revision}" is not a number to count up from; '
                "give the new one: --revision"
            )
        revision = str(int(current_revision) + 1)
    try:
        target = TopologySpec.model_validate({"ref": ref, "revision": revision})
    except ValidationError as invalid:
        problems = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in invalid.errors())
        raise PluginError(
            f'cannot upgrade to "{ref}" revision "{revision}": {problems} (a topology is a '
            "module:function reference inside the app's image, e.g. wordcount:topology)"
        ) from None
    wanted = TopologyRecord(ref=target.ref, revision=target.revision)
    if str(current.get("ref")) == wanted.ref and current_revision == wanted.revision:
        raise PluginError(f'spec.topology of "{app}" already is {wanted}; give another --revision')
    patch = {"spec": {"topology": {"ref": wanted.ref, "revision": wanted.revision}}}
    _api(
        lambda: kube.merge_patch("StreamApp", namespace, app, patch),
        f'patch spec.topology of StreamApp "{app}"',
    )
    running = status.topology
    print(f"{app}: upgrading from {running or '-'} to {wanted}", file=out, flush=True)
    if wait_seconds is None:
        return True
    # Pods ready of the app's pods, the step as its label; nothing when not a terminal.
    with ProgressLine(out, label="", unit="pods ready", enabled=progress, show_rate=False) as line:
        return _follow(
            kube,
            namespace,
            app,
            wanted=wanted,
            wait_seconds=wait_seconds,
            out=out,
            style=style,
            line=line,
        )


def _follow(
    kube: Kube,
    namespace: str,
    app: str,
    *,
    wanted: TopologyRecord,
    wait_seconds: float,
    out: TextIO,
    style: Style,
    line: ProgressLine,
) -> bool:
    started = time.monotonic()
    shown = 0
    while True:
        status, _ = read_status(get_app(kube, namespace, app).get("status"))
        record = status.upgrade
        steps = record.steps if record is not None else []
        if record is None and status.last_upgrade is not None:
            last = status.last_upgrade
            if last.to_topology.same_spec(wanted) or last.from_topology.same_spec(wanted):
                steps = last.steps
        ended = status.last_upgrade
        if len(steps) > shown:
            line.clear()
            for entered in steps[shown:]:
                # When each step began; how long each took, `kubectl eddyline status` shows.
                print(style.fit(f"    {entered.started_at}  {entered.step}"), file=out, flush=True)
            shown = len(steps)
        if record is None:
            if status.topology is not None and status.topology.same_spec(wanted):
                line.clear()
                print(
                    style.paint(f"{app}: {wanted} runs", "green")
                    + (f" (describe hash {status.topology.hash})" if status.topology.hash else ""),
                    file=out,
                    flush=True,
                )
                return True
            if status.failed_topology is not None and status.failed_topology.same_spec(wanted):
                line.clear()
                why = ""
                if ended is not None and ended.rollback is not None:
                    pod = f" on {ended.rollback.pod}" if ended.rollback.pod else ""
                    why = f": {ended.rollback.reason}{pod}: {ended.rollback.message}"
                print(
                    style.paint(f"{app}: {wanted} was rolled back", "red")
                    + f"; {status.topology or 'the previous revision'} runs again{why}",
                    file=out,
                    flush=True,
                )
                return False
        elapsed = time.monotonic() - started
        if elapsed >= wait_seconds:
            line.clear()
            step = record.step if record is not None else "not started by the operator"
            raise PluginError(
                f"{app}: the upgrade to {wanted} has not ended after {wait_seconds:.0f} s "
                f"(step: {step}); it goes on: follow it with `kubectl eddyline status {app}`"
            )
        step = record.step if record is not None else "waiting for the operator"
        line.update(status.ready_replicas or 0, total=status.replicas or 0, label=f"  {step}")
        time.sleep(_POLL_SECONDS)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _pods(kube: Kube, namespace: str, app: str) -> list[Obj]:
    return _api(
        lambda: kube.list("Pod", namespace, selector=names.selector_string(app)),
        f'list the pods of "{app}"',
    )


def _proxy(kube: Kube, namespace: str, pod: str, path: str) -> Obj | None:
    try:
        return kube.pod_proxy_get(namespace, pod, names.QUERY_PORT, path)
    except ApiError as error:
        if error.status in (401, 403):
            raise PluginError(
                f'cannot read {path} of pod "{pod}" through the API server\'s pod proxy '
                f'({error}); kubectl eddyline needs "get" on "pods/proxy" in namespace '
                f'"{namespace}" ({DOCS})'
            ) from None
        raise


def _api(call: Callable[[], T], what: str) -> T:
    """``call``, with a refusal turned into what the user lacks and where the rights are."""
    try:
        return call()
    except ApiError as error:
        if error.status in (401, 403):
            raise PluginError(f"cannot {what}: {error}; the rights it needs: {DOCS}") from None
        if error.status == 0:
            raise PluginError(str(error)) from None
        raise PluginError(f"cannot {what}: {error}") from None
