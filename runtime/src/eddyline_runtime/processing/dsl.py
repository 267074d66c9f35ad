"""The DSL: ``stream(...).map_values(...).group_by(...).count(...)``, as in Kafka Streams.

Each operation adds nodes to a :class:`~eddyline_runtime.processing.topology.Topology`,
named as Kafka Streams names them (``KSTREAM-MAPVALUES-0000000001``).
Re-keying before an aggregation (``group_by``) goes through a *repartition
topic*, so records with the same new key meet in the same task: the
aggregation reads that topic and therefore starts a new sub-topology.
Repartition topics are internal: the runtime prefixes them with the
``application.id`` when it creates them.

Keys and values inside the DSL are Python objects; serdes convert at sources,
sinks and stores (``count`` stores keys with the stream's key serde and counts
as Kafka longs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, overload

from eddyline_runtime.processing.joins import JoinWindows, ValueJoiner
from eddyline_runtime.processing.materialized import (
    Materialized,
    as_materialized,
    key_value_store,
    store_retention_ms,
)
from eddyline_runtime.processing.operators.aggregations import (
    NO_VALUE,
    AggregateProcessor,
    add_counts,
    count_one_less,
    count_one_more,
    merging,
    reducing,
    subtracting,
)
from eddyline_runtime.processing.operators.foreign_key_joins import (
    ForeignKeyJoin,
    ForeignTableJoinProcessor,
    ResponseResolverProcessor,
    SubscriptionJoinProcessor,
    SubscriptionReceiveProcessor,
    SubscriptionSendProcessor,
)
from eddyline_runtime.processing.operators.joins import (
    GlobalTableJoin,
    GlobalTableJoinProcessor,
    JoinSideStoreProcessor,
    JoinWindowBuffer,
    JoinWindowBufferProcessor,
    StreamStreamJoin,
    StreamStreamJoinProcessor,
    StreamTableJoin,
    StreamTableJoinProcessor,
    TableTableJoin,
    TableTableJoinProcessor,
    join_store_names,
)
from eddyline_runtime.processing.operators.stream_steps import (
    FORWARD_STEP,
    PassThrough,
    SplitProcessor,
    Step,
    StepProcessor,
    filter_step,
    flat_map_step,
    flat_map_values_step,
    map_step,
    map_values_step,
    peek_step,
    select_key_step,
)
from eddyline_runtime.processing.operators.suppress import Suppression, SuppressProcessor
from eddyline_runtime.processing.operators.tables import (
    OldValues,
    TableAggregateProcessor,
    TableFilterProcessor,
    TableMapValuesProcessor,
    TableMaterializeProcessor,
    TableRegroupProcessor,
    TableSourceProcessor,
    TableToStreamProcessor,
    as_change,
)
from eddyline_runtime.processing.operators.value_processors import (
    ProcessValuesProcessor,
    StreamTransformValuesProcessor,
    TableTransformValuesProcessor,
    ValueTransformerSupplier,
)
from eddyline_runtime.processing.operators.windowed import (
    SessionAggregateProcessor,
    SessionWindowedAggregation,
    SlidingWindowAggregateProcessor,
    SlidingWindowedAggregation,
    WindowAggregateProcessor,
    WindowedAggregation,
)
from eddyline_runtime.processing.topology import (
    GlobalStoreSpec,
    Processor,
    StoreSpec,
    Topology,
    TopologyError,
)
from eddyline_runtime.processing.windows import (
    SessionWindows,
    SlidingWindows,
    Suppressed,
    TimeWindows,
)
from eddyline_runtime.resource_names import ResourceKind
from eddyline_runtime.serde import serde_for

# A GlobalKTable join's key mapper: (stream key, stream value) -> the table's key.
KeyMapper = Callable[[Any, Any], Any]


class StreamsBuilder:
    def __init__(self) -> None:
        self.topology = Topology()
        self._index = 0

    @property
    def internal_topics(self) -> list[str]:
        return self.topology.internal_topics

    def stream(
        self, topic: str, *, key_serde: str | None = None, value_serde: str | None = None
    ) -> KStream:
        name = self._name("KSTREAM-SOURCE")
        self.topology.add_source(name, [topic], key_serde=key_serde, value_serde=value_serde)
        return KStream(self, name, key_serde)

    def table(
        self,
        topic: str,
        store: str | Materialized,
        *,
        key_serde: str | None = None,
        value_serde: str | None = None,
    ) -> KTable:
        """The latest value per key of ``topic``, materialized in ``store`` (a name or a
        ``Materialized``; the topic's serdes unless it gives others; every version with
        ``Materialized.as_versioned``)."""
        materialized = key_value_store(as_materialized(store), versioned=True)
        # As Kafka Streams' Consumed and Materialized: each side's serdes default to the
        # other's, so the topic is read and the store written with the serdes given.
        store_keys = materialized.key_serde or key_serde
        store_values = materialized.value_serde or value_serde
        source = self._name("KTABLE-SOURCE")
        self.topology.add_source(
            source,
            [topic],
            key_serde=key_serde or store_keys,
            value_serde=value_serde or store_values,
        )
        name = self._name("KTABLE-MATERIALIZE")
        key_serde, value_serde = store_keys, store_values
        keys, values = serde_for(key_serde), serde_for(value_serde)
        old_values = OldValues()
        table = materialized.store_name
        self.topology.add_processor(
            name, lambda: TableSourceProcessor(table, keys, values, old_values), source
        )
        self.topology.add_state_store(_store_spec(materialized, key_serde, value_serde), name)
        return KTable(
            self, name, key_serde, store=table, value_serde=value_serde, old_values=old_values
        )

    def global_table(
        self,
        topic: str,
        store: str | Materialized,
        *,
        key_serde: str | None = None,
        value_serde: str | None = None,
    ) -> GlobalKTable:
        """``topic`` read in full by every instance into the global store ``store``
        (Kafka Streams' ``globalTable``), to be joined with a stream through a key mapper.

        The topic is the store's changelog: the store holds its key and value bytes as
        they are, so the serdes are the topic's (a ``Materialized``'s, if it gives them).
        Every instance loads it before processing starts and keeps it current; it has
        no task, standbys, Spark restore builds or relocation (see docs/joins.md).
        """
        materialized = key_value_store(as_materialized(store))
        if not materialized.logging_enabled:
            raise TopologyError(
                f'global table "{materialized.store_name}": its topic is its changelog, so '
                "logging cannot be disabled; drop with_logging_disabled"
            )
        key_serde = materialized.key_serde or key_serde
        value_serde = materialized.value_serde or value_serde
        spec = StoreSpec(
            materialized.store_name, key_serde=key_serde, value_serde=value_serde, cached=False
        )
        # Kafka's globalTable names a source and a processor, and so takes two numbers.
        source, processor = self._name("KSTREAM-SOURCE"), self._name("KTABLE-SOURCE")
        self.topology.add_global_store(GlobalStoreSpec(spec, topic, source, processor))
        return GlobalKTable(self, materialized.store_name, topic, key_serde, value_serde)

    def build(self) -> Topology:
        return self.topology

    def _name(self, prefix: str) -> str:
        name = f"{prefix}-{self._index:010d}"
        self._index += 1
        return name


class GlobalKTable:
    """A table every instance holds whole (``StreamsBuilder.global_table``): a stream joins
    it through a key mapper, without co-partitioning."""

    def __init__(
        self,
        builder: StreamsBuilder,
        store: str,
        topic: str,
        key_serde: str | None,
        value_serde: str | None,
    ) -> None:
        self._builder = builder
        self.store = store
        self.topic = topic
        self.key_serde = key_serde
        self.value_serde = value_serde

    def queryable_store_name(self) -> str:
        """The store's name, for interactive queries (Kafka's ``queryableStoreName``)."""
        return self.store


class KStream:
    """A record stream: every record is an independent event."""

    def __init__(self, builder: StreamsBuilder, node: str, key_serde: str | None) -> None:
        self._builder = builder
        self._node = node
        self._key_serde = key_serde
        # Keys may have changed since the last read of a topic (map, flat_map,
        # select_key, process): a join would meet records in the wrong partition.
        self._rekeyed = False

    def map_values(self, mapper: Callable[[Any], Any]) -> KStream:
        return self._then("KSTREAM-MAPVALUES", map_values_step(mapper))

    def map(self, mapper: Callable[[Any, Any], tuple[Any, Any]]) -> KStream:
        return self._then("KSTREAM-MAP", map_step(mapper))._rekey()

    def filter(self, predicate: Callable[[Any, Any], bool]) -> KStream:
        return self._then("KSTREAM-FILTER", filter_step(predicate))

    def flat_map(self, mapper: Callable[[Any, Any], Iterable[tuple[Any, Any]]]) -> KStream:
        return self._then("KSTREAM-FLATMAP", flat_map_step(mapper))._rekey()

    def flat_map_values(self, mapper: Callable[[Any], Iterable[Any]]) -> KStream:
        return self._then("KSTREAM-FLATMAPVALUES", flat_map_values_step(mapper))

    def peek(self, action: Callable[[Any, Any], None]) -> KStream:
        return self._then("KSTREAM-PEEK", peek_step(action))

    def to(
        self, topic: str, *, key_serde: str | None = None, value_serde: str | None = None
    ) -> None:
        name = self._builder._name("KSTREAM-SINK")
        self._builder.topology.add_sink(
            name, topic, self._node, key_serde=key_serde, value_serde=value_serde
        )

    @overload
    def join(self, other: KTable, joiner: ValueJoiner) -> KStream: ...

    @overload
    def join(
        self, other: GlobalKTable, key_mapper: KeyMapper, joiner: ValueJoiner, /
    ) -> KStream: ...

    @overload
    def join(
        self,
        other: KStream,
        joiner: ValueJoiner,
        windows: JoinWindows,
        *,
        store_name: str,
        value_serde: str | None = "json",
        other_value_serde: str | None = "json",
    ) -> KStream: ...

    def join(
        self,
        other: KTable | KStream | GlobalKTable,
        joiner: ValueJoiner,
        windows: JoinWindows | ValueJoiner | None = None,
        *,
        store_name: str | None = None,
        value_serde: str | None = "json",
        other_value_serde: str | None = "json",
    ) -> KStream:
        """Inner join with a table (each record meets the table's current value for its
        key) or, given ``windows``, with another stream (records of both within the
        windows). See :mod:`~eddyline_runtime.processing.joins` for the semantics.

        With a :class:`GlobalKTable` the arguments are Kafka's ``join(globalTable,
        keyMapper, joiner)``: each record meets the global table's value for
        ``key_mapper(key, value)``; no co-partitioning is needed.

        Both inputs must be co-partitioned (same key, same partition count): the join
        reads their stores in the same task. A stream-stream join buffers both sides
        in window stores named from ``store_name`` (required, Kafka Streams'
        ``StreamJoined.withStoreName``), their values stored with the serdes given.
        """
        return self._join(
            other, joiner, windows, store_name, value_serde, other_value_serde, "inner"
        )

    @overload
    def left_join(self, other: KTable, joiner: ValueJoiner) -> KStream: ...

    @overload
    def left_join(
        self, other: GlobalKTable, key_mapper: KeyMapper, joiner: ValueJoiner, /
    ) -> KStream: ...

    @overload
    def left_join(
        self,
        other: KStream,
        joiner: ValueJoiner,
        windows: JoinWindows,
        *,
        store_name: str,
        value_serde: str | None = "json",
        other_value_serde: str | None = "json",
    ) -> KStream: ...

    def left_join(
        self,
        other: KTable | KStream | GlobalKTable,
        joiner: ValueJoiner,
        windows: JoinWindows | ValueJoiner | None = None,
        *,
        store_name: str | None = None,
        value_serde: str | None = "json",
        other_value_serde: str | None = "json",
    ) -> KStream:
        """``join``, keeping every record of this stream: ``joiner(value, None)`` when it
        has no partner (for a stream-stream join, once its window has closed; with a
        GlobalKTable, also when the key mapper returns None)."""
        return self._join(
            other, joiner, windows, store_name, value_serde, other_value_serde, "left"
        )

    def outer_join(
        self,
        other: KStream,
        joiner: ValueJoiner,
        windows: JoinWindows,
        *,
        store_name: str,
        value_serde: str | None = "json",
        other_value_serde: str | None = "json",
    ) -> KStream:
        """A windowed stream-stream join keeping the records of both sides: a record
        without a partner gives ``joiner(left, None)`` or ``joiner(None, right)`` once
        its window has closed."""
        return self._join(
            other, joiner, windows, store_name, value_serde, other_value_serde, "outer"
        )

    def _join(  # noqa: PLR0917 - the public join methods' parameters, passed on
        self,
        other: KTable | KStream | GlobalKTable,
        joiner: ValueJoiner,
        windows: JoinWindows | ValueJoiner | None,
        store_name: str | None,
        value_serde: str | None,
        other_value_serde: str | None,
        kind: str,
    ) -> KStream:
        if isinstance(other, GlobalKTable):
            # Kafka's join(globalTable, keyMapper, joiner): the second argument maps.
            if kind == "outer" or store_name is not None or not callable(windows):
                raise TopologyError(
                    "a stream-GlobalKTable join is join(global_table, key_mapper, joiner) or "
                    "left_join(global_table, key_mapper, joiner): a key mapper (key, value) -> "
                    "the table's key, then the joiner; it takes no JoinWindows, store_name or "
                    "outer form"
                )
            return _global_table_join(self, other, joiner, windows, left=kind == "left")
        if windows is not None and not isinstance(windows, JoinWindows):
            raise TopologyError(
                "the third argument of a stream-stream join is JoinWindows; a joiner there "
                "is for a GlobalKTable join (join(global_table, key_mapper, joiner))"
            )
        for stream in (self, other):
            if isinstance(stream, KStream) and stream._rekeyed:
                raise TopologyError(
                    "a join input's keys may have changed since it was read (map, flat_map, "
                    "select_key or process), so its records may sit in the wrong partition for "
                    'the join: call .repartition("<name>") on it before joining'
                )
        if isinstance(other, KTable):
            if windows is not None or kind == "outer":
                raise TopologyError(
                    "a stream-table join takes no JoinWindows and has no outer form: the "
                    "table's current value is what a record meets"
                )
            return _stream_table_join(self, other, joiner, left=kind == "left")
        if not isinstance(other, KStream) or not isinstance(windows, JoinWindows):
            raise TopologyError(
                "a stream-stream join needs the other KStream and JoinWindows "
                "(JoinWindows.of_time_difference_with_grace(...)); a stream-table join a KTable"
            )
        if not store_name:
            raise TopologyError(
                "a stream-stream join needs store_name (Kafka Streams' "
                "StreamJoined.withStoreName): it names both window stores and their "
                "changelogs, which must not change when the topology changes elsewhere"
            )
        return _stream_stream_join(
            self, other, joiner, windows, store_name, value_serde, other_value_serde, kind
        )

    def select_key(self, mapper: Callable[[Any, Any], Any]) -> KStream:
        """Re-key each record with ``mapper(key, value)`` (no repartition: call
        ``repartition`` before a join or aggregation that needs the new key's partition)."""
        return self._then("KSTREAM-KEY-SELECT", select_key_step(mapper))._rekey()

    def merge(self, other: KStream) -> KStream:
        """Both streams' records in one stream, in the order the task processes them."""
        name = self._builder._name("KSTREAM-MERGE")
        self._builder.topology.add_processor(name, PassThrough, self._node, other._node)
        merged = KStream(self._builder, name, self._key_serde)
        merged._rekeyed = self._rekeyed or other._rekeyed
        return merged

    def repartition(
        self,
        name: str,
        *,
        key_serde: str = "string",
        value_serde: str = "json",
    ) -> KStream:
        """Write through the internal topic ``<name>-repartition`` and read it back, so
        records are partitioned by their current key (Kafka Streams' ``repartition``
        with ``Repartitioned.as(name)``). The name is required: a generated one would
        shift when the topology changes before it, stranding the records still in the
        old topic at an upgrade."""
        if not name:
            raise TopologyError(
                "repartition needs a name (Kafka Streams' Repartitioned.as): it names the "
                "internal topic, which must not change when the topology changes elsewhere"
            )
        builder = self._builder
        topic = f"{name}-repartition"
        builder.internal_topics.append(topic)
        builder.topology.add_sink(
            builder._name("KSTREAM-SINK"),
            topic,
            self._node,
            key_serde=key_serde,
            value_serde=value_serde,
        )
        source = builder._name("KSTREAM-SOURCE")
        builder.topology.add_source(source, [topic], key_serde=key_serde, value_serde=value_serde)
        return KStream(builder, source, key_serde)

    def split(self, name: str = "") -> BranchedKStream:
        """Route each record to the first branch whose predicate it passes (Kafka Streams'
        ``split(Named.as(name))``); branch names are prefixed with ``name``."""
        return BranchedKStream(self, name)

    def process(
        self,
        supplier: Callable[[], Processor],
        stores: Sequence[str | StoreSpec] = (),
    ) -> KStream:
        """Run a custom :class:`Processor` (one instance per task) with access to ``stores``.

        Stores given by name are persistent and logged; pass a ``StoreSpec``
        for an in-memory or unlogged one. Whatever the processor forwards
        continues down the returned stream.
        """
        name = self._builder._name("KSTREAM-PROCESSOR")
        self._builder.topology.add_processor(name, supplier, self._node)
        _connect_stores(self._builder, name, stores)
        # A processor may forward other keys (Kafka Streams marks process() output so, KIP-820).
        return KStream(self._builder, name, self._key_serde)._rekey()

    def process_values(
        self,
        supplier: Callable[[], Processor],
        stores: Sequence[str | StoreSpec] = (),
    ) -> KStream:
        """Kafka's ``processValues`` (KIP-820): ``process`` for a processor that keeps
        keys, so the stream below is not re-keyed (a ``group_by_key`` after it needs no
        repartition topic). A forward under another key than the record's, or from a
        punctuation, raises :class:`TopologyError` naming ``process`` as the way out."""
        name = self._builder._name("KSTREAM-PROCESSVALUES")
        self._builder.topology.add_processor(
            name, lambda: ProcessValuesProcessor(supplier()), self._node
        )
        _connect_stores(self._builder, name, stores)
        stream = KStream(self._builder, name, self._key_serde)
        stream._rekeyed = self._rekeyed
        return stream

    def transform_values(
        self,
        supplier: ValueTransformerSupplier,
        stores: Sequence[str | StoreSpec] = (),
    ) -> KStream:
        """Kafka's ``KStream.transformValues``: each record's value replaced by
        ``transform(key, value)`` of a :class:`ValueTransformerWithKey` (one per task,
        from ``supplier``) that may use ``stores``; keys are kept."""
        name = self._builder._name("KSTREAM-TRANSFORMVALUES")
        self._builder.topology.add_processor(
            name, lambda: StreamTransformValuesProcessor(supplier()), self._node
        )
        _connect_stores(self._builder, name, stores)
        stream = KStream(self._builder, name, self._key_serde)
        stream._rekeyed = self._rekeyed
        return stream

    def group_by_key(self) -> KGroupedStream:
        return KGroupedStream(self._builder, self._node, self._key_serde)

    def group_by(
        self,
        selector: Callable[[Any, Any], Any],
        *,
        key_serde: str = "string",
        value_serde: str = "json",
        repartition_name: str | None = None,
    ) -> KGroupedStream:
        """Re-key by ``selector``; the aggregation reads a repartition topic.

        The topic is ``<repartition_name>-repartition`` (Kafka Streams' ``Grouped.as``), else
        named after a generated node name, which shifts when a topology change adds nodes
        before it: records still in the old topic at such an upgrade would never be read, so
        an operator upgrade that renumbers it is refused, and
        ``ensure.explicit.internal.resource.naming`` refuses it outright (docs/joins.md,
        "Names of stores and internal topics")."""
        rekeyed = self._then("KSTREAM-KEY-SELECT", select_key_step(selector))
        builder = self._builder
        generated = builder._name("KSTREAM-AGGREGATE-STATE-STORE")
        topic = f"{repartition_name or generated}-repartition"
        builder.internal_topics.append(topic)
        if not repartition_name:
            builder.topology.note_generated(
                topic,
                ResourceKind.REPARTITION_TOPIC,
                operation="KStream.group_by",
                way_out='name it with group_by(..., repartition_name="<name>") '
                "(Kafka's Grouped.as); "
                f'repartition_name="{generated}" keeps this name',
            )
        builder.topology.add_sink(
            builder._name("KSTREAM-SINK"),
            topic,
            rekeyed._node,
            key_serde=key_serde,
            value_serde=value_serde,
        )
        source = builder._name("KSTREAM-SOURCE")
        builder.topology.add_source(source, [topic], key_serde=key_serde, value_serde=value_serde)
        return KGroupedStream(builder, source, key_serde)

    def _then(self, prefix: str, step: Step) -> KStream:
        name = self._builder._name(prefix)
        self._builder.topology.add_processor(name, partial(StepProcessor, step), self._node)
        stream = KStream(self._builder, name, self._key_serde)
        stream._rekeyed = self._rekeyed
        return stream

    def _rekey(self) -> KStream:
        self._rekeyed = True
        return self


class KGroupedStream:
    def __init__(self, builder: StreamsBuilder, node: str, key_serde: str | None) -> None:
        self._builder = builder
        self._node = node
        self._key_serde = key_serde

    def count(self, store: str | Materialized) -> KTable:
        """Count records per key in ``store`` (as Kafka longs); forwards each new count."""
        return self.aggregate(lambda: 0, count_one_more, store, "long")

    def reduce(
        self,
        reducer: Callable[[Any, Any], Any],
        store: str | Materialized,
        value_serde: str = "json",
    ) -> KTable:
        """Combine each key's values with ``reducer(aggregate, value)``; the first value seeds."""
        return self.aggregate(
            lambda: NO_VALUE,
            reducing(reducer, empty=NO_VALUE),
            store,
            value_serde,
        )

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        store: str | Materialized,
        value_serde: str = "json",
    ) -> KTable:
        """``aggregator(key, value, aggregate)`` per record, kept in ``store`` (a name or a
        ``Materialized``, whose serdes win over the stream's and ``value_serde``)."""
        materialized = key_value_store(as_materialized(store))
        key_serde = materialized.key_serde or self._key_serde
        value_serde = materialized.value_serde or value_serde
        table = materialized.store_name
        name = self._builder._name("KSTREAM-AGGREGATE")
        keys, values = serde_for(key_serde), serde_for(value_serde)
        self._builder.topology.add_processor(
            name,
            lambda: AggregateProcessor(table, keys, values, initializer, aggregator),
            self._node,
        )
        self._builder.topology.add_state_store(
            _store_spec(materialized, key_serde, value_serde), name
        )
        return KTable(self._builder, name, key_serde, store=table, value_serde=value_serde)

    @overload
    def windowed_by(self, windows: TimeWindows) -> TimeWindowedKStream: ...

    @overload
    def windowed_by(self, windows: SessionWindows) -> SessionWindowedKStream: ...

    @overload
    def windowed_by(self, windows: SlidingWindows) -> SlidingWindowedKStream: ...

    def windowed_by(
        self, windows: TimeWindows | SessionWindows | SlidingWindows
    ) -> TimeWindowedKStream | SessionWindowedKStream | SlidingWindowedKStream:
        """Aggregate per key *and* window: tumbling or hopping ``TimeWindows``,
        ``SessionWindows`` or ``SlidingWindows``."""
        if isinstance(windows, SlidingWindows):
            return SlidingWindowedKStream(self._builder, self._node, self._key_serde, windows)
        if isinstance(windows, TimeWindows):
            return TimeWindowedKStream(self._builder, self._node, self._key_serde, windows)
        if isinstance(windows, SessionWindows):
            return SessionWindowedKStream(self._builder, self._node, self._key_serde, windows)
        raise TopologyError(
            "windowed_by takes TimeWindows (TimeWindows.of_size_with_grace(...)), "
            "SessionWindows (SessionWindows.of_inactivity_gap_with_grace(...)) or "
            f"SlidingWindows (SlidingWindows.of_time_difference_and_grace(...)), got "
            f"{type(windows).__name__}"
        )


