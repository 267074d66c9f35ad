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


# Revision 2 of the topology: it gains a first sub-topology (records of "watched-words" are
# copied to "word-alerts"), so every ordinal shifts and the
# ``word-counts`` store's task moves from sub-topology 1 to 2. Deploy it by changing
# ``spec.topology`` to ``{ref: "wordcount:topology_v2", revision: "2"}``: the operator stops
# every pod, publishes the new revision, and the pods relocate their state (KIP-816)
# instead of rebuilding it.
ALERTS_INPUT_TOPIC = "watched-words"
ALERTS_TOPIC = "word-alerts"
# The name revision 1 generated for its repartition topic (KSTREAM-AGGREGATE-STATE-STORE-<n>).
V1_REPARTITION = "KSTREAM-AGGREGATE-STATE-STORE-0000000003"


def topology_v2() -> StreamsBuilder:
    builder = StreamsBuilder()
    builder.stream(ALERTS_INPUT_TOPIC, value_serde="string").to(ALERTS_TOPIC, value_serde="string")
    (
        builder.stream(INPUT_TOPIC, value_serde="string")
        .flat_map_values(lambda line: line.lower().split())
        # Revision 1's repartition topic, by name: the generated one would shift with the new
        # nodes above, and words still in the old topic at the upgrade would be lost.
        .group_by(lambda _, word: word, value_serde="string", repartition_name=V1_REPARTITION)
        .count(STORE)
        .to_stream()
        .to(OUTPUT_TOPIC, key_serde="string", value_serde="long")
    )
    return builder


# Revision 3 adds an aggregation beside revision 2's: how many words of each length were
# counted, in a new ``word-lengths`` store, with a repartition topic named for it. An
# upgrade to it keeps ``word-counts`` where it is (relocated, as from 1 to 2); the new store
# starts empty and counts what arrives from then on (docs/queries.md, "Stores that differ
# between the revisions"; docs/backfill.md builds it from the input's history instead).
LENGTHS_STORE = "word-lengths"


def topology_v3() -> StreamsBuilder:
    builder = StreamsBuilder()
    builder.stream(ALERTS_INPUT_TOPIC, value_serde="string").to(ALERTS_TOPIC, value_serde="string")
    words = builder.stream(INPUT_TOPIC, value_serde="string").flat_map_values(
        lambda line: line.lower().split()
    )
    (
        words.group_by(lambda _, word: word, value_serde="string", repartition_name=V1_REPARTITION)
        .count(STORE)
        .to_stream()
        .to(OUTPUT_TOPIC, key_serde="string", value_serde="long")
    )
    words.group_by(
        lambda _, word: str(len(word)), value_serde="string", repartition_name="word-lengths"
    ).count(LENGTHS_STORE)
    return builder
