"""Issue 25, lag-driven autoscaling: the operator scales a word count out under a load step
and back in once the step is worked off, through the scale subresource, with exact counts.

On the real control plane (kube-apiserver, controllers, scheduler) with the kubelet stand-in,
a word count runs on the embedded log with one pod and ``spec.autoscaling`` bounded by a
lag of ``MAX_LAG`` records. Its lines cost a fixed wall time each
(tests/support/topologies/throttled_wordcount.py), so a pod cannot process faster than
``1 / LINE_SECONDS`` lines a second however quiet the machine (a loaded one only makes it
slower): the load step is a fixed backlog written at once that keeps the pod behind by far
more than ``MAX_LAG`` for longer than the autoscaler waits before deciding, whatever the
machine's speed. (An earlier version found the step's rate with a ramp; on a quiet machine
one pod kept up with more than 17,000 lines/s and the ramp ran into millions of records.)

The operator scales out once (a ScaledOut event, status.autoscaling, the StreamApp's and the
StatefulSet's scale subresources), to the app's two tasks and not to ``maxReplicas``: a pod
more would get no task. When the backlog is worked off it scales back in once (ScaledIn)
after the down window, and decides nothing more for a whole metric window after that: no
flapping. No count is lost or doubled.
"""

from __future__ import annotations

import collections
import random
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_operator.autoscaler import SCRAPE_SECONDS
from eddyline_operator.reconcile.autoscale import METRIC_WINDOW_SECONDS
from eddyline_runtime.log import Record, open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture
from tests.support.kafka.streamapp import ready
from tests.support.node_loss import membership
from tests.support.topologies.throttled_wordcount import LINE_SECONDS

# Its pods start, scale out and scale in on the control plane: about a minute.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
APP = "autoscale"
NAMESPACE = "autoscale"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
TOPOLOGY = {"ref": "throttled_wordcount:topology", "revision": "1"}
STORE = "word-counts"
TOPIC = "text-lines"
# One input partition: the word count has two tasks (the splitting and the counting
# sub-topology), so two pods is all it can use, below MAX_REPLICAS.
PARTITIONS = 1
TASKS = 2
MAX_REPLICAS = 3
MAX_LAG = 1_000
DOWN_WINDOW_SECONDS = 5
WORDS = [f"w{index:02d}" for index in range(20)]
# A pod buffers up to this many fetched records of a partition, which records-lag (the end
# offset its last fetch saw minus its fetch position) does not count: engine/stream_thread.py
# fetches _FETCH_RECORDS (5,000) whenever fewer than _FETCH_LOW_WATER (2,500) are buffered.
BUFFERED = 7_500
# The backlog, in lines: beyond what the pod buffers, enough for LAG_SECONDS of its fastest
# processing. The first decision comes a metric window after the app settled (the test writes
# the backlog once it sees it settled, the operator sees it within a beat) and reads the mean
# lag of that window: with the lag tens of times MAX_LAG through most of the window, the mean
# is far above it. And the lag is gone soon after the scale out, so the window after that
# step's settling finds none and the scale in follows it.
LAG_SECONDS = METRIC_WINDOW_SECONDS + SCRAPE_SECONDS
BACKLOG = BUFFERED + round(LAG_SECONDS / LINE_SECONDS)
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300
SCALE_TIMEOUT = 300
COUNT_TIMEOUT = 180

operator = operator_fixture(NAMESPACE, directory="operator-autoscale")


class Peaks(threading.Thread):
    """The most pods of the app and the highest StatefulSet replicas (read through its scale
    subresource) seen at once, sampled throughout the test."""

    def __init__(self, operator: Operator) -> None:
        super().__init__(daemon=True)
        self.operator = operator
        self.pods = 0
        self.replicas = 0
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopped.wait(0.5):
                self.pods = max(self.pods, len(self.operator.pods(APP)))
                self.replicas = max(self.replicas, stateful_set_replicas(self.operator))
        except BaseException as error:  # the test reports it
            self.error = error

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)
        if self.error is not None:
            raise AssertionError(f"sampling the pods failed: {self.error!r}")


