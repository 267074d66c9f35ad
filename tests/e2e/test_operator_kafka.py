"""The operator on a ``kafka://`` log, on the real control plane and a real Kafka broker.

The word count's every topic (input, repartition, changelogs, output) lives on the project's
own KRaft broker (``tests/support/kafka``). Pods are processes on their own loopback
addresses, so the broker's ``127.0.0.1`` listener is the host side every pod reaches, as a
node's pods reach a cluster's brokers. Unlike the embedded log, a Kafka log lets the
scheduler spread the pods over the three zones (``standbyPlacement`` ``Required``). The
client settings come from a Secret the operator mounts (``spec.log.secretName``). A
SIGKILLed pod's tasks fail over and the counts stay exact, both through the query Service
and on the output topic read ``read_committed``.
"""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from eddyline_runtime.query.client import QueryRouter
from tests.support.cluster_word_count import STORE, counts_exact, produce_lines, random_lines
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Operator
from tests.support.kafka.broker import KafkaCluster
from tests.support.kafka.plugin import use_cluster
from tests.support.kafka.streamapp import READY_TIMEOUT, create_input, deploy, published, ready

pytestmark = pytest.mark.slow

APP = "wc-kafka"
NAMESPACE = "wordcount-kafka"
SECRET = "wc-kafka-log"
WORDS = [f"k{index:02d}" for index in range(40)]
ZONE_LABEL = "topology.kubernetes.io/zone"
COUNT_TIMEOUT = 120  # a bound for a broken run on a loaded 2-core machine


@dataclass
class WordCount:
    operator: Operator
    bootstrap: str
    query_service: str
    expected: collections.Counter[str]

    def produce(self, lines: int, seed: int) -> None:
        batch = random_lines(random.Random(seed), WORDS, lines, most=6)
        self.expected.update(word for line in batch for word in line.split())
        produce_lines(f"kafka://{self.bootstrap}", batch)

    def router(self) -> QueryRouter:
        return QueryRouter([self.query_service], timeout=2)

    def wait_exact(self, what: str) -> None:
        try:
            wait_until(lambda: counts_exact(self.router(), self.expected), what, COUNT_TIMEOUT)
        except TimeoutError:
            print(self.operator.describe_failure(APP))
            raise


@pytest.fixture(scope="module")
def wordcount(
    control_plane: Cluster, kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WordCount]:
    bootstrap = kafka_broker.bootstrap
    create_input(bootstrap)
    operator = Operator(control_plane, tmp_path_factory.mktemp("operator-kafka"), NAMESPACE)
    operator.install()
    operator.start()
    try:
        service = deploy(operator, APP, bootstrap, SECRET)
        yield WordCount(operator, bootstrap, service, collections.Counter())
        # The pods stop before the broker does (the session's, stopped after this module).
        operator.kubectl("delete", "sapp", APP)
        wait_until(lambda: not operator.pods(APP), "every pod gone", READY_TIMEOUT)
    finally:
        operator.stop()


@pytest.fixture(autouse=True)
def _broker_logs_on_failure(request: pytest.FixtureRequest, kafka_broker: KafkaCluster) -> None:
    use_cluster(request, kafka_broker)


def test_pods_spread_over_the_three_zones_with_the_log_secret_mounted(
    wordcount: WordCount,
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
        # Not pinned to a node, as the embedded log's pods are.
        assert "nodeAffinity" not in pod["spec"].get("affinity", {})
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["log-secret"]["secret"]["secretName"] == SECRET
    claims = {c["metadata"]["name"] for c in operator.objects("", "persistentvolumeclaims")}
    assert f"{APP}-log" not in claims  # no claim for an embedded log
    assert "Forbidden" not in operator.output()


def test_a_sigkilled_pod_fails_over_and_counts_stay_exact_on_kafka(
    wordcount: WordCount, control_plane: Cluster
) -> None:
    operator = wordcount.operator
    assert control_plane.kubelets is not None
    wordcount.produce(1_000, seed=1)
    wordcount.wait_exact("exact counts before the kill")
    word = wordcount.expected.most_common(1)[0][0]
    before = wordcount.router().get(STORE, word)
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
        return bool(statuses and statuses[0]["restartCount"] > 0) and ready(operator, APP)

    wait_until(restarted, f"{victim} restarted by its kubelet and ready", READY_TIMEOUT)
    wordcount.produce(500, seed=3)
    wordcount.wait_exact("exact counts with the pod back")

    # The output topic, read committed: each word's last count is exact, and no word's counts
    # repeat or go back (no aborted transaction's record is seen, no commit is doubled).
    def output_exact() -> bool:
        latest = {w: counts[-1] for w, counts in published(wordcount.bootstrap).items()}
        return latest == dict(wordcount.expected)

    wait_until(output_exact, "exact last counts on the output topic", COUNT_TIMEOUT)
    for published_word, counts in published(wordcount.bootstrap).items():
        assert counts == sorted(set(counts)), f"{published_word}: {counts}"
