"""Processing: what a topology author writes, and the engine that runs it.

A topology author imports from here and nowhere else: build a
:class:`Topology` with :class:`StreamsBuilder` (the DSL) or the Processor API
(:class:`Processor`, :class:`ProcessorContext` with its punctuations,
:class:`StoreSpec`), and pick serdes. ``eddyline run`` loads the function that returns it.

The engine lives in this package's modules and is not part of this face:
``instance`` (:class:`~eddyline_runtime.processing.instance.StreamsInstance`:
resolves a topology against a log and runs its tasks on stream threads),
``stream_thread`` (the loop and the commit protocol), ``task``,
``task_store`` and ``record_cache`` (KIP-63), ``partition_group`` (KIP-695),
``standby_task`` (KIP-535). Restoration is :mod:`eddyline_runtime.restore`.
"""

from eddyline_runtime.processing.dsl import KGroupedStream, KStream, KTable, StreamsBuilder
from eddyline_runtime.processing.topology import (
    Cancellable,
    Change,
    Headers,
    Processor,
    ProcessorContext,
    PunctuationType,
    Punctuator,
    RecordContext,
    StoreSpec,
    Topology,
    TopologyError,
)
from eddyline_runtime.serde import BytesSerde, IntSerde, JsonSerde, LongSerde, Serde, StringSerde

__all__ = [
    "BytesSerde",
    "Cancellable",
    "Change",
    "Headers",
    "IntSerde",
    "JsonSerde",
    "KGroupedStream",
    "KStream",
    "KTable",
    "LongSerde",
    "Processor",
    "ProcessorContext",
    "PunctuationType",
    "Punctuator",
    "RecordContext",
    "Serde",
    "StoreSpec",
    "StreamsBuilder",
    "StringSerde",
    "Topology",
    "TopologyError",
]
