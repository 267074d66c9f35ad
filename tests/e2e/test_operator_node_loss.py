"""Issue 23, item 2: a node dies and its pod's tasks move within the operator's grace.

On the real control plane (kube-apiserver, controllers, scheduler) with the kubelet stand-in,
the word count runs on Kafka (pods spread one per node over three zones). One node is killed
as a machine losing power: its Lease stops being renewed, its status is no longer updated,
its processes die. The pod on it still looks Running and Ready to the API server, and the
node lifecycle controller would evict it only after about 5 minutes: the operator must drop
it from the membership once the node's Lease is older than its grace (the chart's 15 s), so
that the two survivors take over and counts stay exact. The node is then booted again so
that the session's cluster keeps its three nodes.
"""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_runtime.log import Record, open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture
from tests.support.kafka.broker import KafkaCluster
from tests.support.kafka.plugin import use_cluster
from tests.support.kafka.streamapp import ready
from tests.support.node_loss import members, membership, survivor_addresses, wait_dropped

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
APP = "nodeloss"
NAMESPACE = "node-loss"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
STORE = "word-counts"
TOPIC = "text-lines"
WORDS = [f"n{index:02d}" for index in range(30)]
# The chart's nodeLossGraceSeconds (values.yaml), and what may come on top of it: the
# operator lists Leases every 2 s and its clock has whole seconds; then a cycle publishes.
GRACE_SECONDS = 15.0
TAKEOVER_SLACK_SECONDS = 10.0
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300
COUNT_TIMEOUT = 120


operator = operator_fixture(NAMESPACE, directory="operator-node-loss", watching=False)


class Counts:
    """The lines produced so far and the counts the query Service must answer."""

    def __init__(self, log_url: str, query_service: str) -> None:
        self.log_url = log_url
        # Where queries start: the query Service, or chosen pods' addresses.
        self.query_addresses = [query_service]
        self.expected: collections.Counter[str] = collections.Counter()
        self.last_mismatch = ""

    def produce(self, lines: int, seed: int) -> None:
        rng = random.Random(seed)
        batch = []
        for _ in range(lines):
            words = rng.choices(WORDS, k=rng.randint(1, 5))
            self.expected.update(words)
            batch.append(" ".join(words))
        log = open_log(self.log_url)
        try:
            now = int(time.time() * 1000)
            for partition in range(4):
                records = [Record(None, line.encode(), now) for line in batch[partition::4]]
                log.produce(TopicPartition(TOPIC, partition), records)
        finally:
            log.close()

    def exact(self) -> bool:
        router = QueryRouter(self.query_addresses, timeout=2)
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

    def wait_exact(self, operator: Operator, what: str) -> None:
        try:
            wait_until(self.exact, what, COUNT_TIMEOUT)
        except TimeoutError as error:
            print(operator.describe_failure(APP))
            raise AssertionError(f"{error}; last answer {self.last_mismatch}") from None


@pytest.fixture(scope="module")
def counts(
    operator: Operator, control_plane: Cluster, kafka_broker: KafkaCluster
) -> Iterator[Counts]:
    log_url = f"kafka://{kafka_broker.bootstrap}"
    log = open_log(log_url)
    try:
        log.create_topic(TOPIC, 4)
    finally:
        log.close()
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["metadata"]["name"] = APP
    document["spec"]["log"] = {"url": log_url}
    operator.wait_watching()
    operator.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(document))
    try:
        wait_until(lambda: ready(operator, APP), "3 ready pods and Ready=True", READY_TIMEOUT)
    except TimeoutError:
        print(operator.describe_failure(APP))
        raise
    service = operator.get("", "services", f"{APP}-query")
    assert service is not None
    yield Counts(log_url, f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}")
    # Nothing of this app keeps running (and using the 2 cores) for the modules after it.
    operator.kubectl("delete", "sapp", APP, "--wait=false")


def test_a_dead_nodes_pod_leaves_the_membership_within_the_grace_and_counts_stay_exact(
    operator: Operator,
    counts: Counts,
    control_plane: Cluster,
    request: pytest.FixtureRequest,
    kafka_broker: KafkaCluster,
) -> None:
    use_cluster(request, kafka_broker)
    kubelets = control_plane.kubelets
    assert kubelets is not None
    pods = operator.pods(APP)
    # Kafka's log lets pods spread over the zones: one pod per node.
    nodes = {name: pod["spec"]["nodeName"] for name, pod in pods.items()}
    assert len(set(nodes.values())) == 3, nodes
    counts.produce(1_000, seed=1)
    counts.wait_exact(operator, "exact counts before the node dies")
    before = membership(operator, APP)
    assert before is not None
    victim = f"{APP}-1"
    assert before.assignment.tasks_of(victim).active, "the victim holds active tasks"
    dead = nodes[victim]

    killed_at = time.monotonic()
    kubelets.kill_node(dead)
    try:
        wait_dropped(
            operator,
            APP,
            victim,
            f"{victim} (on the dead {dead}) to leave the membership",
            GRACE_SECONDS + TAKEOVER_SLACK_SECONDS + 30,
        )
        dropped_s = time.monotonic() - killed_at
        # The pod still looks Running and Ready: only the node's Lease said it is gone.
        pod = operator.pods(APP)[victim]
        assert pod["status"]["phase"] == "Running"
        assert not pod["metadata"].get("deletionTimestamp")
        after = membership(operator, APP)
        assert after is not None and after.generation > before.generation
        assert members(operator, APP) == {f"{APP}-0", f"{APP}-2"}
        assert after.assignment.tasks == before.assignment.tasks
        # Asked directly: the query Service keeps the dead pod as an endpoint until the node
        # lifecycle controller marks it not ready (its node-monitor grace, 40 s and more).
        service = counts.query_addresses
        counts.query_addresses = survivor_addresses(operator, APP, victim)
        counts.produce(1_000, seed=2)
        counts.wait_exact(operator, "exact counts on the two survivors")
        counts.query_addresses = service
        processing_s = time.monotonic() - killed_at
        print(
            f"node_loss_to_membership_s={dropped_s:.1f} "
            f"node_loss_to_processing_s={processing_s:.1f}"
        )
        # Long before the node lifecycle controller's eviction (300 s): the grace and a cycle.
        assert dropped_s < GRACE_SECONDS + TAKEOVER_SLACK_SECONDS, dropped_s
        status = operator.app(APP)["status"]
        assert f"{victim} left the membership: node {dead} is lost" in status["message"]
        degraded = operator.condition(APP, "Degraded")
        assert degraded is not None and degraded["reason"] == "NodeLost", degraded
        reasons = [
            e["reason"]
            for e in operator.objects("", "events")
            if e["involvedObject"].get("name") == APP
        ]
        assert "NodeLost" in reasons
    finally:
        kubelets.reboot_node(dead)

    # The machine boots again: its pod restarts and rejoins (fencing kept its zombie safe).
    def rejoined() -> bool:
        return victim in members(operator, APP) and ready(operator, APP)

    wait_until(rejoined, f"{victim} back in the membership after {dead} rebooted", READY_TIMEOUT)
    counts.produce(500, seed=3)
    counts.wait_exact(operator, "exact counts with the rebooted node's pod back")
    assert "cannot list Leases" not in operator.output()  # the chart grants reading them
