"""Whose object is it: the operator touches an existing object only when it is this app's.

Objects are found by name, and a name says nothing about who made it: a StreamApp named
after the operator's own ServiceAccount would otherwise merge-patch its owner reference
onto it (its pods then run with the operator's rights, and deleting the app garbage-collects
the operator's account). So an existing object is this app's only when

* its controller owner reference is this StreamApp's uid, or
* it has no controller at all and carries this app's labels as the operator writes them
  (``managed-by: eddyline-operator`` and ``eddyline.dev/app: <app>``): an object the operator
  made without an owner on purpose (the log claim under ``whenDeleted: Retain``) and that a
  re-created app of the same name takes back.

Anything else (another app's, Helm's, a user's) is a name conflict: left alone and
reported as ``Degraded``/``NameConflict`` naming the object.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from eddyline_operator.reconcile import names

Obj = dict[str, Any]
# Raises NameConflictError for an existing object that is not this app's.
Check = Callable[[Obj], None]


class NameConflictError(Exception):
    """An object with the name the app wants belongs to someone else."""

    def __init__(self, kind: str, name: str, holder: str) -> None:
        self.kind = kind
        self.name = name
        self.holder = holder
        super().__init__(
            f"{kind} {name} already exists and belongs to {holder}, not to this StreamApp: "
            "left untouched; rename the app or remove that object"
        )


def controller(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The controller owner reference (at most one may have controller: true)."""
    for reference in meta.get("ownerReferences") or []:
        if reference.get("controller"):
            return dict(reference)
    return None


def check(existing: Obj, *, kind: str, app: str, app_uid: str) -> None:
    """Raise :class:`NameConflictError` unless ``existing`` is app ``app`` (uid ``app_uid``)'s."""
    meta = existing.get("metadata") or {}
    name = str(meta.get("name"))
    owner = controller(meta)
    if owner is not None:
        if owner.get("uid") == app_uid:
            return
        holder = f"{owner.get('kind', '?')} {owner.get('name', '?')} (uid {owner.get('uid')})"
        raise NameConflictError(kind, name, holder)
    labels = meta.get("labels") or {}
    if labels.get(names.LABEL_MANAGED_BY) == names.OPERATOR and labels.get(names.LABEL_APP) == app:
        return
    manager = labels.get(names.LABEL_MANAGED_BY)
    raise NameConflictError(kind, name, f"no StreamApp (managed by {manager or 'nobody we know'})")


def checker(*, kind: str, app: str, app_uid: str) -> Check:
    """:func:`check` for one object kind and app, as the client's ``apply`` takes it."""

    def run(existing: Obj) -> None:
        check(existing, kind=kind, app=app, app_uid=app_uid)

    return run
