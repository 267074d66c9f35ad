"""Key-value aggregations: what ``group_by(...).count/reduce/aggregate`` runs.

Kafka Streams' ``KStreamAggregate`` (and ``KStreamReduce``): each record's key
and value go to ``aggregator(key, value, aggregate)``, the aggregate is kept
in a key-value store (serialized with the stream's key serde and the
aggregation's value serde) and forwarded, on every update without a record
cache, once per key per flush with one (KIP-63). Records with a null key or
value are dropped, as Kafka drops them from aggregations.

:class:`AggregateProcessor` is also a batch processor: the runtime may hand it
a whole batch when its store is its own (see
:class:`~eddyline_runtime.processing.topology.BatchProcessor`); ``count``
then counts a batch's keys in C instead of calling an aggregator per record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from itertools import compress, repeat
from operator import is_
from typing import Any

from eddyline_runtime.processing.operators.stores import KeyValueStore, key_value_store
from eddyline_runtime.processing.topology import (
    BatchProcessor,
    Change,
    Items,
    ProcessorContext,
    RecordFailedError,
)
from eddyline_runtime.serde import serialize_all

# (key, value, aggregate) -> the new aggregate; also a merger's (key, aggregate, other).
Aggregator = Callable[[Any, Any, Any], Any]
# What a batch step forwards when it forwards nothing.
NO_ITEMS = Items((), (), ())


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


def count_one_more(_key: Any, _value: Any, count: int) -> int:
    """``count``'s aggregator; a batch that forwards nothing counts with a Counter instead."""
    return count + 1


# The aggregate of a key that has none yet, for reduce (None may be a real value).
NO_VALUE = object()
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


class AggregateProcessor(BatchProcessor):
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
        self._store: KeyValueStore = key_value_store(context, self._store_name)
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
        if aggregator is count_one_more:
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
                    # Serdes give set keys bytes (null keys were dropped above).
                    stored = store.get(stored_key)  # type: ignore[arg-type]
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
            return NO_ITEMS
        keys, aggregates, indices = map(list, zip(*forwarded, strict=True))
        return Items(keys, aggregates, indices)

    def _count_batch(self, live: Items, at: Callable[[int], None], *, forwards: bool) -> Items:
        """``count``: what ``process_batch`` does, without calling an aggregator per
        record (the per-key totals are counted in C). Same store reads and writes in
        the same order; with ``forwards``, every record's new count, in order."""
        if not live.keys:
            return NO_ITEMS
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
                stored = store.get(stored_key)  # type: ignore[arg-type]
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
        return Items(key_objects, forwarded, indices) if forwards else NO_ITEMS

    def _write_folded(
        self, writes: list[tuple[int, bytes, bytes | None]], at: Callable[[int], None]
    ) -> None:
        """Write (record index, key, value) in record order, each record's timestamp current."""
        writes.sort(key=_first_of)
        store = self._store
        for i, stored_key, data in writes:
            try:
                at(i)
                # A serde giving None for a set value fails here, naming the store.
                store.put(stored_key, data)  # type: ignore[arg-type]
            except Exception as exc:
                # Earlier writes of the batch are in the store: not one to run again.
                raise RecordFailedError(i, exc, partial=True) from exc

    def _flushed(self, key: bytes, change: Change) -> None:
        new = None if change.new is None else self._values.deserialize(change.new)
        self.context.forward(self._keys.deserialize(key), new)


def count_one_less(_key: Any, _value: Any, count: int) -> int:
    """A re-grouped table's ``count`` subtractor: a row left the group."""
    return count - 1


def add_counts(_key: Any, aggregate: Any, other: Any) -> Any:
    """A session ``count``'s merger: two sessions' counts add up."""
    return aggregate + other


def reducing(reducer: Callable[[Any, Any], Any], *, empty: Any = None) -> Aggregator:
    """``reduce`` as an aggregator: the first value seeds the aggregate (``empty``, what
    the initializer gives, marks a key or window without one yet), each next one is
    ``reducer(aggregate, value)``."""

    def aggregate(_key: Any, value: Any, current: Any) -> Any:
        return value if current is empty else reducer(current, value)

    return aggregate


def merging(aggregator: Aggregator) -> Aggregator:
    """A session ``reduce``'s merger: the second session's aggregate folded into the first."""

    def merge(key: Any, aggregate: Any, other: Any) -> Any:
        return aggregator(key, other, aggregate)

    return merge


def subtracting(subtractor: Callable[[Any, Any], Any]) -> Aggregator:
    """A table ``reduce``'s subtractor as an aggregator: ``subtractor(aggregate, value)``."""

    def subtract(_key: Any, value: Any, current: Any) -> Any:
        return subtractor(current, value)

    return subtract
