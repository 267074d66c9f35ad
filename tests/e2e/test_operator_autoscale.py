"""Issue 25, lag-driven autoscaling: the operator scales a word count out under a load step
and back in when the load returns, through the scale subresource, with exact counts.

On the real control plane (kube-apiserver, controllers, scheduler) with the kubelet stand-in,
the word count runs on Kafka with one pod. The test first finds what one pod keeps up with
(the rate raised by half every few seconds until its lag grows), so that the figures hold
on a loaded machine whatever its speed: the base rate is half of it, three times the base
rate the rate it first fell behind at. The policy is a lag bound (``maxLagRecords``): a pod that
keeps up reports next to no lag (records-lag is the fetched end offset minus the
position), one that falls behind a growing lag. The rate triples: the operator scales out
(status.autoscaling, a ScaledOut event, the StatefulSet's replicas); the rate goes back: it
scales in after the down window. Exactly two decisions, and the counts are exact.

(``targetProcessRatio`` is not the driver here: at the rates a shared 2-core machine
sustains, the pods' busy share is a fraction of a percent, dominated by each loop's fixed
cost and by the machine's load; its arithmetic is unit-tested.)
"""

from __future__ import annotations

import collections
import json
import random
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_operator.reconcile.autoscale import parse_metrics
from eddyline_runtime.log import Record, open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Operator
from tests.support.kafka.broker import KafkaCluster
from tests.support.kafka.plugin import use_cluster
from tests.support.kafka.streamapp import ready

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
APP = "autoscale"
NAMESPACE = "autoscale"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
STORE = "word-counts"
TOPIC = "text-lines"
PARTITIONS = 4
WORDS = [f"a{index:02d}" for index in range(40)]
# The ramp that finds what one pod keeps up with: lines/s at the start, seconds per step
# (x1.5 each).
RAMP_START = 200
RAMP_SECONDS = 6
# The producer's prepared lines, and its schedule's tick.
POOL = 1000
TICK_SECONDS = 0.1
DOWN_WINDOW_SECONDS = 15
# How long the test watches for a further decision after the scale in.
QUIET_SECONDS = 30
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300
SCALE_TIMEOUT = 420
COUNT_TIMEOUT = 180


