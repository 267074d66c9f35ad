"""The operator's one door to the outside world: the Kubernetes API and the pods' ports.

Only this module imports ``kubernetes`` (an import contract). It speaks to
the API with the ``kubernetes`` client's authenticated transport but with
plain dicts (no generated models: what the reconcile functions build is what
is sent), and reads each pod's task layout from its query port
(``GET /v1/layout``) with the standard library.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kubernetes

from eddyline_operator.child_cache import ChildCache
from eddyline_runtime.membership import MEMBERSHIP_FILE, MemberReport, Membership
from eddyline_runtime.spec import GROUP, PLURAL, VERSION

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
# Looks at an existing object before it is changed; raises to leave it alone.
Check = Callable[[Obj], None]

# Requests to the API server; a hung one must not stall a reconciliation for long.
_API_TIMEOUT_SECONDS = 10
# A pod's /v1/layout answers from memory: a pod slower than this is treated as silent.
_POD_TIMEOUT_SECONDS = 1.0

# Kind -> (API path prefix, plural, namespaced).
_RESOURCES: dict[str, tuple[str, str, bool]] = {
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Service": ("/api/v1", "services", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims", True),
    "Pod": ("/api/v1", "pods", True),
    "Node": ("/api/v1", "nodes", False),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "Event": ("/api/v1", "events", True),
    "StatefulSet": ("/apis/apps/v1", "statefulsets", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "StreamApp": (f"/apis/{GROUP}/{VERSION}", PLURAL, True),
}
# What may change on an existing object; the rest of its spec is immutable or defaulted.
_MUTABLE_SPEC: dict[str, tuple[str, ...]] = {
    "StatefulSet": (
        "replicas",
        "template",
        "updateStrategy",
        "persistentVolumeClaimRetentionPolicy",
    ),
    "PersistentVolumeClaim": (),
}

# Spec fields the server leaves out when they are false (Go's ``omitempty`` on a plain bool),
# by kind: a child that wants false there holds it when the server shows nothing. Without
# this the query Service (``publishNotReadyAddresses: false`` outside an upgrade) was sent
# again by every drift check of every app. Only plain bools: a pointer bool whose absence
# means true (``automountServiceAccountToken``) must never be listed.
_ABSENT_WHEN_FALSE: dict[str, tuple[str, ...]] = {"Service": ("publishNotReadyAddresses",)}


# Server-side apply: the field manager that owns what the operator writes, and the patch type.
FIELD_MANAGER = "eddyline-operator"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: the client sends the dict as JSON


class ApiError(Exception):
    """The API server refused a request; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def _load_incluster_config() -> None:
    """In-cluster credentials, from ``EDDYLINE_SERVICE_ACCOUNT_DIR`` when a kubelet without
    mount namespaces (the tests' stand-in) put them there instead of the fixed path."""
    directory = os.environ.get("EDDYLINE_SERVICE_ACCOUNT_DIR")
    if not directory:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
        return
    loader = kubernetes.config.incluster_config.InClusterConfigLoader(  # type: ignore[no-untyped-call]
        token_filename=os.path.join(directory, "token"),
        cert_filename=os.path.join(directory, "ca.crt"),
    )
    loader.load_and_set()  # type: ignore[no-untyped-call]


