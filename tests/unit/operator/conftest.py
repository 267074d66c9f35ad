"""The operator's unit tests share an in-memory stand-in for the client wrapper
(``MemoryKube``, the ``kube`` fixture) and kopf's memo holding an Operator over it (``memo``)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import kopf
import pytest

from eddyline_operator import handlers
from eddyline_operator.client import ApiError
from eddyline_runtime.membership import MEMBERSHIP_FILE, Membership

Obj = dict[str, Any]


class MemoryKube:
    """The client wrapper's interface over dicts keyed by (kind, namespace, name)."""

    def __init__(self) -> None:
        # "Kind/name" -> the error the API server answers a write of it with.
        self.refuse: dict[str, ApiError] = {}
        self.objects: dict[tuple[str, str | None, str], Obj] = {}
        self.deleted: list[str] = []
        self.deletions: list[tuple[str, str, str]] = []  # (kind, name, propagation)
        self.status_patches: list[Obj] = []
        self.applies: list[tuple[tuple[str, str | None, str], bool]] = []  # (key, unless_same)

    def put(self, obj: Obj) -> None:
        meta = obj["metadata"]
        self.objects[obj["kind"], meta.get("namespace"), meta["name"]] = copy.deepcopy(obj)

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def list(
        self,
        kind: str,
        namespace: str | None,
        *,
        selector: str | None = None,
        fields: str | None = None,
    ) -> list[Obj]:
        """As the API server lists: by labels and by fields (dotted paths), without kind."""
        wanted = dict(p.split("=") for p in selector.split(",")) if selector else {}
        by_field = dict(p.split("=") for p in fields.split(",")) if fields else {}

        def field(obj: Any, path: str) -> Any:
            for key in path.split("."):
                obj = obj.get(key) if isinstance(obj, dict) else None
            return obj

        return [
            {k: v for k, v in copy.deepcopy(o).items() if k != "kind"}
            for (k, ns, _), o in self.objects.items()
            if k == kind
            and (namespace is None or ns == namespace)
            and all((o["metadata"].get("labels") or {}).get(a) == b for a, b in wanted.items())
            and all(str(field(o, path)) == value for path, value in by_field.items())
        ]

    def get_streamapp(self, namespace: str, name: str) -> Obj | None:
        return self.get("StreamApp", namespace, name)

    def apply(
        self, obj: Obj, *, check: Callable[[Obj], None] | None = None, unless_same: bool = False
    ) -> str:
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        if key in self.objects and check is not None:
            check(copy.deepcopy(self.objects[key]))
        self.applies.append((key, unless_same))
        refused = self.refuse.get(f"{obj['kind']}/{obj['metadata']['name']}")
        if refused is not None:
            raise refused
        outcome = "created" if key not in self.objects else "updated"
        if self.objects.get(key) == obj:
            return "unchanged"
        self.put(obj)
        return outcome

    def publish_membership(
        self, config_map: Obj, *, check: Callable[[Obj], None] | None = None
    ) -> None:
        existing = self.get("ConfigMap", "apps", config_map["metadata"]["name"])
        if existing is not None and check is not None:
            check(existing)
        self.put(config_map)

    def read_membership(self, namespace: str, config_map: str) -> Membership | None:
        found = self.get("ConfigMap", namespace, config_map)
        raw = ((found or {}).get("data") or {}).get(MEMBERSHIP_FILE)
        return None if not raw else Membership.from_json(json.loads(raw))

    def read_config_value(self, namespace: str, config_map: str, key: str) -> str | None:
        found = self.get("ConfigMap", namespace, config_map)
        return None if found is None else found["data"].get(key)

    def delete(
        self, kind: str, namespace: str | None, name: str, *, propagation: str = "Background"
    ) -> bool:
        self.deleted.append(name)
        self.deletions.append((kind, name, propagation))
        return self.objects.pop((kind, namespace, name), None) is not None

    def patch_streamapp_status(self, namespace: str, name: str, status: Obj) -> str | None:
        self.status_patches.append(status)
        found = self.objects["StreamApp", namespace, name]
        found["status"] = copy.deepcopy(status)
        meta = found["metadata"]
        if "resourceVersion" not in meta:
            return None  # as a server that does not say
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return str(meta["resourceVersion"])

    def merge_patch(
        self, kind: str, namespace: str | None, name: str, patch: Obj, sub: str = ""
    ) -> Obj | None:
        """Only the scale subresource (the autoscaler's write) is needed here."""
        assert (kind, sub) == ("StreamApp", "scale"), (kind, sub)
        found = self.objects[kind, namespace, name]
        found["spec"]["replicas"] = patch["spec"]["replicas"]
        found["metadata"]["generation"] = found["metadata"].get("generation", 0) + 1
        self.scaled = [*getattr(self, "scaled", []), patch["spec"]["replicas"]]
        return copy.deepcopy(found)


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryKube]:
    memory = MemoryKube()
    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        handlers, "post_event", lambda body, t, reason, message: events.append((t, reason, message))
    )
    memory.events = events  # type: ignore[attr-defined]
    yield memory


@pytest.fixture
def memo(kube: MemoryKube) -> kopf.Memo:
    """kopf's memo as the startup handler leaves it, with the in-memory store as client."""
    memo = kopf.Memo()
    handlers.configure(settings=kopf.OperatorSettings(), memo=memo)
    memo[handlers.MEMO_KEY] = handlers.Operator(kube)  # type: ignore[arg-type]
    return memo