class TimeWindowedKStream:
    """A grouped stream cut into time windows; its aggregations are keyed by ``Windowed``.

    Each aggregation keeps its windows in the window store named ``store``
    (required: it names the store's directory and changelog, which must not
    change when the topology changes elsewhere). See
    :mod:`~eddyline_runtime.processing.windows` for window semantics.
    """

    def __init__(
        self, builder: StreamsBuilder, node: str, key_serde: str | None, windows: TimeWindows
    ) -> None:
        self._builder = builder
        self._node = node
        self._key_serde = key_serde
        self._windows = windows
        self._emit_final = False

    def emit_final(self) -> TimeWindowedKStream:
        """Forward each window's final result only, once, when it closes (Kafka's
        ``emitStrategy(EmitStrategy.onWindowClose())``); see ``WindowedKTable.suppress``."""
        self._emit_final = True
        return self

    def count(self, store: str | Materialized) -> KTable:
        """Records per key and window (Kafka longs)."""
        return self.aggregate(lambda: 0, count_one_more, store, "long")

    def reduce(
        self,
        reducer: Callable[[Any, Any], Any],
        store: str | Materialized,
        value_serde: str = "json",
    ) -> KTable:
        """Combine a window's values with ``reducer(aggregate, value)``; the first value seeds."""
        return self.aggregate(lambda: None, reducing(reducer), store, value_serde)

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        store: str | Materialized,
        value_serde: str = "json",
    ) -> KTable:
        """``aggregator(key, value, aggregate)`` per record and window, kept in ``store``
        (a name or a ``Materialized``: serdes, retention, caching)."""
        if not store:
            raise TopologyError(
                "a windowed aggregation needs a store name (Kafka Streams' Materialized.as): "
                "it names the store's directory and changelog across topology changes"
            )
        materialized = as_materialized(store)
        retention_ms = store_retention_ms(materialized, self._windows)
        key_serde = materialized.key_serde or self._key_serde
        value_serde = materialized.value_serde or value_serde
        table_store = materialized.store_name
        builder = self._builder
        name = builder._name("KSTREAM-AGGREGATE")
        operation = WindowedAggregation(
            table_store, self._windows, initializer, aggregator, key_serde, value_serde,
            emit_final=self._emit_final,
        )  # fmt: skip
        builder.topology.add_processor(
            name, partial(WindowAggregateProcessor, operation), self._node
        )
        builder.topology.add_state_store(
            _store_spec(
                materialized,
                key_serde,
                value_serde,
                window_retention_ms=retention_ms,
                window_size_ms=self._windows.size_ms,
                timestamped=True,
            ),
            name,
        )
        table = WindowedKTable(
            builder, name, key_serde, table_store, value_serde, kind="time",
            size_ms=self._windows.size_ms, close_after_ms=self._windows.grace_ms,
        )  # fmt: skip
        if not self._emit_final:
            return table
        return table._final_results(table_store, finals_forwarded=True)