class Kube:
    """A small, dict-based Kubernetes client over the ``kubernetes`` package's transport."""

    # The watched children reads are served from (none: every read is a GET); see __init__.
    _children: ChildCache | None = None

    def __init__(
        self,
        api_client: Any | None = None,
        *,
        pool_size: int | None = None,
        children: ChildCache | None = None,
    ) -> None:
        """``pool_size``: the HTTP connections kept open to the API server, at least the
        number of threads that send requests at once (the client's default is 5 per CPU:
        a thread that finds the pool full opens a connection, a TLS handshake on both ends,
        and throws it away after one request, logging "Connection pool is full").
        ``children``: the watched copies of the apps' children (child_cache.py): a
        :meth:`get` of one is served from there when it holds the version the server last
        answered this client with, and every answer about one is confirmed to it."""
        self._children = children
        if api_client is None:
            try:
                _load_incluster_config()
            except kubernetes.config.ConfigException:
                kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
            configuration = kubernetes.client.Configuration.get_default_copy()
            if pool_size is not None:
                configuration.connection_pool_maxsize = pool_size
            # The proxy as the environment names it now, fixed: left to follow the
            # environment, the client reads every variable of it again on each request
            # (urllib's getproxies), a twentieth of the operator's CPU with many apps.
            configuration.proxy = configuration.proxy
            api_client = kubernetes.client.ApiClient(configuration)
        self._api = api_client

    # -- generic verbs ------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Obj | None:
        """Send one request; None for 404, ApiError for any other failure."""
        text = self._send(method, path, body=body, query=query, content_type=content_type)
        if text is None:
            return None
        result: Obj = json.loads(text) if text else {}
        return result

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> str | None:
        """The response body as text; None for 404, ApiError for any other failure."""
        headers = {"Accept": accept, "Content-Type": content_type}
        method_, url, headers_, body_, post = self._api.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(
                method_, url, headers_, body_, post, _request_timeout=_API_TIMEOUT_SECONDS
            )
            response.read()
        except kubernetes.client.ApiException as error:
            status = int(error.status or 0)
            raise ApiError(status, _status_message(method, path, status, error.body)) from None
        if response.status == 404:
            return None
        text = response.data.decode() if response.data else ""
        if not 200 <= response.status < 300:
            raise ApiError(response.status, _status_message(method, path, response.status, text))
        return text

    @staticmethod
    def path(kind: str, namespace: str | None, name: str | None = None, sub: str = "") -> str:
        prefix, plural, namespaced = _RESOURCES[kind]
        path = prefix
        if namespaced and namespace:
            path += f"/namespaces/{namespace}"
        path += f"/{plural}"
        if name:
            path += f"/{name}"
        if sub:
            path += f"/{sub}"
        return path

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        if self._children is not None and namespace:
            found = self._children.lookup(kind, namespace, name)
            if found is not None:
                return found
        answer = self.request("GET", self.path(kind, namespace, name))
        self._confirm(kind, namespace, name, answer)
        return answer

    def _confirm(self, kind: str, namespace: str | None, name: str, answer: Obj | None) -> None:
        """Tell the child cache what the server answered about an object (None: none)."""
        if self._children is not None and namespace:
            self._children.confirm(kind, namespace, name, answer)

    def list(
        self,
        kind: str,
        namespace: str | None,
        *,
        selector: str | None = None,
        fields: str | None = None,
    ) -> list[Obj]:
        """Objects of ``kind`` by label ``selector`` and field selector ``fields``."""
        query = {"labelSelector": selector} if selector else {}
        if fields:
            query["fieldSelector"] = fields
        found = self.request("GET", self.path(kind, namespace), query=query or None) or {}
        items: list[Obj] = found.get("items") or []
        return items

    def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        created = self.request("POST", self.path(obj["kind"], meta.get("namespace")), body=obj)
        self._confirm(obj["kind"], meta.get("namespace"), meta["name"], created)
        return created or {}

    def merge_patch(
        self, kind: str, namespace: str | None, name: str, patch: Obj, sub: str = ""
    ) -> Obj | None:
        patched = self.request(
            "PATCH",
            self.path(kind, namespace, name, sub),
            body=patch,
            content_type="application/merge-patch+json",
        )
        self._confirm(kind, namespace, name, patched)
        return patched

    def delete(
        self, kind: str, namespace: str | None, name: str, *, propagation: str = "Background"
    ) -> bool:
        """Delete (``propagation``: Background, or Orphan to keep the dependents); False when
        it was already gone."""
        gone = self.request(
            "DELETE",
            self.path(kind, namespace, name),
            body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation},
        )
        self._confirm(kind, namespace, name, None)  # gone, or on its way: read it again
        return gone is not None

    def apply(self, obj: Obj, *, check: Check | None = None, unless_same: bool = False) -> str:
        """Create ``obj`` or bring the existing one to it: "created", "updated" or "unchanged".

        Server-side apply of the whole object under the operator's field manager (forced:
        the operator's fields are the operator's, whoever edited them since). What an earlier
        apply set and ``obj`` no longer holds is removed, as a merge patch never did: the
        owner reference of a log claim switched to ``whenDeleted: Retain``, the node pin of
        an app moved from the embedded log to Kafka. An existing object is first given to
        ``check``, which raises to leave it untouched (the handlers' ownership check); its
        immutable spec fields are sent as they are (a change there is not applied).

        ``unless_same``: an existing object that already holds everything ``obj`` says is
        left as it is ("unchanged", no PATCH). Only for an ``obj`` the same as the one last
        applied: what an earlier apply set and ``obj`` no longer holds is removed only by
        sending it."""
        kind, meta = obj["kind"], obj["metadata"]
        namespace, name = meta.get("namespace"), meta["name"]
        # The watched copy when it is the version last answered (no request), else a GET.
        existing = self.get(kind, namespace, name)
        if existing is not None and check is not None:
            check(existing)
        body = obj if existing is None else _keep_immutable(obj, existing)
        if existing is not None and unless_same and _contains(_as_read(kind, existing), body):
            return "unchanged"
        applied = self.request(
            "PATCH",
            self.path(kind, namespace, name),
            body=body,
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
            content_type=APPLY_PATCH,
        )
        self._confirm(kind, namespace, name, applied)
        if existing is None:
            return "created"
        return "unchanged" if _same_object(existing, applied or {}) else "updated"

    def pod_proxy_get(
        self,
        namespace: str,
        pod: str,
        port: int,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
    ) -> Obj | None:
        """GET ``path`` on a pod's ``port`` through the API server's pod proxy (the
        ``pods/proxy`` subresource): what a client outside the cluster, where pod addresses
        do not route, uses. None for a 404 (the pod's or the API server's)."""
        return self.request(
            "GET", self.path("Pod", namespace, f"{pod}:{port}", sub=f"proxy{path}"), query=query
        )

    def pod_proxy_text(self, namespace: str, pod: str, port: int, path: str) -> str | None:
        """As :meth:`pod_proxy_get`, for an endpoint that answers text (``/metrics``)."""
        return self._send(
            "GET",
            self.path("Pod", namespace, f"{pod}:{port}", sub=f"proxy{path}"),
            accept="text/plain",
        )

    # -- what the handlers need ---------------------------------------------------------

    def get_streamapp(self, namespace: str, name: str) -> Obj | None:
        return self.get("StreamApp", namespace, name)

    def patch_streamapp_status(self, namespace: str, name: str, status: Obj) -> str | None:
        """Merge ``status`` in; the StreamApp's resourceVersion after the write."""
        patched = self.merge_patch("StreamApp", namespace, name, {"status": status}, sub="status")
        version = ((patched or {}).get("metadata") or {}).get("resourceVersion")
        return None if version is None else str(version)

    def read_membership(self, namespace: str, config_map: str) -> Membership | None:
        return membership_in(self.get("ConfigMap", namespace, config_map))

    def read_config_value(self, namespace: str, config_map: str, key: str) -> str | None:
        found = self.get("ConfigMap", namespace, config_map)
        value = ((found or {}).get("data") or {}).get(key)
        return None if value is None else str(value)

    def publish_membership(self, config_map: Obj, *, check: Check | None = None) -> None:
        """Create or replace the membership ConfigMap's data (pods watch it); an existing one
        is first given to ``check``, as in :meth:`apply`."""
        meta = config_map["metadata"]
        existing = self.get("ConfigMap", meta["namespace"], meta["name"])
        if existing is None:
            self.create(config_map)
            return
        if check is not None:
            check(existing)
        self.merge_patch("ConfigMap", meta["namespace"], meta["name"], {"data": config_map["data"]})


