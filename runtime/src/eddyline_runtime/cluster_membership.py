"""Follow the membership the operator publishes, over the Kubernetes API.

On a cluster the operator is the membership authority: it writes the
:class:`~eddyline_runtime.membership.Membership` JSON into a ConfigMap
(``<app>-membership``, key ``membership.json``). A mounted ConfigMap is too
slow for failover (the kubelet refreshes it about once a minute), so each pod
*watches* the object through the API server instead.

This is the runtime's one Kubernetes adapter, and it deliberately uses plain
HTTP(S) from the standard library: the runtime never imports ``kubernetes``
(an import contract). In a pod it finds the API server from
``KUBERNETES_SERVICE_HOST``/``PORT`` and authenticates with the service
account's token (re-read on every request: projected tokens rotate) and CA;
``EDDYLINE_KUBERNETES_API`` overrides the address (``kubectl proxy``'s
``http://127.0.0.1:8001``, or a test's API server) and then no token is sent
unless the token file exists.

Safety never rests on how fast this is: a pod acting on an old membership is
fenced by the log's transactional producers when another takes its task.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.membership import MEMBERSHIP_FILE, NOTHING_ASSIGNED, Membership

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
API_URL_ENV = "EDDYLINE_KUBERNETES_API"
# Where the service-account files are when not at SERVICE_ACCOUNT_DIR: a kubelet without
# mount namespaces (the tests' stand-in) gives each pod a directory of its own.
SERVICE_ACCOUNT_DIR_ENV = "EDDYLINE_SERVICE_ACCOUNT_DIR"
# The key of the membership ConfigMap that holds the JSON (the local file's name).
MEMBERSHIP_KEY = MEMBERSHIP_FILE
# A watch the server ends after this long is simply resumed; shorter than most proxies' idle
# timeouts, so a silent dead connection is noticed within a minute.
_WATCH_SECONDS = 50
# Between failed attempts (API server restarting, RBAC not bound yet).
_RETRY_SECONDS = 0.5
_REQUEST_TIMEOUT_SECONDS = 10
# The pod's terminationGracePeriodSeconds, rendered by the operator (the downward API does
# not expose it): how long a leaving pod may hand its tasks over before the kubelet kills it.
TERMINATION_GRACE_ENV = "EDDYLINE_TERMINATION_GRACE_SECONDS"
# Kubernetes' default grace period, when the variable is unset (a pod not rendered by the
# operator).
DEFAULT_TERMINATION_GRACE_SECONDS = 30.0
# Kept for the final commit and closing the stores after a hand-over that ran out of time:
# a quarter of the grace period, at least 5 s (never more than the grace period itself).
_FINAL_COMMIT_SHARE = 0.25
_FINAL_COMMIT_MIN_SECONDS = 5.0


class ClusterMembershipError(EddylineError):
    """The membership ConfigMap cannot be read (no API server address, no access, bad JSON)."""


def hand_over_seconds(environ: Mapping[str, str] | None = None) -> float:
    """How long a leaving pod waits for its tasks to be handed over after SIGTERM before it
    commits and exits anyway: its grace period minus a margin for the final commit."""
    env = os.environ if environ is None else environ
    raw = env.get(TERMINATION_GRACE_ENV)
    try:
        grace = float(raw) if raw else DEFAULT_TERMINATION_GRACE_SECONDS
    except ValueError:
        raise ClusterMembershipError(
            f"{TERMINATION_GRACE_ENV}={raw!r} is not a number of seconds; the operator renders "
            "the pod's terminationGracePeriodSeconds there (unset it for the default 30 s)"
        ) from None
    margin = min(grace, max(_FINAL_COMMIT_MIN_SECONDS, grace * _FINAL_COMMIT_SHARE))
    return max(0.0, grace - margin)


class ApiServer:
    """Where the Kubernetes API is and how to authenticate to it, from a pod's view."""

    def __init__(
        self,
        url: str,
        *,
        token_file: Path | None = None,
        ca_file: Path | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token_file = token_file
        self._context: ssl.SSLContext | None = None
        if self.url.startswith("https://"):
            self._context = ssl.create_default_context(
                cafile=str(ca_file) if ca_file is not None and ca_file.exists() else None
            )

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> ApiServer:
        """``EDDYLINE_KUBERNETES_API`` if set, else the in-cluster service address."""
        env = dict(os.environ if environ is None else environ)
        account = Path(env.get(SERVICE_ACCOUNT_DIR_ENV) or SERVICE_ACCOUNT_DIR)
        token = account / "token"
        if env.get(API_URL_ENV):
            return cls(env[API_URL_ENV], token_file=token if token.exists() else None)
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ClusterMembershipError(
                "cannot find the Kubernetes API: KUBERNETES_SERVICE_HOST/PORT are unset "
                f"(not in a pod?); set {API_URL_ENV}, e.g. http://127.0.0.1:8001 for kubectl proxy"
            )
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        return cls(f"https://{host}:{port}", token_file=token, ca_file=account / "ca.crt")

    def open(self, path: str, *, timeout: float) -> Any:
        """GET ``path``; returns the open response (a file-like object)."""
        request = urllib.request.Request(self.url + path, headers={"Accept": "application/json"})
        if self.token_file is not None:
            token = self.token_file.read_text(encoding="utf-8").strip()
            request.add_header("Authorization", f"Bearer {token}")
        return urllib.request.urlopen(request, timeout=timeout, context=self._context)


class ConfigMapMembership:
    """The latest membership published in a ConfigMap, kept current by a watch thread.

    A pod's :class:`~eddyline_runtime.membership.MembershipSource`: it starts with no
    tasks, as the operator computes an assignment only from the layout each pod
    reports, and a pod reports it once its instance runs.
    """

    # current() is a memory read; the watch thread does the waiting.
    poll_seconds = 0.05

    def __init__(self, api: ApiServer, *, namespace: str, name: str) -> None:
        self.api = api
        self.namespace, self.name = namespace, name
        self._latest: Membership | None = None
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        # The ConfigMap was deleted after we read it (the StreamApp is being deleted): no
        # authority is left to hand a leaving pod's tasks over.
        self.gone = False

    @property
    def _object_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{self.name}"

    def start(self, member_id: str) -> Membership:
        self._thread = threading.Thread(
            target=self._follow, name="eddyline-membership", daemon=True
        )
        self._thread.start()
        return NOTHING_ASSIGNED

    def stop(self) -> None:
        self._stop.set()

    def current(self) -> Membership | None:
        with self._lock:
            return self._latest

    def wait_for_change(self, timeout: float) -> bool:
        """Block until a new membership arrived (True) or ``timeout`` passed (False)."""
        changed = self._changed.wait(timeout)
        self._changed.clear()
        return changed

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._read()
                self._watch(version)
            except (OSError, ValueError, ClusterMembershipError) as error:
                # urllib's HTTPError and URLError are OSErrors; a watch the server
                # closed ends the same way. Log once per kind of failure.
                message = f"{type(error).__name__}: {error}"
                if message != self.last_error:
                    logger.warning(
                        "membership ConfigMap %s/%s: %s; retrying",
                        self.namespace,
                        self.name,
                        message,
                    )
                self.last_error = message
                self._stop.wait(_RETRY_SECONDS)

    def _read(self) -> str:
        """GET the object; publish its membership; return its resourceVersion."""
        try:
            with self.api.open(self._object_path, timeout=_REQUEST_TIMEOUT_SECONDS) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                if self._latest is not None:
                    self.gone = True
                    raise ClusterMembershipError("deleted") from None
                # Not published yet: the operator writes it once pods report their layout.
                raise ClusterMembershipError("not found yet") from None
            raise
        self._publish(body)
        return str(body.get("metadata", {}).get("resourceVersion", ""))

    def _watch(self, version: str) -> None:
        query = urllib.parse.urlencode(
            {
                "watch": "true",
                "fieldSelector": f"metadata.name={self.name}",
                "resourceVersion": version,
                "timeoutSeconds": str(_WATCH_SECONDS),
                "allowWatchBookmarks": "true",
            }
        )
        path = f"/api/v1/namespaces/{self.namespace}/configmaps?{query}"
        with self.api.open(path, timeout=_WATCH_SECONDS + _REQUEST_TIMEOUT_SECONDS) as response:
            for event in _json_lines(response):
                if self._stop.is_set():
                    return
                kind = event.get("type")
                if kind in ("ADDED", "MODIFIED"):
                    self._publish(event.get("object", {}))
                elif kind == "DELETED":
                    self.gone = True
                elif kind == "ERROR":  # e.g. 410 Gone: our resourceVersion is too old
                    return  # re-read and watch again
        self.last_error = None

    def _publish(self, body: dict[str, Any]) -> None:
        raw = body.get("data", {}).get(MEMBERSHIP_KEY)
        if raw is None:
            raise ClusterMembershipError(f'the ConfigMap has no "{MEMBERSHIP_KEY}" key yet')
        membership = Membership.from_json(json.loads(raw))
        with self._lock:
            if self._latest is not None and membership.generation == self._latest.generation:
                return  # a replay of what we have
            self._latest = membership
        self.last_error = None
        self._changed.set()


def _json_lines(response: Any) -> Iterator[dict[str, Any]]:
    """A watch stream: one JSON object per line."""
    for line in response:
        text = line.strip()
        if text:
            yield json.loads(text)