class SessionWindowedKStream:
    """A grouped stream cut into sessions; its aggregations are keyed by ``Windowed``
    with a ``SessionWindow``. A merge forwards each merged session's removal (a None
    value) before the merged session. ``store`` is required, as for time windows."""

    def __init__(
        self, builder: StreamsBuilder, node: str, key_serde: str | None, windows: SessionWindows
    ) -> None:
        self._builder = builder
        self._node = node
        self._key_serde = key_serde
        self._windows = windows
        self._emit_final = False

    def emit_final(self) -> SessionWindowedKStream:
        """Forward each session's final result only, once stream time passes its end +
        gap + grace (Kafka's ``EmitStrategy.onWindowClose()``); merged-away sessions
        are never forwarded."""
        self._emit_final = True
        return self

    def count(self, store: str | Materialized) -> KTable:
        """Records per key and session (Kafka longs)."""
        return self.aggregate(lambda: 0, count_one_more, add_counts, store, "long")

    def reduce(
        self,
        reducer: Callable[[Any, Any], Any],
        store: str | Materialized,
        value_serde: str = "json",
    ) -> KTable:
        """Combine a session's values with ``reducer(aggregate, value)``; merging two
        sessions reduces the second into the first."""
        fold = reducing(reducer)
        return self.aggregate(lambda: None, fold, merging(fold), store, value_serde)

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        merger: Callable[[Any, Any, Any], Any],
        store: str | Materialized,
        value_serde: str = "json",
    ) -> KTable:
        """``aggregator(key, value, aggregate)`` per record; ``merger(key, aggregate,
        other)`` when a record bridges sessions. Kept in the session store ``store``."""
        if not store:
            raise TopologyError(
                "a session-windowed aggregation needs a store name (Kafka Streams' "
                "Materialized.as): it names the store's directory and changelog"
            )
        materialized = as_materialized(store)
        retention_ms = store_retention_ms(materialized, self._windows)
        key_serde = materialized.key_serde or self._key_serde
        value_serde = materialized.value_serde or value_serde
        table_store = materialized.store_name
        builder = self._builder
        name = builder._name("KSTREAM-AGGREGATE")
        operation = SessionWindowedAggregation(
            table_store, self._windows, initializer, aggregator, merger, key_serde, value_serde,
            retention_ms,
        )  # fmt: skip
        builder.topology.add_processor(
            name, partial(SessionAggregateProcessor, operation), self._node
        )
        builder.topology.add_state_store(
            _store_spec(materialized, key_serde, value_serde, session_retention_ms=retention_ms),
            name,
        )
        # A session is final once no record can reach it: gap + grace after its end.
        wait = self._windows.gap_ms + self._windows.grace_ms
        table = WindowedKTable(
            builder, name, key_serde, table_store, value_serde, kind="session", size_ms=0,
            close_after_ms=wait,
        )  # fmt: skip
        return table._final_results(table_store) if self._emit_final else table


