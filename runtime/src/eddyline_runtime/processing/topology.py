"""Topologies: sources, processors, sinks and state stores, as Kafka Streams draws them.

A :class:`Topology` is a graph of named nodes. Sources read topics, processors
receive records from their parents and forward to their children, sinks write
topics. Stores are attached to the processors that use them. Nodes connected
by edges or by a shared store form a *sub-topology*; sub-topologies are
numbered by position (the order in which their first node was added), as in
Kafka Streams, and a task is one sub-topology on one input partition, named
``<sub-topology>_<partition>``. A store's state lives under
``state.dir/<task id>/<store name>``.

This module is the Processor API; the DSL builds on it.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from eddyline_runtime import partitions
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.processing import description
from eddyline_runtime.resource_names import GeneratedName, ResourceKind, explicit_naming_error

# Record headers, as the log carries them: (name, value) pairs, names may repeat.
Headers = tuple[tuple[str, bytes], ...]


class RecordContext(NamedTuple):
    """Where a record came from: what Kafka Streams' ``ProcessorRecordContext`` carries.

    A punctuation runs with its own context: its time, no headers and no
    topic (``topic`` None, ``partition`` and ``offset`` -1).
    """

    timestamp: int
    headers: Headers = ()
    topic: str | None = None
    partition: int = -1
    offset: int = -1


@dataclass(frozen=True, slots=True)
class Change:
    """An update as downstream sees it: the new value and the one it replaces.

    ``context`` is the record context of the write that produced ``new`` (the
    record cache forwards a key's update with it); it takes no part in
    equality: two changes are equal by their values.
    """

    new: bytes | None
    old: bytes | None
    context: RecordContext | None = field(default=None, compare=False)


class TopologyError(EddylineError, ValueError):
    """A topology that cannot be built: a duplicate name, an unknown parent or store."""


class PunctuationType(enum.StrEnum):
    """What drives a punctuation (Kafka's ``PunctuationType``).

    ``STREAM_TIME``: the task's stream time (the largest timestamp it has
    processed), so it advances only with input; ``WALL_CLOCK_TIME``: the
    system clock, checked by the stream thread on every loop, input or not.
    """

    STREAM_TIME = "STREAM_TIME"
    WALL_CLOCK_TIME = "WALL_CLOCK_TIME"


# Called with the punctuation's time: the stream time, or the wall-clock time in ms.
Punctuator = Callable[[int], None]


class Cancellable(Protocol):
    """What ``schedule`` returns: ``cancel()`` stops further punctuations."""

    def cancel(self) -> None: ...


class NodeSensor(Protocol):
    """What a processor records into one of its node's metrics (see
    :meth:`ProcessorContext.node_sensor`)."""

    def record(self, value: float = 1.0) -> None: ...

    def record_many(self, count: int, total: float, maximum: float) -> None:
        """``count`` values at once, given their sum and largest."""
        ...


class ProcessorContext(Protocol):
    """What a processor may do while it processes a record (or punctuates)."""

    def forward(
        self,
        key: Any,
        value: Any,
        *,
        to: str | None = None,
        timestamp: int | None = None,
        headers: Headers | None = None,
    ) -> None:
        """Send a record to the children (or to the child named ``to``); it carries the
        current record's timestamp and headers unless ``timestamp``/``headers`` are given."""

    def get_state_store(self, name: str) -> Any:
        """A store attached to this processor."""

    def schedule(
        self, interval_ms: int, punctuation_type: PunctuationType, punctuator: Punctuator
    ) -> Cancellable:
        """Call ``punctuator`` every ``interval_ms`` of stream time or wall-clock time."""

    def commit(self) -> None:
        """Ask for a commit as soon as the current record (or punctuation) is done."""

    def record_dropped(self) -> None:
        """Count the record being processed as dropped (the task's ``dropped-records``
        metric, as Kafka's ``droppedRecordsSensor``): late, or without a key."""

    def node_sensor(self, name: str) -> NodeSensor:
        """This node's sensor ``name`` (Kafka's ``stream-processor-node-metrics``, tagged
        ``processor-node-id``): a name ending in ``-latency`` (ms), and Kafka's
        ``suppression-buffer-size``/``-count``, are published as ``<name>-avg`` and
        ``<name>-max`` of the values recorded, any other as ``<name>-total`` (their sum)
        and ``<name>-rate`` (per second). Ask in ``init``:
        a sensor first asked for later is counted but not published."""

    @property
    def timestamp(self) -> int:
        """The timestamp of the record being processed (a punctuation's: its time)."""

    @property
    def headers(self) -> Headers:
        """The headers of the record being processed; forwarded records carry them."""

    @property
    def topic(self) -> str | None:
        """The topic the record came from; None in a punctuation."""

    @property
    def partition(self) -> int:
        """The partition the record came from; -1 in a punctuation."""

    @property
    def offset(self) -> int:
        """The record's offset in its partition; -1 in a punctuation."""

    @property
    def stream_time(self) -> int:
        """The largest timestamp this task has processed since it started (-1: none yet)."""

    @property
    def record_lateness(self) -> int:
        """How far the record being processed is behind stream time (0: not late)."""

    @property
    def task_id(self) -> str:
        """The task this processor instance runs in, ``<sub-topology>_<partition>``."""


