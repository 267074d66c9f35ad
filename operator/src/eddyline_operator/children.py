"""Carry a plan's children out through the client: apply them, withhold those that name a
foreign object, prune those no longer wanted; and read what the StatefulSet controller says
about the pods it makes (``stateful_set_events``). The decisions are the pure ``reconcile``
modules' (``ownership``, ``references``, ``prune``); this module only sequences the calls.

Children are applied in the order ``objects.owned_objects`` lists them, every one after the
children it names (a unit test holds the order to that), so one pass knows, when it reaches
a child, whether anything it names turned out to be another owner's. The membership
ConfigMap is published after the others but named by the Role and the pods' args: its owner
is looked at first.

A withheld child that an earlier cycle made (an operator from before this rule, or a name
taken over since) is deleted, so that nothing keeps pointing at the foreign object: a
StatefulSet with ``propagationPolicy: Orphan`` (its claims keep the state, whatever
``whenDeleted`` says), then each of the app's pods and restore Jobs that names an
unavailable object.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eddyline_operator.client import ApiError, Kube
from eddyline_operator.reconcile import names, ownership, pod_creation, prune, references
from eddyline_operator.reconcile.references import Ref

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
# (reason, message) of a child that could not be applied.
Refusal = tuple[str, str]
# Posts a Normal event about the app: (reason, message).
Announce = Callable[[str, str], None]

NAME_CONFLICT = "NameConflict"
APPLY_FAILED = "ApplyFailed"


@dataclass
class Outcome:
    """What applying a plan's children came to."""

    refusals: list[Refusal] = field(default_factory=list)
    # Objects no child may name this cycle, ref -> why (a conflict, or withheld in turn).
    unavailable: dict[Ref, str] = field(default_factory=dict)
    # Whether any child was created or changed (an apply that found every child as it
    # would be applied sent nothing: what was read before it still holds).
    changed: bool = False


@dataclass(frozen=True)
class Running:
    """The app's pods and restore Jobs as this cycle observed them."""

    pods: Sequence[Any] = ()
    jobs: Sequence[Any] = ()


# A starting app's cycles come every SETTLING_SECONDS (a quarter second): its StatefulSet's
# Events are listed at most this often, so that many apps starting at once cost the API
# server little; a FailedCreate shows within this long.
EVENTS_SECONDS = 2.0


@dataclass
class EventsSeen:
    """The StatefulSet's Events as last listed for one app: (time.monotonic(), events)."""

    listed_at: float = float("-inf")
    events: list[Obj] = field(default_factory=list)


def stateful_set_events(kube: Kube, body: Any, pods: Sequence[Obj], seen: EventsSeen) -> list[Obj]:
    """The Events about the app's StatefulSet, listed only while fewer pods exist than the
    spec wants, and at most every EVENTS_SECONDS (pod_creation.py reads a FailedCreate)."""
    spec = body.get("spec") or {}
    wanted = 0 if spec.get("suspend") else int(spec.get("replicas", 1))
    if sum(1 for p in pods if not p["metadata"].get("deletionTimestamp")) >= wanted:
        seen.listed_at, seen.events = float("-inf"), []
        return []
    if time.monotonic() - seen.listed_at < EVENTS_SECONDS:
        return seen.events
    meta = body["metadata"]
    try:
        found = kube.list(
            "Event", meta["namespace"], fields=pod_creation.field_selector(meta["name"])
        )
    except ApiError as error:
        if error.status != 403:
            raise
        logger.warning("cannot list Events (RBAC): a pod the StatefulSet cannot create goes unseen")
        found = []
    seen.listed_at, seen.events = time.monotonic(), found
    return found


def refused(what: str, error: ApiError) -> str:
    return f"{what} was refused by the API server: {error}"


@dataclass(frozen=True)
class FreshRead:
    """An object as the server (or the child cache, which stands in for it only on a version
    it confirmed, child_cache.py) answered this very cycle; ``obj`` None: it has none. Held
    for the one cycle only, so a 404 is never carried to the next one: a ConfigMap someone
    else makes meanwhile (unlabelled, so no watch delivers it) is seen at the next read."""

    obj: Obj | None


