"""A topology drawn: Graphviz ``dot`` text, Mermaid text, or SVG rendered by Graphviz.

``describe()`` says everything, but a reader sees an app's shape faster in a
picture: each sub-topology is a box (a cluster) holding its sources,
processors and sinks, each store sits beside the processors that use it, and
the topics stand between the boxes (input topics feed sources, sinks feed
output topics, a repartition topic links the sink of one box to the source of
the next). Global stores get a box of their own, fed by their topic.

Both texts are built from one list of nodes and edges (:func:`picture`), so
the dot and the Mermaid drawings never disagree. SVG is Graphviz's layout:
its ``dot`` program (Debian package ``graphviz``; ``make graphviz``).
"""

from __future__ import annotations

import enum
import shutil
import subprocess
from dataclasses import dataclass, field

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.processing.topology import Topology

# Debian's package that provides the dot program.
GRAPHVIZ_PACKAGE = "graphviz"
# How long Graphviz may take to lay a topology out: hundreds of nodes take well under a
# second, so this bounds only a hung process.
_DOT_TIMEOUT_S = 60


class PictureError(EddylineError):
    """The picture cannot be drawn (Graphviz missing or failing)."""


class Shape(enum.StrEnum):
    """What a box in the picture stands for."""

    SOURCE = "source"
    PROCESSOR = "processor"
    SINK = "sink"
    STORE = "store"
    TOPIC = "topic"
    REPARTITION_TOPIC = "repartition-topic"


@dataclass(frozen=True)
class Box:
    """One drawn node; ``id`` is unique across the picture (``kind:name``)."""

    id: str
    label: str
    shape: Shape


@dataclass(frozen=True)
class Cluster:
    """A sub-topology's box (or a global store's) and the ids drawn inside it."""

    title: str
    members: tuple[str, ...]


@dataclass
class Picture:
    """Boxes, clusters and edges (``dashed``: a processor's use of a store)."""

    boxes: dict[str, Box] = field(default_factory=dict)
    clusters: list[Cluster] = field(default_factory=list)
    edges: list[tuple[str, str, bool]] = field(default_factory=list)

    def box(self, id_: str, label: str, shape: Shape) -> str:
        self.boxes.setdefault(id_, Box(id_, label, shape))
        return id_


def picture(topology: Topology) -> Picture:
    """The topology as boxes and edges, in describe()'s sub-topology order."""
    drawn = Picture()
    internal = set(topology.internal_topics)

    def topic(name: str) -> str:
        shape = Shape.REPARTITION_TOPIC if name in internal else Shape.TOPIC
        return drawn.box(f"topic:{name}", name, shape)

    for sub in topology.subtopologies():
        members: list[str] = []
        for name in sub.nodes:
            node = topology.nodes[name]
            node_id = drawn.box(f"node:{name}", name, Shape(node.kind))
            members.append(node_id)
            if node.kind == "source":
                for source_topic in node.topics:
                    drawn.edges.append((topic(source_topic), node_id, False))
            elif node.kind == "sink":
                drawn.edges.append((node_id, topic(node.topics[0]), False))
            for store in node.stores:
                store_id = drawn.box(f"store:{store}", store, Shape.STORE)
                if store not in topology.global_stores and store_id not in members:
                    members.append(store_id)
                drawn.edges.append((node_id, store_id, True))
            for child in node.children:
                drawn.edges.append((node_id, f"node:{child}", False))
        drawn.clusters.append(Cluster(f"Sub-topology {sub.id}", tuple(members)))
    first_global = len(drawn.clusters)
    for offset, spec in enumerate(topology.global_stores.values()):
        source = drawn.box(f"node:{spec.source_name}", spec.source_name, Shape.SOURCE)
        processor = drawn.box(f"node:{spec.processor_name}", spec.processor_name, Shape.PROCESSOR)
        store = drawn.box(f"store:{spec.name}", spec.name, Shape.STORE)
        drawn.edges.append((topic(spec.topic), source, False))
        drawn.edges.append((source, processor, False))
        drawn.edges.append((processor, store, True))
        title = f"Sub-topology {first_global + offset} (global store)"
        drawn.clusters.append(Cluster(title, (source, processor, store)))
    return drawn


_DOT_SHAPES = {
    Shape.SOURCE: 'shape=invhouse, style=filled, fillcolor="#dbeafe"',
    Shape.PROCESSOR: 'shape=box, style="rounded,filled", fillcolor="#f3f4f6"',
    Shape.SINK: 'shape=house, style=filled, fillcolor="#dcfce7"',
    Shape.STORE: 'shape=cylinder, style=filled, fillcolor="#fef3c7"',
    Shape.TOPIC: 'shape=cds, style=filled, fillcolor="#e0e7ff"',
    Shape.REPARTITION_TOPIC: 'shape=cds, style="filled,dashed", fillcolor="#fce7f3"',
}


