"""Word count: split lines into words, count each word, publish every new count.

The counting sub-topology reads a repartition topic keyed by word, so each
word's count lives in exactly one task's ``word-counts`` store.
"""

from eddyline_runtime.processing import StreamsBuilder

INPUT_TOPIC = "text-lines"
OUTPUT_TOPIC = "word-counts"
STORE = "word-counts"


def topology() -> StreamsBuilder:
    builder = StreamsBuilder()
    (
        builder.stream(INPUT_TOPIC, value_serde="string")
        .flat_map_values(lambda line: line.lower().split())
        .group_by(lambda _, word: word, value_serde="string")
        .count(STORE)
        .to_stream()
        .to(OUTPUT_TOPIC, key_serde="string", value_serde="long")
    )
    return builder