class KTable:
    """A changelog stream: the latest value per key."""

    def __init__(
        self,
        builder: StreamsBuilder,
        node: str,
        key_serde: str | None,
        *,
        store: str | None = None,
        value_serde: str | None = None,
        old_values: OldValues | None = None,
    ) -> None:
        self._builder = builder
        self._node = node
        self.key_serde = key_serde
        self.store = store
        self.value_serde = value_serde
        # Set for tables whose nodes forward TableChange values (sources, table
        # operations, joins); None for aggregations, which forward new values only.
        self._old_values = old_values

    def to_stream(self) -> KStream:
        name = self._builder._name("KTABLE-TOSTREAM")
        if self._old_values is not None:  # a table forwarding changes: their new values
            self._builder.topology.add_processor(name, TableToStreamProcessor, self._node)
            return KStream(self._builder, name, self.key_serde)
        self._builder.topology.add_processor(name, partial(StepProcessor, FORWARD_STEP), self._node)
        return KStream(self._builder, name, self.key_serde)

    def suppress(self, suppressed: Suppressed) -> KTable:
        """Kafka Streams' ``suppress``: each key's updates are held in a buffer and only
        the latest is forwarded, ``Suppressed.until_time_limit(ms, buffer_config)`` after
        the key's first held update, or (``until_window_closes``, a windowed table) once
        its window closes. The buffer is a changelogged store committed with the task,
        named ``suppressed.name`` or ``<table store>-suppress-buffer``; see docs/windows.md."""
        if not isinstance(suppressed, Suppressed):
            raise TopologyError(
                "suppress takes Suppressed.until_time_limit(...) or "
                f"Suppressed.until_window_closes(...), got {type(suppressed).__name__}"
            )
        buffer = suppressed.name
        if buffer is None and self.store is not None:
            buffer = f"{self.store}-suppress-buffer"
        if not buffer:
            raise TopologyError(
                "suppress on a table without a store names its buffer: "
                "Suppressed.until_time_limit(..., name=...). The name is the buffer's store "
                "and changelog, so it must not change when the topology changes"
            )
        return _suppression(self, buffer, suppressed)

    def filter(
        self,
        predicate: Callable[[Any, Any], bool],
        *,
        materialized: str | Materialized | None = None,
        value_serde: str | None = None,
    ) -> KTable:
        """The rows passing ``predicate(key, value)``; a failing update removes its key.
        With ``materialized`` (Kafka Streams' ``Materialized.as``), the result is kept in
        that store (values with ``value_serde``, the table's by default), so it can be
        queried and joined with a stream."""
        serde = value_serde or self.value_serde
        step = self._table_step(
            "KTABLE-FILTER", lambda cell: TableFilterProcessor(predicate, True, cell), serde
        )
        return step._materialize(materialized, serde)

    def filter_not(
        self,
        predicate: Callable[[Any, Any], bool],
        *,
        materialized: str | Materialized | None = None,
        value_serde: str | None = None,
    ) -> KTable:
        """The rows failing ``predicate(key, value)``; ``materialized`` as for ``filter``."""
        serde = value_serde or self.value_serde
        step = self._table_step(
            "KTABLE-FILTER", lambda cell: TableFilterProcessor(predicate, False, cell), serde
        )
        return step._materialize(materialized, serde)

    def map_values(
        self,
        mapper: Callable[[Any], Any],
        *,
        materialized: str | Materialized | None = None,
        value_serde: str = "json",
    ) -> KTable:
        """Each row's value mapped; ``materialized`` keeps the result in that store.
        ``value_serde`` is how mapped values serialize (in that store, or a join's)."""
        step = self._table_step(
            "KTABLE-MAPVALUES", lambda cell: TableMapValuesProcessor(mapper, cell), value_serde
        )
        return step._materialize(materialized, value_serde)

    def transform_values(
        self,
        supplier: ValueTransformerSupplier,
        *,
        materialized: str | Materialized | None = None,
        value_serde: str = "json",
        stores: Sequence[str | StoreSpec] = (),
    ) -> KTable:
        """Kafka's ``KTable.transformValues``: each row's value replaced by
        ``transform(key, value)`` of a :class:`ValueTransformerWithKey` (one per task, from
        ``supplier``) that may use ``stores``. It is called for tombstones too (value None)
        and what it returns is the row's new value. When a node below needs old values,
        a table not ``materialized`` transforms the old value again, which suits a
        transformer that depends on its input only; materialize a stateful one so old
        values come from the store (see
        :mod:`~eddyline_runtime.processing.operators.value_processors`)."""
        step = self._table_step(
            "KTABLE-TRANSFORMVALUES",
            lambda cell: TableTransformValuesProcessor(supplier(), cell),
            value_serde,
        )
        _connect_stores(self._builder, step._node, stores)
        return step._materialize(materialized, value_serde)

    @overload
    def join(
        self,
        other: KTable,
        joiner: ValueJoiner,
        *,
        store_name: str,
        materialized: str | Materialized | None = None,
        value_serde: str = "json",
    ) -> KTable: ...

    @overload
    def join(
        self,
        other: KTable,
        foreign_key_extractor: Callable[[Any], Any],
        joiner: ValueJoiner,
        /,
        *,
        name: str | None = None,
        materialized: str | Materialized | None = None,
        value_serde: str = "json",
    ) -> KTable: ...

    def join(
        self,
        other: KTable,
        joiner: Callable[..., Any],  # the joiner, or the foreign-key extractor
        foreign_key_joiner: ValueJoiner | None = None,
        *,
        store_name: str | None = None,
        name: str | None = None,
        materialized: str | Materialized | None = None,
        value_serde: str = "json",
    ) -> KTable:
        """Inner table-table join on the key; results are table changes. ``store_name``
        names the stores each side keeps its table in (``<store_name>-left-store``,
        ``-right-store``); ``materialized`` keeps the result in a store too.

        ``join(other, foreign_key_extractor, joiner)`` is Kafka's foreign-key join
        (KIP-213): each row meets ``other``'s row whose key is
        ``foreign_key_extractor(value)``; ``name`` (Kafka's ``TableJoined.withName``)
        names its internal topics and store, else they are generated as Kafka's are.
        See :mod:`~eddyline_runtime.processing.operators.foreign_key_joins`."""
        if foreign_key_joiner is not None or name is not None:
            return _foreign_key_join(
                self, other, joiner, foreign_key_joiner, name, store_name, materialized,
                value_serde, left=False,
            )  # fmt: skip
        return _table_table_join(
            self, other, joiner, store_name or "", ("inner", "inner"), materialized, value_serde
        )

    @overload
    def left_join(
        self,
        other: KTable,
        joiner: ValueJoiner,
        *,
        store_name: str,
        materialized: str | Materialized | None = None,
        value_serde: str = "json",
    ) -> KTable: ...

    @overload
    def left_join(
        self,
        other: KTable,
        foreign_key_extractor: Callable[[Any], Any],
        joiner: ValueJoiner,
        /,
        *,
        name: str | None = None,
        materialized: str | Materialized | None = None,
        value_serde: str = "json",
    ) -> KTable: ...

    def left_join(
        self,
        other: KTable,
        joiner: Callable[..., Any],  # the joiner, or the foreign-key extractor
        foreign_key_joiner: ValueJoiner | None = None,
        *,
        store_name: str | None = None,
        name: str | None = None,
        materialized: str | Materialized | None = None,
        value_serde: str = "json",
    ) -> KTable:
        """Every row of this table, joined with ``other``'s row or None; with a foreign-key
        extractor (``left_join(other, foreign_key_extractor, joiner)``), with the row of
        ``other`` its foreign key names, or None (also for a null foreign key)."""
        if foreign_key_joiner is not None or name is not None:
            return _foreign_key_join(
                self, other, joiner, foreign_key_joiner, name, store_name, materialized,
                value_serde, left=True,
            )  # fmt: skip
        return _table_table_join(
            self, other, joiner, store_name or "", ("left", "right"), materialized, value_serde
        )

    def outer_join(
        self,
        other: KTable,
        joiner: ValueJoiner,
        *,
        store_name: str,
        materialized: str | Materialized | None = None,
        value_serde: str = "json",
    ) -> KTable:
        """Every row of either table, joined with the other's row or None."""
        return _table_table_join(
            self, other, joiner, store_name, ("outer", "outer"), materialized, value_serde
        )

    def _materialize(
        self, store: str | Materialized | None, value_serde: str | None, node: str = ""
    ) -> KTable:
        if store is None:
            return self
        if not store:
            raise TopologyError("materialized names a store: give it a non-empty name")
        materialized = key_value_store(as_materialized(store))
        key_serde = materialized.key_serde or self.key_serde
        value_serde = materialized.value_serde or value_serde
        table = materialized.store_name
        builder = self._builder
        name = node or builder._name("KTABLE-MATERIALIZE")
        keys, values = serde_for(key_serde), serde_for(value_serde)
        cell = OldValues()  # old values come from the store, not from the node above
        builder.topology.add_processor(
            name, lambda: TableMaterializeProcessor(table, keys, values, cell), self._node
        )
        builder.topology.add_state_store(_store_spec(materialized, key_serde, value_serde), name)
        return KTable(
            builder, name, key_serde, store=table, value_serde=value_serde, old_values=cell
        )

    def group_by(
        self,
        selector: Callable[[Any, Any], tuple[Any, Any]],
        *,
        repartition_name: str,
        key_serde: str = "string",
    ) -> KGroupedTable:
        """Re-group the table by ``selector(key, value) -> (new key, new value)`` through the
        repartition topic ``<repartition_name>-repartition`` (values travel as JSON); the
        name is required, as for every internal topic of the table operations."""
        if not repartition_name:
            raise TopologyError(
                "a table's group_by needs repartition_name (Kafka Streams' Grouped.as): it "
                "names the internal topic, which must not change when the topology changes"
            )
        if self._old_values is None:
            raise TopologyError(
                "group_by on this table needs its old values, which an aggregation's result "
                "table does not forward yet: write it to a topic and read that with "
                "builder.table"
            )
        self._old_values.enable()
        builder = self._builder
        name = builder._name("KTABLE-SELECT")
        builder.topology.add_processor(name, lambda: TableRegroupProcessor(selector), self._node)
        topic = f"{repartition_name}-repartition"
        builder.internal_topics.append(topic)
        builder.topology.add_sink(
            builder._name("KSTREAM-SINK"), topic, name, key_serde=key_serde, value_serde="json"
        )
        source = builder._name("KSTREAM-SOURCE")
        builder.topology.add_source(source, [topic], key_serde=key_serde, value_serde="json")
        return KGroupedTable(builder, source, key_serde)

    def _table_step(
        self, prefix: str, make: Callable[[OldValues], Processor], value_serde: str | None
    ) -> KTable:
        """A table node; ``value_serde`` is how its values serialize (a join storing them)."""
        name = self._builder._name(prefix)
        # This node forwards old values when one below asks; then it needs its parent's.
        cell = OldValues(self._old_values)
        self._builder.topology.add_processor(name, lambda: make(cell), self._node)
        return KTable(self._builder, name, self.key_serde, value_serde=value_serde, old_values=cell)