def stateful_set_replicas(operator: Operator) -> int:
    """spec.replicas of the StatefulSet's scale subresource (0 before it exists)."""
    scale = operator.get("apps", "statefulsets", f"{APP}/scale")
    return 0 if scale is None else int(scale["spec"]["replicas"])


def app_replicas(operator: Operator) -> int:
    """spec.replicas of the StreamApp's scale subresource, what the autoscaler writes."""
    scale = operator.get("eddyline.dev/v1alpha1", "streamapps", f"{APP}/scale")
    assert scale is not None
    return int(scale["spec"]["replicas"])


def autoscaling(operator: Operator) -> dict[str, Any]:
    found: dict[str, Any] = operator.app(APP).get("status", {}).get("autoscaling") or {}
    return found


def next_decision(operator: Operator, after: dict[str, Any] | None, what: str) -> dict[str, Any]:
    """The first status.autoscaling.lastDecision other than ``after``, whatever its step (a
    wrong one fails at once, naming itself, instead of timing out)."""

    def changed() -> dict[str, Any] | None:
        decision: dict[str, Any] | None = autoscaling(operator).get("lastDecision")
        return decision if decision and decision != after else None

    found: dict[str, Any] = wait_until(changed, what, SCALE_TIMEOUT)
    return found


def scaling_events(operator: Operator) -> list[tuple[str, str]]:
    """The autoscaler's decisions as (reason, message), oldest first."""
    return [
        (e["reason"], e.get("message", ""))
        for e in sorted(
            operator.objects("", "events"),
            key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or "",
        )
        if e["involvedObject"].get("name") == APP and e["reason"] in ("ScaledOut", "ScaledIn")
    ]


def settled(operator: Operator, replicas: int) -> bool:
    """``replicas`` ready pods and no other, each running active tasks in the published
    membership: what the autoscaler waits for after a step."""
    published = membership(operator, APP)
    return (
        ready(operator, APP, replicas)
        and len(operator.pods(APP)) == replicas
        and published is not None
        and sum(1 for tasks in published.assignment.active.values() if tasks) == replicas
    )


def backlog() -> tuple[list[str], collections.Counter[str]]:
    """The load step's lines and the count of each word in them."""
    rng = random.Random(25)
    lines = [" ".join(rng.choices(WORDS, k=rng.randint(1, 3))) for _ in range(BACKLOG)]
    return lines, collections.Counter(word for line in lines for word in line.split())


def deploy(operator: Operator, log_url: str) -> None:
    """The throttled word count on the embedded log, one pod, autoscaled on lag."""
    log = open_log(log_url)  # the input topic exists before the app, as on a cluster
    try:
        log.create_topic(TOPIC, PARTITIONS)
    finally:
        log.close()
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["metadata"]["name"] = APP
    document["spec"].update(
        topology=TOPOLOGY,
        replicas=1,
        log={"url": log_url},
        autoscaling={
            "minReplicas": 1,
            "maxReplicas": MAX_REPLICAS,
            "maxLagRecords": MAX_LAG,
            "scaleUpStabilizationSeconds": 0,
            "scaleDownStabilizationSeconds": DOWN_WINDOW_SECONDS,
        },
    )
    operator.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(document))


def produce(log_url: str, lines: list[str]) -> None:
    log = open_log(log_url)
    try:
        now = int(time.time() * 1000)
        for start in range(0, len(lines), 5_000):
            records = [Record(None, line.encode(), now) for line in lines[start : start + 5_000]]
            log.produce(TopicPartition(TOPIC, 0), records)
    finally:
        log.close()


def wait_exact(operator: Operator, expected: collections.Counter[str]) -> None:
    """Until the query Service answers every word's count exactly."""
    service = operator.get("", "services", f"{APP}-query")
    assert service is not None
    address = f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
    last = [""]

    def exact() -> bool:
        router = QueryRouter([address], timeout=2)
        for word, count in sorted(expected.items()):
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
        wait_until(exact, "every word's count exact", COUNT_TIMEOUT)
    except TimeoutError as error:
        raise AssertionError(f"{error}; last answer {last[0]}") from None


