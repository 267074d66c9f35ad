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
from typing import Any

from eddyline_runtime.processing.topology import (
    Change,
    Processor,
    ProcessorContext,
    StoreSpec,
    Topology,
    TopologyError,
)
from eddyline_runtime.serde import serde_for


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
        store: str,
        *,
        key_serde: str | None = None,
        value_serde: str | None = None,
    ) -> KTable:
        """The latest value per key of ``topic``, materialized in ``store`` (stored as bytes)."""
        source = self._name("KTABLE-SOURCE")
        self.topology.add_source(source, [topic], key_serde=key_serde, value_serde=value_serde)
        name = self._name("KTABLE-MATERIALIZE")
        keys, values = serde_for(key_serde), serde_for(value_serde)
        self.topology.add_processor(
            name, lambda: _MaterializeProcessor(store, keys, values), source
        )
        self.topology.add_state_store(
            StoreSpec(store, key_serde=key_serde, value_serde=value_serde), name
        )
        return KTable(self, name, key_serde, store=store, value_serde=value_serde)

    def build(self) -> Topology:
        return self.topology

    def _name(self, prefix: str) -> str:
        name = f"{prefix}-{self._index:010d}"
        self._index += 1
        return name


class KStream:
    """A record stream: every record is an independent event."""

    def __init__(self, builder: StreamsBuilder, node: str, key_serde: str | None) -> None:
        self._builder = builder
        self._node = node
        self._key_serde = key_serde

    def map_values(self, mapper: Callable[[Any], Any]) -> KStream:
        return self._then("KSTREAM-MAPVALUES", lambda k, v, emit: emit(k, mapper(v)))

    def map(self, mapper: Callable[[Any, Any], tuple[Any, Any]]) -> KStream:
        return self._then("KSTREAM-MAP", lambda k, v, emit: emit(*mapper(k, v)))

    def filter(self, predicate: Callable[[Any, Any], bool]) -> KStream:
        return self._then(
            "KSTREAM-FILTER", lambda k, v, emit: emit(k, v) if predicate(k, v) else None
        )

    def flat_map(self, mapper: Callable[[Any, Any], Iterable[tuple[Any, Any]]]) -> KStream:
        def each(k: Any, v: Any, emit: Callable[[Any, Any], None]) -> None:
            for new_key, new_value in mapper(k, v):
                emit(new_key, new_value)

        return self._then("KSTREAM-FLATMAP", each)

    def flat_map_values(self, mapper: Callable[[Any], Iterable[Any]]) -> KStream:
        def each(k: Any, v: Any, emit: Callable[[Any, Any], None]) -> None:
            for new_value in mapper(v):
                emit(k, new_value)

        return self._then("KSTREAM-FLATMAPVALUES", each)

    def peek(self, action: Callable[[Any, Any], None]) -> KStream:
        def each(k: Any, v: Any, emit: Callable[[Any, Any], None]) -> None:
            action(k, v)
            emit(k, v)

        return self._then("KSTREAM-PEEK", each)

    def to(
        self, topic: str, *, key_serde: str | None = None, value_serde: str | None = None
    ) -> None:
        name = self._builder._name("KSTREAM-SINK")
        self._builder.topology.add_sink(
            name, topic, self._node, key_serde=key_serde, value_serde=value_serde
        )

    def join(self, table: KTable, joiner: Callable[[Any, Any], Any]) -> KStream:
        """Inner stream-table join: each record meets the table's current value for its key.

        The stream and the table topic must be co-partitioned (same key, same
        partition count): the join reads the table's store in the same task.
        """
        if table.store is None:
            raise TopologyError("join needs a materialized table: build it with builder.table")
        name = self._builder._name("KSTREAM-JOIN")
        keys, values = serde_for(table.key_serde), serde_for(table.value_serde)
        store = table.store
        self._builder.topology.add_processor(
            name, lambda: _JoinProcessor(store, keys, values, joiner), self._node
        )
        self._builder.topology.add_state_store(self._builder.topology.stores[store], name)
        return KStream(self._builder, name, self._key_serde)

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
        topology = self._builder.topology
        topology.add_processor(name, supplier, self._node)
        for store in stores:
            topology.add_state_store(
                store if isinstance(store, StoreSpec) else StoreSpec(store), name
            )
        return KStream(self._builder, name, self._key_serde)

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
        before it: records still in the old topic at such an upgrade would never be read."""
        rekeyed = self._then("KSTREAM-KEY-SELECT", lambda k, v, emit: emit(selector(k, v), v))
        builder = self._builder
        generated = builder._name("KSTREAM-AGGREGATE-STATE-STORE")
        topic = f"{repartition_name or generated}-repartition"
        builder.internal_topics.append(topic)
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

    def _then(self, prefix: str, step: _Step) -> KStream:
        name = self._builder._name(prefix)
        self._builder.topology.add_processor(name, lambda: _StepProcessor(step), self._node)
        return KStream(self._builder, name, self._key_serde)


class KGroupedStream:
    def __init__(self, builder: StreamsBuilder, node: str, key_serde: str | None) -> None:
        self._builder = builder
        self._node = node
        self._key_serde = key_serde

    def count(self, store: str) -> KTable:
        """Count records per key in ``store`` (as Kafka longs); forwards each new count."""
        return self.aggregate(lambda: 0, lambda _, __, count: count + 1, store, "long")

    def reduce(
        self, reducer: Callable[[Any, Any], Any], store: str, value_serde: str = "json"
    ) -> KTable:
        """Combine each key's values with ``reducer(aggregate, value)``; the first value seeds."""
        return self.aggregate(
            lambda: _NO_VALUE,
            lambda _, value, current: value if current is _NO_VALUE else reducer(current, value),
            store,
            value_serde,
        )

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        store: str,
        value_serde: str = "json",
    ) -> KTable:
        """``aggregator(key, value, aggregate)`` per record, kept in ``store``; forwards it."""
        name = self._builder._name("KSTREAM-AGGREGATE")
        keys, values = serde_for(self._key_serde), serde_for(value_serde)
        self._builder.topology.add_processor(
            name,
            lambda: _AggregateProcessor(store, keys, values, initializer, aggregator),
            self._node,
        )
        self._builder.topology.add_state_store(
            StoreSpec(store, key_serde=self._key_serde, value_serde=value_serde), name
        )
        return KTable(self._builder, name, self._key_serde, store=store, value_serde=value_serde)


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
    ) -> None:
        self._builder = builder
        self._node = node
        self.key_serde = key_serde
        self.store = store
        self.value_serde = value_serde

    def to_stream(self) -> KStream:
        name = self._builder._name("KTABLE-TOSTREAM")
        self._builder.topology.add_processor(
            name, lambda: _StepProcessor(lambda k, v, emit: emit(k, v)), self._node
        )
        return KStream(self._builder, name, self.key_serde)


