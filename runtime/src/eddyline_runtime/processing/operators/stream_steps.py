"""Stateless stream steps: what ``map_values``, ``filter``, ``flat_map``, ``split``... run.

Each step is one :class:`StepProcessor` holding two forms of the same logic:
``each`` takes one record and an ``emit`` callback (the record-by-record
path), ``batch`` takes a batch's :class:`~eddyline_runtime.processing.topology.Items`
and returns what it forwards, in order, calling the user's function once per
record as ``each`` does (the runtime's batch path; see
:class:`~eddyline_runtime.processing.topology.BatchProcessor`). A user
function failing inside a batch raises
:class:`~eddyline_runtime.processing.topology.RecordFailedError` with the
index of the input record it failed on, so the runtime reports the same
record either way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, compress, repeat
from operator import length_hint
from typing import Any, NamedTuple

from eddyline_runtime.processing.topology import (
    BatchProcessor,
    Items,
    Processor,
    RecordFailedError,
)

# One record's step: (key, value, emit) where emit(key, value) forwards.
EachStep = Callable[[Any, Any, Callable[[Any, Any], None]], None]
# The same step over a batch: the user's function once per record, the forwards returned.
BatchStep = Callable[[Items], Items]


class Step(NamedTuple):
    """A stateless step in both forms; ``batch`` None: record by record only."""

    each: EachStep
    batch: BatchStep | None = None


class StepProcessor(BatchProcessor):
    """A stateless DSL step (see the module docstring)."""

    def __init__(self, step: Step) -> None:
        self._each = step.each
        self._batch = step.batch

    @property
    def batchable(self) -> bool:
        return self._batch is not None

    def process(self, key: Any, value: Any) -> None:
        self._each(key, value, self.context.forward)

    def process_batch(
        self, items: Items, timestamps: Sequence[int], at: Callable[[int], None]
    ) -> Items:
        assert self._batch is not None, "the runtime batches only steps that have a batch form"
        return self._batch(items)


class SplitProcessor(Processor):
    """``split()``: each record to the first branch whose predicate it passes (a None
    predicate is the default branch), or to none."""

    def __init__(self, routes: list[tuple[Callable[[Any, Any], bool] | None, str]]) -> None:
        self._routes = routes

    def process(self, key: Any, value: Any) -> None:
        for predicate, child in self._routes:
            if predicate is None or predicate(key, value):
                self.context.forward(key, value, to=child)
                return


class PassThrough(Processor):
    """Forwards every record as it is (a branch, a merge)."""

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value)


def _failed_index(items: Items, source: Iterator[Any]) -> int:
    """The input record index of the item a user function failed on, while
    ``source`` (an iterator over one of the columns) fed it: the last one taken."""
    taken = len(items.keys) - length_hint(source)
    return items.indices[taken - 1] if taken else -1


def map_values_step(mapper: Callable[[Any], Any]) -> Step:
    def batch(items: Items) -> Items:
        # The user's function is called from C, once per item; no Python frame besides.
        source = iter(items.values)
        try:
            values = list(map(mapper, source))
        except Exception as exc:
            raise RecordFailedError(_failed_index(items, source), exc) from exc
        return Items(items.keys, values, items.indices)

    return Step(lambda k, v, emit: emit(k, mapper(v)), batch)


def map_step(mapper: Callable[[Any, Any], tuple[Any, Any]]) -> Step:
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

    return Step(lambda k, v, emit: emit(*mapper(k, v)), batch)


def filter_step(predicate: Callable[[Any, Any], bool]) -> Step:
    def batch(items: Items) -> Items:
        source = iter(items.keys)
        try:
            kept = list(map(bool, map(predicate, source, items.values)))
        except Exception as exc:
            raise RecordFailedError(_failed_index(items, source), exc) from exc
        return Items(*(list(compress(column, kept)) for column in items))

    return Step(lambda k, v, emit: emit(k, v) if predicate(k, v) else None, batch)


def flat_map_step(mapper: Callable[[Any, Any], Iterable[tuple[Any, Any]]]) -> Step:
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

    return Step(each, batch)


def flat_map_values_step(mapper: Callable[[Any], Iterable[Any]]) -> Step:
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

    return Step(each, batch)


def peek_step(action: Callable[[Any, Any], None]) -> Step:
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

    return Step(each, batch)


def select_key_step(mapper: Callable[[Any, Any], Any]) -> Step:
    """Re-key with ``mapper(key, value)`` (``select_key``, and ``group_by``'s key)."""

    def batch(items: Items) -> Items:
        source = iter(items.keys)
        try:
            keys = list(map(mapper, source, items.values))
        except Exception as exc:
            raise RecordFailedError(_failed_index(items, source), exc) from exc
        return Items(keys, items.values, items.indices)

    return Step(lambda k, v, emit: emit(mapper(k, v), v), batch)


def _same(items: Items) -> Items:
    return items


# Every record as it is, in both forms (an aggregation's table to a stream).
FORWARD_STEP = Step(lambda k, v, emit: emit(k, v), _same)
