"""Processing: what a topology author writes, and nothing else.

A topology author imports from here and nowhere else: build a
:class:`Topology` with :class:`StreamsBuilder` (the DSL) or the Processor API
(:class:`Processor`, :class:`ProcessorContext` with its punctuations,
:class:`StoreSpec`), and pick serdes. ``eddyline run`` loads the function that returns it
(:mod:`.loader`).

The engine that runs a topology is :mod:`eddyline_runtime.engine`; restoration
is :mod:`eddyline_runtime.restore`. This package imports neither, nor the
stores or the log (an import contract holds it), so what authors see never
depends on how it is run. Every processor the DSL builds is in
:mod:`.operators`, by kind; :mod:`.dsl` only builds nodes.
"""

from eddyline_runtime.processing.dsl import (
    BranchedKStream,
    GlobalKTable,
    KGroupedStream,
    KGroupedTable,
    KStream,
    KTable,
    SessionWindowedKStream,
    SlidingWindowedKStream,
    StreamsBuilder,
    TimeWindowedKStream,
    WindowedKTable,
)
from eddyline_runtime.processing.joins import JoinWindows
from eddyline_runtime.processing.materialized import Materialized
from eddyline_runtime.processing.operators.stores import (
    KeyValueStore,
    SessionStore,
    TimestampedKeyValueStore,
    WindowStore,
)
from eddyline_runtime.processing.operators.suppress import SuppressionBufferFullError
from eddyline_runtime.processing.operators.tables import TableChange
from eddyline_runtime.processing.operators.value_processors import ValueTransformerWithKey
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
from eddyline_runtime.processing.windows import (
    BufferConfig,
    SessionWindow,
    SessionWindowedSerde,
    SessionWindows,
    SlidingWindows,
    Suppressed,
    TimeWindow,
    TimeWindowedSerde,
    TimeWindows,
    Windowed,
    WindowedSerdes,
)
from eddyline_runtime.serde import BytesSerde, IntSerde, JsonSerde, LongSerde, Serde, StringSerde

__all__ = [
    "BranchedKStream",
    "BufferConfig",
    "BytesSerde",
    "Cancellable",
    "Change",
    "GlobalKTable",
    "Headers",
    "IntSerde",
    "JoinWindows",
    "JsonSerde",
    "KGroupedStream",
    "KGroupedTable",
    "KStream",
    "KTable",
    "KeyValueStore",
    "LongSerde",
    "Materialized",
    "Processor",
    "ProcessorContext",
    "PunctuationType",
    "Punctuator",
    "RecordContext",
    "Serde",
    "SessionStore",
    "SessionWindow",
    "SessionWindowedKStream",
    "SessionWindowedSerde",
    "SessionWindows",
    "SlidingWindowedKStream",
    "SlidingWindows",
    "StoreSpec",
    "StreamsBuilder",
    "StringSerde",
    "Suppressed",
    "SuppressionBufferFullError",
    "TableChange",
    "TimeWindow",
    "TimeWindowedKStream",
    "TimeWindowedSerde",
    "TimeWindows",
    "TimestampedKeyValueStore",
    "Topology",
    "TopologyError",
    "ValueTransformerWithKey",
    "WindowStore",
    "Windowed",
    "WindowedKTable",
    "WindowedSerdes",
]
