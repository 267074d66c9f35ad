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

from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from itertools import chain, compress, repeat
from operator import is_, length_hint
from typing import Any, overload

from eddyline_runtime.processing.topology import (
    BatchProcessor,
    Change,
    Items,
    Processor,
    ProcessorContext,
    RecordFailedError,
    StoreSpec,
    Topology,
    TopologyError,
)
from eddyline_runtime.processing.windows import (
    FinalResults,
    SessionWindowedAggregation,
    SessionWindows,
    SlidingWindowedAggregation,
    SlidingWindows,
    Suppressed,
    TimeWindows,
    WindowedAggregation,
)
from eddyline_runtime.serde import serde_for, serialize_all


def _failed_index(items: Items, source: Iterator[Any]) -> int:
    """The input record index of the item a user function failed on, while
    ``source`` (an iterator over one of the columns) fed it: the last one taken."""
    taken = len(items.keys) - length_hint(source)
    return items.indices[taken - 1] if taken else -1


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
        def batch(items: Items) -> Items:
            # The user's function is called from C, once per item; no Python frame besides.
            source = iter(items.values)
            try:
                values = list(map(mapper, source))
            except Exception as exc:
                raise RecordFailedError(_failed_index(items, source), exc) from exc
            return Items(items.keys, values, items.indices)

        return self._then("KSTREAM-MAPVALUES", lambda k, v, emit: emit(k, mapper(v)), batch)

    def map(self, mapper: Callable[[Any, Any], tuple[Any, Any]]) -> KStream:
        def batch(items: Items) -> Items:
            keys: list[Any] = []
            values: list[Any] = []
            add_key, add_value, i = keys.append, values.append, -1
            try:
                for k, v, i in zip(*items, strict=True):  # noqa: B007 - i names a failure
                    new_key, new_value = mapper(k, v)
                    add_key(new_key)
                    add_value(new_value)
            except Exception as exc:
                raise RecordFailedError(i, exc) from exc
            return Items(keys, values, items.indices)

        return self._then("KSTREAM-MAP", lambda k, v, emit: emit(*mapper(k, v)), batch)

    def filter(self, predicate: Callable[[Any, Any], bool]) -> KStream:
        def batch(items: Items) -> Items:
            source = iter(items.keys)
            try:
                kept = list(map(bool, map(predicate, source, items.values)))
            except Exception as exc:
                raise RecordFailedError(_failed_index(items, source), exc) from exc
            return Items(*(list(compress(column, kept)) for column in items))

        return self._then(
            "KSTREAM-FILTER", lambda k, v, emit: emit(k, v) if predicate(k, v) else None, batch
        )

    def flat_map(self, mapper: Callable[[Any, Any], Iterable[tuple[Any, Any]]]) -> KStream:
        def each(k: Any, v: Any, emit: Callable[[Any, Any], None]) -> None:
            for new_key, new_value in mapper(k, v):
                emit(new_key, new_value)

        def batch(items: Items) -> Items:
            keys: list[Any] = []
            values: list[Any] = []
            indices: list[int] = []
            add_key, add_value, add_index, i = keys.append, values.append, indices.append, -1
            try:
                for k, v, i in zip(*items, strict=True):
                    for new_key, new_value in mapper(k, v):
                        add_key(new_key)
                        add_value(new_value)
                        add_index(i)
            except Exception as exc:
                raise RecordFailedError(i, exc) from exc
            return Items(keys, values, indices)

        return self._then("KSTREAM-FLATMAP", each, batch)

    def flat_map_values(self, mapper: Callable[[Any], Iterable[Any]]) -> KStream:
        def each(k: Any, v: Any, emit: Callable[[Any, Any], None]) -> None:
            for new_value in mapper(v):
                emit(k, new_value)

        def batch(items: Items) -> Items:
            source = iter(items.values)
            try:
                # Each record's values (a list, whatever iterable the mapper returned).
                parts = list(map(list, map(mapper, source)))
            except Exception as exc:
                raise RecordFailedError(_failed_index(items, source), exc) from exc
            sizes = list(map(len, parts))
            return Items(
                list(chain.from_iterable(map(repeat, items.keys, sizes))),
                list(chain.from_iterable(parts)),
                list(chain.from_iterable(map(repeat, items.indices, sizes))),
            )

        return self._then("KSTREAM-FLATMAPVALUES", each, batch)

    def peek(self, action: Callable[[Any, Any], None]) -> KStream:
        def each(k: Any, v: Any, emit: Callable[[Any, Any], None]) -> None:
            action(k, v)
            emit(k, v)

        def batch(items: Items) -> Items:
            source = iter(items.keys)
            try:
                deque(map(action, source, items.values), maxlen=0)  # run it, keep nothing
            except Exception as exc:
                raise RecordFailedError(_failed_index(items, source), exc) from exc
            return items

        return self._then("KSTREAM-PEEK", each, batch)

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

        def batch(items: Items) -> Items:
            source = iter(items.keys)
            try:
                keys = list(map(selector, source, items.values))
            except Exception as exc:
                raise RecordFailedError(_failed_index(items, source), exc) from exc
            return Items(keys, items.values, items.indices)

        rekeyed = self._then(
            "KSTREAM-KEY-SELECT", lambda k, v, emit: emit(selector(k, v), v), batch
        )
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

    def _then(self, prefix: str, step: _Step, batch: _BatchStep | None = None) -> KStream:
        name = self._builder._name(prefix)
        self._builder.topology.add_processor(name, lambda: _StepProcessor(step, batch), self._node)
        return KStream(self._builder, name, self._key_serde)


