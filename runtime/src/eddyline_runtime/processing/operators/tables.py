"""KTable operations: what ``filter``/``map_values``/``group_by(...).aggregate`` on a table run.

Kafka Streams' semantics (``KTableFilter``, ``KTableMapValues``,
``KTableRepartitionMap``, ``KTableAggregate``). Between table nodes a record's
value is a :class:`TableChange`: the key's new value and, when a node below
needs it (an aggregation over a re-grouped table subtracts it), the value it
replaces. ``to_stream`` forwards the new value only, as Kafka does.

* ``filter``/``filter_not``: a value failing the predicate becomes a tombstone
  (its key leaves the filtered table). Without old values, every update is
  forwarded (tombstones included); with them, an update whose old and new
  results are both absent is not.
* ``map_values``: the mapper on the new (and old) value; tombstones stay tombstones.
* ``group_by(selector).aggregate(initializer, adder, subtractor)``: each update
  sends, through a repartition topic, the old value to its old group (to be
  subtracted) and the new value to its new group (to be added); one record when
  both groups are the same. The aggregation subtracts before it adds.
  ``count`` and ``reduce`` are aggregations too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from eddyline_runtime.processing.operators.stores import (
    PUT_RETURN_CODE_VALID_TO_UNDEFINED,
    KeyValueStore,
    VersionedKeyValueStore,
    is_versioned,
    key_value_store,
    versioned_store,
)
from eddyline_runtime.processing.topology import Change, Processor, ProcessorContext


class TableChange(NamedTuple):
    """An update of a table's key as table nodes pass it on: the new value (None: the key
    is gone) and the old one (None: none, or not asked for)."""

    new: Any
    old: Any


class OldValues:
    """Whether a table node forwards old values: set when a node below needs them (Kafka's
    ``enableSendingOldValues``), before the topology runs; asks the node's parent too."""

    def __init__(self, parent: OldValues | None = None) -> None:
        self.enabled = False
        self._parent = parent

    def enable(self) -> None:
        self.enabled = True
        if self._parent is not None:
            self._parent.enable()

    def __call__(self) -> bool:
        return self.enabled


def as_change(value: Any) -> TableChange:
    """A table node's input: a change, or a plain value from a table that forwards only
    new values (an aggregation's result)."""
    return value if isinstance(value, TableChange) else TableChange(value, None)


class _StoredTable(Processor):
    """A table node that keeps its table in a key-value store (keys and values
    serialized with the table's serdes); old values come from that store."""

    def __init__(self, store: str, keys: Any, values: Any, old_values: OldValues) -> None:
        self._store_name, self._keys, self._values = store, keys, values
        self._old_values = old_values

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store: KeyValueStore = key_value_store(context, self._store_name)

    def _stored(self, stored_key: bytes) -> Any:
        stored = self._store.get(stored_key)
        return None if stored is None else self._values.deserialize(stored)

    def _write(self, stored_key: bytes, value: Any) -> None:
        """Keep ``value`` for the key; None (a tombstone) deletes it."""
        if value is None:
            self._store.delete(stored_key)
        else:
            self._store.put(stored_key, self._values.serialize(value))


class TableSourceProcessor(_StoredTable):
    """``builder.table``: keeps the latest value per key in its store and forwards the
    change (with the old value read from the store when a node below needs it).

    Materialized as a versioned store (``Materialized.as_versioned``), every update is
    kept as a version at the record's timestamp, and only an update that is the key's
    latest version is forwarded, as Kafka's ``KTableSource`` (KIP-914): an out-of-order
    update changes the table's past (which as-of joins read), not its present; one older
    than the history retention is dropped whole. (Kafka forwards the out-of-order
    update marked not-latest and its table operations drop it; dropping it here is
    the same for every table operation eddyline has.)
    """

    def init(self, context: ProcessorContext) -> None:
        self._versioned: VersionedKeyValueStore | None = None
        if not is_versioned(context, self._store_name):
            super().init(context)
            return
        Processor.init(self, context)
        self._versioned = versioned_store(context, self._store_name)

    def process(self, key: Any, value: Any) -> None:
        if key is None:
            return
        if self._versioned is not None:
            self._process_versioned(self._versioned, key, value)
            return
        stored_key = self._keys.serialize(key)
        old = self._stored(stored_key) if self._old_values.enabled else None
        self._write(stored_key, value)
        self.context.forward(key, TableChange(value, old))

    def _process_versioned(self, store: VersionedKeyValueStore, key: Any, value: Any) -> None:
        stored_key = self._keys.serialize(key)
        old = None
        if self._old_values.enabled:
            latest = store.get(stored_key)
            old = None if latest is None else self._values.deserialize(latest.value)
        stored_value = None if value is None else self._values.serialize(value)
        if store.put(stored_key, stored_value, self.context.timestamp) == (
            PUT_RETURN_CODE_VALID_TO_UNDEFINED
        ):
            self.context.forward(key, TableChange(value, old))


