"""Which objects an object names, and which children a name conflict withholds. Pure.

A name says nothing about who holds it (``ownership.py``): when ``<app>-runtime`` is another
owner's ServiceAccount, leaving it untouched is not enough, because the app's other children
point at it by name. The StatefulSet's pods would run as that account with its token
(``serviceAccountName``), the membership RoleBinding would grant its rights to whoever the
foreign account is (``subjects``), the restore RoleBinding would hand the executor role to it.
So a child that names a child of the app that is not the app's is withheld too: not applied,
and deleted when an earlier cycle made it (``withheld``).

What a child names, by kind (the only references the operator's children make):

====================  ============================================================
StatefulSet, Job       its pod template, and a StatefulSet's ``serviceName`` (Service)
Pod                    ``serviceAccountName``, volumes (``configMap``, ``secret``,
                       ``persistentVolumeClaim``, projected ones), ``envFrom`` and
                       ``valueFrom`` ConfigMaps and Secrets, the membership ConfigMap in
                       the container's args, ``subdomain`` (Service)
RoleBinding            ``roleRef`` (a Role; a ClusterRole is the chart's, not a child)
                       and its ServiceAccount ``subjects`` in the same namespace
Role                   ``resourceNames`` of the kinds its rules name
====================  ============================================================

Withholding is transitive: what names a withheld child is withheld as well (it would
point at an object the app does not keep). ``children.py`` applies the children in an order
where each comes after those it names, so one pass carries it through.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eddyline_operator.reconcile import names

Obj = dict[str, Any]
# (kind, name) of an object in the app's namespace.
Ref = tuple[str, str]

# The resources a Role's rules may name that the operator makes (core group).
_RESOURCE_KINDS = {
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "serviceaccounts": "ServiceAccount",
    "services": "Service",
    "persistentvolumeclaims": "PersistentVolumeClaim",
}


def ref(obj: Obj) -> Ref:
    return str(obj["kind"]), str(obj["metadata"]["name"])


def describe(reference: Ref) -> str:
    return f"{reference[0]} {reference[1]}"


def refers_to(obj: Obj) -> set[Ref]:
    """The objects in its own namespace that ``obj`` names (see the module docstring)."""
    kind = obj.get("kind")
    namespace = (obj.get("metadata") or {}).get("namespace")
    found: set[Ref] = set()
    if kind in ("StatefulSet", "Job"):
        spec = obj.get("spec") or {}
        found |= _pod_refers_to((spec.get("template") or {}).get("spec") or {})
        if kind == "StatefulSet" and spec.get("serviceName"):
            found.add(("Service", str(spec["serviceName"])))
    elif kind == "Pod":
        found |= _pod_refers_to(obj.get("spec") or {})
    elif kind == "RoleBinding":
        role = obj.get("roleRef") or {}
        if role.get("kind") == "Role" and role.get("name"):
            found.add(("Role", str(role["name"])))
        for subject in obj.get("subjects") or []:
            same = subject.get("namespace") in (None, namespace)
            if subject.get("kind") == "ServiceAccount" and same and subject.get("name"):
                found.add(("ServiceAccount", str(subject["name"])))
    elif kind == "Role":
        for rule in obj.get("rules") or []:
            if "" not in (rule.get("apiGroups") or []):
                continue
            for resource in rule.get("resources") or []:
                named = _RESOURCE_KINDS.get(resource)
                if named is not None:
                    found |= {(named, str(n)) for n in rule.get("resourceNames") or []}
    return found


def _pod_refers_to(spec: Mapping[str, Any]) -> set[Ref]:
    found: set[Ref] = set()
    if spec.get("serviceAccountName"):
        found.add(("ServiceAccount", str(spec["serviceAccountName"])))
    if spec.get("subdomain"):
        found.add(("Service", str(spec["subdomain"])))
    for volume in spec.get("volumes") or []:
        found |= _volume_refers_to(volume)
        for source in (volume.get("projected") or {}).get("sources") or []:
            found |= _volume_refers_to(source)
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        args = [str(a) for a in container.get("args") or []]
        for i, arg in enumerate(args[:-1]):
            if arg == names.MEMBERSHIP_FLAG:
                found.add(("ConfigMap", args[i + 1]))
        for source in container.get("envFrom") or []:
            for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
                if (source.get(key) or {}).get("name"):
                    found.add((kind, str(source[key]["name"])))
        for env in container.get("env") or []:
            value_from = env.get("valueFrom") or {}
            for key, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                if (value_from.get(key) or {}).get("name"):
                    found.add((kind, str(value_from[key]["name"])))
    return found


def _volume_refers_to(volume: Mapping[str, Any]) -> set[Ref]:
    found: set[Ref] = set()
    if (volume.get("configMap") or {}).get("name"):
        found.add(("ConfigMap", str(volume["configMap"]["name"])))
    if (volume.get("secret") or {}).get("secretName"):
        found.add(("Secret", str(volume["secret"]["secretName"])))
    if (volume.get("persistentVolumeClaim") or {}).get("claimName"):
        found.add(("PersistentVolumeClaim", str(volume["persistentVolumeClaim"]["claimName"])))
    return found


@dataclass(frozen=True)
class Withheld:
    """A child that is not applied (and not kept): ``names`` the object that stops it."""

    ref: Ref
    names: Ref
    because: str  # why that one is unavailable: its own conflict, or what it names in turn

    @property
    def message(self) -> str:
        return (
            f"{describe(self.ref)} not applied (and removed if made before): it names "
            f"{describe(self.names)}, which {self.because}"
        )


def withheld(obj: Obj, unavailable: Mapping[Ref, str]) -> Withheld | None:
    """Whether ``obj`` names an object in ``unavailable`` (ref -> why it is not the app's);
    the first such, in name order so that the message is the same every cycle."""
    for reference in sorted(refers_to(obj) & unavailable.keys()):
        return Withheld(ref(obj), reference, unavailable[reference])
    return None