@pytest.fixture(scope="module")
def operator(
    control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    running = Operator(control_plane, tmp_path_factory.mktemp("operator-autoscale"), NAMESPACE)
    running.install()  # the release is named after the namespace: no collision
    running.start()
    yield running
    running.stop()


class Load(threading.Thread):
    """Lines at ``rate`` per second, on a schedule of 0.1 s ticks (behind it, it catches up:
    the rate is what was asked for as long as the producer can), cycling through a pool of
    prepared lines so that producing costs little next to what the pod does per line."""

    def __init__(self, log_url: str) -> None:
        super().__init__(daemon=True)
        self.log_url = log_url
        self.rate = 0
        self.produced = 0  # lines so far
        rng = random.Random(25)
        self.pool = [" ".join(rng.choices(WORDS, k=rng.randint(1, 5))) for _ in range(POOL)]
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        log = open_log(self.log_url)
        encoded = [line.encode() for line in self.pool]
        try:
            due, owed = time.monotonic(), 0.0
            while not self.stopped.wait(max(0.0, due - time.monotonic())):
                due += TICK_SECONDS
                owed += self.rate * TICK_SECONDS
                count, owed = int(owed), owed - int(owed)
                now = int(time.time() * 1000)
                batches: list[list[Record]] = [[] for _ in range(PARTITIONS)]
                for n in range(self.produced, self.produced + count):
                    index = n % POOL
                    batches[index % PARTITIONS].append(Record(None, encoded[index], now))
                for partition, batch in enumerate(batches):
                    if batch:
                        log.produce(TopicPartition(TOPIC, partition), batch)
                self.produced += count
        except BaseException as error:  # the test reports it
            self.error = error
        finally:
            log.close()

    def expected(self) -> collections.Counter[str]:
        """Each word's count in what was produced (the pool's line i went out
        ``produced // POOL`` times, once more when ``i < produced % POOL``)."""
        rounds, rest = divmod(self.produced, POOL)
        counts: collections.Counter[str] = collections.Counter()
        for index, line in enumerate(self.pool):
            times = rounds + (1 if index < rest else 0)
            for word in line.split():
                counts[word] += times
        return counts

    def stop(self) -> None:
        self.stopped.set()
        if self.is_alive():
            self.join(30)
        if self.error is not None:
            raise AssertionError(f"the producer failed: {self.error!r}")


def autoscaling(operator: Operator) -> dict[str, Any]:
    found: dict[str, Any] = operator.app(APP).get("status", {}).get("autoscaling") or {}
    return found


def scaling_events(operator: Operator) -> list[tuple[str, str]]:
    return [
        (e["reason"], e.get("message", ""))
        for e in sorted(
            operator.objects("", "events"),
            key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or "",
        )
        if e["involvedObject"].get("name") == APP and e["reason"] in ("ScaledOut", "ScaledIn")
    ]


def stateful_set_replicas(operator: Operator) -> int:
    found = operator.get("apps", "statefulsets", APP)
    assert found is not None
    return int(found["spec"]["replicas"])


def wait_exact(
    operator: Operator, expected: collections.Counter[str], what: str = "exact counts"
) -> None:
    """Until the query Service answers every word's count exactly."""
    service = operator.get("", "services", f"{APP}-query")
    assert service is not None
    address = f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
    last: list[str] = [""]

    def exact() -> bool:
        router = QueryRouter([address], timeout=2)
        for word, count in expected.items():
            try:
                result = router.get(STORE, word)
            except QueryFailedError as error:
                last[0] = f"{word}: {error}"
                return False
            if not result.found or int(result.value) != count:
                last[0] = f"{word}: {result} (expected {count})"
                return False
        return True

    try:
        wait_until(exact, what, COUNT_TIMEOUT)
    except TimeoutError as error:
        print(operator.describe_failure(APP))
        raise AssertionError(f"{error}; last answer {last[0]}") from None


def deploy(operator: Operator, log_url: str) -> None:
    """The word count on Kafka with one pod and no autoscaling yet."""
    log = open_log(log_url)
    try:
        log.create_topic(TOPIC, PARTITIONS)
    finally:
        log.close()
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["metadata"]["name"] = APP
    document["spec"]["log"] = {"url": log_url}
    document["spec"]["replicas"] = 1
    operator.wait_watching()
    operator.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(document))


def total_lag(operator: Operator) -> float:
    """The app's input lag in records: records-lag summed over its pods' partitions."""
    lag = 0.0
    for pod in operator.pods(APP).values():
        ip = pod["status"].get("podIP")
        if not ip:
            continue
        with urllib.request.urlopen(f"http://{ip}:7070/metrics", timeout=5) as response:
            lag += sum(parse_metrics(response.read().decode(), 0.0).records_lag.values())
    return lag


def lag_readings(operator: Operator) -> list[float]:
    readings = []
    for _ in range(3):
        readings.append(total_lag(operator))
        time.sleep(1)
    return readings


def falling_behind(operator: Operator, rate: int) -> bool:
    """The lag holds more than two seconds of input at ``rate`` over three readings."""
    return min(lag_readings(operator)) > 2 * rate


