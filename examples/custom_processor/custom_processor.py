"""Deduplication with the Processor API: forward each event id's first occurrence only.

Producers that retry may write an event twice. Events on ``events`` are keyed
by their id; :class:`DeduplicateProcessor` remembers every id it has seen in
the ``seen-event-ids`` store (id -> timestamp of its first occurrence, a
Kafka long) and forwards an event to ``unique-events`` only the first time.
Because the id is the key, every copy of an event lands in the same
partition, hence in the same task and store. Under exactly-once the store
and the output commit together, so a restart neither forgets an id nor
forwards an event twice.

The store grows with every distinct id; a real deployment would expire old
ids (a windowed store), which this example leaves out.
"""

from typing import Any

from eddyline_runtime.processing import Processor, ProcessorContext, StoreSpec, Topology
from eddyline_runtime.serde import LongSerde, StringSerde

INPUT_TOPIC = "events"
OUTPUT_TOPIC = "unique-events"
STORE = "seen-event-ids"

_ids = StringSerde()


class DeduplicateProcessor(Processor):
    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.seen = context.get_state_store(STORE)

    def process(self, key: Any, value: Any) -> None:
        if key is None:
            return  # without an id, duplicates cannot be told apart: drop it
        stored_key = _ids.serialize(key)  # stores hold bytes: serialize first
        if self.seen.get(stored_key) is not None:
            return  # a duplicate
        self.seen.put(stored_key, LongSerde.serialize(self.context.timestamp))
        self.context.forward(key, value)


def topology() -> Topology:
    return (
        Topology()
        .add_source("events-source", [INPUT_TOPIC], key_serde="string", value_serde="json")
        .add_processor("deduplicate", DeduplicateProcessor, "events-source")
        .add_state_store(StoreSpec(STORE), "deduplicate")
        .add_sink(
            "unique-events-sink",
            OUTPUT_TOPIC,
            "deduplicate",
            key_serde="string",
            value_serde="json",
        )
    )