class KGroupedTable:
    """A table re-grouped by ``KTable.group_by``: its aggregations add each new value
    and subtract each replaced one (Kafka Streams' ``KGroupedTable``)."""

    def __init__(self, builder: StreamsBuilder, node: str, key_serde: str | None) -> None:
        self._builder = builder
        self._node = node
        self._key_serde = key_serde

    def count(self, store: str | Materialized) -> KTable:
        """Rows per group (Kafka longs)."""
        return self.aggregate(lambda: 0, count_one_more, count_one_less, store, "long")

    def reduce(
        self,
        adder: Callable[[Any, Any], Any],
        subtractor: Callable[[Any, Any], Any],
        store: str | Materialized,
        value_serde: str = "json",
    ) -> KTable:
        """``adder(aggregate, value)`` for each new value (the first one seeds),
        ``subtractor(aggregate, value)`` for each replaced one."""
        return self.aggregate(
            lambda: None,
            reducing(adder),
            subtracting(subtractor),
            store,
            value_serde,
        )

    def aggregate(
        self,
        initializer: Callable[[], Any],
        adder: Callable[[Any, Any, Any], Any],
        subtractor: Callable[[Any, Any, Any], Any],
        store: str | Materialized,
        value_serde: str = "json",
    ) -> KTable:
        """``adder(key, value, aggregate)`` / ``subtractor(key, value, aggregate)``, kept in
        ``store``; forwards each group's new aggregate."""
        if not store:
            raise TopologyError("a table aggregation needs a store name (Materialized.as)")
        materialized = key_value_store(as_materialized(store))
        key_serde = materialized.key_serde or self._key_serde
        value_serde = materialized.value_serde or value_serde
        table = materialized.store_name
        builder = self._builder
        name = builder._name("KTABLE-AGGREGATE")
        keys, values = serde_for(key_serde), serde_for(value_serde)
        cell = OldValues()
        builder.topology.add_processor(
            name,
            lambda: TableAggregateProcessor(
                table,
                keys,
                values,
                initializer=initializer,
                adder=adder,
                subtractor=subtractor,
                old_values=cell,
            ),
            self._node,
        )
        builder.topology.add_state_store(_store_spec(materialized, key_serde, value_serde), name)
        return KTable(
            builder, name, key_serde, store=table, value_serde=value_serde, old_values=cell
        )


