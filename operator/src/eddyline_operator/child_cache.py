"""The apps' children as kopf's watches last delivered them, so that the drift check reads
them from memory instead of with a GET per child per app (issue 38: at 200 apps those GETs,
a dozen per app every REAPPLY_SECONDS, were most of the API server's requests).

Two maps, both by (kind, namespace, name):

* ``seen``: the object as the last watch event of its kind delivered it (``record``; the
  handlers feed it from kopf's watches of the child kinds, server-side filtered to the
  operator's managed-by label, so an object whose label is taken off arrives as DELETED);
* ``confirmed``: the resourceVersion this operator last had from the server itself for it
  (the answer to a GET, an apply, a create, a patch; none after a 404 or a delete).

A read (:meth:`ChildCache.lookup`) is served from ``seen`` only when both agree: the
watched copy is then the very object the server last told this operator about, no older
than its own last write (a watch event can arrive after the answer to the write that made
it) and not someone else's version this operator has not looked at. Any other case (never
seen, deleted, edited by someone else since, a watch behind) is a miss, and the caller asks
the server (``client.Kube.get``), whose answer is confirmed in turn. So a child deleted or
edited by hand is still found as it is (a GET, once its watch event arrived), and a child
nobody touched costs nothing. What a watch has not delivered yet is not known here, exactly
as it is not known to a GET sent a moment earlier.

A confirmed version is trusted for TRUST_SECONDS, then read from the server again: kopf
re-lists after a gap in a watch (a 410, a paused replica resuming) without reporting what
was deleted in the gap, and a copy of such an object would otherwise look current forever.

No import of kopf or kubernetes: the client reads and confirms, the handlers record.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]

# kopf's watch event type for an object that is gone (or no longer matches the selector).
DELETED = "DELETED"
# How long a version the server answered stands in for a GET: a child deleted in a watch's
# gap is read again (and made again) within this long. Ten drift checks (REAPPLY_SECONDS);
# at 200 apps of ten children that is about 7 GETs per second, against 80 without the cache.
TRUST_SECONDS = 300.0


def _version(obj: Mapping[str, Any]) -> str | None:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return None if version is None else str(version)


class ChildCache:
    """The watched copies of the children of ``kinds`` and the versions confirmed by the
    server (the module docstring). Thread-safe: kopf's event loop records, cycle threads
    read and confirm."""

    def __init__(self, kinds: Iterable[str]) -> None:
        self.kinds = frozenset(kinds)
        self._lock = threading.Lock()
        self._seen: dict[Key, Obj] = {}
        # Key -> (resourceVersion, time.monotonic() when the server answered it).
        self._confirmed: dict[Key, tuple[str, float]] = {}

    def record(self, kind: str, event_type: str | None, obj: Mapping[str, Any]) -> None:
        """A watch event of ``kind``: the object as delivered, or gone (``DELETED``)."""
        meta = obj.get("metadata") or {}
        key = (kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if event_type == DELETED:
            with self._lock:
                self._seen.pop(key, None)
            return
        # A copy of its own: kopf keeps using the event's dict, and readers get copies too.
        # Without managedFields, which no reader looks at (the drift check compares without
        # them) and which are most of a small object's bytes.
        snapshot: Obj = json.loads(json.dumps(obj))
        snapshot.get("metadata", {}).pop("managedFields", None)
        with self._lock:
            self._seen[key] = snapshot

    def forget(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Drop the watched copy of ``obj`` (an event about an object this cache must not
        hold: one without the operator's label)."""
        self.record(kind, DELETED, obj)

    def lookup(self, kind: str, namespace: str, name: str) -> Obj | None:
        """A copy of the watched object when its version is the one the server last gave
        this operator; None otherwise (ask the server)."""
        if kind not in self.kinds:
            return None
        key = (kind, namespace, name)
        with self._lock:
            found = self._seen.get(key)
            confirmed = self._confirmed.get(key)
        if found is None or confirmed is None or _version(found) != confirmed[0]:
            return None
        if time.monotonic() - confirmed[1] >= TRUST_SECONDS:
            return None
        copied: Obj = json.loads(json.dumps(found))
        return copied

    def confirm(
        self, kind: str, namespace: str, name: str, answer: Mapping[str, Any] | None
    ) -> None:
        """What the server answered about the object (None: it has none): reads of it are
        served from the watch once the watch shows that version."""
        if kind not in self.kinds:
            return
        key = (kind, namespace, name)
        version = None if answer is None else _version(answer)
        with self._lock:
            if version is None:
                self._confirmed.pop(key, None)
            else:
                self._confirmed[key] = (version, time.monotonic())

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)
