"""The operator on a ``kafka://`` log, on the real control plane and a real Kafka broker.

The word count's every topic (input, repartition, changelogs, output) lives on the project's
own KRaft broker (``tests/support/kafka``). Pods are processes on their own loopback
addresses (``127.10.<node>.<n>``), so the broker's ``127.0.0.1`` listener is the host side
every pod reaches, as a node's pods reach a cluster's brokers. Unlike the embedded log, a
Kafka log lets the scheduler spread the pods over the three zones (``standbyPlacement``
``Required``). The client settings come from a Secret the operator mounts
(``spec.log.secretName``). A SIGKILLed pod's tasks fail over and the counts stay exact, both
through the query Service and on the output topic read ``read_committed``.
"""

from __future__ import annotations

import collections
import random
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaPartition

from eddyline_runtime.log import Record
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Operator
from tests.support.kafka.broker import KafkaCluster

pytestmark = pytest.mark.slow

APP = "wc-kafka"
NAMESPACE = "wordcount-kafka"
SECRET = "wc-kafka-log"
INPUT = "text-lines"
OUTPUT = "word-counts"
STORE = "word-counts"
PARTITIONS = 4
WORDS = [f"k{index:02d}" for index in range(40)]
ZONE_LABEL = "topology.kubernetes.io/zone"
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300
COUNT_TIMEOUT = 120


def manifest(bootstrap: str) -> dict[str, Any]:
    return {
        "apiVersion": "eddyline.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": {"name": APP},
        "spec": {
            "topology": {"ref": "wordcount:topology", "revision": "1"},
            "image": "ghcr.io/eddyline/examples:0.1.0",
            "replicas": 3,
            "log": {"url": f"kafka://{bootstrap}", "secretName": SECRET},
            "config": {"processing.guarantee": "exactly_once_v2", "num.standby.replicas": 1},
            "standbyPlacement": {"spread": "Required"},
            "storage": {"size": "1Gi"},
        },
    }