class BranchedKStream:
    """``KStream.split()``: ``branch(predicate, name)`` in order, then ``default_branch()``
    or ``no_default_branch()``, which return the branches by name (prefix + name, or
    prefix + position from 1; the default branch's position is 0). A record goes to the
    first branch it passes; one passing none goes to the default branch, or nowhere."""

    def __init__(self, stream: KStream, prefix: str) -> None:
        self._builder = stream._builder
        self._key_serde = stream._key_serde
        self._prefix = prefix or stream._builder._name("KSTREAM-BRANCH") + "-"
        self._routes: list[tuple[Callable[[Any, Any], bool] | None, str]] = []
        self._node = self._builder._name("KSTREAM-SPLIT")
        routes = self._routes
        self._builder.topology.add_processor(
            self._node, lambda: SplitProcessor(routes), stream._node
        )
        self._branches: dict[str, KStream] = {}

    def branch(
        self, predicate: Callable[[Any, Any], bool], name: str | None = None
    ) -> BranchedKStream:
        self._add(predicate, self._prefix + (name or str(len(self._routes) + 1)))
        return self

    def default_branch(self, name: str | None = None) -> dict[str, KStream]:
        self._add(None, self._prefix + (name or "0"))
        return dict(self._branches)

    def no_default_branch(self) -> dict[str, KStream]:
        return dict(self._branches)

    def _add(self, predicate: Callable[[Any, Any], bool] | None, name: str) -> None:
        if name in self._branches:
            raise TopologyError(f'split: a branch named "{name}" already exists')
        self._builder.topology.add_processor(name, PassThrough, self._node)
        self._routes.append((predicate, name))
        self._branches[name] = KStream(self._builder, name, self._key_serde)


def _connect_stores(builder: StreamsBuilder, node: str, stores: Sequence[str | StoreSpec]) -> None:
    """Attach ``stores`` to ``node``: a name is a persistent, logged key-value store; a
    ``StoreSpec`` says otherwise (in memory, unlogged)."""
    for store in stores:
        builder.topology.add_state_store(
            store if isinstance(store, StoreSpec) else StoreSpec(store), node
        )


def _stream_table_join(
    stream: KStream, table: KTable, joiner: ValueJoiner, *, left: bool
) -> KStream:
    if table.store is None:
        raise TopologyError(
            "a stream-table join needs a materialized table: builder.table, an "
            'aggregation\'s result, or a table operation given materialized="<store>"'
        )
    builder = stream._builder
    # Kafka's names: KStreamImpl.JOIN_NAME, or LEFTJOIN_NAME for a left join.
    name = builder._name("KSTREAM-LEFTJOIN" if left else "KSTREAM-JOIN")
    operation = StreamTableJoin(table.store, joiner, left, table.key_serde, table.value_serde)
    builder.topology.add_processor(name, partial(StreamTableJoinProcessor, operation), stream._node)
    builder.topology.add_state_store(builder.topology.stores[table.store], name)
    return KStream(builder, name, stream._key_serde)


def _global_table_join(
    stream: KStream,
    table: GlobalKTable,
    key_mapper: KeyMapper,
    joiner: ValueJoiner,
    *,
    left: bool,
) -> KStream:
    # No co-partitioning check: every task holds the whole table, so a re-keyed stream
    # joins as it is (Kafka needs no repartition before a GlobalKTable join either).
    builder = stream._builder
    name = builder._name("KSTREAM-LEFTJOIN" if left else "KSTREAM-JOIN")
    operation = GlobalTableJoin(
        table.store, key_mapper, joiner, left, table.key_serde, table.value_serde
    )
    builder.topology.add_processor(name, partial(GlobalTableJoinProcessor, operation), stream._node)
    builder.topology.connect_global_store(table.store, name)
    return KStream(builder, name, stream._key_serde)


