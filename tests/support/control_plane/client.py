"""A small synchronous client of the real API server: HTTPS, client certificate or token.

The harness, the kubelet stand-in, the provisioner and the Service proxy each talk to the API
server with their own identity through one of these; :class:`Informer` keeps a list+watch
cache of one resource as client-go's informers do (relist on ``410 Gone`` or a broken watch).
"""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """The API server answered with an error status (``code`` and its ``Status`` body)."""

    def __init__(self, code: int, body: Any, what: str) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)
        super().__init__(f"{what}: {code} {message}")
        self.code = code
        self.body = body


class Client:
    """Requests to ``server`` as one identity (client certificate, or bearer token)."""

    def __init__(
        self,
        server: str,
        ca_file: Path,
        *,
        cert: tuple[Path, Path] | None = None,
        token: str | None = None,
        agent: str = "eddyline-test-harness",
    ) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.agent = agent
        self.context = ssl.create_default_context(cafile=str(ca_file))
        if cert is not None:
            self.context.load_cert_chain(str(cert[0]), str(cert[1]))

    def open(
        self,
        path: str,
        method: str = "GET",
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", self.agent)
        if data is not None:
            request.add_header("Content-Type", content_type)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        return urllib.request.urlopen(request, timeout=timeout, context=self.context)

    def request(
        self,
        path: str,
        method: str = "GET",
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> Any:
        """The decoded JSON answer; raises :class:`ApiError` for an error status."""
        try:
            with self.open(
                path, method, body, content_type=content_type, timeout=timeout
            ) as response:
                return _decode(response.read())
        except urllib.error.HTTPError as error:
            raise ApiError(error.code, _decode(error.read()), f"{method} {path}") from None

    def get(self, path: str) -> Obj | None:
        """The object, or None when it does not exist."""
        try:
            found: Obj = self.request(path)
        except ApiError as error:
            if error.code == 404:
                return None
            raise
        return found

    def create(self, path: str, body: Obj) -> Obj:
        created: Obj = self.request(path, "POST", body)
        return created

    def ensure(self, path: str, body: Obj) -> None:
        """Create unless it exists (409 is fine)."""
        try:
            self.request(path, "POST", body)
        except ApiError as error:
            if error.code != 409:
                raise

    def patch(self, path: str, body: Obj, *, kind: str = MERGE_PATCH) -> Obj:
        patched: Obj = self.request(path, "PATCH", body, content_type=kind)
        return patched

    def delete(self, path: str, body: Obj | None = None) -> None:
        with contextlib.suppress(ApiError):
            self.request(path, "DELETE", body)


def _decode(data: bytes) -> Any:
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        return data.decode(errors="replace")


class Informer:
    """A list+watch cache of one collection, kept current by a daemon thread.

    ``on_change`` runs (on the informer's thread) after every event, so a controller can wake.
    """

    def __init__(
        self,
        client: Client,
        path: str,
        *,
        field_selector: str = "",
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.path = path
        self.field_selector = field_selector
        self.on_change = on_change or (lambda: None)
        self.objects: dict[str, Obj] = {}
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"informer {path}", daemon=True)

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the current watch (a daemon thread; closing its response from here
        would block on the reader's lock until the server ends the watch)."""
        self._stop.set()

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self.objects.values())

    def _query(self, **extra: str) -> str:
        query = {"fieldSelector": self.field_selector} if self.field_selector else {}
        query.update(extra)
        return f"{self.path}?{urllib.parse.urlencode(query)}" if query else self.path

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = self.client.request(self._query())
                with self._lock:
                    self.objects = {_key(o): o for o in listed.get("items", [])}
                self.synced.set()
                self.on_change()
                self._watch(listed["metadata"]["resourceVersion"])
            except Exception:  # the server restarting, a broken stream: relist shortly
                if self._stop.wait(0.5):
                    return

    def _watch(self, version: str) -> None:
        while not self._stop.is_set():
            path = self._query(
                watch="1",
                resourceVersion=version,
                allowWatchBookmarks="true",
                timeoutSeconds="60",
            )
            with self.client.open(path, timeout=90) as response:
                for event in _json_lines(response):
                    if self._stop.is_set():
                        return
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        return  # 410 Gone and the like: relist
                    version = obj["metadata"]["resourceVersion"]
                    if kind == "BOOKMARK":
                        continue
                    with self._lock:
                        if kind == "DELETED":
                            self.objects.pop(_key(obj), None)
                        else:
                            self.objects[_key(obj)] = obj
                    self.on_change()


def _key(obj: Obj) -> str:
    return str(obj["metadata"].get("uid") or obj["metadata"]["name"])


def _json_lines(response: Any) -> Iterator[Obj]:
    for line in response:
        if line.strip():
            yield json.loads(line)


def wait_until(condition: Callable[[], Any], what: str, timeout: float) -> Any:
    """Poll ``condition`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)