@dataclass
class WordCount:
    operator: Operator
    bootstrap: str
    query_service: str
    expected: collections.Counter[str]
    last_mismatch: str = ""

    def produce(self, lines: int, seed: int) -> None:
        rng = random.Random(seed)
        batch = []
        for _ in range(lines):
            words = rng.choices(WORDS, k=rng.randint(1, 6))
            self.expected.update(words)
            batch.append(" ".join(words))
        log = KafkaLog.open(f"kafka://{self.bootstrap}")
        try:
            now = int(time.time() * 1000)
            for partition in range(PARTITIONS):
                records = [Record(None, line.encode(), now) for line in batch[partition::4]]
                log.produce(TopicPartition(INPUT, partition), records)
        finally:
            log.close()

    def counts_exact(self) -> bool:
        router = QueryRouter([self.query_service], timeout=2)
        for word, count in self.expected.items():
            try:
                result = router.get(STORE, word)
            except QueryFailedError as error:
                self.last_mismatch = f"{word}: {error}"
                return False
            if not result.found or int(result.value) != count:
                self.last_mismatch = f"{word}: {result} (expected {count})"
                return False
        return True

    def wait_exact(self, what: str) -> None:
        try:
            wait_until(self.counts_exact, what, COUNT_TIMEOUT)
        except TimeoutError as error:
            print(self.operator.describe_failure(APP))
            raise AssertionError(f"{error}; last answer {self.last_mismatch}") from None

    def published(self) -> dict[str, list[int]]:
        """Every count committed to the output topic, per word, in order."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"check-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        counts: dict[str, list[int]] = {}
        try:
            for partition in range(PARTITIONS):
                tp = KafkaPartition(OUTPUT, partition)
                _, end = consumer.get_watermark_offsets(tp, timeout=10)
                consumer.assign([KafkaPartition(OUTPUT, partition, 0)])
                position = 0
                while position < end:
                    message = consumer.poll(1)
                    if message is None:
                        break  # the rest up to the high watermark is markers or aborted
                    assert message.error() is None, message.error()
                    word = message.key().decode()
                    counts.setdefault(word, []).append(struct.unpack(">q", message.value())[0])
                    position = message.offset() + 1
        finally:
            consumer.close()
        return counts


def _ready(operator: Operator, replicas: int = 3) -> bool:
    app = operator.app(APP)
    status = app.get("status", {})
    ready = operator.condition(APP, "Ready")
    return bool(
        status.get("readyReplicas") == replicas
        and ready is not None
        and ready["status"] == "True"
        and status.get("observedGeneration") == app["metadata"]["generation"]
    )


@pytest.fixture(scope="module")
def wordcount(
    control_plane: Cluster,
    kafka_broker: KafkaCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WordCount]:
    pytest.importorskip("helm_sdkpy")  # installed by `make setup`
    bootstrap = kafka_broker.bootstrap
    log = KafkaLog.open(f"kafka://{bootstrap}")
    try:
        # Input topics are the user's: created before the app, as on a real cluster.
        assert INPUT not in log.topics(), f"{INPUT} already on the session's broker"
        log.create_topic(INPUT, PARTITIONS)
    finally:
        log.close()
    operator = Operator(control_plane, tmp_path_factory.mktemp("operator-kafka"), NAMESPACE)
    operator.install()
    operator.start()
    try:
        operator.wait_watching()
        # Client settings the pods get through the mounted Secret (docs/kafka.md).
        operator.kubectl(
            "create", "secret", "generic", SECRET,
            "--from-literal=replication.factor=1",
            "--from-literal=client.rack=eddyline-e2e",
        )  # fmt: skip
        applied = operator.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(manifest(bootstrap)))
        assert applied.strip() == f"streamapp.eddyline.dev/{APP} created"
        try:
            wait_until(lambda: _ready(operator), "3 ready pods and Ready=True", READY_TIMEOUT)
        except TimeoutError:
            print(operator.describe_failure(APP))
            raise
        service = operator.get("", "services", f"{APP}-query")
        assert service is not None
        address = f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
        yield WordCount(operator, bootstrap, address, collections.Counter())
        # The pods stop before the broker does (it is the session's, stopped after).
        operator.kubectl("delete", "sapp", APP)
        wait_until(lambda: not operator.pods(APP), "every pod gone", READY_TIMEOUT)
    finally:
        operator.stop()


def test_pods_spread_over_the_three_zones_with_the_log_secret_mounted(
    wordcount: WordCount, control_plane: Cluster
) -> None:
    operator = wordcount.operator
    pods = operator.pods(APP)
    assert sorted(pods) == [f"{APP}-0", f"{APP}-1", f"{APP}-2"]
    nodes = {pod["spec"]["nodeName"] for pod in pods.values()}
    zones = {
        operator.admin.get(f"/api/v1/nodes/{node}")["metadata"]["labels"][ZONE_LABEL]
        for node in nodes
    }
    assert len(zones) == 3, f"pods on nodes {nodes} in zones {zones}"
    for pod in pods.values():
        assert "affinity" not in pod["spec"] or "nodeAffinity" not in pod["spec"]["affinity"]
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["log-secret"]["secret"]["secretName"] == SECRET
    # No claim for an embedded log.
    claims = {c["metadata"]["name"] for c in operator.objects("", "persistentvolumeclaims")}
    assert f"{APP}-log" not in claims
    assert "Forbidden" not in operator.output()


def test_a_sigkilled_pod_fails_over_and_counts_stay_exact_on_kafka(
    wordcount: WordCount, control_plane: Cluster
) -> None:
    operator = wordcount.operator
    assert control_plane.kubelets is not None
    wordcount.produce(1_000, seed=1)
    wordcount.wait_exact("exact counts before the kill")
    word = wordcount.expected.most_common(1)[0][0]
    before = QueryRouter([wordcount.query_service], timeout=2).get(STORE, word)
    assert before.host is not None
    victim = next(
        name
        for name, pod in operator.pods(APP).items()
        if pod["status"].get("podIP") == before.host.split(":")[0]
    )
    killed_at = time.monotonic()
    control_plane.kubelets.kill_container(NAMESPACE, victim)
    wordcount.produce(1_000, seed=2)  # arrives while the victim's tasks move
    wordcount.wait_exact("exact counts after the failover")
    print(f"exact again {time.monotonic() - killed_at:.2f} s after the kill")

    def restarted() -> bool:
        statuses = operator.pods(APP)[victim]["status"].get("containerStatuses", [])
        return bool(statuses and statuses[0]["restartCount"] > 0) and _ready(operator)

    wait_until(restarted, f"{victim} restarted by its kubelet and ready", READY_TIMEOUT)
    wordcount.produce(500, seed=3)
    wordcount.wait_exact("exact counts with the pod back")

    # The output topic, read committed: the last count of each word is exact, and no word's
    # counts repeat or go back (an aborted transaction's records are never seen).
    def output_exact() -> bool:
        latest = {w: counts[-1] for w, counts in wordcount.published().items()}
        return latest == dict(wordcount.expected)

    wait_until(output_exact, "exact last counts on the output topic", COUNT_TIMEOUT)
    for published_word, counts in wordcount.published().items():
        assert counts == sorted(set(counts)), f"{published_word}: {counts}"
