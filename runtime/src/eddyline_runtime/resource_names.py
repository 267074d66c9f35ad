"""Generated names of state stores and internal topics, and the one rule for them.

State is found by name: a store's directory and changelog topic, a repartition topic's
records. When the DSL names a resource itself (Kafka's numbering,
``KSTREAM-AGGREGATE-STATE-STORE-0000000003``), the number counts the nodes built before
it, so an edit earlier in the topology renumbers it: an upgrade then relocates state by
a name that means something else, or leaves it behind under a name nothing reads.

Two guards, both over :class:`GeneratedName` (what a topology says of each generated
name, from its ``describe()`` graph):

- when a topology is built, ``ensure.explicit.internal.resource.naming`` (KIP-1111)
  refuses every generated name at once: :func:`explicit_naming_error`;
- when a StreamApp's topology changes, the operator compares the generated names of the
  revision that ran with those of the new one and refuses the upgrade when one's meaning
  moved: :func:`moved_names`.

This module is a leaf: the DSL records the names, pods report them
(``MemberReport.generated_names``) and the operator compares them, all through it.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class ResourceKind(enum.StrEnum):
    STATE_STORE = "state store"
    REPARTITION_TOPIC = "repartition topic"


@dataclass(frozen=True, slots=True)
class GeneratedName:
    """A store or internal topic the DSL named itself.

    ``operation`` is the DSL call that made it and ``way_out`` how to name it
    (the parameter to pass). Its meaning, as the ``describe()`` text gives it:
    ``attached``, the processors that use it (a store: the processors listing it; a
    topic: the sinks writing it and the sources reading it), and ``inputs``, the topics
    the sub-topology that writes it reads. ``logged``: a store with a changelog topic
    (``<store>-changelog``, generated with it).
    """

    name: str
    kind: ResourceKind
    operation: str
    way_out: str
    attached: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    logged: bool = False

    def meaning(self) -> tuple[ResourceKind, tuple[str, ...], tuple[str, ...]]:
        return self.kind, self.attached, self.inputs

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": str(self.kind),
            "operation": self.operation,
            "way_out": self.way_out,
            "attached": list(self.attached),
            "inputs": list(self.inputs),
            "logged": self.logged,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GeneratedName:
        return cls(
            name=str(data["name"]),
            kind=ResourceKind(data["kind"]),
            operation=str(data.get("operation", "")),
            way_out=str(data.get("way_out", "")),
            attached=tuple(str(a) for a in data.get("attached", ())),
            inputs=tuple(str(i) for i in data.get("inputs", ())),
            logged=bool(data.get("logged", False)),
        )


def changelog_suffix(store: str) -> str:
    """A store's changelog topic without the application.id prefix, as Kafka lists it."""
    return f"{store}-changelog"


def explicit_naming_error(names: Sequence[GeneratedName]) -> str:
    """KIP-1111's refusal: every generated name at once, in Kafka's words
    (``InternalTopologyBuilder.checkUnprovidedNames``), then which DSL call made each
    and how to name it."""
    stores = [n for n in names if n.kind is ResourceKind.STATE_STORE]
    changelogs = [changelog_suffix(n.name) for n in stores if n.logged]
    topics = [n for n in names if n.kind is ResourceKind.REPARTITION_TOPIC]
    lines = []
    if changelogs:
        lines.append(f"Following changelog topic(s) has not been named: {', '.join(changelogs)}")
    if stores:
        lines.append(
            f"Following state store(s) has not been named: {', '.join(n.name for n in stores)}"
        )
    if topics:
        lines.append(
            "Following repartition topic(s) has not been named: "
            f"{', '.join(n.name for n in topics)}"
        )
    lines.append(
        "ensure.explicit.internal.resource.naming is true, so every state store and "
        "internal topic needs a name given in the topology code:"
    )
    lines.extend(f'  {n.kind} "{n.name}" ({n.operation}): {n.way_out}' for n in names)
    return "\n".join(lines)


def generated_name_notes(names: Sequence[GeneratedName]) -> list[str]:
    """What ``eddyline describe`` says of each generated name, after Kafka's text (which
    it leaves as Kafka prints it): the name, that it is numbered by its node's position,
    and how to name it. Empty when the topology names everything."""
    if not names:
        return []
    notes = [
        f"{len(names)} generated name(s): numbered by the position of the node that made "
        "them, so an edit earlier in the topology renumbers them, and an upgrade then "
        "orphans their state or is refused (GeneratedNamesMoved). Name them in the "
        "topology code:"
    ]
    for name in names:
        changelog = f" and its changelog {changelog_suffix(name.name)}" if name.logged else ""
        notes.append(f'  {name.kind} "{name.name}"{changelog} ({name.operation}): {name.way_out}')
    return notes


def moved_names(
    before: Iterable[GeneratedName],
    after: Iterable[GeneratedName],
    *,
    still_named: Collection[str] = (),
) -> list[str]:
    """Why an upgrade from a topology with the generated names ``before`` to one with
    ``after`` would put state under the wrong name; empty when it would not.
    ``still_named``: every store and internal topic name of the new topology, so that an
    old generated name the new one gives explicitly (pinned) counts as kept, not vanished.

    The rule (docs/operator.md, "Generated names across an upgrade"), per kind:

    - a generated name in both revisions whose meaning differs (other processors use
      it, or the sub-topology writing it reads other topics): its state would be
      relocated into, or read by, another operation;
    - generated names of the old revision that vanished while generated names of the same
      kind appeared: the numbering shifted, and the old state would be orphaned.

    A generated name that only vanished (its operation removed) or only appeared (a new
    operation) moves nothing. Explicit names are not compared: they are relocated by name.
    """
    old = {n.name: n for n in before}
    new = {n.name: n for n in after}
    problems: list[str] = []
    for name in sorted(old.keys() & new.keys()):
        was, now = old[name], new[name]
        if was.meaning() != now.meaning():
            problems.append(
                f'{now.kind} "{name}" ({now.operation}) now means another operation: used by '
                f"{_listed(was.attached)} reading {_listed(was.inputs)} before, by "
                f"{_listed(now.attached)} reading {_listed(now.inputs)} now; {now.way_out}"
            )
    for kind in ResourceKind:
        gone = sorted(
            n for n in old.keys() - new.keys() if old[n].kind is kind and n not in still_named
        )
        came = sorted(n for n in new.keys() - old.keys() if new[n].kind is kind)
        if gone and came:
            # The old names' way out: pinning an old generated name keeps its state (a
            # new one starts empty). Reports of older pods may carry none.
            pins = {old[n].way_out for n in gone if old[n].way_out}
            ways = "; ".join(sorted(pins or {new[n].way_out for n in came}))
            problems.append(
                f"generated {kind} name(s) {_listed(gone)} vanished while {_listed(came)} "
                f"appeared: the numbering shifted, and state under the old name(s) would be "
                f"orphaned; {ways}"
            )
    return problems


def _listed(items: Iterable[str]) -> str:
    return "[" + ", ".join(items) + "]"
