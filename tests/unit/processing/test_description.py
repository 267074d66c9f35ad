"""describe(): Kafka Streams 4.4's ``TopologyDescription.toString()``, character for character.

The expected strings are Kafka's own: one ported from Kafka's
``TopologyTest.kGroupedStreamNamedMaterializedCountShouldPreserveTopologyStructure``,
one printed by Kafka Streams 4.4's ``Topology.describe()`` for the same
Processor API topology (tests/integration/processing/test_describe_kafka.py
compares hundreds more with a live Kafka Streams).
"""

from __future__ import annotations

from typing import Any

from eddyline_runtime.processing import StreamsBuilder
from eddyline_runtime.processing.description import describe_hash
from eddyline_runtime.processing.topology import GlobalStoreSpec, Processor, StoreSpec, Topology
from eddyline_runtime.query.layout import topology_hash


class Nothing(Processor):
    def process(self, key: Any, value: Any) -> None:
        pass


def test_kgrouped_stream_named_materialized_count_as_kafka_topology_test() -> None:
    """TopologyTest.kGroupedStreamNamedMaterializedCountShouldPreserveTopologyStructure:
    stream("input-topic").groupByKey().count(Materialized.as("count-store"))."""
    builder = StreamsBuilder()
    builder.stream("input-topic").group_by_key().count("count-store")
    assert builder.build().describe() == (
        "Topologies:\n"
        "   Sub-topology: 0\n"
        "    Source: KSTREAM-SOURCE-0000000000 (topics: [input-topic])\n"
        "      --> KSTREAM-AGGREGATE-0000000001\n"
        "    Processor: KSTREAM-AGGREGATE-0000000001 (stores: [count-store])\n"
        "      --> none\n"
        "      <-- KSTREAM-SOURCE-0000000000\n\n"
    )


def fan_in_with_global_store() -> Topology:
    """Kafka 4.4 orders this one by every rule it has: a source of three topics, a
    processor with three stores, a sink with two parents, a second sub-topology and a
    global store."""
    topology = Topology()
    topology.add_source("source", ["topic-b", "topic-a", "topic-c"])
    topology.add_processor("a-proc", Nothing, "source")
    topology.add_processor("z-proc", Nothing, "source")
    topology.add_processor("m-proc", Nothing, "z-proc")
    for store in ("store-two", "counts", "alpha"):
        topology.add_state_store(StoreSpec(store), "z-proc")
    topology.add_sink("sink", "out", "m-proc", "a-proc")
    topology.add_source("source2", ["other"])
    topology.add_sink("sink2", "out2", "source2")
    rates = GlobalStoreSpec(StoreSpec("rates"), "rates-topic", "rates-source", "rates-processor")
    topology.add_global_store(rates)
    return topology


# Kafka Streams 4.4's Topology.describe().toString() for the same topology, built with
# addSource/addProcessor/addStateStore/addSink/addGlobalStore in the same order.
KAFKA_4_4_FAN_IN_WITH_GLOBAL_STORE = (
    "Topologies:\n"
    "   Sub-topology: 0\n"
    "    Source: source (topics: [topic-a, topic-b, topic-c])\n"
    "      --> a-proc, z-proc\n"
    "    Processor: z-proc (stores: [counts, store-two, alpha])\n"
    "      --> m-proc\n"
    "      <-- source\n"
    "    Processor: a-proc (stores: [])\n"
    "      --> sink\n"
    "      <-- source\n"
    "    Processor: m-proc (stores: [])\n"
    "      --> sink\n"
    "      <-- z-proc\n"
    "    Sink: sink (topic: out)\n"
    "      <-- m-proc, a-proc\n"
    "\n"
    "  Sub-topology: 1\n"
    "    Source: source2 (topics: [other])\n"
    "      --> sink2\n"
    "    Sink: sink2 (topic: out2)\n"
    "      <-- source2\n"
    "\n"
    "  Sub-topology: 2 for global store (will not generate tasks)\n"
    "    Source: rates-source (topics: [rates-topic])\n"
    "      --> rates-processor\n"
    "    Processor: rates-processor (stores: [rates])\n"
    "      --> none\n"
    "      <-- rates-source\n"
)


def test_processor_api_topology_describes_as_kafka_4_4() -> None:
    assert fan_in_with_global_store().describe() == KAFKA_4_4_FAN_IN_WITH_GLOBAL_STORE


def test_dsl_global_table_takes_kafkas_two_node_names() -> None:
    builder = StreamsBuilder()
    builder.global_table("rates", "rates-store")
    builder.stream("orders").to("out")
    assert (
        builder.build()
        .describe()
        .endswith(
            "  Sub-topology: 1 for global store (will not generate tasks)\n"
            "    Source: KSTREAM-SOURCE-0000000000 (topics: [rates])\n"
            "      --> KTABLE-SOURCE-0000000001\n"
            "    Processor: KTABLE-SOURCE-0000000001 (stores: [rates-store])\n"
            "      --> none\n"
            "      <-- KSTREAM-SOURCE-0000000000\n"
        )
    )


def test_describe_hash_is_the_hash_the_pods_report_and_tells_topologies_apart() -> None:
    text = fan_in_with_global_store().describe()
    assert describe_hash(text) == topology_hash(text)
    # sha256 of the text's UTF-8, its first 16 hex digits: the same on every machine.
    assert describe_hash("Topologies:\n ") == "86b0a39863357efd"
    other = fan_in_with_global_store()
    other.add_processor("extra", Nothing, "source2")
    assert describe_hash(other.describe()) != describe_hash(text)
