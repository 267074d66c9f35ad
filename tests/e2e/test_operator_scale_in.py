"""Issue 25, scale in: a pod that leaves hands its tasks over before it exits.

On the real control plane (kube-apiserver, controllers, scheduler, the kubelet stand-in) the
word count runs on Kafka with one standby per stateful task, its three pods spread one per
node, while a producer writes a steady stream of lines. Three ways a pod leaves, each with
exact counts after it (no count lost or doubled) and no store restored on the critical path
(the records the new active copies replayed before processing, from the pods' metrics, stay
within a caught-up copy's tail):

* an eviction through the Eviction API (policy/v1): the pod hands over and comes back; the
  PodDisruptionBudget (``maxUnavailable: 1``) refuses a second eviction meanwhile;
* ``kubectl drain`` of one node: its pod hands over and its replacement waits (cordoned, its
  local volume is on that node) until the node is uncordoned;
* ``kubectl scale`` 3 -> 2: the StatefulSet keeps the third pod until it handed over, then
  drops it (the operator lowers replicas one pod at a time).
"""

from __future__ import annotations

import collections
import random
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_operator.reconcile.names import QUERY_PORT
from eddyline_runtime.assignor import DEFAULT_ACCEPTABLE_RECOVERY_LAG
from eddyline_runtime.log import Record, open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.support.control_plane.client import ApiError, wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Operator
from tests.support.kafka.broker import KafkaCluster
from tests.support.kafka.plugin import use_cluster
from tests.support.kafka.streamapp import ready
from tests.support.node_loss import membership

# Three pods start, leave and come back per test: minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
APP = "scalein"
NAMESPACE = "scale-in"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
STORE = "word-counts"
TOPIC = "text-lines"
# Words no other module counts (they share the session's broker and its input topic).
WORDS = [f"s{index:02d}" for index in range(30)]
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300
COUNT_TIMEOUT = 120
HAND_OVER_TIMEOUT = 90
_RESTORED = re.compile(r"^eddyline_stream_state_metrics_restore_total\{([^}]*)\} (\S+)$", re.M)
_HANDED_OVER = re.compile(r"tasks handed over after ([0-9.]+) s")