def membership_in(config_map: Obj | None) -> Membership | None:
    """The membership a ConfigMap publishes (None: no ConfigMap, or none in it)."""
    raw = ((config_map or {}).get("data") or {}).get(MEMBERSHIP_FILE)
    if not raw:
        return None
    return Membership.from_json(json.loads(raw))


def kubeconfig_client(
    kubeconfig: str | None = None, context: str | None = None
) -> tuple[Kube, str]:
    """A client from a kubeconfig (``kubeconfig``, else ``$KUBECONFIG``, else
    ``~/.kube/config``) and ``context`` (else its current one), as ``kubectl`` finds them,
    and that context's namespace ("default" when it names none). Never in-cluster
    credentials: this is for programs a user runs (``kubectl eddyline``)."""
    try:
        contexts, current = kubernetes.config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=kubeconfig
        )
        chosen = current
        if context is not None:
            chosen = next((c for c in contexts if c.get("name") == context), None)
            if chosen is None:
                names = ", ".join(sorted(str(c.get("name")) for c in contexts))
                raise kubernetes.config.ConfigException(
                    f'no context "{context}" in the kubeconfig (it has: {names})'
                )
        api_client = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context
        )
    except kubernetes.config.ConfigException as error:
        raise ApiError(0, f"cannot load the kubeconfig: {error}") from None
    namespace = str(((chosen or {}).get("context") or {}).get("namespace") or "default")
    return Kube(api_client), namespace