_Step = Callable[[Any, Any, Callable[[Any, Any], None]], None]


class _StepProcessor(Processor):
    def __init__(self, step: _Step) -> None:
        self._step = step

    def process(self, key: Any, value: Any) -> None:
        self._step(key, value, self.context.forward)


# The aggregate of a key that has none yet, for reduce (None may be a real value).
_NO_VALUE = object()


class _AggregateProcessor(Processor):
    def __init__(
        self,
        store: str,
        keys: Any,
        values: Any,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
    ) -> None:
        self._store_name = store
        self._keys, self._values = keys, values
        self._initializer, self._aggregator = initializer, aggregator

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store = context.get_state_store(self._store_name)
        # With a record cache, results go downstream when the cache flushes
        # (once per key per commit, KIP-63); without one, on every update.
        self._forwards_on_flush: bool = self._store.set_flush_listener(self._flushed)

    def process(self, key: Any, value: Any) -> None:
        if key is None or value is None:
            return  # Kafka Streams drops these from aggregations
        stored_key = self._keys.serialize(key)
        stored = self._store.get(stored_key)
        current = self._initializer() if stored is None else self._values.deserialize(stored)
        updated = self._aggregator(key, value, current)
        self._store.put(stored_key, self._values.serialize(updated))
        if not self._forwards_on_flush:
            self.context.forward(key, updated)

    def _flushed(self, key: bytes, change: Change) -> None:
        new = None if change.new is None else self._values.deserialize(change.new)
        self.context.forward(self._keys.deserialize(key), new)


class _MaterializeProcessor(Processor):
    def __init__(self, store: str, keys: Any, values: Any) -> None:
        self._store_name, self._keys, self._values = store, keys, values

    def process(self, key: Any, value: Any) -> None:
        if key is None:
            return
        store = self.context.get_state_store(self._store_name)
        if value is None:
            store.delete(self._keys.serialize(key))
        else:
            store.put(self._keys.serialize(key), self._values.serialize(value))
        self.context.forward(key, value)


class _JoinProcessor(Processor):
    def __init__(
        self, store: str, keys: Any, values: Any, joiner: Callable[[Any, Any], Any]
    ) -> None:
        self._store_name, self._keys, self._values, self._joiner = store, keys, values, joiner

    def process(self, key: Any, value: Any) -> None:
        if key is None:
            return
        stored = self.context.get_state_store(self._store_name).get(self._keys.serialize(key))
        if stored is not None:  # inner join: no table value, no output
            self.context.forward(key, self._joiner(value, self._values.deserialize(stored)))