def find_capacity(operator: Operator, load: Load) -> int:
    """Raise the rate by half every few seconds while the one pod clearly keeps up (its lag
    under half a second of input at every reading): the rate actually produced at the last
    such step (lines/s), whatever the machine's speed and load."""
    rate = RAMP_START
    load.rate = rate
    load.start()
    kept_up = 0
    while True:
        started, produced = time.monotonic(), load.produced
        time.sleep(RAMP_SECONDS)
        readings = lag_readings(operator)
        actual = (load.produced - produced) / (time.monotonic() - started)
        print(f"ramp: {rate} lines/s asked, {actual:.0f} made, lag {readings}")
        if max(readings) > rate / 2:
            break
        if actual < 0.8 * rate:
            raise AssertionError(
                f"the test's producer made {actual:.0f} of {rate} lines/s and the pod kept up: "
                "the producer is the limit on this machine"
            )
        kept_up = int(actual)
        rate = int(rate * 1.5)
        load.rate = rate
    assert kept_up, f"the pod fell behind at the first rate, {RAMP_START} lines/s"
    load.rate = kept_up // 2
    wait_until(lambda: not falling_behind(operator, kept_up // 2), "the backlog drained", 180)
    return kept_up


def enable_autoscaling(operator: Operator, kept_up: int) -> None:
    policy = {
        "minReplicas": 1,
        "maxReplicas": 2,
        # A second of input at the rate the pod kept up with: never reached while it keeps
        # up (its lag is then a few records), soon once it falls behind.
        "maxLagRecords": max(500, kept_up),
        "scaleUpStabilizationSeconds": 0,
        "scaleDownStabilizationSeconds": DOWN_WINDOW_SECONDS,
    }
    patch = json.dumps({"spec": {"autoscaling": policy}})
    operator.kubectl("patch", "sapp", APP, "--type", "merge", "-p", patch)


# A ramp, a scale out, a settle and the down window, each step on a loaded machine:
# minutes, not the default 300 s.
@pytest.mark.timeout(900)
def test_the_operator_scales_out_under_a_load_step_and_back_in_after_it(
    operator: Operator,
    control_plane: Cluster,
    request: pytest.FixtureRequest,
    kafka_broker_of_module: KafkaCluster,
) -> None:
    # A broker of its own: the load step writes millions of lines into text-lines, which
    # every later module's word count on the session's broker would otherwise read first.
    use_cluster(request, kafka_broker_of_module)
    log_url = f"kafka://{kafka_broker_of_module.bootstrap}"
    deploy(operator, log_url)
    load = Load(log_url)
    try:
        wait_until(lambda: ready(operator, APP, 1), "1 ready pod and Ready=True", READY_TIMEOUT)
        kept_up = find_capacity(operator, load)
        base = kept_up // 2
        print(f"one pod kept up with {kept_up} lines/s: base rate {base}, step {3 * base}")
        enable_autoscaling(operator, kept_up)
        time.sleep(DOWN_WINDOW_SECONDS)  # the base rate alone: no decision
        assert not scaling_events(operator), scaling_events(operator)
        stepped_at = time.monotonic()
        load.rate = 3 * base

        def scaled_to(replicas: int) -> bool:
            decision = autoscaling(operator).get("lastDecision") or {}
            return decision.get("toReplicas") == replicas

        wait_until(lambda: scaled_to(2), "a scale out to 2 pods", SCALE_TIMEOUT)
        out_s = time.monotonic() - stepped_at
        decision = autoscaling(operator)["lastDecision"]
        assert decision["fromReplicas"] == 1 and "input lag" in decision["reason"], decision
        assert operator.app(APP)["spec"]["replicas"] == 2  # through the scale subresource
        wait_until(lambda: stateful_set_replicas(operator) == 2, "2 StatefulSet replicas", 60)
        load.rate = base
        back_at = time.monotonic()
        wait_until(lambda: scaled_to(1), "a scale in to 1 pod", SCALE_TIMEOUT)
        in_s = time.monotonic() - back_at
        print(f"autoscale_out_s={out_s:.1f} autoscale_in_s={in_s:.1f}")
        wait_until(lambda: stateful_set_replicas(operator) == 1, "1 StatefulSet replica", 60)
        status = autoscaling(operator)
        assert status["currentReplicas"] in (1, 2) and status["desiredReplicas"] in (1, 2)
        # At the base rate one pod keeps up: nothing more is decided (the lag the moved tasks
        # gathered while moving is not read as load).
        time.sleep(QUIET_SECONDS)
        events = scaling_events(operator)
        # One decision each way: the windows held every other recommendation.
        assert [reason for reason, _ in events] == ["ScaledOut", "ScaledIn"], events
        assert "1 -> 2 replicas: input lag" in events[0][1], events
        assert "2 -> 1 replicas: input lag" in events[1][1], events
    except (AssertionError, TimeoutError):
        print(operator.describe_failure(APP))
        raise
    finally:
        load.stop()
    try:
        wait_exact(operator, load.expected())
    finally:
        operator.kubectl("delete", "sapp", APP, "--wait=false")