class KGroupedStream:
    def __init__(self, builder: StreamsBuilder, node: str, key_serde: str | None) -> None:
        self._builder = builder
        self._node = node
        self._key_serde = key_serde

    def count(self, store: str) -> KTable:
        """Count records per key in ``store`` (as Kafka longs); forwards each new count."""
        return self.aggregate(lambda: 0, _count_one_more, store, "long")

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

    def count(self, store: str) -> KTable:
        """Records per key and window (Kafka longs)."""
        return self.aggregate(lambda: 0, _count_one_more, store, "long")

    def reduce(
        self, reducer: Callable[[Any, Any], Any], store: str, value_serde: str = "json"
    ) -> KTable:
        """Combine a window's values with ``reducer(aggregate, value)``; the first value seeds."""

        def fold(_key: Any, value: Any, current: Any) -> Any:
            return value if current is None else reducer(current, value)

        return self.aggregate(lambda: None, fold, store, value_serde)

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        store: str,
        value_serde: str = "json",
    ) -> KTable:
        """``aggregator(key, value, aggregate)`` per record and window, kept in ``store``."""
        if not store:
            raise TopologyError(
                "a windowed aggregation needs a store name (Kafka Streams' Materialized.as): "
                "it names the store's directory and changelog across topology changes"
            )
        builder = self._builder
        name = builder._name("KSTREAM-AGGREGATE")
        operation = WindowedAggregation(
            store, self._windows, initializer, aggregator, self._key_serde, value_serde
        )
        builder.topology.add_operator(name, operation, self._node)
        builder.topology.add_state_store(
            StoreSpec(
                store,
                key_serde=self._key_serde,
                value_serde=value_serde,
                window_retention_ms=self._windows.retention_ms,
            ),
            name,
        )
        table = WindowedKTable(
            builder, name, self._key_serde, store, value_serde, kind="time",
            size_ms=self._windows.size_ms, close_after_ms=self._windows.grace_ms,
        )  # fmt: skip
        return table._final_results(store) if self._emit_final else table


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

    def count(self, store: str) -> KTable:
        """Records per key and session (Kafka longs)."""
        return self.aggregate(lambda: 0, _count_one_more, _add, store, "long")

    def reduce(
        self, reducer: Callable[[Any, Any], Any], store: str, value_serde: str = "json"
    ) -> KTable:
        """Combine a session's values with ``reducer(aggregate, value)``; merging two
        sessions reduces the second into the first."""

        def fold(_key: Any, value: Any, current: Any) -> Any:
            return value if current is None else reducer(current, value)

        def merge(key: Any, aggregate: Any, other: Any) -> Any:
            return fold(key, other, aggregate)

        return self.aggregate(lambda: None, fold, merge, store, value_serde)

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        merger: Callable[[Any, Any, Any], Any],
        store: str,
        value_serde: str = "json",
    ) -> KTable:
        """``aggregator(key, value, aggregate)`` per record; ``merger(key, aggregate,
        other)`` when a record bridges sessions. Kept in the session store ``store``."""
        if not store:
            raise TopologyError(
                "a session-windowed aggregation needs a store name (Kafka Streams' "
                "Materialized.as): it names the store's directory and changelog"
            )
        builder = self._builder
        name = builder._name("KSTREAM-AGGREGATE")
        operation = SessionWindowedAggregation(
            store, self._windows, initializer, aggregator, merger, self._key_serde, value_serde
        )
        builder.topology.add_operator(name, operation, self._node)
        builder.topology.add_state_store(
            StoreSpec(
                store,
                key_serde=self._key_serde,
                value_serde=value_serde,
                session_retention_ms=self._windows.retention_ms,
            ),
            name,
        )
        # A session is final once no record can reach it: gap + grace after its end.
        wait = self._windows.gap_ms + self._windows.grace_ms
        table = WindowedKTable(
            builder, name, self._key_serde, store, value_serde, kind="session", size_ms=0,
            close_after_ms=wait,
        )  # fmt: skip
        return table._final_results(store) if self._emit_final else table


