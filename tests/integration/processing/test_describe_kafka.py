"""describe() against Kafka Streams itself: random Processor API topologies built the same
way in Kafka Streams (the pinned release, kstreams/DescribeTopologies.java) and in eddyline
print the same text, character for character.

Kafka's order of nodes, of ``-->``/``<--`` names and of stores comes from its Java
collections (see eddyline_runtime.processing.description); fan-ins, fan-outs, shared
stores, several sub-topologies and global stores exercise every one of them.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.processing.topology import GlobalStoreSpec, Processor, StoreSpec, Topology
from tests.support.kafka.broker import kafka_libs

pytestmark = pytest.mark.slow

JAVA_SOURCE = Path(__file__).parent / "kstreams" / "DescribeTopologies.java"
# Enough random topologies to meet every ordering rule many times over; Kafka describes
# them all in one JVM.
TOPOLOGIES = 200


class Nothing(Processor):
    def process(self, key: Any, value: Any) -> None:
        pass


def random_topology(seed: int) -> tuple[Topology, list[str]]:
    """A topology and the lines that build the same one in DescribeTopologies.java."""
    rnd = random.Random(seed)
    topology, lines, nodes, processors = Topology(), [], [], []
    for index in range(rnd.randint(1, 3)):
        name = f"src{rnd.randint(0, 999)}-{index}"
        topics = list(dict.fromkeys(f"t{rnd.randint(0, 50)}x{index}" for _ in range(3)))
        topology.add_source(name, topics)
        lines.append(f"source {name} {','.join(topics)}")
        nodes.append(name)
    for index in range(rnd.randint(1, 25)):
        name = rnd.choice(["proc", "KSTREAM-MAP", "a", "zz", "KTABLE-X"]) + f"-{index}"
        parents = rnd.sample(nodes, rnd.randint(1, min(3, len(nodes))))
        topology.add_processor(name, Nothing, *parents)
        lines.append(f"proc {name} {','.join(parents)}")
        nodes.append(name)
        processors.append(name)
    for _ in range(rnd.randint(0, 8)):
        store = rnd.choice(["counts", "st", "alpha", "beta-store", "agg", "x"])
        store += str(rnd.randint(0, 5))
        processor = rnd.choice(processors)
        if store not in topology.nodes[processor].stores:
            topology.add_state_store(StoreSpec(store), processor)
            lines.append(f"store {store} {processor}")
    for index in range(rnd.randint(1, 3)):
        parents = rnd.sample(nodes, rnd.randint(1, min(3, len(nodes))))
        topology.add_sink(f"sink-{index}", f"out{index}", *parents)
        lines.append(f"sink sink-{index} out{index} {','.join(parents)}")
    for index in range(rnd.randint(0, 2)):
        store, topic = f"global-{index}", f"global-topic-{index}"
        source, processor = f"gsource-{index}", f"gprocessor-{index}"
        topology.add_global_store(GlobalStoreSpec(StoreSpec(store), topic, source, processor))
        # Kafka's processors read a global store without being connected to it.
        topology.connect_global_store(store, rnd.choice(processors))
        lines.append(f"global {store} {topic} {source} {processor}")
    return topology, lines


@pytest.mark.skipif(shutil.which("javac") is None, reason="needs a JDK (javac)")
def test_describe_matches_kafka_streams_for_random_topologies(tmp_path: Path) -> None:
    classpath = f"{kafka_libs()}/*"
    subprocess.run(
        ["javac", "-d", str(tmp_path), "-cp", classpath, str(JAVA_SOURCE)],
        check=True,
        capture_output=True,
    )
    ours, files = [], []
    for seed in range(TOPOLOGIES):
        topology, lines = random_topology(seed)
        spec = tmp_path / f"topology-{seed}.txt"
        spec.write_text("\n".join(lines) + "\n")
        files.append(str(spec))
        ours.append(topology.describe())
    done = subprocess.run(
        ["java", "-cp", f"{classpath}:{tmp_path}", "DescribeTopologies", *files],
        check=True,
        capture_output=True,
        text=True,
    )
    kafkas = done.stdout.split("=====\n")[:-1]
    assert len(kafkas) == TOPOLOGIES
    for seed, (kafka, our) in enumerate(zip(kafkas, ours, strict=True)):
        assert our == kafka, f"topology {seed} ({files[seed]}) is described differently"
