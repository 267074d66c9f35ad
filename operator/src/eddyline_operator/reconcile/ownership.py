"""Whose object is it: the operator touches an existing object only when it is this app's.

Objects are found by name, and a name says nothing about who made it: a StreamApp named
after the operator's own ServiceAccount would otherwise merge-patch its owner reference
onto it (its pods then run with the operator's rights, and deleting the app garbage-collects
the operator's account). So an existing object is this app's only when

* its controller owner reference is this StreamApp's uid, or
* it is a claim with no controller at all that carries this app's labels as the operator
  writes them (``managed-by: eddyline-operator`` and ``eddyline.dev/app: <app>``): the log
  claim, which the operator leaves without an owner on purpose under ``whenDeleted: Retain``,
  and which a re-created app of the same name (or a switch back to ``Delete``) takes back.

Labels alone never make any other object the app's: anyone who may create a ServiceAccount
may label it, and an adopted account would keep whatever token its maker minted for it.
Anything else (another app's, Helm's, a user's, a labelled orphan) is a name conflict: left
alone and reported as ``Degraded``/``NameConflict`` naming the object; the children that name
it are withheld too (``references.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from eddyline_operator.reconcile import names

Obj = dict[str, Any]
# Raises NameConflictError for an existing object that is not this app's.
Check = Callable[[Obj], None]
# The one kind the operator leaves without an owner on purpose (storage.whenDeleted: Retain).
ORPHAN_KIND = "PersistentVolumeClaim"


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
    ours = labels.get(names.LABEL_MANAGED_BY) == names.OPERATOR
    if kind == ORPHAN_KIND and ours and labels.get(names.LABEL_APP) == app:
        return
    manager = labels.get(names.LABEL_MANAGED_BY)
    if ours:  # labelled as ours, but only a claim is ever left without an owner
        raise NameConflictError(kind, name, "no StreamApp (it has no owner reference)")
    raise NameConflictError(kind, name, f"no StreamApp (managed by {manager or 'nobody we know'})")


def is_owned(existing: Obj, app_uid: str) -> bool:
    """Whether ``existing``'s controller owner reference is app ``app_uid``: the only objects
    the operator deletes (a withheld child made before, a child no longer wanted)."""
    owner = controller(existing.get("metadata") or {})
    return owner is not None and owner.get("uid") == app_uid


def checker(*, kind: str, app: str, app_uid: str) -> Check:
    """:func:`check` for one object kind and app, as the client's ``apply`` takes it."""

    def run(existing: Obj) -> None:
        check(existing, kind=kind, app=app, app_uid=app_uid)

    return run