def _add(_key: Any, aggregate: Any, other: Any) -> Any:
    """``count``'s merger: two sessions' counts add up."""
    return aggregate + other


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
            name, lambda: _StepProcessor(lambda k, v, emit: emit(k, v), _same), self._node
        )
        return KStream(self._builder, name, self.key_serde)


_Step = Callable[[Any, Any, Callable[[Any, Any], None]], None]
# The same step over a batch: the user's function once per record, the forwards returned.
_BatchStep = Callable[[Items], Items]


class _StepProcessor(BatchProcessor):
    """A stateless DSL step; ``batch`` (when given) is the same step over a list."""

    def __init__(self, step: _Step, batch: _BatchStep | None = None) -> None:
        self._step = step
        self._batch = batch

    @property
    def batchable(self) -> bool:
        return self._batch is not None

    def process(self, key: Any, value: Any) -> None:
        self._step(key, value, self.context.forward)

    def process_batch(
        self, items: Items, timestamps: Sequence[int], at: Callable[[int], None]
    ) -> Items:
        assert self._batch is not None, "the runtime batches only steps that have a batch form"
        return self._batch(items)


def _same(items: Items) -> Items:
    return items


_NO_ITEMS = Items((), (), ())


# Up to this many distinct keys, a batch finds each key's first and last record
# by scanning (list.index: a C loop of identity/bytes compares that stops at the
# first match), at most 2 * this many passes, cheaper than a dict per record.
_SCANNED_KEYS = 16


def _first_and_last_index(
    keys: list[bytes | None], indices: Sequence[int], distinct: Collection[bytes | None]
) -> tuple[dict[bytes | None, int], dict[bytes | None, int]]:
    """Each distinct key's index (from ``indices``) at its first and last record."""
    if len(distinct) > _SCANNED_KEYS:
        return (
            dict(zip(reversed(keys), reversed(indices), strict=True)),
            dict(zip(keys, indices, strict=True)),
        )
    backwards = keys[::-1]
    end = len(keys) - 1
    return (
        {key: indices[keys.index(key)] for key in distinct},
        {key: indices[end - backwards.index(key)] for key in distinct},
    )


def _without_nulls(items: Items) -> Items:
    """The items whose key and value are both set."""
    keys, values, _ = items
    if not any(map(is_, keys, repeat(None))) and not any(map(is_, values, repeat(None))):
        return items
    kept = [key is not None and value is not None for key, value in zip(keys, values, strict=True)]
    return Items(*(list(compress(column, kept)) for column in items))


def _first_of(write: tuple[int, bytes, bytes | None]) -> int:
    return write[0]


def _count_one_more(_key: Any, _value: Any, count: int) -> int:
    """``count``'s aggregator; a batch that forwards nothing counts with a Counter instead."""
    return count + 1


# The aggregate of a key that has none yet, for reduce (None may be a real value).
_NO_VALUE = object()
# Not read from the store yet in this batch.
_UNREAD = object()
# Aggregates no aggregator can change in place: a batch keeps them as objects.
_IMMUTABLE: frozenset[type] = frozenset({int, float, str, bytes, bool, type(None), frozenset})