class Processor(abc.ABC):
    """A node's logic. ``init`` runs once per task, before the first record."""

    def init(self, context: ProcessorContext) -> None:
        self.context = context

    @abc.abstractmethod
    def process(self, key: Any, value: Any) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what ``init`` acquired."""


ProcessorSupplier = Callable[[], Processor]


class Items(NamedTuple):
    """Records inside a batch, as columns: no object per record.

    ``indices[i]`` is the index, in the batch, of the input record that
    ``keys[i]``/``values[i]`` came from: it finds the input's timestamp and
    offset (a flat_map repeats it).
    """

    keys: Sequence[Any]
    values: Sequence[Any]
    indices: Sequence[int]


class RecordFailedError(Exception):
    """Raised by a batch step: the input record at ``index`` of the batch failed.

    ``partial``: the step had already applied part of the batch (a store write
    failed midway), so it cannot be run again record by record; else the step
    applied none of the batch, and the runtime retries it one record at a time
    so one bad record does not fail the others.
    """

    def __init__(self, index: int, cause: BaseException, *, partial: bool = False) -> None:
        super().__init__(index, cause)
        self.index = index
        self.cause = cause
        self.partial = partial


class BatchProcessor(Processor):
    """A processor the runtime may hand a whole batch of records at once.

    Only the DSL's own processors are batch processors: each runs the user's
    function once per record, as the per-record path would, and returns what
    it forwards, in order. The runtime batches a source only when every node
    below it forms one chain of batch processors ending in a sink (or
    nothing), so depth-first and batch-at-a-time order give the same outputs.
    """

    @property
    def batchable(self) -> bool:
        """Whether this instance may run batch-at-a-time (see the class docstring)."""
        return True

    @abc.abstractmethod
    def process_batch(
        self, items: Items, timestamps: Sequence[int], at: Callable[[int], None]
    ) -> Items:
        """Process ``items`` in order; return the forwarded items. ``at(i)`` makes
        input ``i``'s timestamp the current one (for stores that keep it).
        A failing record raises :class:`RecordFailedError` with its index."""


@dataclass(frozen=True)
class StoreSpec:
    """A key-value store: its name, whether it persists (RocksDB) and has a changelog.

    The serdes say how its bytes read (interactive queries render keys and
    values with them); None means raw bytes. ``window_retention_ms`` makes it
    a window store keeping each window that long (size + grace for a windowed
    aggregation), ``session_retention_ms`` a session store keeping each session
    that long after its end (gap + grace); either gives its changelog
    ``cleanup.policy=compact,delete``. A windowed aggregation's window store
    also says its windows' size (``window_size_ms``: a window ends at start +
    size) and that its values carry the newest record's timestamp
    (``timestamped``, :mod:`eddyline_runtime.value_and_timestamp`), so that
    queries can answer windows and aggregates. ``cached`` puts the thread's
    record cache (KIP-63) in front of the store; off, every update is written
    and forwarded (``Materialized.with_caching_disabled``). ``versioned_history_ms``
    makes it a versioned store (KIP-889) keeping old versions queryable that long
    (:mod:`eddyline_runtime.state.versioned_store`).
    """

    name: str
    persistent: bool = True
    logged: bool = True
    key_serde: str | None = None
    value_serde: str | None = None
    window_retention_ms: int | None = None
    session_retention_ms: int | None = None
    window_size_ms: int | None = None
    timestamped: bool = False
    cached: bool = True
    versioned_history_ms: int | None = None
    # Its changelog's topic configs (Materialized.with_logging_enabled), sorted pairs:
    # cleanup.policy and retention.ms of a key-value store (processing.materialized).
    changelog_configs: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.changelog_configs and self.retention_ms is not None:
            raise TopologyError(
                f'store "{self.name}": a window or session store\'s changelog is '
                "compact,delete with retention.ms = the store's retention + "
                "windowstore.changelog.additional.retention.ms (as Kafka Streams sets it), "
                "so it takes no changelog configs: use Materialized.with_retention, or that "
                "setting"
            )
        if self.changelog_configs and not self.logged:
            raise TopologyError(
                f'store "{self.name}": changelog configs for a store without a changelog; '
                "drop them, or enable logging"
            )

    @property
    def retention_ms(self) -> int | None:
        """A window or session store's retention; None for a key-value store."""
        if self.window_retention_ms is not None:
            return self.window_retention_ms
        return self.session_retention_ms

    def changelog_topic(self, application_id: str) -> str:
        return partitions.changelog_topic(application_id, self.name)