def _stream_stream_join(  # noqa: PLR0917 - the public join methods' parameters, passed on
    this: KStream,
    other: KStream,
    joiner: ValueJoiner,
    windows: JoinWindows,
    store_name: str,
    value_serde: str | None,
    other_value_serde: str | None,
    kind: str,
) -> KStream:
    """Kafka Streams' KStreamImplJoin: a buffer and a join node per side, then a merge."""
    builder, topology = this._builder, this._builder.topology
    left_outer, right_outer = kind in ("left", "outer"), kind == "outer"
    this_store, other_store, shared = join_store_names(
        store_name, left_outer=left_outer, right_outer=right_outer
    )
    shared_store = shared if left_outer else None
    key_serde = this._key_serde
    this_window = builder._name("KSTREAM-JOINTHIS")
    other_window = builder._name("KSTREAM-JOINOTHER")
    this_buffer = JoinWindowBuffer(this_store, windows, key_serde, value_serde)
    other_buffer = JoinWindowBuffer(other_store, windows, key_serde, other_value_serde)
    topology.add_processor(this_window, partial(JoinWindowBufferProcessor, this_buffer), this._node)
    topology.add_processor(
        other_window, partial(JoinWindowBufferProcessor, other_buffer), other._node
    )
    this_join = builder._name("KSTREAM-OUTERTHIS" if right_outer else "KSTREAM-JOINTHIS")
    other_join = builder._name("KSTREAM-OUTEROTHER" if left_outer else "KSTREAM-JOINOTHER")
    left_side = StreamStreamJoin(
        left=True,
        this_store=this_store,
        other_store=other_store,
        shared_store=shared_store,
        time_key=this_store,
        windows=windows,
        joiner=joiner,
        outer=left_outer,
        key_serde=key_serde,
        left_value_serde=value_serde,
        right_value_serde=other_value_serde,
    )
    right_side = replace(
        left_side, left=False, this_store=other_store, other_store=this_store, outer=right_outer
    )
    topology.add_processor(this_join, partial(StreamStreamJoinProcessor, left_side), this_window)
    topology.add_processor(other_join, partial(StreamStreamJoinProcessor, right_side), other_window)
    for store, buffer in ((this_store, this_window), (other_store, other_window)):
        topology.add_state_store(
            StoreSpec(
                store,
                key_serde=key_serde,
                value_serde=None,  # several values per entry (joins.pack_values)
                window_retention_ms=windows.retention_ms,
            ),
            buffer,
            this_join,
            other_join,
        )
    if shared_store is not None:
        topology.add_state_store(StoreSpec(shared_store), this_join, other_join)
    merge = builder._name("KSTREAM-MERGE")
    topology.add_processor(merge, PassThrough, this_join, other_join)
    return KStream(builder, merge, key_serde)


def _table_table_join(  # noqa: PLR0917 (the three join methods' arguments, passed on)
    this: KTable,
    other: KTable,
    joiner: ValueJoiner,
    store_name: str,
    kinds: tuple[str, str],
    materialized: str | Materialized | None,
    value_serde: str,
) -> KTable:
    """Each side keeps its own timestamped copy of its table, then joins against the other's;
    results serialize with ``value_serde`` (stored in ``materialized``, or joined again)."""
    if not store_name:
        raise TopologyError(
            "a table-table join needs store_name: it names the stores both sides keep their "
            "tables in, which must not change when the topology changes elsewhere"
        )
    builder, topology = this._builder, this._builder.topology
    result = OldValues()
    stores = (f"{store_name}-left-store", f"{store_name}-right-store")
    sides = (this, other)
    joins = []
    for index, (side, kind) in enumerate(zip(sides, kinds, strict=True)):
        keys, values = serde_for(side.key_serde), serde_for(side.value_serde)
        store = stores[index]
        keep = builder._name("KTABLE-JOIN-STORE")
        topology.add_processor(
            keep,
            lambda store=store, keys=keys, values=values: JoinSideStoreProcessor(
                store, keys, values
            ),  # type: ignore[misc]
            side._node,
        )
        join = builder._name("KTABLE-JOINTHIS" if index == 0 else "KTABLE-JOINOTHER")
        spec = TableTableJoin(
            left=index == 0,
            other_store=stores[1 - index],
            joiner=joiner,
            kind=kind,
            key_serde=side.key_serde,
            other_value_serde=sides[1 - index].value_serde,
            send_old_values=result,
        )
        topology.add_processor(join, partial(TableTableJoinProcessor, spec), keep)
        joins.append((keep, join))
    for index, store in enumerate(stores):
        topology.add_state_store(
            StoreSpec(store, key_serde=sides[index].key_serde),
            joins[index][0],
            joins[1 - index][1],
        )
    merge = builder._name("KTABLE-MERGE")
    topology.add_processor(merge, PassThrough, joins[0][1], joins[1][1])
    joined = KTable(builder, merge, this.key_serde, old_values=result)
    joined.value_serde = value_serde  # how results serialize, stored or joined again
    return joined._materialize(materialized, value_serde)


def _foreign_key_join(  # noqa: PLR0917 - the public join methods' arguments, passed on
    this: KTable,
    other: KTable,
    extractor: Callable[[Any], Any],
    joiner: ValueJoiner | None,
    name: str | None,
    store_name: str | None,
    materialized: str | Materialized | None,
    value_serde: str,
    *,
    left: bool,
) -> KTable:
    """Kafka's ``KTableImpl.doJoinOnForeignKey``: the nodes, topics and store of a
    foreign-key join, named as Kafka names them (``<name>-...`` given a name)."""
    if joiner is None or store_name is not None or not callable(extractor):
        raise TopologyError(
            "a foreign-key table join is join(other, foreign_key_extractor, joiner, name=...) "
            "(or left_join): the extractor value -> other's key, then the joiner; store_name "
            "is for the join on the key"
        )
    if name == "":
        raise TopologyError(
            "a foreign-key join's name names its internal topics: give a non-empty one"
        )
    for side, table in (("left", this), ("right", other)):
        if table.store is None:
            raise TopologyError(
                f"a foreign-key join reads the {side} table's store, and this table has none: "
                'pass materialized="<store>" to the operation that made it'
            )
    if this._old_values is None:
        raise TopologyError(
            "a foreign-key join needs the left table's old values (to unsubscribe a changed "
            "foreign key), which an aggregation's result does not forward yet: write it to a "
            "topic and read that with builder.table"
        )
    this._old_values.enable()
    builder, topology = this._builder, this._builder.topology
    assert this.store is not None and other.store is not None

    def named(suffix: str, prefix: str) -> str:
        # Kafka's NamedInternal.suffixWithOrElseGet: a given name still burns an index,
        # so naming one join does not renumber the nodes after it.
        generated = builder._name(prefix)
        return f"{name}{suffix}" if name else generated

    fk = "KTABLE-FK-JOIN-SUBSCRIPTION-"
    # Every name first, in Kafka's order of numbering (KTableImpl.doJoinOnForeignKey).
    registration = named("-subscription-registration", f"{fk}REGISTRATION") + "-topic"
    send = named("-subscription-registration-processor", f"{fk}REGISTRATION")
    sink = named("-subscription-registration-sink", "KTABLE-SINK")
    source = named("-subscription-registration-source", "KTABLE-SOURCE")
    spec_store = named("-subscription-store", f"{fk}STATE-STORE")
    receive = named("-subscription-receive", f"{fk}PROCESSOR")
    join = named("-subscription-join-foreign", f"{fk}PROCESSOR")
    fan_out = named("-foreign-join-subscription", f"{fk}PROCESSOR")
    response = named("-subscription-response", f"{fk}RESPONSE") + "-topic"
    response_sink = named("-subscription-response-sink", "KTABLE-SINK")
    response_source = named("-subscription-response-source", "KTABLE-SOURCE")
    resolver = named("-subscription-response-resolver", f"{fk}RESPONSE-RESOLVER-PROCESSOR")
    result = named("-result", "KTABLE-FK-JOIN-OUTPUT")
    if materialized is None:
        builder._name("KTABLE-FK-JOIN-OUTPUT-STATE-STORE")  # Kafka numbers it even unused
    spec = ForeignKeyJoin(
        extractor, joiner, left, this.store, other.store, spec_store,
        this.key_serde, this.value_serde, other.key_serde, other.value_serde,
    )  # fmt: skip
    topology.internal_topics.extend((registration, response))
    _note_foreign_key_join_names(topology, name, (registration, spec_store, response), left=left)
    topology.add_processor(send, partial(SubscriptionSendProcessor, spec), this._node)
    # Subscriptions and responses are bytes of their own format (foreign_key_joins):
    # only the keys go through serdes, the foreign key the right table's (its partitioner).
    topology.add_sink(sink, registration, send, key_serde=other.key_serde)
    topology.add_source(source, [registration], key_serde=other.key_serde)
    topology.add_processor(receive, partial(SubscriptionReceiveProcessor, spec), source)
    topology.add_processor(join, partial(SubscriptionJoinProcessor, spec), receive)
    topology.add_processor(fan_out, partial(ForeignTableJoinProcessor, spec), other._node)
    topology.add_state_store(StoreSpec(spec_store, cached=False), receive, fan_out)
    topology.add_state_store(topology.stores[other.store], join)
    # A response is keyed by the left key's bytes as the subscription carried them.
    topology.add_sink(response_sink, response, join, fan_out)
    topology.add_source(response_source, [response], key_serde=this.key_serde)
    topology.add_processor(resolver, partial(ResponseResolverProcessor, spec), response_source)
    topology.add_state_store(topology.stores[this.store], resolver)
    if materialized is not None:
        resolved = KTable(builder, resolver, this.key_serde)
        return resolved._materialize(materialized, value_serde, node=result)
    topology.add_processor(result, PassThrough, resolver)
    joined = KTable(builder, result, this.key_serde)
    joined.value_serde = value_serde  # how results serialize, stored or joined again
    return joined


