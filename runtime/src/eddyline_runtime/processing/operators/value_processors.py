"""Value-only user code with state stores: ``KTable.transform_values``,
``KStream.transform_values`` and ``KStream.process_values``.

Kafka Streams' ``KTableTransformValues``, ``KStreamTransformValues`` and (KIP-820)
``KStreamImpl.processValues`` with its ``FixedKeyProcessor``:

* A :class:`ValueTransformerWithKey` gets ``init(context)``, then
  ``transform(key, value)`` per record, and returns the new value. Its context
  reaches the stores connected to it but refuses ``forward``: the node forwards
  what ``transform`` returns, so a transformer forwarding too would send records
  nobody downstream expects (Kafka's ``ForwardingDisabledProcessorContext``).
* On a table, ``transform`` is called for tombstones too (its value is None) and
  its result is forwarded as is, as Kafka does. When a node below needs old
  values (a re-grouped aggregation subtracting them), a table step not
  materialized calls ``transform`` on the old value as well, which is right only
  for a transformer whose result depends on its input alone; a materialized one
  takes the old value from its store, so a stateful transformer (a counter) is
  called once per update and the aggregation still subtracts what it added
  (Kafka's ``shouldCalculateCorrectOldValuesIfMaterializedEvenIfStateful``).
* ``process_values`` runs a :class:`~eddyline_runtime.processing.topology.Processor`
  whose forwards keep the key of the record being processed: the stream below is
  not marked re-keyed, so a ``group_by_key`` after it needs no repartition topic.
  A forward with another key, or outside ``process`` (a punctuation), is refused:
  that is what a repartition would have been needed for.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from eddyline_runtime.processing.operators.tables import OldValues, TableChange, as_change
from eddyline_runtime.processing.topology import (
    Cancellable,
    Headers,
    NodeSensor,
    Processor,
    ProcessorContext,
    PunctuationType,
    Punctuator,
    TopologyError,
)


class ValueTransformerWithKey(abc.ABC):
    """Kafka Streams' ``ValueTransformerWithKey``: a new value from a record's key and
    value; one instance per task (the supplier is called once per task)."""

    def init(self, context: ProcessorContext) -> None:  # noqa: B027 - optional hook
        """Called once per task before the first record: look stores up here
        (``context.get_state_store(name)``). ``context.forward`` is refused."""

    @abc.abstractmethod
    def transform(self, key: Any, value: Any) -> Any:
        """The new value for ``value`` (None on a table: the key leaves it)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what ``init`` acquired."""


ValueTransformerSupplier = Callable[[], ValueTransformerWithKey]


class _DelegatingContext:
    """A processor context passing everything but ``forward`` to the node's own."""

    def __init__(self, inner: ProcessorContext) -> None:
        self._inner = inner

    def get_state_store(self, name: str) -> Any:
        return self._inner.get_state_store(name)

    def schedule(
        self, interval_ms: int, punctuation_type: PunctuationType, punctuator: Punctuator
    ) -> Cancellable:
        return self._inner.schedule(interval_ms, punctuation_type, punctuator)

    def commit(self) -> None:
        self._inner.commit()

    def record_dropped(self) -> None:
        self._inner.record_dropped()

    def node_sensor(self, name: str) -> NodeSensor:
        return self._inner.node_sensor(name)

    @property
    def timestamp(self) -> int:
        return self._inner.timestamp

    @property
    def headers(self) -> Headers:
        return self._inner.headers

    @property
    def topic(self) -> str | None:
        return self._inner.topic

    @property
    def partition(self) -> int:
        return self._inner.partition

    @property
    def offset(self) -> int:
        return self._inner.offset

    @property
    def stream_time(self) -> int:
        return self._inner.stream_time

    @property
    def record_lateness(self) -> int:
        return self._inner.record_lateness

    @property
    def task_id(self) -> str:
        return self._inner.task_id


class _ForwardingDisabledContext(_DelegatingContext):
    def __init__(self, inner: ProcessorContext, operation: str) -> None:
        super().__init__(inner)
        self._operation = operation

    def forward(
        self,
        key: Any,
        value: Any,
        *,
        to: str | None = None,
        timestamp: int | None = None,
        headers: Headers | None = None,
    ) -> None:
        raise TopologyError(
            f"a value transformer of {self._operation} called context.forward, which it "
            "may not: the node forwards what transform() returns. Return the value, or "
            "use KStream.process to forward records yourself"
        )


class _FixedKeyContext(_DelegatingContext):
    """``process_values``' context: forwards keep the key of the record being processed."""

    _NO_RECORD = object()

    def __init__(self, inner: ProcessorContext) -> None:
        super().__init__(inner)
        self.current_key: Any = self._NO_RECORD

    def forward(
        self,
        key: Any,
        value: Any,
        *,
        to: str | None = None,
        timestamp: int | None = None,
        headers: Headers | None = None,
    ) -> None:
        if self.current_key is self._NO_RECORD:
            raise TopologyError(
                "a process_values processor forwarded outside process() (in a punctuation): "
                "it may only forward under the key of the record it is processing. Use "
                "KStream.process to forward from a punctuation"
            )
        if key != self.current_key:
            raise TopologyError(
                f"a process_values processor forwarded key {key!r} while processing key "
                f"{self.current_key!r}: process_values keeps keys (so no repartition "
                "follows it). Use KStream.process to change keys"
            )
        self._inner.forward(key, value, to=to, timestamp=timestamp, headers=headers)


class ProcessValuesProcessor(Processor):
    """``KStream.process_values``: the user's processor, its forwards held to its keys."""

    def __init__(self, inner: Processor) -> None:
        self._inner = inner

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._fixed = _FixedKeyContext(context)
        self._inner.init(self._fixed)

    def process(self, key: Any, value: Any) -> None:
        self._fixed.current_key = key
        try:
            self._inner.process(key, value)
        finally:
            self._fixed.current_key = _FixedKeyContext._NO_RECORD

    def close(self) -> None:
        self._inner.close()


class StreamTransformValuesProcessor(Processor):
    """``KStream.transform_values``: forwards ``transform(key, value)``, None included
    (Kafka's ``KStreamTransformValues``)."""

    def __init__(self, transformer: ValueTransformerWithKey) -> None:
        self._transformer = transformer

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._transformer.init(_ForwardingDisabledContext(context, "KStream.transform_values"))

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, self._transformer.transform(key, value))

    def close(self) -> None:
        self._transformer.close()


class TableTransformValuesProcessor(Processor):
    """``KTable.transform_values`` (Kafka's ``KTableTransformValuesProcessor``); see the
    module docstring for when the old value is transformed and when it is read."""

    def __init__(self, transformer: ValueTransformerWithKey, old_values: OldValues) -> None:
        self._transformer, self._old_values = transformer, old_values

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._transformer.init(_ForwardingDisabledContext(context, "KTable.transform_values"))

    def process(self, key: Any, value: Any) -> None:
        change = as_change(value)
        new = self._transformer.transform(key, change.new)
        old = self._transformer.transform(key, change.old) if self._old_values.enabled else None
        self.context.forward(key, TableChange(new, old))

    def close(self) -> None:
        self._transformer.close()