@dataclass(frozen=True)
class GlobalStoreSpec:
    """A global store (Kafka's ``addGlobalStore`` / ``GlobalKTable``): every instance
    holds all of ``topic``, read by its global thread, not by a task.

    The source topic is its changelog: the store keeps the topic's key and value
    bytes as they are (a tombstone deletes), restores by reading the topic from the
    offsets it committed, and has no changelog, standbys or task of its own. The
    serdes say how the topic's bytes read (joins and queries use them).
    """

    store: StoreSpec
    topic: str
    # The names describe() gives its source and processor, as Kafka's addGlobalStore takes
    # them (the DSL's globalTable names them KSTREAM-SOURCE-n and KTABLE-SOURCE-n+1);
    # empty: named after the store.
    source: str = ""
    processor: str = ""

    @property
    def name(self) -> str:
        return self.store.name

    @property
    def source_name(self) -> str:
        return self.source or f"{self.name}-global-source"

    @property
    def processor_name(self) -> str:
        return self.processor or f"{self.name}-global-processor"


@dataclass
class Node:
    name: str
    kind: str  # "source", "processor" or "sink"
    parents: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    topics: tuple[str, ...] = ()  # a source's inputs or a sink's output
    supplier: ProcessorSupplier | None = None
    stores: list[str] = field(default_factory=list)
    # Serdes by name (see eddyline_runtime.serde); None: bytes pass through.
    key_serde: str | None = None
    value_serde: str | None = None


@dataclass(frozen=True)
class SubTopology:
    id: int
    nodes: tuple[str, ...]
    source_topics: tuple[str, ...]
    sink_topics: tuple[str, ...]
    stores: tuple[str, ...]

    def task_id(self, partition: int) -> str:
        return f"{self.id}_{partition}"


