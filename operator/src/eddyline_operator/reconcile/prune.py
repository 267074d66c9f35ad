"""Which existing children an app no longer wants: what the handlers delete. Pure.

A spec change can make a child unwanted: ``spec.restore.when`` back to ``Never`` leaves the
restore claim, ServiceAccount and RoleBinding (the executor role stayed bound); a Spark
master from ``k8s://`` to ``local[*]`` leaves the RoleBinding; the log from sqlite to Kafka
leaves the log claim. Kubernetes removes children only with their owner, so without this
they stayed until the app was deleted.

Only objects whose *controller* owner reference is this app's uid are ever pruned, never
ones that merely carry its labels (anyone may label an object), and never

* the membership ConfigMap (published apart from the other children),
* the StatefulSet (a cycle that renders none, while the embedded log waits for a node,
  still wants it; deleting it would stop every pod),
* claims unless ``storage.whenDeleted`` is ``Delete``: a claim goes only where deleting
  the app would delete it too (under ``Retain`` the log claim has no owner anyway),
* restore Jobs (kept a day for whoever investigates, ``ttlSecondsAfterFinished``) and the
  StatefulSet controller's own claims (owned by the StatefulSet, not the app).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from eddyline_operator.reconcile import names, ownership
from eddyline_operator.reconcile.references import Obj, Ref, ref
from eddyline_runtime.spec import ClaimRetention, StreamApp

# The kinds of children the operator makes directly that may become unwanted.
KINDS = (
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "Service",
    "PodDisruptionBudget",
    "PersistentVolumeClaim",
)
CLAIM = "PersistentVolumeClaim"


def kinds(app: StreamApp) -> tuple[str, ...]:
    """The kinds whose unwanted children of ``app`` are pruned: claims only under
    ``storage.whenDeleted: Delete``."""
    if app.spec.storage.when_deleted is ClaimRetention.DELETE:
        return KINDS
    return tuple(k for k in KINDS if k != CLAIM)


def selector(app: str) -> str:
    """The label selector that finds an app's children (the owner reference decides)."""
    return f"{names.LABEL_APP}={app}"


def unwanted(
    existing: Iterable[Obj],
    desired: Collection[Ref],
    *,
    app: str,
    app_uid: str,
    kinds: Collection[str],
) -> list[Obj]:
    """The objects of ``existing`` to delete: of a prunable kind, controlled by ``app_uid``,
    not among ``desired`` ((kind, name) of this cycle's children) and not the membership
    ConfigMap."""
    keep = {*desired, ("ConfigMap", names.membership_map(app))}
    return sorted(
        (
            obj
            for obj in existing
            if obj.get("kind") in kinds
            and ref(obj) not in keep
            and ownership.is_owned(obj, app_uid)
        ),
        key=ref,
    )