_LAG = re.compile(r"input lag (\d+) records")


def check_scale_out(operator: Operator, decision: dict[str, Any]) -> None:
    assert decision["fromReplicas"] == 1 and decision["toReplicas"] == 2, decision
    # The lag asked for more pods than the app has tasks: clamped to its 2 tasks, below
    # maxReplicas (a third pod would get no task).
    reason = decision["reason"]
    bound = f"clamped to {TASKS} by [1 (minReplicas), {TASKS} (the app's {TASKS} tasks)]"
    assert bound in reason, reason
    lag = _LAG.search(reason)
    assert lag is not None and int(lag.group(1)) > MAX_LAG, reason
    assert app_replicas(operator) == 2  # through the StreamApp's scale subresource


def check_decisions(operator: Operator) -> None:
    """One decision each way: the windows held every other recommendation."""
    events = scaling_events(operator)
    assert [reason for reason, _ in events] == ["ScaledOut", "ScaledIn"], events
    assert events[0][1].startswith("1 -> 2 replicas: input lag"), events
    assert events[1][1].startswith("2 -> 1 replicas: input lag"), events
    status = autoscaling(operator)
    assert status["currentReplicas"] == 1 and status["desiredReplicas"] == 1, status


def test_the_operator_scales_out_under_a_load_step_and_back_in_after_it(
    operator: Operator,
) -> None:
    assert operator.cluster.provisioner is not None
    claim = operator.cluster.provisioner.directory(NAMESPACE, f"{APP}-log")
    claim.mkdir(parents=True)
    log_url = f"sqlite:///{claim}/log.db"
    lines, expected = backlog()
    began = time.monotonic()
    marks: list[str] = []

    def mark(what: str) -> None:
        marks.append(f"{what} at {time.monotonic() - began:.1f} s")

    deploy(operator, log_url)
    peaks = Peaks(operator)
    peaks.start()
    try:
        wait_until(lambda: settled(operator, 1), "1 ready pod running its tasks", READY_TIMEOUT)
        # Idle, one pod keeps up: nothing to decide.
        assert scaling_events(operator) == []
        mark("settled on 1 pod")

        # The load step: the backlog at once.
        produce(log_url, lines)
        mark(f"{BACKLOG} lines written")
        out = next_decision(operator, None, "a scale out")
        mark("scaled out")
        check_scale_out(operator, out)
        wait_until(lambda: settled(operator, 2), "2 ready pods running tasks", READY_TIMEOUT)
        mark("settled on 2 pods")

        # The backlog worked off, the lag gone: back to minReplicas after the down window.
        back = next_decision(operator, out, "a scale in")
        mark("scaled in")
        assert back["fromReplicas"] == 2 and back["toReplicas"] == 1, back
        assert "input lag" in back["reason"], back
        assert app_replicas(operator) == 1
        wait_until(lambda: settled(operator, 1), "1 ready pod again", READY_TIMEOUT)
        assert stateful_set_replicas(operator) == 1
        scaled_in = time.monotonic()
        mark("settled on 1 pod again")

        wait_exact(operator, expected)
        mark("counts exact")
        # A whole metric window after the step settled, and the cycles that read it: the
        # autoscaler has decided on the figures after the scale in, and held.
        quiet_until = scaled_in + METRIC_WINDOW_SECONDS + 3 * SCRAPE_SECONDS
        time.sleep(max(0.0, quiet_until - time.monotonic()))
        check_decisions(operator)
    except (AssertionError, TimeoutError):
        print(operator.describe_failure(APP))
        raise
    finally:
        peaks.stop()
        print("; ".join(marks))  # where the time went (-s, or with a failure)
    # Never more pods than maxReplicas, nor than the app's tasks can use.
    assert peaks.pods == 2 and peaks.replicas == 2, (peaks.pods, peaks.replicas)