class TableFilterProcessor(Processor):
    def __init__(
        self, predicate: Callable[[Any, Any], bool], keep: bool, old_values: OldValues
    ) -> None:
        self._predicate, self._keep, self._old_values = predicate, keep, old_values

    def _kept(self, key: Any, value: Any) -> Any:
        if value is None or bool(self._predicate(key, value)) != self._keep:
            return None
        return value

    def process(self, key: Any, value: Any) -> None:
        change = as_change(value)
        new = self._kept(key, change.new)
        if self._old_values.enabled:
            old = self._kept(key, change.old)
            if new is None and old is None:
                return  # the key was not in the filtered table and is not now
        else:
            old = None
        self.context.forward(key, TableChange(new, old))


class TableMapValuesProcessor(Processor):
    def __init__(self, mapper: Callable[[Any], Any], old_values: OldValues) -> None:
        self._mapper, self._old_values = mapper, old_values

    def process(self, key: Any, value: Any) -> None:
        change = as_change(value)
        new = None if change.new is None else self._mapper(change.new)
        old = None
        if self._old_values.enabled and change.old is not None:
            old = self._mapper(change.old)
        self.context.forward(key, TableChange(new, old))


class TableToStreamProcessor(Processor):
    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, as_change(value).new)


class TableRegroupProcessor(Processor):
    """``KTableRepartitionMap``: each update becomes a subtraction from the old value's
    group and an addition to the new value's (one record when the group is the same);
    the repartition topic carries ``[new, old]``."""

    def __init__(self, selector: Callable[[Any, Any], tuple[Any, Any]]) -> None:
        self._selector = selector

    def process(self, key: Any, value: Any) -> None:
        change = as_change(value)
        new = None if change.new is None else self._selector(key, change.new)
        old = None if change.old is None else self._selector(key, change.old)
        new_ok = new is not None and new[0] is not None and new[1] is not None
        old_ok = old is not None and old[0] is not None and old[1] is not None
        if new_ok and old_ok and new[0] == old[0]:  # type: ignore[index]
            self.context.forward(new[0], [new[1], old[1]])  # type: ignore[index]
            return
        if old_ok:
            self.context.forward(old[0], [None, old[1]])  # type: ignore[index]
        if new_ok:
            self.context.forward(new[0], [new[1], None])  # type: ignore[index]


class TableAggregateProcessor(Processor):
    """``KTableAggregate``: subtract the old value, then add the new one; forwards the
    aggregate's change (an emptied group keeps its aggregate, as Kafka's does), on
    every update or, with a record cache, as the cache flushes."""

    def __init__(
        self,
        store: str,
        keys: Any,
        values: Any,
        *,
        initializer: Callable[[], Any],
        adder: Callable[[Any, Any, Any], Any],
        subtractor: Callable[[Any, Any, Any], Any],
        old_values: OldValues,
    ) -> None:
        self._store_name, self._keys, self._values = store, keys, values
        self._initializer, self._adder, self._subtractor = initializer, adder, subtractor
        self._old_values = old_values

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store: KeyValueStore = key_value_store(context, self._store_name)
        # With a record cache, results go downstream when the cache flushes (once per
        # key per commit, as Kafka's cached table aggregations); without one, each update.
        self._forwards_on_flush: bool = self._store.set_flush_listener(self._flushed)

    def _flushed(self, key: bytes, change: Change) -> None:
        values = self._values
        new = None if change.new is None else values.deserialize(change.new)
        old = None
        if self._old_values.enabled and change.old is not None:
            old = values.deserialize(change.old)
        self.context.forward(self._keys.deserialize(key), TableChange(new, old))

    def process(self, key: Any, value: Any) -> None:
        if key is None or value is None:
            return
        new_value, old_value = value
        stored_key = self._keys.serialize(key)
        stored = self._store.get(stored_key)
        current = None if stored is None else self._values.deserialize(stored)
        aggregate = current
        if old_value is not None and current is not None:
            aggregate = self._subtractor(key, old_value, current)
        if new_value is not None:
            if aggregate is None:
                aggregate = self._initializer()
            aggregate = self._adder(key, new_value, aggregate)
        if aggregate is None:
            self._store.delete(stored_key)
        else:
            self._store.put(stored_key, self._values.serialize(aggregate))
        if not self._forwards_on_flush:
            old = current if self._old_values.enabled else None
            self.context.forward(key, TableChange(aggregate, old))


class TableMaterializeProcessor(_StoredTable):
    """A table operation's result kept in a store (Kafka Streams' ``Materialized.as``), so
    it can be queried and joined: each change is written (a tombstone deletes) and
    passed on, with the old value read from the store when a node below needs it."""

    def process(self, key: Any, value: Any) -> None:
        if key is None:
            return
        new = as_change(value).new
        stored_key = self._keys.serialize(key)
        old = None
        if self._old_values.enabled:
            old = self._stored(stored_key)
            if new is None and old is None:
                return  # the key was not in the table and is not now
        self._write(stored_key, new)
        self.context.forward(key, TableChange(new, old))
