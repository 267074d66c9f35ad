"""A Kubernetes API server for tests: the real ``kubectl``, kopf and Helm talk to it over HTTP.

There is no cluster on these machines. This emulator serves the parts of the API that
``kubectl`` 1.32, kopf 1.45 and helm-sdkpy rely on, with the semantics they check
(``docs/kubernetes-emulator.md`` lists each one and why):

- discovery (``/api``, ``/apis``, group versions; subresources without short names),
  ``/version`` as v1.32 (the machine's kubectl dispatcher picks its client from it), and
  ``/openapi/v3`` built from the registered resources, so kubectl's default validation
  works and sends ``fieldValidation=Strict``;
- objects with uid, ``resourceVersion`` (one counter, optimistic concurrency: 409 on a stale
  write), ``generation`` bumped on changes outside metadata and status only, generateName,
  namespaces that must exist, finalizers and ``deletionTimestamp``, owner-reference garbage
  collection, graceful deletion of scheduled pods (the kubelet stand-in finishes it);
- lists with ``kind``, label and field selectors, server-side Tables from a CRD's
  ``additionalPrinterColumns`` (and pods' and StatefulSets' usual columns); watches from a
  resourceVersion (410 when too old), with bookmarks and ``timeoutSeconds``;
- PUT, merge, JSON (422 on a failed ``test``) and apply patches; strategic merge patches are
  415 for custom resources as on a real server, and approximated as merge patches for
  built-ins; the status and scale subresources;
- CRDs that register their resource and become Established, and custom resources defaulted,
  pruned and validated by their schema and CEL rules (``crd_schema.py``).

RBAC is enforced for the bearer tokens :meth:`ApiServer.issue_token` gives to service accounts
and for requests to a pod's own endpoint (:meth:`ApiServer.listen_as`): Roles, ClusterRoles
and their bindings, ``resourceNames``, subresources; 403 in the API server's words. Any other
request is an administrator's. Not emulated: privilege-escalation checks, protobuf bodies
(run Helm with ``HELM_DRIVER=memory``), managed fields and server-side apply conflicts, the
strategic merge of lists for built-ins, CEL's Kubernetes libraries (``quantity()``, ...), and
conversion between CRD versions.

Everything runs on one event loop in one thread, so a write and the watch events it causes
are never interleaved with another write. Controllers that stand in for the cluster
(``cluster.py``) run on the same loop and use the same methods as HTTP clients.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import hashlib
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from random import SystemRandom
from typing import Any

import jsonpatch
import yaml
from aiohttp import web

from tests.support.k8s.crd_schema import admit

Obj = dict[str, Any]

SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.4",
    "gitCommit": "eddyline-test-emulator",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23.8",
    "compiler": "gc",
    "platform": "linux/amd64",
}
# How many events a watch can be resumed from; older resourceVersions get 410 Expired.
EVENT_HISTORY = 5000
# Seconds between bookmarks on watches that asked for them; they also reveal gone clients.
BOOKMARK_INTERVAL = 5.0
# Each scheduled pod's deletion waits for the kubelet (a stand-in or nobody, see cluster.py).
GRACEFUL_KINDS = {"Pod"}


class ApiError(Exception):
    """An error answered as a ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


@dataclass
class Resource:
    """One served resource: what discovery, OpenAPI and the store know about it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    status: bool = False
    scale: Obj | None = None  # specReplicasPath, statusReplicasPath, labelSelectorPath
    printer_columns: list[Obj] = field(default_factory=list)
    schema: Obj | None = None  # a CRD version's openAPIV3Schema
    custom: bool = False

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """Objects are stored per group and plural, whatever version they are served in."""
        return f"{self.group}/{self.plural}"

    @property
    def qualified(self) -> str:
        """``streamapps.eddyline.dev``, ``pods``: how error messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def singular(self) -> str:
        return self.kind.lower()