def fetch_reports(pods: Sequence[Obj], port: int) -> dict[str, MemberReport]:
    """Each pod's ``/v1/layout``, by pod name; silent or starting pods are left out."""
    reports = {}
    for pod in pods:
        ip = pod.get("status", {}).get("podIP")
        if not ip:
            continue
        host = f"[{ip}]" if ":" in ip else ip
        url = f"http://{host}:{port}/v1/layout"
        try:
            with urllib.request.urlopen(url, timeout=_POD_TIMEOUT_SECONDS) as response:
                reports[pod["metadata"]["name"]] = MemberReport.from_json(json.load(response))
        except (OSError, ValueError) as error:  # URLError, HTTPError (503 while starting)
            logger.debug("no layout from %s: %s", url, error)
    return reports


def fetch_metrics(pods: Sequence[Obj], port: int) -> dict[str, str]:
    """Each pod's ``/metrics`` (Prometheus text), by pod name, over the same path as
    :func:`fetch_reports`; silent or starting pods are left out."""
    texts = {}
    for pod in pods:
        ip = pod.get("status", {}).get("podIP")
        if not ip:
            continue
        host = f"[{ip}]" if ":" in ip else ip
        url = f"http://{host}:{port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=_POD_TIMEOUT_SECONDS) as response:
                texts[pod["metadata"]["name"]] = response.read().decode("utf-8", errors="replace")
        except (OSError, ValueError) as error:
            logger.debug("no metrics from %s: %s", url, error)
    return texts


def _status_message(method: str, path: str, status: int, body: Any) -> str:
    """The API server's own message (a Status object's ``message``), which names the field
    and the problem; the raw body when it sent none."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    try:
        message = json.loads(text).get("message")
    except (ValueError, AttributeError):
        message = None
    return f"{method} {path}: {status} {message or text[:500]}"


def _keep_immutable(obj: Obj, existing: Obj) -> Obj:
    """``obj`` with each spec field that may not change (``_MUTABLE_SPEC``) as ``existing``
    has it whenever they differ, and left out when ``existing`` has none: the server refuses
    a change there, and the fields that may change are still applied."""
    mutable = _MUTABLE_SPEC.get(obj["kind"])
    if mutable is None or "spec" not in obj:
        return obj
    old_spec = existing.get("spec") or {}
    spec: Obj = {}
    for key, value in obj["spec"].items():
        if key in mutable:
            spec[key] = value
        elif key in old_spec:
            spec[key] = value if _contains(old_spec[key], value) else old_spec[key]
    return {**obj, "spec": spec}


def _as_read(kind: str, existing: Obj) -> Obj:
    """``existing`` (of ``kind``) with each spec field of ``_ABSENT_WHEN_FALSE`` it leaves
    out as false."""
    fields = _ABSENT_WHEN_FALSE.get(kind, ())
    spec = existing.get("spec")
    missing = [k for k in fields if isinstance(spec, dict) and k not in spec]
    if not missing:
        return existing
    return {**existing, "spec": {**(spec or {}), **dict.fromkeys(missing, False)}}


def _same_object(before: Obj, after: Obj) -> bool:
    """Whether an apply changed nothing but bookkeeping (resourceVersion, managedFields)."""

    def content(obj: Obj) -> Obj:
        meta = {
            k: v
            for k, v in (obj.get("metadata") or {}).items()
            if k not in ("resourceVersion", "managedFields")
        }
        return {**obj, "metadata": meta}

    return content(before) == content(after)


def _contains(existing: Any, wanted: Any) -> bool:
    """Whether ``existing`` has everything ``wanted`` says (servers add defaults)."""
    if isinstance(wanted, dict):
        if not isinstance(existing, dict):
            return False
        return all(_contains(existing.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        if not isinstance(existing, list) or len(existing) != len(wanted):
            return False
        return all(_contains(e, w) for e, w in zip(existing, wanted, strict=True))
    return bool(existing == wanted)


__all__ = ["ApiError", "Kube", "fetch_metrics", "fetch_reports", "kubeconfig_client"]