class _Serialized:
    """A mutable aggregate kept serialized between records, so each record's
    aggregator gets a fresh object, as it does when every update goes through
    the store."""

    __slots__ = ("data",)

    def __init__(self, data: bytes | None) -> None:
        self.data = data


class _AggregateProcessor(BatchProcessor):
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

    def process_batch(
        self, items: Items, timestamps: Sequence[int], at: Callable[[int], None]
    ) -> Items:
        """The batch's records, each aggregated in order, with one store read per key.

        Each key's running aggregate stays in this call; the store then gets
        at most two writes per key, in record order, each with its record's
        timestamp current: at the key's first record of the batch, the
        aggregate as of that record, and at its last, the batch's final one.
        So a record cache in front of the store sees keys become dirty and
        last written in the same order as record by record, and an eviction
        mid-batch forwards one of the key's successive aggregates (the cache
        forwards a subsequence of a key's updates, as it always does, ending
        with the latest). Nothing else reads the store during the batch: the
        runtime batches only aggregations whose store no other node uses.
        """
        store, values = self._store, self._values
        initializer, aggregator = self._initializer, self._aggregator
        forwards = not self._forwards_on_flush
        live = _without_nulls(items)  # Kafka Streams drops null keys and values here
        if aggregator is _count_one_more:
            return self._count_batch(live, at, forwards=forwards)
        forwarded: list[tuple[Any, Any, int]] = []
        current: dict[bytes, Any] = {}
        first: dict[bytes, tuple[int, bytes | None]] = {}  # index, aggregate as of it
        last: dict[bytes, int] = {}
        i = -1
        try:
            stored_keys = serialize_all(self._keys, live.keys)
            for key, value, i, stored_key in zip(*live, stored_keys, strict=True):
                aggregate = current.get(stored_key, _UNREAD)  # type: ignore[arg-type]
                if aggregate is _UNREAD:
                    stored = store.get(stored_key)
                    aggregate = initializer() if stored is None else values.deserialize(stored)
                    aggregate = aggregator(key, value, aggregate)
                    data = values.serialize(aggregate)
                    first[stored_key] = (i, data)  # type: ignore[index]
                    mutable = type(aggregate) not in _IMMUTABLE
                    current[stored_key] = _Serialized(data) if mutable else aggregate  # type: ignore[index]
                else:
                    if type(aggregate) is _Serialized:
                        aggregate = values.deserialize(aggregate.data)
                    aggregate = aggregator(key, value, aggregate)
                    if type(aggregate) in _IMMUTABLE:
                        current[stored_key] = aggregate  # type: ignore[index]
                    else:
                        current[stored_key] = _Serialized(values.serialize(aggregate))  # type: ignore[index]
                last[stored_key] = i  # type: ignore[index]
                if forwards:
                    forwarded.append((key, aggregate, i))
            writes: list[tuple[int, bytes, bytes | None]] = []
            for stored_key, (first_index, data) in first.items():
                writes.append((first_index, stored_key, data))
                i = last[stored_key]
                if i != first_index:
                    aggregate = current[stored_key]
                    if type(aggregate) is not _Serialized:
                        aggregate = _Serialized(values.serialize(aggregate))
                    writes.append((i, stored_key, aggregate.data))
            i = -1
            self._write_folded(writes, at)
        except RecordFailedError:
            raise
        except Exception as exc:
            raise RecordFailedError(i, exc) from exc
        if not forwarded:
            return _NO_ITEMS
        keys, aggregates, indices = map(list, zip(*forwarded, strict=True))
        return Items(keys, aggregates, indices)

    def _count_batch(self, live: Items, at: Callable[[int], None], *, forwards: bool) -> Items:
        """``count``: what ``process_batch`` does, without calling an aggregator per
        record (the per-key totals are counted in C). Same store reads and writes in
        the same order; with ``forwards``, every record's new count, in order."""
        if not live.keys:
            return _NO_ITEMS
        store, values = self._store, self._values
        key_objects, indices = live.keys, live.indices
        try:
            stored_keys = serialize_all(self._keys, key_objects)
        except Exception:  # find the record it was, the slow way
            for key, index in zip(key_objects, indices, strict=True):
                try:
                    self._keys.serialize(key)
                except Exception as exc:
                    raise RecordFailedError(index, exc) from exc
            raise
        counts = Counter(stored_keys)
        first, last = _first_and_last_index(stored_keys, indices, counts)
        running: dict[bytes | None, int] = {}
        writes: list[tuple[int, bytes, bytes | None]] = []
        i = -1
        try:
            for stored_key, added in counts.items():
                i = first[stored_key]
                stored = store.get(stored_key)
                current = self._initializer() if stored is None else values.deserialize(stored)
                running[stored_key] = current
                # The count as of the key's first record, then as of its last.
                writes.append((i, stored_key, values.serialize(current + 1)))  # type: ignore[arg-type]
                if added > 1:
                    final = values.serialize(current + added)
                    writes.append((last[stored_key], stored_key, final))  # type: ignore[arg-type]
        except Exception as exc:
            raise RecordFailedError(i, exc) from exc
        forwarded: list[int] = []
        if forwards:
            append = forwarded.append
            for stored_key in stored_keys:
                count = running[stored_key] + 1
                running[stored_key] = count
                append(count)
        self._write_folded(writes, at)
        return Items(key_objects, forwarded, indices) if forwards else _NO_ITEMS

    def _write_folded(
        self, writes: list[tuple[int, bytes, bytes | None]], at: Callable[[int], None]
    ) -> None:
        """Write (record index, key, value) in record order, each record's timestamp current."""
        writes.sort(key=_first_of)
        store = self._store
        for i, stored_key, data in writes:
            try:
                at(i)
                store.put(stored_key, data)
            except Exception as exc:
                raise RecordFailedError(i, exc) from exc

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
        store: str,
        value_serde: str = "json",
    ) -> KTable:
        """``aggregator(key, value, aggregate)`` per record and window, kept in ``store``."""
        if not store:
            raise TopologyError(
                "a sliding-windowed aggregation needs a store name (Kafka Streams' "
                "Materialized.as): it names the store's directory and changelog"
            )
        builder, windows = self._builder, self._sliding
        name = builder._name("KSTREAM-AGGREGATE")
        operation = SlidingWindowedAggregation(
            store, windows, initializer, aggregator, self._key_serde, value_serde
        )
        builder.topology.add_operator(name, operation, self._node)
        builder.topology.add_state_store(
            StoreSpec(
                store,
                key_serde=self._key_serde,
                value_serde=value_serde,
                window_retention_ms=windows.retention_ms,
            ),
            name,
        )
        table = WindowedKTable(
            builder, name, self._key_serde, store, value_serde, kind="sliding",
            size_ms=windows.size_ms, close_after_ms=windows.grace_ms,
        )  # fmt: skip
        return table._final_results(store) if self._emit_final else table


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

    def suppress(self, suppressed: Suppressed) -> KTable:
        """Kafka Streams' ``suppress(Suppressed.untilWindowCloses(...))``: forward each
        window's final value, once, when the stream time seen by this node (the newest
        update timestamp) reaches the window's end + grace (sessions: + gap). The
        buffer is a store of its own, changelogged and committed with the task, named
        ``suppressed.name`` or ``<aggregation store>-suppress-buffer``."""
        if not isinstance(suppressed, Suppressed):
            raise TopologyError(
                f"suppress takes Suppressed.until_window_closes(), got {type(suppressed).__name__}"
            )
        assert self.store is not None  # every windowed aggregation has its store
        return self._final_results(suppressed.name or f"{self.store}-suppress-buffer", False)

    def _final_results(self, buffer: str, emit_final: bool = True) -> KTable:
        builder = self._builder
        if emit_final:
            buffer = f"{buffer}-final-buffer"
        name = builder._name("KTABLE-SUPPRESS")
        kind = self._window_kind
        operation = FinalResults(
            store=buffer,
            wait_ms=self._close_after_ms,
            # Kafka's emit-on-window-close treats sliding window ends and session ends
            # as inclusive: such a window can still take a record at end + grace.
            strict=emit_final and kind in ("sliding", "session"),
            window_kind="session" if kind == "session" else "time",
            window_size_ms=self._window_size_ms,
            key_serde=self._inner_key_serde,
            value_serde=self.value_serde,
        )
        builder.topology.add_operator(name, operation, self._node)
        builder.topology.add_state_store(StoreSpec(buffer), name)
        return KTable(builder, name, None, value_serde=self.value_serde)