class Children:
    """One cycle's children of app ``app`` (uid ``uid``) in ``namespace``."""

    def __init__(self, kube: Kube, *, namespace: str, app: str, uid: str, announce: Announce):
        self.kube = kube
        self.namespace = namespace
        self.app = app
        self.uid = uid
        self.announce = announce

    def check(self, kind: str) -> ownership.Check:
        return ownership.checker(kind=kind, app=self.app, app_uid=self.uid)

    def conflict(self, outcome: Outcome, error: ownership.NameConflictError) -> None:
        outcome.refusals.append((NAME_CONFLICT, str(error)))
        outcome.unavailable[(error.kind, error.name)] = f"belongs to {error.holder}"

    def membership_conflict(self, outcome: Outcome, *, read: FreshRead | None = None) -> None:
        """Look at the membership ConfigMap's owner before anything that names it: as
        ``read`` found it when this cycle read it already, else with a GET of its own."""
        name = names.membership_map(self.app)
        existing = self.kube.get("ConfigMap", self.namespace, name) if read is None else read.obj
        if existing is None:
            return
        try:
            self.check("ConfigMap")(existing)
        except ownership.NameConflictError as error:
            outcome.unavailable[("ConfigMap", name)] = f"belongs to {error.holder}"

    def apply(self, objects: Sequence[Obj], outcome: Outcome, *, unless_same: bool = False) -> None:
        """Apply each child unless it names an unavailable object; a withheld one is
        deleted when it exists and is the app's. A 5xx raises (the cycle is retried).
        ``unless_same``: a child that exists as it would be applied is not sent (Kube.apply)."""
        for obj in objects:
            what = references.describe(references.ref(obj))
            stopped = references.withheld(obj, outcome.unavailable)
            if stopped is not None:
                outcome.refusals.append((NAME_CONFLICT, stopped.message))
                outcome.unavailable[stopped.ref] = "is withheld itself"
                self.remove_withheld(obj)
                continue
            try:
                result = self.kube.apply(
                    obj, check=self.check(obj["kind"]), unless_same=unless_same
                )
            except ownership.NameConflictError as error:
                self.conflict(outcome, error)
                continue
            except ApiError as error:
                if not 400 <= error.status < 500:
                    raise
                outcome.refusals.append((APPLY_FAILED, refused(what, error)))
                continue
            if result != "unchanged":
                outcome.changed = True
                self.announce(result.capitalize(), f"{result} {what}")

    def remove_withheld(self, obj: Obj) -> None:
        kind, name = references.ref(obj)
        existing = self.kube.get(kind, self.namespace, name)
        if existing is None or not ownership.is_owned(existing, self.uid):
            return
        # The StatefulSet's claims hold the state: orphaned, they wait for it to come back.
        orphan = "Orphan" if kind == "StatefulSet" else "Background"
        if self.kube.delete(kind, self.namespace, name, propagation=orphan):
            logger.warning(
                "StreamApp %s/%s: deleted withheld %s %s", self.namespace, self.app, kind, name
            )
            self.announce("Deleted", f"deleted {kind} {name}: it names an object not this app's")

    def remove_naming(self, found: Sequence[Obj], kind: str, unavailable: dict[Ref, str]) -> None:
        """Delete the app's pods or restore Jobs (``kind``) that name an unavailable object:
        a pod already running as a foreign ServiceAccount, a Job running as one."""
        for obj in found:
            if obj["metadata"].get("deletionTimestamp"):
                continue  # on its way out already
            if references.withheld({**obj, "kind": kind}, unavailable) is None:
                continue
            name = obj["metadata"]["name"]
            if kind == "Job" and not ownership.is_owned(obj, self.uid):
                continue
            if self.kube.delete(kind, self.namespace, name):
                self.announce(
                    "Deleted", f"deleted {kind} {name}: it names an object not this app's"
                )

    def prune(self, desired: Sequence[Obj], kinds: Sequence[str]) -> None:
        """Delete the app's children (controller reference) that ``desired`` no longer holds."""
        existing: list[Obj] = []
        for kind in kinds:
            listed = self.kube.list(kind, self.namespace, selector=prune.selector(self.app))
            existing += [{**item, "kind": kind} for item in listed]  # lists leave kind out
        wanted = {references.ref(o) for o in desired}
        for obj in prune.unwanted(existing, wanted, app=self.app, app_uid=self.uid, kinds=kinds):
            kind, name = references.ref(obj)
            try:
                gone = self.kube.delete(kind, self.namespace, name)
            except ApiError as error:
                if not 400 <= error.status < 500:
                    raise
                logger.warning("StreamApp %s/%s: %s", self.namespace, self.app, error)
                continue
            if gone:
                self.announce("Pruned", f"deleted {kind} {name}: the spec no longer asks for it")