def _builtin_resources() -> list[Resource]:
    r = Resource
    return [
        r("", "v1", "namespaces", "Namespace", namespaced=False, short_names=["ns"], status=True),
        r("", "v1", "configmaps", "ConfigMap", short_names=["cm"]),
        r("", "v1", "secrets", "Secret"),
        r("", "v1", "services", "Service", short_names=["svc"], status=True),
        r("", "v1", "serviceaccounts", "ServiceAccount", short_names=["sa"]),
        r("", "v1", "events", "Event", short_names=["ev"]),
        r("", "v1", "endpoints", "Endpoints", short_names=["ep"]),
        r("", "v1", "pods", "Pod", short_names=["po"], status=True, categories=["all"]),
        r(
            "",
            "v1",
            "persistentvolumeclaims",
            "PersistentVolumeClaim",
            short_names=["pvc"],
            status=True,
        ),
        r("", "v1", "nodes", "Node", namespaced=False, short_names=["no"], status=True),
        r(
            "apps",
            "v1",
            "statefulsets",
            "StatefulSet",
            short_names=["sts"],
            status=True,
            categories=["all"],
            scale={
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        ),
        r(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            short_names=["deploy"],
            status=True,
            categories=["all"],
            scale={
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        ),
        r("apps", "v1", "controllerrevisions", "ControllerRevision"),
        r("batch", "v1", "jobs", "Job", status=True, categories=["all"]),
        r(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            short_names=["pdb"],
            status=True,
        ),
        r("coordination.k8s.io", "v1", "leases", "Lease"),
        r("rbac.authorization.k8s.io", "v1", "roles", "Role"),
        r("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
        r("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
        r(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            namespaced=False,
        ),
        r(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            namespaced=False,
            short_names=["crd", "crds"],
            status=True,
        ),
    ]


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def human_age(timestamp: str | None) -> str | None:
    """kubectl's ``duration.HumanDuration``: the server renders date cells this way."""
    if not timestamp:
        return None
    then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    seconds = int((datetime.now(UTC) - then).total_seconds())
    if seconds < -1:
        return "<invalid>"
    seconds = max(seconds, 0)
    minutes, hours = seconds // 60, seconds // 3600
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    return f"{hours // 24}d" if hours < 24 * 365 * 2 else f"{hours // 8760}y"


def json_path(obj: Any, path: str) -> Any:
    """A printer column's JSONPath (``.status.conditions[?(@.type=="Ready")].status``)."""
    tokens = re.findall(
        r"\.([A-Za-z0-9_-]+)|\[\?\(@\.([\w.-]+)\s*==\s*[\"']([^\"']*)[\"']\)\]"
        r"|\[(\d+)\]|\[[\"']([^\"']+)[\"']\]",
        path,
    )
    values = [obj]
    for name, filter_key, filter_value, index, quoted in tokens:
        found: list[Any] = []
        for value in values:
            if (name or quoted) and isinstance(value, dict) and (name or quoted) in value:
                found.append(value[name or quoted])
            elif filter_key and isinstance(value, list):
                found += [
                    item
                    for item in value
                    if isinstance(item, dict) and str(dig(item, filter_key)) == filter_value
                ]
            elif index and isinstance(value, list) and int(index) < len(value):
                found.append(value[int(index)])
        values = found
    return values[0] if values else None


def dig(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386; keys of strategic-merge directives (``$patch``, ``$setElementOrder``) dropped."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _selector_requirements(selector: str) -> list[tuple[str, str, list[str]]]:
    parts = re.findall(r"(?:[^,(]|\([^)]*\))+", selector or "")
    requirements = []
    for part in (p.strip() for p in parts):
        if match := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", part):
            values = [v.strip() for v in match.group(3).split(",") if v.strip()]
            requirements.append((match.group(1), match.group(2), values))
        elif match := re.fullmatch(r"([^!=]+?)\s*(==|!=|=)\s*(.*)", part):
            operator = "!=" if match.group(2) == "!=" else "="
            requirements.append((match.group(1).strip(), operator, [match.group(3).strip()]))
        elif part.startswith("!"):
            requirements.append((part[1:].strip(), "!exists", []))
        elif part:
            requirements.append((part, "exists", []))
    return requirements


def label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for key, operator, values in _selector_requirements(selector):
        present = key in labels
        if (
            (operator == "=" and labels.get(key) != values[0])
            or (operator == "!=" and present and labels[key] == values[0])
            or (operator == "in" and labels.get(key) not in values)
            or (operator == "notin" and present and labels[key] in values)
            or (operator == "exists" and not present)
            or (operator == "!exists" and present)
        ):
            return False
    return True


def match_expressions(selector: Obj, labels: dict[str, str]) -> bool:
    """A ``LabelSelector`` object (matchLabels and matchExpressions) against labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = (
            expression["key"],
            expression["operator"],
            expression.get("values", []),
        )
        if (
            (operator == "In" and labels.get(key) not in values)
            or (operator == "NotIn" and key in labels and labels[key] in values)
            or (operator == "Exists" and key not in labels)
            or (operator == "DoesNotExist" and key in labels)
        ):
            return False
    return True


def field_selector_matches(selector: str, obj: Obj) -> bool:
    for key, operator, values in _selector_requirements(selector):
        value = dig(obj, key)
        text = (
            "" if value is None else (str(value).lower() if isinstance(value, bool) else str(value))
        )
        if (operator == "=" and text != values[0]) or (operator == "!=" and text == values[0]):
            return False
    return True


def _spec_part(obj: Obj) -> Obj:
    """What ``generation`` tracks: everything outside metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


@dataclass
class _Watch:
    resource: Resource
    namespace: str | None
    labels: str
    fields: str
    queue: asyncio.Queue[tuple[int, str, Obj]]


@dataclass
class Injection:
    method: str
    path_prefix: str
    status: int
    times: int


class ApiServer:
    """The emulated API server. Start it with :meth:`start` (a thread) or :meth:`serve`."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self.resources: dict[tuple[str, str, str], Resource] = {}
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.revision = 1
        self.history: collections.deque[tuple[int, str, str, Obj]] = collections.deque(
            maxlen=EVENT_HISTORY
        )
        self.watches: list[_Watch] = []
        self.requests: collections.deque[Obj] = collections.deque(maxlen=2000)
        self.injections: list[Injection] = []
        self.tokens: dict[str, tuple[str, str]] = {}  # bearer token -> (namespace, account)
        self.denied: list[str] = []  # every RBAC refusal's message, for tests to assert on
        # Addresses whose every request is a service account's: a pod's own endpoint.
        self.address_identities: dict[str, tuple[str, str]] = {}
        self._sites: dict[str, web.TCPSite] = {}
        self.listeners: list[Callable[[str, Resource, Obj], None]] = []
        # Each emulated cluster takes two /24s of the loopback range of its own (pods, then
        # Services), so clusters of tests running at once on one machine never share one.
        second, third = SystemRandom().randrange(16, 250), SystemRandom().randrange(0, 254, 2)
        self.pod_network = f"127.{second}.{third}"
        self.cluster_ips = iter(f"127.{second}.{third + 1}.{n}" for n in range(2, 255))
        self.loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        for resource in _builtin_resources():
            self.register(resource)
        for name in ("default", "kube-system", "kube-public"):
            self.create(self.resource("", "namespaces"), None, {"metadata": {"name": name}})

    # ----------------------------------------------------------------- running
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ApiServer:
        """Serve from a daemon thread with its own event loop; returns once listening."""
        ready = threading.Event()

        failure: list[BaseException] = []

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            try:
                self.loop.run_until_complete(self._listen())
            except BaseException as error:
                failure.append(error)
                ready.set()
                self.loop.close()
                return
            ready.set()
            self.loop.run_forever()
            self.loop.run_until_complete(self._shutdown())
            self.loop.close()

        self._thread = threading.Thread(target=run, name="k8s-apiserver", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the emulated API server did not start within 10 s")
        if failure:
            raise RuntimeError("the emulated API server did not start") from failure[0]
        return self

    def stop(self) -> None:
        if self.loop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    def call(self, function: Callable[[], Any], timeout: float = 10) -> Any:
        """Run ``function`` on the server's loop (the only thread that touches the store)."""
        assert self.loop is not None

        async def wrapper() -> Any:
            return function()

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(timeout)

    async def _listen(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        self.port = server.sockets[0].getsockname()[1]

    async def listen_as(self, host: str, namespace: str, service_account: str) -> str:
        """Also serve on ``host`` (same port), every request there as the service account.

        What ``kubectl proxy`` with the account's credentials would be: a pod reaches the API
        through its own endpoint, and RBAC holds it to its account's roles.
        """
        assert self._runner is not None
        site = web.TCPSite(self._runner, host, self.port)
        await site.start()
        self._sites[host] = site
        self.address_identities[host] = (namespace, service_account)
        return f"http://{host}:{self.port}"

    async def stop_listening(self, host: str) -> None:
        self.address_identities.pop(host, None)
        site = self._sites.pop(host, None)
        if site is not None:
            await site.stop()

    async def _shutdown(self) -> None:
        for watch in self.watches:
            watch.queue.put_nowait((0, "STOP", {}))
        if self._runner is not None:
            await self._runner.cleanup()

    def inject(self, method: str, path_prefix: str, status: int, times: int = 1) -> None:
        """Answer the next ``times`` matching requests with ``status`` (fault injection)."""
        self.injections.append(Injection(method.upper(), path_prefix, status, times))

    def issue_token(self, namespace: str, service_account: str) -> str:
        """A bearer token for a service account: its requests are checked against RBAC."""
        token = f"sa.{namespace}.{service_account}.{uuid.uuid4().hex}"
        self.tokens[token] = (namespace, service_account)
        return token

    def kubeconfig(self, token: str = "admin") -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
                "users": [{"name": "tester", "user": {"token": token}}],
                "contexts": [
                    {
                        "name": "emulator",
                        "context": {
                            "cluster": "emulator",
                            "user": "tester",
                            "namespace": "default",
                        },
                    }
                ],
                "current-context": "emulator",
            }
        )

    # --------------------------------------------------------------- resources
    def register(self, resource: Resource) -> None:
        self.resources[resource.group, resource.version, resource.plural] = resource

    def resource(self, group: str, plural: str, version: str | None = None) -> Resource:
        for (g, v, p), resource in self.resources.items():
            if g == group and p == plural and (version is None or v == version):
                return resource
        raise ApiError(
            404, "NotFound", f"the server could not find the requested resource ({plural})"
        )

    def resource_for(self, obj: Obj) -> Resource:
        group, _, version = obj.get("apiVersion", "").rpartition("/")
        for resource in self.resources.values():
            if (resource.group, resource.version, resource.kind) == (
                group,
                version,
                obj.get("kind"),
            ):
                return resource
        raise ApiError(
            404, "NotFound", f"no resource for {obj.get('apiVersion')} {obj.get('kind')}"
        )

    # ------------------------------------------------------------------- reads
    def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        obj = self.objects.get((resource.key, namespace or "", name))
        if obj is None:
            raise ApiError(
                404,
                "NotFound",
                f'{resource.qualified} "{name}" not found',
                {"name": name, "group": resource.group, "kind": resource.plural},
            )
        return self._served(resource, obj)

    def find(self, resource: Resource, namespace: str | None, name: str) -> Obj | None:
        obj = self.objects.get((resource.key, namespace or "", name))
        return None if obj is None else self._served(resource, obj)

    def select(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        labels: str = "",
        fields: str = "",
    ) -> list[Obj]:
        return [
            self._served(resource, obj)
            for (key, ns, _), obj in sorted(self.objects.items())
            if key == resource.key
            and (namespace is None or ns == namespace)
            and label_selector_matches(labels, obj["metadata"].get("labels", {}))
            and field_selector_matches(fields, obj)
        ]

    def _served(self, resource: Resource, obj: Obj) -> Obj:
        served = copy.deepcopy(obj)
        served["apiVersion"] = resource.group_version
        return served

    # ------------------------------------------------------------------ writes
    def create(
        self,
        resource: Resource,
        namespace: str | None,
        body: Obj,
        *,
        dry_run: bool = False,
        validation: str = "Ignore",
    ) -> Obj:
        obj = copy.deepcopy(body)
        obj["apiVersion"], obj["kind"] = resource.group_version, resource.kind
        meta = obj.setdefault("metadata", {})
        namespace = self._check_namespace(resource, namespace, meta)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(
                    422,
                    "Invalid",
                    f'{resource.kind} in version "{resource.version}" '
                    "is invalid: metadata.name: Required value: name or generateName "
                    "is required",
                )
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if (resource.key, namespace or "", meta["name"]) in self.objects:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{resource.qualified} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": resource.group, "kind": resource.plural},
            )
        if resource.status and resource.kind not in ("Namespace", "Node", "Pod"):
            obj.pop("status", None)
        for key in ("resourceVersion", "deletionTimestamp", "uid", "managedFields"):
            meta.pop(key, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1)
        self._default_builtin(resource, obj)
        obj = self._admit(resource, obj, None, validation)
        if dry_run:
            return obj
        self._store(resource, obj, "ADDED")
        if resource.kind == "CustomResourceDefinition":
            self._establish(obj)
        return self._served(resource, obj)

    def replace(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: Obj,
        *,
        subresource: str = "",
        dry_run: bool = False,
        validation: str = "Ignore",
    ) -> Obj:
        key = (resource.key, namespace or "", name)
        old = self.objects.get(key)
        if old is None:
            self.get(resource, namespace, name)  # raises NotFound
            raise AssertionError("unreachable")
        new = copy.deepcopy(body)
        wanted = new.get("metadata", {}).get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource.qualified} "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
                {"name": name, "group": resource.group, "kind": resource.plural},
            )
        if subresource == "status":
            new = {**copy.deepcopy(old), "status": new.get("status")}
            if new["status"] is None:
                del new["status"]
        else:
            meta = new.setdefault("metadata", {})
            for immutable in (
                "uid",
                "creationTimestamp",
                "namespace",
                "name",
                "generation",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generateName",
            ):
                if immutable in old["metadata"]:
                    meta[immutable] = old["metadata"][immutable]
                else:
                    meta.pop(immutable, None)
            if resource.status:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
        new["apiVersion"], new["kind"] = resource.group_version, resource.kind
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if subresource != "status":
            new = self._admit(resource, new, old, validation)
        if _spec_part(new) != _spec_part(old):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if dry_run or new == old:
            return self._served(resource, new)
        meta = new["metadata"]
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not meta.get("deletionGracePeriodSeconds")
        ):
            self._remove(resource, old)
            return self._served(resource, new)
        self._store(resource, new, "MODIFIED")
        if resource.kind == "CustomResourceDefinition" and subresource != "status":
            self._establish(new)
        return self._served(resource, new)

    def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        content_type: str,
        *,
        subresource: str = "",
        dry_run: bool = False,
        validation: str = "Ignore",
    ) -> Obj:
        current = self.objects.get((resource.key, namespace or "", name))
        if current is None and content_type.startswith("application/apply-patch"):
            body = copy.deepcopy(patch)
            body.setdefault("metadata", {}).setdefault("name", name)
            return self.create(resource, namespace, body, dry_run=dry_run, validation=validation)
        old = self.get(resource, namespace, name)
        if content_type.startswith("application/json-patch+json"):
            try:
                new = jsonpatch.apply_patch(old, patch)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
                raise ApiError(
                    422,
                    "Invalid",
                    f"the server rejected our request due to an error in our request: {error}",
                ) from None
        elif content_type.startswith("application/strategic-merge-patch+json") and resource.custom:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                "include: application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml",
            )
        elif content_type.split(";", maxsplit=1)[0] in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
            "application/apply-patch+yaml",
            "application/apply-patch+cbor",
        ):
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            new = merge_patch(old, patch)
        else:
            raise ApiError(415, "UnsupportedMediaType", f'unsupported patch type "{content_type}"')
        stale = dig(patch, "metadata.resourceVersion") if isinstance(patch, dict) else None
        if not stale or stale == old["metadata"]["resourceVersion"]:
            new.setdefault("metadata", {})["resourceVersion"] = old["metadata"]["resourceVersion"]
        if subresource == "scale":
            return self._patch_scale(resource, namespace, name, new, dry_run)
        return self.replace(
            resource,
            namespace,
            name,
            new,
            subresource=subresource,
            dry_run=dry_run,
            validation=validation,
        )

    def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        grace_seconds: int | None = None,
        preconditions: Obj | None = None,
        dry_run: bool = False,
    ) -> Obj:
        key = (resource.key, namespace or "", name)
        obj = self.get(resource, namespace, name)
        stored = self.objects[key]
        wanted_uid = (preconditions or {}).get("uid")
        if wanted_uid and wanted_uid != stored["metadata"]["uid"]:
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: "
                f"{wanted_uid}, UID in object meta: {stored['metadata']['uid']}",
            )
        if dry_run:
            return obj
        meta = stored["metadata"]
        grace = 0
        if (
            resource.kind in GRACEFUL_KINDS
            and stored.get("spec", {}).get("nodeName")
            and stored.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        ):
            grace = stored["spec"].get("terminationGracePeriodSeconds", 30)
            grace = grace if grace_seconds is None else grace_seconds
            grace = min(grace, meta.get("deletionGracePeriodSeconds", grace))
        if not meta.get("finalizers") and grace == 0:
            self._remove(resource, stored)
            return obj
        updated = copy.deepcopy(stored)
        if not meta.get("deletionTimestamp"):
            updated["metadata"]["deletionTimestamp"] = now_iso()
            updated["metadata"]["generation"] = meta.get("generation", 1) + 1
        if resource.kind in GRACEFUL_KINDS:
            updated["metadata"]["deletionGracePeriodSeconds"] = grace
        if updated != stored:
            self._store(resource, updated, "MODIFIED")
        return self._served(resource, updated)

    def _patch_scale(
        self, resource: Resource, namespace: str | None, name: str, scale: Obj, dry_run: bool
    ) -> Obj:
        if resource.scale is None:
            raise ApiError(404, "NotFound", f"{resource.plural} has no scale subresource")
        obj = self.get(resource, namespace, name)
        replicas = dig(scale, "spec.replicas")
        path = resource.scale["specReplicasPath"].lstrip(".").split(".")
        target = obj
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = replicas
        self.replace(resource, namespace, name, obj, dry_run=dry_run, validation="Strict")
        return self.scale_of(resource, namespace, name)

    def scale_of(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        obj = self.get(resource, namespace, name)
        assert resource.scale is not None
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: obj["metadata"][k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in obj["metadata"]
            },
            "spec": {"replicas": json_path(obj, resource.scale["specReplicasPath"]) or 0},
            "status": {
                "replicas": json_path(obj, resource.scale["statusReplicasPath"]) or 0,
                "selector": json_path(obj, resource.scale.get("labelSelectorPath", "")) or "",
            },
        }

    def _check_namespace(self, resource: Resource, namespace: str | None, meta: Obj) -> str | None:
        if not resource.namespaced:
            meta.pop("namespace", None)
            return None
        namespace = namespace or meta.get("namespace")
        if meta.get("namespace", namespace) != namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not "
                "match the namespace sent on the request",
            )
        if not namespace:
            raise ApiError(400, "BadRequest", "a namespace is required")
        if ("/namespaces", "", namespace) not in self.objects:
            raise ApiError(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        meta["namespace"] = namespace
        return namespace

    def _default_builtin(self, resource: Resource, obj: Obj) -> None:
        """The few defaults of built-in kinds that clients here read back."""
        spec = (
            obj.setdefault("spec", {})
            if resource.kind in ("Service", "StatefulSet", "Deployment", "Pod", "Job")
            else None
        )
        if resource.kind == "Namespace":
            obj["status"] = {"phase": "Active"}
        elif resource.kind == "Service" and spec is not None:
            spec.setdefault("type", "ClusterIP")
            if spec.get("clusterIP") in (None, ""):
                spec["clusterIP"] = next(self.cluster_ips)
            spec["clusterIPs"] = [spec["clusterIP"]]
            for port in spec.get("ports", []):
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
        elif resource.kind == "StatefulSet" and spec is not None:
            spec.setdefault("replicas", 1)
            spec.setdefault("podManagementPolicy", "OrderedReady")
            spec.setdefault(
                "updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
            )
            spec.setdefault("revisionHistoryLimit", 10)
        elif resource.kind == "Deployment" and spec is not None:
            spec.setdefault("replicas", 1)
        elif resource.kind == "Pod" and spec is not None:
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("serviceAccountName", "default")
            obj["status"] = {"phase": "Pending"}
        elif resource.kind == "Job" and spec is not None:
            spec.setdefault("backoffLimit", 6)
            spec.setdefault("completions", 1)
            spec.setdefault("parallelism", 1)

    def _admit(self, resource: Resource, obj: Obj, old: Obj | None, validation: str) -> Obj:
        """Defaulting, pruning and validation of a custom resource against its CRD."""
        name = obj["metadata"].get("name", "")
        if resource.custom and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name):
            self._invalid(
                resource,
                name,
                [
                    (
                        "metadata.name",
                        "FieldValueInvalid",
                        f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist '
                        "of lower case alphanumeric characters, '-' or '.'",
                    )
                ],
            )
        if resource.schema is None:
            return obj
        result = admit(obj, resource.schema, old=old)
        if result.unknown_fields and validation == "Strict":
            unknown = ", ".join(f'unknown field "{path}"' for path in result.unknown_fields)
            raise ApiError(
                400,
                "BadRequest",
                f'{resource.kind} in version "{resource.version}" cannot be handled as a '
                f"{resource.kind}: strict decoding error: {unknown}",
            )
        if result.errors:
            self._invalid(resource, name, [(e.field, e.reason, e.detail) for e in result.errors])
        return result.obj

    def _invalid(self, resource: Resource, name: str, causes: list[tuple[str, str, str]]) -> None:
        messages = [f"{path}: {detail}" for path, _, detail in causes]
        joined = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
        kind = f"{resource.kind}.{resource.group}" if resource.group else resource.kind
        raise ApiError(
            422,
            "Invalid",
            f'{kind} "{name}" is invalid: {joined}',
            {
                "name": name,
                "group": resource.group,
                "kind": resource.kind,
                "causes": [
                    {"reason": reason, "message": detail, "field": path}
                    for path, reason, detail in causes
                ],
            },
        )

    def _store(self, resource: Resource, obj: Obj, event: str) -> None:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        meta = obj["metadata"]
        self.objects[resource.key, meta.get("namespace", ""), meta["name"]] = obj
        self._notify(resource, event, obj)

    def _remove(self, resource: Resource, obj: Obj) -> None:
        meta = obj["metadata"]
        key = (resource.key, meta.get("namespace", ""), meta["name"])
        if key not in self.objects:
            return
        del self.objects[key]
        self.revision += 1
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = str(self.revision)
        self._notify(resource, "DELETED", gone)
        self._collect_garbage(resource, gone)

    def _notify(self, resource: Resource, event: str, obj: Obj) -> None:
        snapshot = copy.deepcopy(obj)
        self.history.append((self.revision, resource.key, event, snapshot))
        for watch in self.watches:
            if watch.resource.key == resource.key:
                watch.queue.put_nowait((self.revision, event, snapshot))
        for listener in self.listeners:
            listener(event, resource, snapshot)

    def _collect_garbage(self, resource: Resource, gone: Obj) -> None:
        """Background deletion: dependents, a CRD's instances, a namespace's contents."""
        uid = gone["metadata"]["uid"]
        doomed: list[tuple[Resource, Obj]] = []
        by_key = {r.key: r for r in self.resources.values()}
        for (key, namespace, _), obj in list(self.objects.items()):
            owners = obj["metadata"].get("ownerReferences", [])
            if (
                any(owner.get("uid") == uid for owner in owners)
                or (resource.kind == "Namespace" and namespace == gone["metadata"]["name"])
                or (
                    resource.kind == "CustomResourceDefinition"
                    and key == f"{gone['spec']['group']}/{gone['spec']['names']['plural']}"
                )
            ):
                doomed.append((by_key[key], obj))
        if resource.kind == "CustomResourceDefinition":
            for served in list(self.resources.values()):
                if (
                    served.custom
                    and served.key == f"{gone['spec']['group']}/{gone['spec']['names']['plural']}"
                ):
                    del self.resources[served.group, served.version, served.plural]
        for owner_resource, obj in doomed:
            remaining = [
                o for o in obj["metadata"].get("ownerReferences", []) if o.get("uid") != uid
            ]
            meta = obj["metadata"]
            if remaining and resource.kind not in ("Namespace", "CustomResourceDefinition"):
                updated = copy.deepcopy(obj)
                updated["metadata"]["ownerReferences"] = remaining
                self._store(owner_resource, updated, "MODIFIED")
                continue
            with contextlib.suppress(ApiError):  # already gone through another owner
                self.delete(owner_resource, meta.get("namespace"), meta["name"])

    def _establish(self, crd: Obj) -> None:
        """Register a CRD's versions and mark it Established (the apiextensions controller)."""
        spec = crd["spec"]
        names = spec["names"]
        for version in spec.get("versions", []):
            if not version.get("served", True):
                continue
            subresources = version.get("subresources") or {}
            self.register(
                Resource(
                    group=spec["group"],
                    version=version["name"],
                    plural=names["plural"],
                    kind=names["kind"],
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    short_names=names.get("shortNames", []),
                    categories=names.get("categories", []),
                    status="status" in subresources,
                    scale=subresources.get("scale"),
                    printer_columns=version.get("additionalPrinterColumns", []),
                    schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                    custom=True,
                )
            )
        established = copy.deepcopy(crd)
        stamp = now_iso()
        established["status"] = {
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage")],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": stamp,
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": stamp,
                },
            ],
        }
        if established.get("status") != crd.get("status"):
            self._store(
                self.resource("apiextensions.k8s.io", "customresourcedefinitions"),
                established,
                "MODIFIED",
            )

    # -------------------------------------------------------------------- HTTP
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        entry: Obj = {
            "method": request.method,
            "path": request.path,
            "query": dict(request.query),
            "token": request.headers.get("Authorization", "").removeprefix("Bearer "),
            "agent": request.headers.get("User-Agent", ""),
            "time": asyncio.get_running_loop().time(),
        }
        self.requests.append(entry)
        for injection in self.injections:
            if (
                injection.times > 0
                and injection.method in (request.method, "*")
                and request.path.startswith(injection.path_prefix)
            ):
                injection.times -= 1
                error = ApiError(injection.status, "InternalError", "injected failure")
                entry["status"] = injection.status
                return web.json_response(error.status(), status=injection.status)
        try:
            response = await self._route(request)
        except ApiError as error:
            entry["status"] = error.code
            return web.json_response(error.status(), status=error.code)
        entry["status"] = response.status
        return response

    async def _route(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        parts = [p for p in path.split("/") if p]
        if path == "/version":
            return web.json_response(SERVER_VERSION)
        if path in ("/healthz", "/readyz", "/livez"):
            return web.Response(text="ok")
        if path == "/api":
            return web.json_response(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}
                    ],
                }
            )
        if path == "/apis":
            return web.json_response(self._group_list())
        if path.startswith("/openapi/v3"):
            return web.json_response(self._openapi(path.removeprefix("/openapi/v3").strip("/")))
        if path.startswith("/openapi"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 2:
            if len(parts) == 2:
                return web.json_response(self._group(parts[1]))
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            return web.json_response(self._resource_list(group, version))
        namespace = None
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and (group, version, rest[2]) in self.resources
        ):
            namespace, rest = rest[1], rest[2:]
        resource = self.resources.get((group, version, rest[0]))
        if resource is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else ""
        return await self._serve(request, resource, namespace, name, subresource)

    async def _serve(
        self,
        request: web.Request,
        resource: Resource,
        namespace: str | None,
        name: str | None,
        subresource: str,
    ) -> web.StreamResponse:
        query = request.query
        method = request.method
        account = self.tokens.get(request.headers.get("Authorization", "").removeprefix("Bearer "))
        local = request.transport.get_extra_info("sockname") if request.transport else None
        if account is None and local:
            account = self.address_identities.get(local[0])
        if account is not None:
            self.authorize(
                account,
                _verb(method, name, query),
                resource,
                subresource=subresource,
                namespace=namespace,
                name=name,
                fields=query.get("fieldSelector", ""),
            )
        dry_run = query.get("dryRun") == "All"
        # The server's default is Warn: unknown fields are pruned (we send no warning header).
        validation = query.get("fieldValidation", "Warn")
        if method in ("POST", "PUT", "PATCH") and "protobuf" in request.content_type:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "this emulator takes JSON bodies only; run Helm with HELM_DRIVER=memory",
            )
        if name is None and method == "GET":
            labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
            if query.get("watch") in ("true", "1"):
                return await self._watch(request, resource, namespace, labels, fields)
            items = self.select(resource, namespace, labels=labels, fields=fields)
            if _wants_table(request):
                return web.json_response(self._table(resource, items, query))
            return web.json_response(
                {
                    "kind": f"{resource.kind}List",
                    "apiVersion": resource.group_version,
                    "metadata": {"resourceVersion": str(self.revision)},
                    "items": items,
                }
            )
        if name is None and method == "POST":
            body = await _body(request)
            return web.json_response(
                self.create(resource, namespace, body, dry_run=dry_run, validation=validation),
                status=201,
            )
        if name is None and method == "DELETE":
            labels = query.get("labelSelector", "")
            for obj in self.select(resource, namespace, labels=labels):
                self.delete(resource, namespace, obj["metadata"]["name"])
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})
        assert name is not None
        if subresource not in ("", "status", "scale"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if (subresource == "status" and not resource.status) or (
            subresource == "scale" and not resource.scale
        ):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method == "GET":
            if subresource == "scale":
                return web.json_response(self.scale_of(resource, namespace, name))
            obj = self.get(resource, namespace, name)
            if _wants_table(request):
                return web.json_response(self._table(resource, [obj], query))
            return web.json_response(obj)
        if method == "PUT":
            body = await _body(request)
            if subresource == "scale":
                return web.json_response(
                    self._patch_scale(resource, namespace, name, body, dry_run)
                )
            return web.json_response(
                self.replace(
                    resource,
                    namespace,
                    name,
                    body,
                    subresource=subresource,
                    dry_run=dry_run,
                    validation=validation,
                )
            )
        if method == "PATCH":
            body = await _body(request)
            existed = (resource.key, namespace or "", name) in self.objects
            obj = self.patch(
                resource,
                namespace,
                name,
                body,
                request.content_type,
                subresource=subresource,
                dry_run=dry_run,
                validation=validation,
            )
            return web.json_response(obj, status=200 if existed or dry_run else 201)
        if method == "DELETE":
            options = await _body(request) if request.can_read_body else {}
            grace = options.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
            return web.json_response(
                self.delete(
                    resource,
                    namespace,
                    name,
                    grace_seconds=None if grace is None else int(grace),
                    preconditions=options.get("preconditions"),
                    dry_run=dry_run,
                )
            )
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    async def _watch(
        self,
        request: web.Request,
        resource: Resource,
        namespace: str | None,
        labels: str,
        fields: str,
    ) -> web.StreamResponse:
        query = request.query
        table = _wants_table(request)
        watch = _Watch(resource, namespace, labels, fields, asyncio.Queue())
        start = query.get("resourceVersion", "")
        backlog: list[tuple[int, str, Obj]] = []
        # Everything up to `prepare()` runs without awaiting: no write can slip in between
        # the backlog and the live queue.
        if start in ("", "0") or query.get("sendInitialEvents") == "true":
            backlog = [(self.revision, "ADDED", o) for o in self.select(resource, namespace)]
        else:
            oldest = self.history[0][0] if self.history else self.revision
            if int(start) < oldest - 1 and int(start) < self.revision:
                backlog = [
                    (
                        0,
                        "ERROR",
                        {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "status": "Failure",
                            "code": 410,
                            "reason": "Expired",
                            "message": f"too old resource version: {start} ({oldest - 1})",
                        },
                    )
                ]
            else:
                backlog = [
                    (rv, event, obj)
                    for rv, key, event, obj in self.history
                    if key == resource.key and rv > int(start)
                ]
        self.watches.append(watch)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await response.prepare(request)
            timeout = float(query.get("timeoutSeconds", 1800))
            deadline = asyncio.get_running_loop().time() + timeout
            bookmarks = query.get("allowWatchBookmarks") == "true"
            for _, event, obj in backlog:
                await self._send(response, watch, event, obj, table)
            if query.get("sendInitialEvents") == "true":
                await _write_event(
                    response,
                    "BOOKMARK",
                    {
                        "kind": resource.kind,
                        "apiVersion": resource.group_version,
                        "metadata": {
                            "resourceVersion": str(self.revision),
                            "annotations": {"k8s.io/initial-events-end": "true"},
                        },
                    },
                )
            if backlog and backlog[0][1] == "ERROR":
                return response
            last_bookmark = asyncio.get_running_loop().time()
            while (remaining := deadline - asyncio.get_running_loop().time()) > 0:
                try:
                    _, event, obj = await asyncio.wait_for(
                        watch.queue.get(), timeout=min(remaining, 1.0)
                    )
                except TimeoutError:
                    if request.transport is None or request.transport.is_closing():
                        break
                    now = asyncio.get_running_loop().time()
                    if bookmarks and now - last_bookmark >= BOOKMARK_INTERVAL:
                        last_bookmark = now
                        await _write_event(
                            response,
                            "BOOKMARK",
                            {
                                "kind": resource.kind,
                                "apiVersion": resource.group_version,
                                "metadata": {"resourceVersion": str(self.revision)},
                            },
                        )
                    continue
                if event == "STOP":
                    break
                await self._send(response, watch, event, obj, table)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watches.remove(watch)
        return response

    async def _send(
        self, response: web.StreamResponse, watch: _Watch, event: str, obj: Obj, table: bool
    ) -> None:
        if event != "ERROR":
            if watch.namespace is not None and obj["metadata"].get("namespace") != watch.namespace:
                return
            if not label_selector_matches(watch.labels, obj["metadata"].get("labels", {})):
                return
            if not field_selector_matches(watch.fields, obj):
                return
            obj = self._served(watch.resource, obj)
            if table:
                obj = self._table(watch.resource, [obj], {})
        await _write_event(response, event, obj)

    # -------------------------------------------------------------------- RBAC
    def authorize(
        self,
        account: tuple[str, str],
        verb: str,
        resource: Resource,
        *,
        subresource: str = "",
        namespace: str | None = None,
        name: str | None = None,
        fields: str = "",
    ) -> None:
        """Raise 403 unless a Role or ClusterRole bound to the account allows the request."""
        target = f"{resource.plural}/{subresource}" if subresource else resource.plural
        named = name or dict(
            (r[0], r[2][0]) for r in _selector_requirements(fields) if r[1] == "="
        ).get("metadata.name")
        for rule in self._rules_of(account, namespace):
            if (
                ({"*", verb} & set(rule.get("verbs", [])))
                and ({"*", resource.group} & set(rule.get("apiGroups", [])))
                and ({"*", target} & set(rule.get("resources", [])))
                and (not rule.get("resourceNames") or named in rule["resourceNames"])
            ):
                return
        user = f"system:serviceaccount:{account[0]}:{account[1]}"
        subject = f'{resource.qualified} "{name}"' if name else resource.qualified
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        message = (
            f'{subject} is forbidden: User "{user}" cannot {verb} resource "{target}" in API '
            f'group "{resource.group}" {where}'
        )
        self.denied.append(message)
        raise ApiError(
            403,
            "Forbidden",
            message,
            {"name": name or "", "group": resource.group, "kind": resource.plural},
        )

    def _rules_of(self, account: tuple[str, str], namespace: str | None) -> list[Obj]:
        rbac = "rbac.authorization.k8s.io"
        account_namespace, account_name = account

        def binds(binding: Obj) -> bool:
            home = binding["metadata"].get("namespace", "")
            return any(
                subject.get("kind") == "ServiceAccount"
                and subject.get("name") == account_name
                and subject.get("namespace", home) == account_namespace
                for subject in binding.get("subjects", [])
            )

        def role(reference: Obj, home: str | None) -> list[Obj]:
            plural = "clusterroles" if reference["kind"] == "ClusterRole" else "roles"
            found = self.objects.get((f"{rbac}/{plural}", home or "", reference["name"]))
            return list((found or {}).get("rules", []))

        rules: list[Obj] = []
        for binding in self.select(self.resource(rbac, "clusterrolebindings")):
            if binds(binding):
                rules += role(binding["roleRef"], None)
        if namespace:
            for binding in self.select(self.resource(rbac, "rolebindings"), namespace):
                if binds(binding):
                    reference = binding["roleRef"]
                    rules += role(
                        reference, None if reference["kind"] == "ClusterRole" else namespace
                    )
        return rules

    # ---------------------------------------------------------------- discovery
    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for group, version, _ in self.resources:
            if group and version not in groups.setdefault(group, []):
                groups[group].append(version)
        return groups

    def _group(self, name: str) -> Obj:
        versions = self._groups().get(name)
        if versions is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": name,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def _group_list(self) -> Obj:
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self._group(name) for name in self._groups()],
        }

    def _resource_list(self, group: str, version: str) -> Obj:
        served = [r for (g, v, _), r in self.resources.items() if (g, v) == (group, version)]
        if not served:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        entries: list[Obj] = []
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        for r in served:
            entry = {
                "name": r.plural,
                "singularName": r.singular(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": verbs,
            }
            if r.short_names:
                entry["shortNames"] = r.short_names
            if r.categories:
                entry["categories"] = r.categories
            entries.append(entry)
            # Subresources carry no short names: kubectl warns about ambiguous ones otherwise.
            if r.status:
                entries.append(
                    {
                        "name": f"{r.plural}/status",
                        "singularName": "",
                        "namespaced": r.namespaced,
                        "kind": r.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if r.scale:
                entries.append(
                    {
                        "name": f"{r.plural}/scale",
                        "singularName": "",
                        "namespaced": r.namespaced,
                        "group": "autoscaling",
                        "version": "v1",
                        "kind": "Scale",
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": entries,
        }

    def _openapi(self, group_version: str) -> Obj:
        """OpenAPI v3: kubectl's validation looks for the ``fieldValidation`` parameter here."""
        served: dict[str, list[Resource]] = {}
        for resource in self.resources.values():
            prefix = "apis/" + resource.group_version if resource.group else "api/v1"
            served.setdefault(prefix, []).append(resource)
        if not group_version:
            return {
                "paths": {
                    prefix: {
                        "serverRelativeURL": f"/openapi/v3/{prefix}?hash="
                        + hashlib.sha256(json.dumps(self._openapi(prefix), sort_keys=True).encode())
                        .hexdigest()[:16]
                        .upper()
                    }
                    for prefix in served
                }
            }
        if group_version not in served:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        paths: Obj = {}
        schemas: Obj = {}
        validation = {
            "name": "fieldValidation",
            "in": "query",
            "uniqueItems": True,
            "schema": {"type": "string"},
            "description": "Strict, Warn or Ignore",
        }
        for r in served[group_version]:
            gvk = {"group": r.group, "version": r.version, "kind": r.kind}
            scope = "namespaces/{namespace}/" if r.namespaced else ""
            base = f"/{group_version}/{scope}{r.plural}"
            reference = ".".join(reversed(r.group.split("."))) if r.group else "io.k8s.api.core"
            schema_name = f"{reference}.{r.version}.{r.kind}"
            ref = {"$ref": f"#/components/schemas/{schema_name}"}
            body = {"content": {"application/json": {"schema": ref}}}

            def op(
                action: str,
                *,
                with_validation: bool = False,
                gvk: Obj = gvk,
                ref: Obj = ref,
                body: Obj = body,
            ) -> Obj:
                operation: Obj = {
                    "x-kubernetes-action": action,
                    "x-kubernetes-group-version-kind": gvk,
                    "responses": {"200": {"content": {"application/json": {"schema": ref}}}},
                }
                if with_validation:
                    operation["parameters"] = [validation]
                    operation["requestBody"] = body
                return operation

            paths[base] = {"get": op("list"), "post": op("post", with_validation=True)}
            paths[base + "/{name}"] = {
                "get": op("get"),
                "put": op("put", with_validation=True),
                "patch": op("patch", with_validation=True),
                "delete": op("delete"),
            }
            schema = (
                copy.deepcopy(r.schema)
                if r.schema
                else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            )
            schema["x-kubernetes-group-version-kind"] = [gvk]
            schemas[schema_name] = schema
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.32.4"},
            "paths": paths,
            "components": {"schemas": schemas},
        }

    def _table(self, resource: Resource, items: Iterable[Obj], query: Any) -> Obj:
        columns = [
            {
                "name": "Name",
                "type": "string",
                "format": "name",
                "priority": 0,
                "description": "Name must be unique within a namespace.",
            }
        ]
        printer = (
            resource.printer_columns
            or _BUILTIN_COLUMNS.get(resource.kind)
            or [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
        )
        for column in printer:
            columns.append(
                {
                    "name": column["name"],
                    "type": column.get("type", "string"),
                    "format": column.get("format", ""),
                    "priority": column.get("priority", 0),
                    "description": column.get("description", ""),
                }
            )
        rows = []
        for obj in items:
            cells: list[Any] = [obj["metadata"]["name"]]
            for column in printer:
                compute = column.get("compute")
                value = compute(obj) if compute else json_path(obj, column["jsonPath"])
                cells.append(human_age(value) if column.get("type") == "date" else value)
            whole = query.get("includeObject") == "Object"
            rows.append(
                {
                    "cells": cells,
                    "object": obj
                    if whole
                    else {
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj["metadata"],
                    },
                }
            )
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(self.revision)},
            "columnDefinitions": columns,
            "rows": rows,
        }


def _pod_status(pod: Obj) -> str:
    """The STATUS kubectl prints: Terminating, a waiting or terminated reason, or the phase."""
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    for container in pod.get("status", {}).get("containerStatuses", []):
        state = container.get("state", {})
        reason = state.get("waiting", {}).get("reason") or state.get("terminated", {}).get("reason")
        if reason:
            return str(reason)
    return str(pod.get("status", {}).get("phase", "Pending"))


def _ready_of(statuses: list[Obj]) -> str:
    return f"{sum(bool(s.get('ready')) for s in statuses)}/{len(statuses)}"


# What the API server's table convertors print for built-in kinds (kubectl get pods, sts).
_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
_BUILTIN_COLUMNS: dict[str, list[Obj]] = {
    "Pod": [
        {"name": "Ready", "type": "string",
         "compute": lambda p: _ready_of(p.get("status", {}).get("containerStatuses", []))},
        {"name": "Status", "type": "string", "compute": _pod_status},
        {"name": "Restarts", "type": "string",
         "compute": lambda p: str(sum(c.get("restartCount", 0)
                                      for c in p.get("status", {}).get("containerStatuses", [])))},
        _AGE,
        {"name": "IP", "type": "string", "priority": 1, "jsonPath": ".status.podIP"},
        {"name": "Node", "type": "string", "priority": 1, "jsonPath": ".spec.nodeName"},
    ],
    "StatefulSet": [
        {"name": "Ready", "type": "string",
         "compute": lambda s: f"{s.get('status', {}).get('readyReplicas', 0)}/"
                              f"{s.get('spec', {}).get('replicas', 0)}"},
        _AGE,
    ],
}  # fmt: skip


def _verb(method: str, name: str | None, query: Any) -> str:
    if method == "GET":
        if query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if name else "list"
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def _wants_table(request: web.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


async def _body(request: web.Request) -> Any:
    text = await request.text()
    if not text:
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ApiError(
                400, "BadRequest", f"the body is neither JSON nor YAML: {error}"
            ) from None


async def _write_event(response: web.StreamResponse, event: str, obj: Obj) -> None:
    await response.write(json.dumps({"type": event, "object": obj}).encode() + b"\n")


def main() -> None:
    """Serve the emulator on a port until interrupted.

    ``python -m tests.support.k8s.apiserver 8001``, from the repository's root.
    """
    import sys

    server = ApiServer(port=int(sys.argv[1]) if len(sys.argv) > 1 else 8001).start()
    print(server.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
