"""Deduplication with the Processor API: forward each event id's first occurrence only.

Producers that retry may write an event twice. Events on ``events`` are keyed
by their id; :class:`DeduplicateProcessor` remembers every id it has seen in
the ``seen-event-ids`` store (id -> timestamp of its first occurrence, a
Kafka long) and forwards an event to ``unique-events`` only the first time,
with its timestamp and headers. Because the id is the key, every copy of an
event lands in the same partition, hence in the same task and store. Under
exactly-once the store and the output commit together, so a restart neither
forgets an id nor forwards an event twice.

Ids are remembered for ``RETENTION_MS`` of event time: a punctuation driven
by stream time (the largest event timestamp the task has processed) deletes
older ids every ``PURGE_INTERVAL_MS``, so the store stops growing with every
distinct id. A copy arriving more than ``RETENTION_MS`` after the first is
forwarded again.
"""

from typing import Any

from eddyline_runtime.processing import (
    Processor,
    ProcessorContext,
    PunctuationType,
    StoreSpec,
    Topology,
)
from eddyline_runtime.serde import LongSerde, StringSerde

INPUT_TOPIC = "events"
OUTPUT_TOPIC = "unique-events"
STORE = "seen-event-ids"
# How long, in event time, an id is remembered: retries come within minutes.
RETENTION_MS = 24 * 60 * 60 * 1000
# How often, in stream time, forgotten ids are deleted: each purge reads the whole store.
PURGE_INTERVAL_MS = 60 * 60 * 1000

_ids = StringSerde()


class DeduplicateProcessor(Processor):
    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.seen = context.get_state_store(STORE)
        context.schedule(PURGE_INTERVAL_MS, PunctuationType.STREAM_TIME, self.purge)

    def process(self, key: Any, value: Any) -> None:
        if key is None:
            return  # without an id, duplicates cannot be told apart: drop it
        stored_key = _ids.serialize(key)  # stores hold bytes: serialize first
        first_seen = self.seen.put_if_absent(
            stored_key, LongSerde.serialize(self.context.timestamp)
        )
        if first_seen is None:  # not seen before: put_if_absent wrote it
            self.context.forward(key, value)

    def purge(self, stream_time: int) -> None:
        """Forget ids first seen more than RETENTION_MS before the stream time."""
        horizon = stream_time - RETENTION_MS
        expired = [key for key, first in self.seen.all() if LongSerde.deserialize(first) < horizon]
        for key in expired:
            self.seen.delete(key)


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