def _note_foreign_key_join_names(
    topology: Topology, name: str | None, generated: tuple[str, str, str], *, left: bool
) -> None:
    """Without ``name``, a foreign-key join's topics and subscription store (``generated``:
    registration topic, store, response topic) are generated names."""
    if name:
        return
    registration, store, response = generated
    way_out = (
        'name the join with name="<name>" (Kafka\'s TableJoined.withName): it names '
        "its topics and subscription store"
    )
    operation = "KTable.left_join (foreign key)" if left else "KTable.join (foreign key)"
    for resource, kind in (
        (registration, ResourceKind.REPARTITION_TOPIC),
        (store, ResourceKind.STATE_STORE),
        (response, ResourceKind.REPARTITION_TOPIC),
    ):
        topology.note_generated(resource, kind, operation=operation, way_out=way_out)


class SlidingWindowedKStream(TimeWindowedKStream):
    """A grouped stream over sliding windows (``SlidingWindows``): Kafka Streams'
    ``SlidingWindowedKStream``. Results are keyed ``Windowed(key, TimeWindow(start,
    start + time difference))``, both ends inclusive; ``store`` is required."""

    def __init__(
        self, builder: StreamsBuilder, node: str, key_serde: str | None, windows: SlidingWindows
    ) -> None:
        self._builder = builder
        self._node = node
        self._key_serde = key_serde
        self._sliding = windows
        self._emit_final = False

    def emit_final(self) -> SlidingWindowedKStream:
        """Forward each window's final result only, once stream time passes its end +
        grace (Kafka's ``EmitStrategy.onWindowClose()``)."""
        self._emit_final = True
        return self

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        store: str | Materialized,
        value_serde: str = "json",
    ) -> KTable:
        """``aggregator(key, value, aggregate)`` per record and window, kept in ``store``."""
        if not store:
            raise TopologyError(
                "a sliding-windowed aggregation needs a store name (Kafka Streams' "
                "Materialized.as): it names the store's directory and changelog"
            )
        builder, windows = self._builder, self._sliding
        materialized = as_materialized(store)
        retention_ms = store_retention_ms(materialized, windows)
        key_serde = materialized.key_serde or self._key_serde
        value_serde = materialized.value_serde or value_serde
        table_store = materialized.store_name
        name = builder._name("KSTREAM-AGGREGATE")
        operation = SlidingWindowedAggregation(
            table_store, windows, initializer, aggregator, key_serde, value_serde
        )
        builder.topology.add_processor(
            name, partial(SlidingWindowAggregateProcessor, operation), self._node
        )
        builder.topology.add_state_store(
            _store_spec(
                materialized,
                key_serde,
                value_serde,
                window_retention_ms=retention_ms,
                window_size_ms=windows.size_ms,
                timestamped=True,
            ),
            name,
        )
        table = WindowedKTable(
            builder, name, key_serde, table_store, value_serde, kind="sliding",
            size_ms=windows.size_ms, close_after_ms=windows.grace_ms,
        )  # fmt: skip
        return table._final_results(table_store) if self._emit_final else table


class WindowedKTable(KTable):
    """The table of a windowed aggregation: keys are ``Windowed``. Adds ``suppress``."""

    def __init__(
        self,
        builder: StreamsBuilder,
        node: str,
        inner_key_serde: str | None,
        store: str,
        value_serde: str | None,
        *,
        kind: str,
        size_ms: int,
        close_after_ms: int,
    ) -> None:
        super().__init__(builder, node, None, store=store, value_serde=value_serde)
        self._inner_key_serde = inner_key_serde
        self._window_kind = kind
        self._window_size_ms = size_ms
        # How long after a window's end it can still change: grace (sessions: gap + grace).
        self._close_after_ms = close_after_ms

    def _final_results(self, buffer: str, *, finals_forwarded: bool = False) -> KTable:
        """``emit_final``: the window-close suppression, buffered in ``<buffer>-final-buffer``;
        with ``finals_forwarded`` the aggregation emits its final results itself and the
        node passes them on (its buffer store stays, empty, so the topology is unchanged)."""
        return _suppression(
            self,
            f"{buffer}-final-buffer",
            Suppressed(),
            emit_final=True,
            finals_forwarded=finals_forwarded,
        )


def _new_value(value: Any) -> Any:
    return as_change(value).new


def _suppression(
    table: KTable,
    buffer: str,
    suppressed: Suppressed,
    *,
    emit_final: bool = False,
    finals_forwarded: bool = False,
) -> KTable:
    """The suppress node below ``table`` (processing/operators/suppress.py), buffering in
    the store ``buffer``; its table forwards new values only."""
    windowed = table if isinstance(table, WindowedKTable) else None
    wait = suppressed.time_to_wait_ms
    if wait is None and windowed is None:
        raise TopologyError(
            "Suppressed.until_window_closes needs the table of a windowed aggregation "
            "(windowed_by(...).count(...)); for any other table use "
            "Suppressed.until_time_limit(time_to_wait_ms, buffer_config)"
        )
    builder = table._builder
    name = builder._name("KTABLE-SUPPRESS")
    kind = None if windowed is None else windowed._window_kind
    if wait is None:  # until the window closes: its grace (sessions: gap + grace)
        assert windowed is not None
        wait = windowed._close_after_ms
    operation = Suppression(
        node=name,
        store=buffer,
        wait_ms=wait,
        # Kafka's emit-on-window-close treats sliding window ends and session ends
        # as inclusive: such a window can still take a record at end + grace.
        strict=emit_final and kind in ("sliding", "session"),
        window_kind=None if kind is None else "session" if kind == "session" else "time",
        window_size_ms=0 if windowed is None else windowed._window_size_ms,
        key_serde=table.key_serde if windowed is None else windowed._inner_key_serde,
        value_serde=table.value_serde,
        buffer_time="window-end" if suppressed.time_to_wait_ms is None else "first-update",
        buffer_config=suppressed.buffer_config,
        new_value=None if table._old_values is None else _new_value,
        emit_final=emit_final,
        finals_forwarded=finals_forwarded,
    )
    builder.topology.add_processor(name, partial(SuppressProcessor, operation), table._node)
    builder.topology.add_state_store(StoreSpec(buffer), name)
    return KTable(builder, name, table.key_serde, value_serde=table.value_serde)


def _store_spec(
    materialized: Materialized,
    key_serde: str | None,
    value_serde: str | None,
    **window: Any,
) -> StoreSpec:
    """The store a ``Materialized`` asks for, with the serdes resolved by its operation."""
    return StoreSpec(
        materialized.store_name,
        key_serde=key_serde,
        value_serde=value_serde,
        cached=materialized.caching_enabled,
        logged=materialized.logging_enabled,
        versioned_history_ms=materialized.history_retention_ms,
        changelog_configs=materialized.logging_configs,
        **window,
    )