class Topology:
    """A graph of nodes; build it with the ``add_*`` methods or through the DSL."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.stores: dict[str, StoreSpec] = {}
        # Stores every instance holds in full, fed by their topic, not by a task: they
        # are no sub-topology's (processors reach them read-only; see GlobalStoreSpec).
        self.global_stores: dict[str, GlobalStoreSpec] = {}
        # Topics the topology owns (repartition topics): the runtime creates
        # them, prefixed with the application.id.
        self.internal_topics: list[str] = []
        # Stores and internal topics the DSL named itself (Kafka's numbering): name ->
        # (kind, the DSL call, how to name it). See eddyline_runtime.resource_names.
        self._generated: dict[str, tuple[ResourceKind, str, str]] = {}

    def note_generated(
        self, name: str, kind: ResourceKind, *, operation: str, way_out: str
    ) -> None:
        """Record that the DSL generated ``name`` (a store or internal topic) for
        ``operation``; ``way_out`` says which parameter names it instead."""
        self._generated[name] = (kind, operation, way_out)

    def generated_names(self) -> list[GeneratedName]:
        """Every generated store and internal topic name, with its meaning as the
        ``describe()`` graph gives it (the processors using it, the topics its writing
        sub-topology reads), in the order they were generated."""
        if not self._generated:
            return []
        inputs_of = {
            node: tuple(sorted(sub.source_topics))
            for sub in self.subtopologies()
            for node in sub.nodes
        }
        names = []
        for name, (kind, operation, way_out) in self._generated.items():
            if kind is ResourceKind.STATE_STORE:
                users = [n for n in self.nodes.values() if name in n.stores]
                writers = users
            else:
                writers = [n for n in self.nodes.values() if n.kind == "sink" and name in n.topics]
                readers = [
                    n for n in self.nodes.values() if n.kind == "source" and name in n.topics
                ]
                users = writers + readers
            spec = self.stores.get(name)
            names.append(
                GeneratedName(
                    name,
                    kind,
                    operation,
                    way_out,
                    attached=tuple(sorted(n.name for n in users)),
                    inputs=tuple(sorted({t for n in writers for t in inputs_of[n.name]})),
                    logged=spec is not None and spec.persistent and spec.logged,
                )
            )
        return names

    def ensure_explicit_naming(self) -> None:
        """KIP-1111's ``ensure.explicit.internal.resource.naming``: refuse this topology
        if any store or internal topic has a generated name, listing every one."""
        names = self.generated_names()
        if names:
            raise TopologyError("Invalid topology: " + explicit_naming_error(names))

    def add_source(
        self,
        name: str,
        topics: Sequence[str],
        *,
        key_serde: str | None = None,
        value_serde: str | None = None,
    ) -> Topology:
        if not topics:
            raise TopologyError(f'source "{name}" needs at least one topic')
        taken = {
            t: f'source "{n.name}"'
            for n in self.nodes.values()
            if n.kind == "source"
            for t in n.topics
        }
        taken.update({g.topic: f'global store "{g.name}"' for g in self.global_stores.values()})
        for topic in topics:
            if topic in taken:
                raise TopologyError(
                    f'topic "{topic}" is already read by {taken[topic]}; '
                    "a topic can feed one source"
                )
        self._add(
            Node(name, "source", topics=tuple(topics), key_serde=key_serde, value_serde=value_serde)
        )
        return self

    def add_processor(self, name: str, supplier: ProcessorSupplier, *parents: str) -> Topology:
        self._add(Node(name, "processor", supplier=supplier), parents)
        return self

    def add_sink(
        self,
        name: str,
        topic: str,
        *parents: str,
        key_serde: str | None = None,
        value_serde: str | None = None,
    ) -> Topology:
        self._add(
            Node(name, "sink", topics=(topic,), key_serde=key_serde, value_serde=value_serde),
            parents,
        )
        return self

    def add_state_store(self, spec: StoreSpec, *processors: str) -> Topology:
        if spec.name in self.stores and self.stores[spec.name] != spec:
            raise TopologyError(f'store "{spec.name}" is already defined differently')
        self.stores[spec.name] = spec
        for processor in processors:
            node = self._node(processor, f'store "{spec.name}"')
            if node.kind != "processor":
                raise TopologyError(f'store "{spec.name}" can only attach to processors')
            node.stores.append(spec.name)
        return self

    def add_global_store(self, spec: GlobalStoreSpec) -> Topology:
        """A store every instance holds in full, kept by the global thread from ``spec.topic``."""
        name = spec.name
        if name in self.stores or name in self.global_stores:
            raise TopologyError(f'a store named "{name}" already exists; store names are unique')
        taken = {t: n.name for n in self.nodes.values() if n.kind == "source" for t in n.topics}
        global_topics = {g.topic: g.name for g in self.global_stores.values()}
        if spec.topic in taken or spec.topic in global_topics:
            reader = taken.get(spec.topic) or f'global store "{global_topics[spec.topic]}"'
            raise TopologyError(
                f'topic "{spec.topic}" is already read by {reader}; a global store needs a '
                "topic of its own (it is the store's changelog)"
            )
        if not spec.store.persistent or not spec.store.logged:
            raise TopologyError(
                f'global store "{name}" must be persistent and keep its source topic as its '
                "changelog: drop with_logging_disabled / persistent=False from its Materialized"
            )
        if spec.store.retention_ms is not None:
            raise TopologyError(f'global store "{name}" is a key-value store, not a window store')
        for node_name in (spec.source_name, spec.processor_name):
            if node_name in self.nodes or node_name in self._global_node_names():
                raise TopologyError(
                    f'global store "{name}": a node named "{node_name}" already exists; '
                    "node names are unique (give the global store's source and processor "
                    "other names)"
                )
        self.global_stores[name] = spec
        return self

    def _global_node_names(self) -> set[str]:
        return {n for g in self.global_stores.values() for n in (g.source_name, g.processor_name)}

    def connect_global_store(self, name: str, *processors: str) -> Topology:
        """Let ``processors`` read the global store ``name`` (read-only: it is written only
        from its topic). Unlike a task store it does not tie them into one sub-topology."""
        if name not in self.global_stores:
            known = ", ".join(sorted(self.global_stores)) or "none"
            raise TopologyError(f'no global store named "{name}" (global stores: {known})')
        for processor in processors:
            node = self._node(processor, f'global store "{name}"')
            if node.kind != "processor":
                raise TopologyError(f'global store "{name}" can only attach to processors')
            node.stores.append(name)
        return self

    def subtopologies(self) -> list[SubTopology]:
        """Connected groups of nodes (edges and shared stores), numbered by position."""
        group_of: dict[str, str] = {name: name for name in self.nodes}

        def root(name: str) -> str:
            while group_of[name] != name:
                group_of[name] = group_of[group_of[name]]
                name = group_of[name]
            return name

        def join(a: str, b: str) -> None:
            group_of[root(a)] = root(b)

        by_store: dict[str, str] = {}
        for node in self.nodes.values():
            for parent in node.parents:
                join(node.name, parent)
            for store in node.stores:
                if store in self.global_stores:
                    continue  # every task reads it; it ties no nodes together
                if store in by_store:
                    join(node.name, by_store[store])
                by_store.setdefault(store, node.name)
        groups: dict[str, list[Node]] = {}
        for node in self.nodes.values():  # insertion order: the first node fixes the position
            groups.setdefault(root(node.name), []).append(node)
        return [
            SubTopology(
                id=index,
                nodes=tuple(n.name for n in members),
                source_topics=tuple(t for n in members if n.kind == "source" for t in n.topics),
                sink_topics=tuple(t for n in members if n.kind == "sink" for t in n.topics),
                stores=tuple(
                    dict.fromkeys(
                        s for n in members for s in n.stores if s not in self.global_stores
                    )
                ),
            )
            for index, members in enumerate(groups.values())
        ]

    def describe(self) -> str:
        """The topology in Kafka Streams' ``describe()`` text, exactly as Kafka prints it
        (:mod:`eddyline_runtime.processing.description` says how)."""
        return description.describe(self)

    def _add(self, node: Node, parents: Sequence[str] = ()) -> None:
        if node.name in self.nodes or node.name in self._global_node_names():
            raise TopologyError(f'a node named "{node.name}" already exists; names are unique')
        if node.kind != "source" and not parents:
            raise TopologyError(f'{node.kind} "{node.name}" needs at least one parent')
        for parent in parents:
            parent_node = self._node(parent, f'{node.kind} "{node.name}"')
            if parent_node.kind == "sink":
                raise TopologyError(f'sink "{parent}" cannot be a parent of "{node.name}"')
        self.nodes[node.name] = node
        for parent in parents:
            node.parents.append(parent)
            self.nodes[parent].children.append(node.name)

    def _node(self, name: str, wanted_by: str) -> Node:
        node = self.nodes.get(name)
        if node is None:
            known = ", ".join(self.nodes) or "none"
            raise TopologyError(f'{wanted_by} refers to unknown node "{name}" (nodes: {known})')
        return node
