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

import random
import time
from collections.abc import Iterator

import pytest

from tests.support.cluster_word_count import produce_lines, random_lines
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture
from tests.support.kafka.broker import KafkaCluster
from tests.support.kafka.plugin import use_cluster
from tests.support.kafka.streamapp import READY_TIMEOUT, ready
from tests.support.node_loss import members, membership, survivor_addresses, wait_dropped
from tests.support.wordcount_app import ExpectedCounts, word_count_on

pytestmark = pytest.mark.slow

APP = "nodeloss"
NAMESPACE = "node-loss"
WORDS = [f"n{index:02d}" for index in range(30)]
# The chart's nodeLossGraceSeconds (values.yaml), and what may come on top of it: the
# operator lists Leases every 2 s and its clock has whole seconds; then a cycle publishes.
GRACE_SECONDS = 15.0
TAKEOVER_SLACK_SECONDS = 10.0


operator = operator_fixture(NAMESPACE, directory="operator-node-loss", watching=False)


class Counts(ExpectedCounts):
    """The lines produced so far and the counts the query Service must answer."""

    def produce(self, lines: int, seed: int) -> None:
        batch = random_lines(random.Random(seed), WORDS, lines, most=5)
        self.expected.update(word for line in batch for word in line.split())
        produce_lines(self.log_url, batch)


@pytest.fixture(scope="module")
def counts(
    operator: Operator, control_plane: Cluster, kafka_broker: KafkaCluster
) -> Iterator[Counts]:
    log_url = f"kafka://{kafka_broker.bootstrap}"
    with word_count_on(operator, APP, log_url) as query_service:
        yield Counts(APP, log_url, query_service)


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
