"""Kafka Streams' ``Topology.describe()`` text, character for character, and its hash.

Users paste ``describe()`` into Kafka's visualisers and diff it between
revisions, and the operator compares its hash across pods; so the text is
Kafka 4.4's ``InternalTopologyBuilder.TopologyDescription.toString()``, not
a look-alike. Kafka's order of things comes from its Java collections, and
this module reproduces each one:

- sub-topologies by id, then each global store as ``Sub-topology: N for
  global store (will not generate tasks)``. eddyline numbers global stores
  after the sub-topologies (its task ids never skip a number for them), which
  is Kafka's numbering when the global stores are added last;
- a sub-topology's nodes by the size of the graph below them, largest first,
  then by name (``NodeComparator``);
- a node's ``-->`` successors and ``<--`` predecessors in ``TreeSet``\\ s
  ordered by that comparator *at the moment each edge was added*: Kafka adds
  the edges while the sizes are still growing, visiting nodes in ``HashMap``
  order, so both are replayed here (a red-black tree, as ``java.util.TreeMap``);
- a processor's stores and a source's topics in ``HashSet`` order (by bucket
  of ``String.hashCode``).

Checked against Kafka 4.4's own output (tests/unit/processing/test_description.py
names the topologies and Kafka tests it was compared with).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


# What describe() reads of a Topology, so that this module sits below topology.py (which
# calls it) and imports nothing of it.
class _NodeView(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def parents(self) -> Sequence[str]: ...
    @property
    def topics(self) -> Sequence[str]: ...
    @property
    def stores(self) -> Sequence[str]: ...


class _GlobalStoreView(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def topic(self) -> str: ...
    @property
    def source_name(self) -> str: ...
    @property
    def processor_name(self) -> str: ...


class _SubTopologyView(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def nodes(self) -> Sequence[str]: ...


class _TopologyView(Protocol):
    @property
    def nodes(self) -> Mapping[str, _NodeView]: ...
    @property
    def global_stores(self) -> Mapping[str, _GlobalStoreView]: ...
    def subtopologies(self) -> Sequence[_SubTopologyView]: ...


# How many hex digits of the SHA-256 a describe hash keeps: 64 bits tell topologies apart
# and still fit a status line (the pods' membership reports carry the same 16).
DESCRIBE_HASH_DIGITS = 16


def describe_hash(description: str) -> str:
    """A short, stable fingerprint of a topology's ``describe()`` text: equal texts, equal
    hashes, on every machine and Python version (the operator compares the pods')."""
    return hashlib.sha256(description.encode()).hexdigest()[:DESCRIBE_HASH_DIGITS]


def describe(topology: _TopologyView) -> str:
    """The topology in Kafka Streams' ``describe()`` text (see the module docstring)."""
    entries: list[str] = []
    subtopologies = topology.subtopologies()
    for sub in subtopologies:
        nodes = _described_nodes(topology, sub.nodes)
        ordered = sorted(nodes.values(), key=lambda n: (-n.size, n.name))
        body = "".join(f"    {_node_text(node)}\n" for node in ordered)
        entries.append(f"Sub-topology: {sub.id}\n{body}\n")
    for offset, spec in enumerate(topology.global_stores.values()):
        source, processor = spec.source_name, spec.processor_name
        entries.append(
            f"Sub-topology: {len(subtopologies) + offset} for global store "
            "(will not generate tasks)\n"
            f"    Source: {source} (topics: [{spec.topic}])\n      --> {processor}\n"
            f"    Processor: {processor} (stores: [{spec.name}])\n"
            f"      --> none\n      <-- {source}\n"
        )
    # Kafka writes "Topologies:\n " and then "  " before every entry: the first line is
    # indented by three spaces, the others by two.
    return "Topologies:\n " + "".join(f"  {entry}" for entry in entries)


@dataclass(eq=False)
class _DescribedNode:
    """Kafka's ``AbstractNode``: ``size`` counts the node and every path below it."""

    name: str
    kind: str
    topics: tuple[str, ...]
    stores: tuple[str, ...]
    size: int = 1
    predecessors: _KafkaTreeSet = field(init=False)
    successors: _KafkaTreeSet = field(init=False)

    def __post_init__(self) -> None:
        self.predecessors = _KafkaTreeSet(_node_order)
        self.successors = _KafkaTreeSet(_node_order)


def _node_order(a: _DescribedNode, b: _DescribedNode) -> int:
    """Kafka's ``NodeComparator``: the larger sub-graph first, then the name."""
    if a is b:
        return 0
    if a.size != b.size:
        return b.size - a.size
    return (a.name > b.name) - (a.name < b.name)


def _described_nodes(topology: _TopologyView, names: Sequence[str]) -> dict[str, _DescribedNode]:
    """``InternalTopologyBuilder.describeSubtopology``: nodes connected in HashMap order."""
    nodes: dict[str, _DescribedNode] = {}
    for name in names:
        node = topology.nodes[name]
        # Kafka lists only the stores connected to a processor: a global store is read
        # without being connected (Kafka refuses to connect one), so it is left out.
        local = [store for store in node.stores if store not in topology.global_stores]
        # Both are copied into a new HashSet when Kafka describes the node.
        topics = _hash_set_order(node.topics, _copied_capacity(len(node.topics)))
        stores = _hash_set_order(local, _copied_capacity(len(local)))
        nodes[name] = _DescribedNode(name, node.kind, tuple(topics), tuple(stores))
    for name in _hash_set_order(names, _grown_capacity(len(names))):
        described = nodes[name]
        for parent_name in topology.nodes[name].parents:
            parent = nodes[parent_name]
            described.predecessors.add(parent)
            parent.successors.add(described)
            _grow(parent, described.size)
    return nodes


def _grow(node: _DescribedNode, delta: int) -> None:
    """Kafka's ``updateSize``: every node above gains the new edge's sub-graph."""
    node.size += delta
    for predecessor in node.predecessors:
        _grow(predecessor, delta)


def _node_text(node: _DescribedNode) -> str:
    successors = _names(node.successors)
    predecessors = _names(node.predecessors)
    if node.kind == "source":
        return f"Source: {node.name} (topics: [{', '.join(node.topics)}])\n      --> {successors}"
    if node.kind == "sink":
        return f"Sink: {node.name} (topic: {node.topics[0]})\n      <-- {predecessors}"
    return (
        f"Processor: {node.name} (stores: [{', '.join(node.stores)}])\n"
        f"      --> {successors}\n      <-- {predecessors}"
    )


def _names(nodes: _KafkaTreeSet) -> str:
    return ", ".join(node.name for node in nodes) or "none"


# Java's HashMap: a table of 16 buckets that doubles whenever it holds more than 3/4 of
# its capacity; a copy (new HashSet<>(c)) starts at the capacity for c.size() / 0.75 + 1.
_JAVA_INITIAL_CAPACITY = 16
_JAVA_LOAD_FACTOR = 0.75


def _grown_capacity(size: int) -> int:
    capacity = _JAVA_INITIAL_CAPACITY
    while size > capacity * _JAVA_LOAD_FACTOR:
        capacity *= 2
    return capacity


def _copied_capacity(size: int) -> int:
    wanted = max(int(size / _JAVA_LOAD_FACTOR) + 1, _JAVA_INITIAL_CAPACITY)
    capacity = 1
    while capacity < wanted:
        capacity *= 2
    return capacity


def _java_string_hash(text: str) -> int:
    """``String.hashCode()`` over UTF-16 code units, as an unsigned 32-bit number."""
    data = text.encode("utf-16-be")
    value = 0
    for index in range(0, len(data), 2):
        value = (31 * value + int.from_bytes(data[index : index + 2], "big")) & 0xFFFFFFFF
    return value


def _hash_set_order(items: Sequence[str], capacity: int) -> list[str]:
    """A Java HashSet's iteration order: by bucket (``HashMap.hash`` spreads the high bits
    down), and in insertion order within a bucket."""

    def bucket(text: str) -> int:
        value = _java_string_hash(text)
        return (value ^ (value >> 16)) & (capacity - 1)

    positions = {item: index for index, item in reversed(list(enumerate(items)))}
    return sorted(dict.fromkeys(items), key=lambda item: (bucket(item), positions[item]))


class _RedBlackNode:
    __slots__ = ("black", "item", "left", "parent", "right")

    def __init__(self, item: _DescribedNode, parent: _RedBlackNode | None) -> None:
        self.item = item
        self.parent = parent
        self.left: _RedBlackNode | None = None
        self.right: _RedBlackNode | None = None
        self.black = True


class _KafkaTreeSet:
    """``java.util.TreeSet`` with a comparator that may change its mind: an element's place
    is decided by the comparisons made when it is added (``TreeMap.put`` and its
    red-black rebalancing), and never revisited; Kafka's node sizes grow after the fact."""

    def __init__(self, compare: Callable[[_DescribedNode, _DescribedNode], int]) -> None:
        self._compare = compare
        self._root: _RedBlackNode | None = None

    def __iter__(self) -> Iterator[_DescribedNode]:
        stack: list[_RedBlackNode] = []
        current = self._root
        while stack or current is not None:
            while current is not None:
                stack.append(current)
                current = current.left
            current = stack.pop()
            yield current.item
            current = current.right

    def add(self, item: _DescribedNode) -> None:
        if self._root is None:
            self._root = _RedBlackNode(item, None)
            return
        parent = self._root
        while True:
            order = self._compare(item, parent.item)
            if order == 0:
                return
            child = parent.left if order < 0 else parent.right
            if child is None:
                break
            parent = child
        node = _RedBlackNode(item, parent)
        if order < 0:
            parent.left = node
        else:
            parent.right = node
        self._rebalance(node)

    def _rebalance(self, node: _RedBlackNode) -> None:
        """``TreeMap.fixAfterInsertion``, branch for branch."""
        node.black = False
        x: _RedBlackNode | None = node
        while x is not None and x is not self._root and not _black(x.parent):
            parent = _parent(x)
            grandparent = _parent(parent)
            if parent is _left(grandparent):
                uncle = _right(grandparent)
                if not _black(uncle):
                    _paint(parent, black=True)
                    _paint(uncle, black=True)
                    _paint(grandparent, black=False)
                    x = grandparent
                else:
                    if x is _right(parent):
                        x = parent
                        self._rotate_left(x)
                    _paint(_parent(x), black=True)
                    _paint(_parent(_parent(x)), black=False)
                    self._rotate_right(_parent(_parent(x)))
            else:
                uncle = _left(grandparent)
                if not _black(uncle):
                    _paint(parent, black=True)
                    _paint(uncle, black=True)
                    _paint(grandparent, black=False)
                    x = grandparent
                else:
                    if x is _left(parent):
                        x = parent
                        self._rotate_right(x)
                    _paint(_parent(x), black=True)
                    _paint(_parent(_parent(x)), black=False)
                    self._rotate_left(_parent(_parent(x)))
        assert self._root is not None
        self._root.black = True

    def _rotate_left(self, p: _RedBlackNode | None) -> None:
        if p is None or p.right is None:
            return
        r = p.right
        p.right = r.left
        if r.left is not None:
            r.left.parent = p
        r.parent = p.parent
        if p.parent is None:
            self._root = r
        elif p.parent.left is p:
            p.parent.left = r
        else:
            p.parent.right = r
        r.left = p
        p.parent = r

    def _rotate_right(self, p: _RedBlackNode | None) -> None:
        if p is None or p.left is None:
            return
        left = p.left
        p.left = left.right
        if left.right is not None:
            left.right.parent = p
        left.parent = p.parent
        if p.parent is None:
            self._root = left
        elif p.parent.right is p:
            p.parent.right = left
        else:
            p.parent.left = left
        left.right = p
        p.parent = left


# TreeMap's null-tolerant helpers: a missing node is black and has no relatives.
def _black(node: _RedBlackNode | None) -> bool:
    return node is None or node.black


def _parent(node: _RedBlackNode | None) -> _RedBlackNode | None:
    return None if node is None else node.parent


def _left(node: _RedBlackNode | None) -> _RedBlackNode | None:
    return None if node is None else node.left


def _right(node: _RedBlackNode | None) -> _RedBlackNode | None:
    return None if node is None else node.right


def _paint(node: _RedBlackNode | None, *, black: bool) -> None:
    if node is not None:
        node.black = black