def to_dot(topology: Topology) -> str:
    """Graphviz's dot language; ``dot -Tsvg`` draws it."""
    drawn = picture(topology)
    clustered = {member for cluster in drawn.clusters for member in cluster.members}
    lines = [
        "digraph topology {",
        "  rankdir=TB;",
        '  graph [fontname="Helvetica", fontsize=11];',
        '  node [fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    for index, cluster in enumerate(drawn.clusters):
        lines.append(f"  subgraph cluster_{index} {{")
        lines.append(f'    label="{_dot_escape(cluster.title)}"; style=rounded; color="#6b7280";')
        for member in cluster.members:
            lines.append(f"    {_dot_box(drawn.boxes[member])}")
        lines.append("  }")
    for box in drawn.boxes.values():
        if box.id not in clustered:
            lines.append(f"  {_dot_box(box)}")
    for tail, head, dashed in drawn.edges:
        style = " [style=dashed, arrowhead=none]" if dashed else ""
        lines.append(f'  "{_dot_escape(tail)}" -> "{_dot_escape(head)}"{style};')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_box(box: Box) -> str:
    return f'"{_dot_escape(box.id)}" [label="{_dot_escape(box.label)}", {_DOT_SHAPES[box.shape]}];'


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


# Mermaid's node shapes: the text goes between the brackets.
_MERMAID_SHAPES = {
    Shape.SOURCE: ("[/", "\\]"),
    Shape.PROCESSOR: ("(", ")"),
    Shape.SINK: ("[\\", "/]"),
    Shape.STORE: ("[(", ")]"),
    Shape.TOPIC: ("[[", "]]"),
    Shape.REPARTITION_TOPIC: ("{{", "}}"),
}


def to_mermaid(topology: Topology) -> str:
    """A Mermaid flowchart (GitHub and most wikis draw it)."""
    drawn = picture(topology)
    # Mermaid ids are bare words: number the boxes, keep the names as labels.
    ids = {box_id: f"n{index}" for index, box_id in enumerate(drawn.boxes)}
    clustered = {member for cluster in drawn.clusters for member in cluster.members}
    lines = ["flowchart TB"]
    for index, cluster in enumerate(drawn.clusters):
        lines.append(f'  subgraph s{index}["{_mermaid_escape(cluster.title)}"]')
        for member in cluster.members:
            lines.append(f"    {_mermaid_box(ids[member], drawn.boxes[member])}")
        lines.append("  end")
    for box in drawn.boxes.values():
        if box.id not in clustered:
            lines.append(f"  {_mermaid_box(ids[box.id], box)}")
    for tail, head, dashed in drawn.edges:
        arrow = "-.-" if dashed else "-->"
        lines.append(f"  {ids[tail]} {arrow} {ids[head]}")
    return "\n".join(lines) + "\n"


def _mermaid_box(mermaid_id: str, box: Box) -> str:
    opening, closing = _MERMAID_SHAPES[box.shape]
    return f'{mermaid_id}{opening}"{_mermaid_escape(box.label)}"{closing}'


def _mermaid_escape(text: str) -> str:
    return text.replace('"', "#quot;")


def to_svg(topology: Topology) -> str:
    """The dot drawing laid out by Graphviz's ``dot`` program, as SVG text."""
    program = shutil.which("dot")
    if program is None:
        raise PictureError(
            "drawing SVG needs Graphviz's dot program, which is not on PATH: install the "
            f"Debian package {GRAPHVIZ_PACKAGE} (make graphviz, or apt-get install "
            f"{GRAPHVIZ_PACKAGE}), or use --format dot or --format mermaid"
        )
    try:
        done = subprocess.run(
            [program, "-Tsvg"],
            input=to_dot(topology),
            capture_output=True,
            text=True,
            timeout=_DOT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise PictureError(
            f"Graphviz's dot ({program}) did not finish within {_DOT_TIMEOUT_S} s; "
            "draw with --format dot and lay it out elsewhere"
        ) from None
    if done.returncode != 0:
        raise PictureError(
            f"Graphviz's dot ({program}) failed with exit code {done.returncode}: "
            f"{done.stderr.strip()}; check the Graphviz install ({GRAPHVIZ_PACKAGE})"
        )
    return done.stdout