@pytest.fixture(scope="module")
def operator(
    control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    running = Operator(control_plane, tmp_path_factory.mktemp("operator-scale-in"), NAMESPACE)
    running.install()  # the release is named after the namespace: no collision
    running.start()
    yield running
    running.stop()


class SteadyInput:
    """Lines at a steady rate from a thread, and the counts they must add up to."""

    def __init__(self, log_url: str, query_service: str) -> None:
        self.log_url = log_url
        self.query_addresses = [query_service]
        self.expected: collections.Counter[str] = collections.Counter()
        self.last_mismatch = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seed = 0

    def start(self) -> None:
        self._stop.clear()
        self._seed += 1
        self._thread = threading.Thread(target=self._produce, args=(self._seed,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _produce(self, seed: int) -> None:
        rng = random.Random(seed)
        log = open_log(self.log_url)
        try:
            while not self._stop.wait(0.2):  # about 50 lines a second
                batch = []
                words: collections.Counter[str] = collections.Counter()
                for _ in range(10):
                    line = rng.choices(WORDS, k=rng.randint(1, 5))
                    words.update(line)
                    batch.append(" ".join(line))
                now = int(time.time() * 1000)
                for partition in range(4):
                    records = [Record(None, text.encode(), now) for text in batch[partition::4]]
                    log.produce(TopicPartition(TOPIC, partition), records)
                self.expected.update(words)  # produced (acknowledged): it must be counted
        finally:
            log.close()

    def exact(self) -> bool:
        router = QueryRouter(self.query_addresses, timeout=2)
        for word, count in sorted(self.expected.items()):
            try:
                result = router.get(STORE, word)
            except QueryFailedError as error:
                self.last_mismatch = f"{word}: {error}"
                return False
            if not result.found or int(result.value) != count:
                self.last_mismatch = f"{word}: {result} (expected {count})"
                return False
        return True

    def stop_and_check(self, operator: Operator, what: str) -> None:
        self.stop()
        try:
            wait_until(self.exact, what, COUNT_TIMEOUT)
        except TimeoutError as error:
            print(operator.describe_failure(APP))
            raise AssertionError(f"{error}; last answer {self.last_mismatch}") from None


@pytest.fixture(scope="module")
def steady(
    operator: Operator, control_plane: Cluster, kafka_broker: KafkaCluster
) -> Iterator[SteadyInput]:
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
    yield SteadyInput(
        log_url, f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
    )
    operator.kubectl("delete", "sapp", APP, "--wait=false")


def restored(operator: Operator, pods: list[str]) -> dict[tuple[str, str], float]:
    """Per pod and restore series (task, store, thread): the records its active copies
    replayed before they processed (``restore-total``)."""
    found = {}
    for name, pod in operator.pods(APP).items():
        if name not in pods or not pod.get("status", {}).get("podIP"):
            continue
        url = f"http://{pod['status']['podIP']}:{QUERY_PORT}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        for labels, value in _RESTORED.findall(text):
            found[name, labels] = float(value)
    return found


def restored_since(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]
) -> float:
    return sum(value - before.get(key, 0.0) for key, value in after.items())


def settled(operator: Operator, pods: list[str]) -> None:
    """Every pod runs active tasks and standbys are caught up: the state before a step."""

    def check() -> bool:
        published = membership(operator, APP)
        status = operator.app(APP).get("status", {})
        return (
            ready(operator, APP, len(pods))
            and published is not None
            and all(published.assignment.active.get(p) for p in pods)
            and published.assignment.warmup_count == 0
            and (status.get("maxStandbyLag") or 0) <= 1_000
        )

    try:
        wait_until(check, f"{', '.join(pods)} settled with caught-up standbys", READY_TIMEOUT)
    except TimeoutError:
        print(operator.describe_failure(APP))
        raise


def handed_over(operator: Operator, control_plane: Cluster, pod: str, since: float) -> float:
    """Waits until the membership gives ``pod`` no active task and its process said it
    handed over; returns the seconds from SIGTERM to the hand-over it printed."""
    kubelets = control_plane.kubelets
    assert kubelets is not None

    def done() -> float | None:
        published = membership(operator, APP)
        if published is None or published.assignment.active.get(pod):
            return None
        said = _HANDED_OVER.findall(kubelets.pod_log(NAMESPACE, pod))
        return float(said[-1]) if said else None

    try:
        wait_until(lambda: done() is not None, f"{pod} to hand its tasks over", HAND_OVER_TIMEOUT)
    except TimeoutError:
        print(operator.describe_failure(APP))
        print(kubelets.pod_log(NAMESPACE, pod)[-3000:])
        raise
    seconds = done()
    assert seconds is not None
    print(
        f"{pod}: handed over {seconds:.1f} s after SIGTERM ({time.monotonic() - since:.1f} s "
        "after the request)"
    )
    log = kubelets.pod_log(NAMESPACE, pod)
    assert "hand-over not done" not in log, "it ran out of grace instead of handing over"
    return seconds


def evict(operator: Operator, pod: str) -> None:
    operator.admin.request(
        f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction",
        "POST",
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": NAMESPACE},
        },
    )


def test_an_evicted_pod_hands_over_and_the_pdb_refuses_a_second_eviction(
    operator: Operator,
    steady: SteadyInput,
    control_plane: Cluster,
    request: pytest.FixtureRequest,
    kafka_broker: KafkaCluster,
) -> None:
    use_cluster(request, kafka_broker)
    pods = [f"{APP}-{i}" for i in range(3)]
    victim, other = f"{APP}-1", f"{APP}-0"
    steady.start()
    settled(operator, pods)
    survivors = [p for p in pods if p != victim]
    before = restored(operator, survivors)

    started = time.monotonic()
    evict(operator, victim)
    # The PDB (maxUnavailable 1) counted that one: a second eviction is refused meanwhile.
    with pytest.raises(ApiError) as refused:
        evict(operator, other)
    assert refused.value.code == 429, refused.value
    assert "disruption budget" in str(refused.value)

    handed_over(operator, control_plane, victim, started)
    replayed = restored_since(before, restored(operator, survivors))
    print(f"evict_critical_path_restored={replayed:.0f}")
    assert replayed <= DEFAULT_ACCEPTABLE_RECOVERY_LAG, "a task restored more than a tail"
    reasons = [e["reason"] for e in operator.objects("", "events")]
    assert "MembershipChanged" in reasons

    settled(operator, pods)  # the StatefulSet made it again, on its volume
    steady.stop_and_check(operator, "exact counts after the eviction")


def test_a_drained_nodes_pod_hands_over_before_it_goes(
    operator: Operator,
    steady: SteadyInput,
    control_plane: Cluster,
    request: pytest.FixtureRequest,
    kafka_broker: KafkaCluster,
) -> None:
    use_cluster(request, kafka_broker)
    pods = [f"{APP}-{i}" for i in range(3)]
    victim = f"{APP}-2"
    steady.start()
    settled(operator, pods)
    node = operator.pods(APP)[victim]["spec"]["nodeName"]
    survivors = [p for p in pods if p != victim]
    before = restored(operator, survivors)
    service = steady.query_addresses
    started = time.monotonic()
    try:
        # Only this app's pods: other modules' pods may share the node.
        operator.kubectl(
            "drain", node, f"--pod-selector=app.kubernetes.io/instance={APP}",
            "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s",
            timeout=180,
        )  # fmt: skip
        handed_over(operator, control_plane, victim, started)
        replayed = restored_since(before, restored(operator, survivors))
        print(f"drain_critical_path_restored={replayed:.0f}")
        assert replayed <= DEFAULT_ACCEPTABLE_RECOVERY_LAG
        # Its replacement waits: the node is cordoned and its local volume is there.
        steady.query_addresses = [
            f"{operator.pods(APP)[p]['status']['podIP']}:{QUERY_PORT}" for p in survivors
        ]
        steady.stop_and_check(operator, "exact counts on the two pods left by the drain")
        replacement = operator.pods(APP).get(victim)
        assert replacement is None or replacement["status"].get("phase") == "Pending"
    finally:
        operator.kubectl("uncordon", node)
    steady.query_addresses = service
    settled(operator, pods)


def test_scaling_in_lowers_the_stateful_set_only_after_the_hand_over(
    operator: Operator,
    steady: SteadyInput,
    control_plane: Cluster,
    request: pytest.FixtureRequest,
    kafka_broker: KafkaCluster,
) -> None:
    use_cluster(request, kafka_broker)
    pods = [f"{APP}-{i}" for i in range(3)]
    leaving = f"{APP}-2"
    steady.start()
    settled(operator, pods)
    survivors = pods[:2]
    before = restored(operator, survivors)
    sts_path = f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/{APP}"
    started = time.monotonic()
    operator.kubectl("scale", "sapp", APP, "--replicas=2")
    # While the StatefulSet still has 3 replicas the pod is draining; it drops to 2 only once
    # the membership gives the pod no active task (sampled: every look must agree).
    lowered_while_busy: list[str] = []

    def lowered() -> bool:
        published = membership(operator, APP)
        sts = operator.admin.get(sts_path)
        assert sts is not None
        if sts["spec"]["replicas"] < 3 and published is not None:
            if published.assignment.active.get(leaving):
                lowered_while_busy.append(str(sorted(published.assignment.active[leaving])))
            return True
        return False

    wait_until(lowered, "the StatefulSet lowered to 2", HAND_OVER_TIMEOUT)
    assert not lowered_while_busy, lowered_while_busy
    handed_over(operator, control_plane, leaving, started)
    replayed = restored_since(before, restored(operator, survivors))
    print(f"scale_in_critical_path_restored={replayed:.0f}")
    assert replayed <= DEFAULT_ACCEPTABLE_RECOVERY_LAG
    events = {
        e["reason"]: e["message"]
        for e in operator.objects("", "events")
        if e["involvedObject"].get("name") == APP
    }
    assert "DrainingPod" in events and f"draining {leaving}" in events["DrainingPod"], events
    assert "PodHandedOver" in events

    def scaled_in() -> bool:
        condition = operator.condition(APP, "ScalingIn")
        return (
            leaving not in operator.pods(APP)
            and condition is not None
            and condition["status"] == "False"
            and ready(operator, APP, 2)
        )

    wait_until(scaled_in, "2 ready pods and ScalingIn=False", READY_TIMEOUT)
    steady.stop_and_check(operator, "exact counts on two pods after the scale-in")
