"""Queries through every operation (issue 36): failed, wrong and slow answers while the app
is upgraded, restarted, scaled, evicted, killed and restored.

Run it with ``make bench-queries`` (``BENCH_QUERIES_ARGS="--keys 1000000 --log kafka"`` for the
issue's size). It is a script, not a test: it measures and reports
(``tests/e2e/test_queries_through_restarts.py`` asserts the behaviour). It runs on the control
plane ``make bench-scale`` uses (``tests/support/control_plane``: the real kube-apiserver,
etcd, controller manager and scheduler, the kubelet stand-in running each pod as a real
``eddyline`` process, the chart installed through Helm's library, the operator as its own
process), reusing ``bench_scale``'s key loader, input producer and eviction.

The app is the word count of ``examples/wordcount`` (exactly-once, ``num.standby.replicas``
1, ``--replicas`` pods, 3 by default) reading ``text-lines`` with 8 partitions, on the
embedded SQLite log (``--log sqlite``, the default; every pod on one node, on one shared
claim) or on a Kafka broker started here (``--log kafka``; the pods spread over the zones).
``--keys`` distinct words are loaded and counted first; then lines arrive at ``--rate``
words/s for the rest of the run (live input), and ``--clients`` processes query random
loaded words, each through a ``QueryRouter`` bootstrapped with the query Service only, a 2 s
timeout and ``max_staleness_ms`` (``--max-staleness-ms``, 600,000 by default: wide enough
that a standby's answer is taken; the benchmark is about answers, not freshness), at
``--qps`` queries/s together (or as fast as they can).

A query is one ``QueryRouter.get`` call (which may make several HTTP requests: the key's
metadata, then the copies it tries): it *fails* when it raises (any error: a timeout, no copy
within the bound, no host answering), and it is *wrong* when its value differs from the key's
count in the store's changelog as of the ``changelog_offset`` the answer reports (the last
changelog record the answering copy includes, exact for active, standby and restoring copies
alike: docs/queries.md). The changelog is read ``read_committed`` from the log after the run;
a count the answer gives for a key whose changelog has no record up to that offset is wrong,
as is an answer without a ``changelog_offset``.

The operations, in turn, each from its command until the app is settled again (Ready with
every pod, generation observed, no upgrade in progress, the membership balanced over the
expected pods without warm-ups):

* ``upgrade``: the full-cluster topology upgrade to ``wordcount:topology_v2`` (revision 2,
  state relocated: KIP-816), ``upgradeStrategy: Rolling`` (the default: pods replaced while
  the others serve, one at a time at 3 pods, several together on more);
* ``upgrade_recreate``: the same kind of upgrade back to ``wordcount:topology`` (or to v2,
  whichever does not run; the revision one up) with ``upgradeStrategy: Recreate``, every pod
  stopped at once as every upgrade was before issue 36: today's behaviour side by side, the
  baseline, not held to the targets;
* ``rolling_restart``: a config change (``commit.interval.ms``) rolls the pods one at a time;
* ``scale_out`` to one pod more and ``scale_in`` back (the scale subresource);
* ``evict``: ``wordcount-1`` evicted through the Eviction API (the PDB allows one);
* ``node_loss`` (``--log kafka`` only: on the embedded log every pod is on one node): the node
  of a pod holding active tasks loses power, the operator drops the pod, the node boots again
  and its pod rejoins;
* ``pod_kill``: ``wordcount-1`` SIGKILLed, restarted by its kubelet, Ready again;
* ``wiped_restore``: ``wordcount-2``'s container killed twice (the second restart waits out
  the kubelet's back-off) and its state claim emptied while it is down: it restores every copy
  from the changelogs.

A ``steady`` window of ``--steady`` s before the first operation is measured the same way, as
the baseline. ``--rounds N`` runs the operations N times (a race shows in one upgrade of
several); round k's windows are ``<operation>_r<k>``. Keys per operation (and
``steady``): ``<op>_queries``, ``<op>_failed``,
``<op>_wrong``, ``<op>_p99_ms`` (of every query, failed ones at the time they took),
``<op>_max_staleness_ms`` (the most ``staleness_ms`` an answer reported; -1: none reported),
``<op>_duration_s``, ``<op>_qps``. ``targets_met``: 0 failed and 0 wrong in every operation
(``upgrade_recreate`` aside) and every p99 under 100 ms. The last line is JSON; every value
a number. ``load_average_*`` is the machine's 1-minute load average at the start and the
end: the machine is shared, and timings taken under load are noisy.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import json
import multiprocessing
import multiprocessing.synchronize
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eddyline_runtime.log import open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from eddyline_runtime.serde import LongSerde
from tests.bench.bench_kafka import percentile
from tests.bench.bench_scale import Producer, balanced, evict, load_keys
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import REPO, Operator
from tests.support.kafka.broker import KafkaCluster
from tests.support.kafka.streamapp import deploy, manifest, query_service_when_ready
from tests.support.node_loss import members, membership, wait_dropped

APP = "wordcount"
NAMESPACE = "bench-queries"
SECRET = "wordcount-kafka"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
STORE = "word-counts"
CHANGELOG = f"{APP}-{STORE}-changelog"
INPUT = "text-lines"
ALERTS_INPUT = "watched-words"  # topology_v2's new first sub-topology reads it
PARTITIONS = 8
OPERATIONS = (
    "upgrade", "upgrade_recreate", "rolling_restart", "scale_out", "scale_in", "evict",
    "node_loss", "pod_kill", "wiped_restore",
)  # fmt: skip
# Measured side by side with the others, as the behaviour they improve on: not held to the
# targets (a Recreate upgrade answers no query while no pod runs).
BASELINES = frozenset({"upgrade_recreate"})
# The client: one request's timeout (the router's, per HTTP request it makes).
QUERY_TIMEOUT_S = 2.0
P99_TARGET_MS = 100.0
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 600


# ------------------------------------------------------------------ pure helpers (unit-tested)
@dataclass(frozen=True)
class Answer:
    """One query as a client saw it: when it started (wall clock, s), how long it took, and
    what came back (``error`` empty: answered)."""

    started: float
    latency_ms: float
    key: str
    error: str = ""
    found: bool = False
    value: int | None = None
    partition: int = -1
    changelog_offset: int | None = None
    staleness_ms: int | None = None
    role: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.error)


def wrong_answers(
    answers: Iterable[Answer], changelog: Iterable[tuple[int, str, int | None]]
) -> list[tuple[Answer, str]]:
    """The answers of one store partition whose value is not the key's count in that
    partition's changelog as of the answer's ``changelog_offset`` (the last changelog record
    the copy includes; -1: none), each with why. ``changelog``: (offset, key, count or None
    for a tombstone) in offset order, read up to at least the largest offset an answer
    reports. Failed answers are not judged here: they are counted as failed. One pass over
    the changelog, the answers taken in the order of their offsets."""
    judged = sorted((a for a in answers if not a.failed), key=_offset_order)
    wanted = {a.key for a in judged}
    current: dict[str, int | None] = {}
    records: Iterator[tuple[int, str, int | None]] = iter(changelog)
    upcoming = next(records, None)
    wrong: list[tuple[Answer, str]] = []
    for answer in judged:
        if answer.changelog_offset is None:
            wrong.append((answer, f"{answer.key}: the answer reports no changelog_offset"))
            continue
        while upcoming is not None and upcoming[0] <= answer.changelog_offset:
            _, key, count = upcoming
            if key in wanted:
                current[key] = count
            upcoming = next(records, None)
        expected = current.get(answer.key)
        got = answer.value if answer.found else None
        if got != expected:
            wrong.append((answer, (
                f"{answer.key}: {got} from a {answer.role} copy at changelog offset "
                f"{answer.changelog_offset}, the changelog says {expected}"
            )))  # fmt: skip
    return wrong


def _offset_order(answer: Answer) -> int:
    return -2 if answer.changelog_offset is None else answer.changelog_offset


def summarize(
    operation: str, answers: Sequence[Answer], wrong: int, duration_s: float
) -> dict[str, float]:
    """The per-operation keys of the JSON line, for the answers of queries started during the
    operation."""
    staleness = [a.staleness_ms for a in answers if not a.failed and a.staleness_ms is not None]
    latencies = [a.latency_ms for a in answers]
    return {
        f"{operation}_queries": float(len(answers)),
        f"{operation}_failed": float(sum(a.failed for a in answers)),
        f"{operation}_wrong": float(wrong),
        f"{operation}_p99_ms": round(percentile(sorted(latencies), 0.99), 1) if latencies else -1.0,
        f"{operation}_max_staleness_ms": float(max(staleness, default=-1)),
        f"{operation}_duration_s": round(duration_s, 3),
        f"{operation}_qps": round(len(answers) / duration_s, 1) if duration_s > 0 else 0.0,
    }


def window_name(operation: str, round_: int) -> str:
    """The name of an operation's window in its round (1: the operation's own name)."""
    return operation if round_ == 1 else f"{operation}_r{round_}"


def targets_met(summary: Mapping[str, float], windows: Iterable[str]) -> bool:
    """The issue's targets at every window measured but the baselines': 0 failed, 0 wrong,
    p99 under 100 ms, and at least one query answered (a window with no query proves
    nothing)."""
    return all(
        summary[f"{op}_queries"] > 0
        and summary[f"{op}_failed"] == 0
        and summary[f"{op}_wrong"] == 0
        and 0 <= summary[f"{op}_p99_ms"] < P99_TARGET_MS
        for op in windows
        if re.sub(r"_r\d+$", "", op) not in BASELINES
    )


# ------------------------------------------------------------------------ the query clients
def client_main(
    *,
    service: str,
    keys: int,
    qps: float,
    max_staleness_ms: int,
    out: str,
    seed: int,
    stop: multiprocessing.synchronize.Event,
) -> None:
    """One client process: queries random loaded words until ``stop``, one JSON line an
    answer in ``out``."""
    rng = random.Random(seed)
    router = QueryRouter([service], timeout=QUERY_TIMEOUT_S)
    period = 1.0 / qps if qps > 0 else 0.0
    tick = time.monotonic()
    with open(out, "a", encoding="utf-8") as sink:
        while not stop.is_set():
            key = f"k{rng.randrange(keys):07d}"
            started, clock = time.time(), time.monotonic()
            try:
                result = router.get(STORE, key, max_staleness_ms=max_staleness_ms)
            except Exception as error:  # every kind counts: the promise is "never fails"
                why = f"{type(error).__name__}: {error}"[:400]
                answer = Answer(started, (time.monotonic() - clock) * 1000, key, error=why)
            else:
                answer = Answer(
                    started, (time.monotonic() - clock) * 1000, key,
                    found=result.found,
                    value=int(result.value) if result.found else None,
                    partition=result.partition,
                    changelog_offset=result.reflects.changelog_offset,
                    staleness_ms=result.reflects.staleness_ms,
                    role=result.role,
                )  # fmt: skip
            sink.write(json.dumps(dataclasses.asdict(answer)) + "\n")
            tick = max(tick + period, time.monotonic() - 1.0)  # never a burst to catch up
            stop.wait(max(0.0, tick - time.monotonic()))


def read_answers(paths: Iterable[Path]) -> list[Answer]:
    answers = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):  # a line cut short by the client's end
                answers.append(Answer(**json.loads(line)))
    return answers


def changelog_records(log_url: str, partition: int, upto: int) -> list[tuple[int, str, int | None]]:
    """The changelog partition's committed records up to offset ``upto`` (at least),
    decoded: (offset, word, count or None)."""
    log = open_log(log_url)
    tp = TopicPartition(CHANGELOG, partition)
    records: list[tuple[int, str, int | None]] = []
    try:
        offset = log.beginning_offset(tp)
        while offset <= upto:
            fetched = log.fetch(tp, offset, 50_000)
            for record in fetched.records:
                assert record.key is not None
                value = None if record.value is None else LongSerde.deserialize(record.value)
                records.append((record.offset, record.key.decode(), value))
                offset = record.offset + 1
            if not fetched.records:
                if fetched.end_offset <= upto:
                    raise RuntimeError(
                        f"{tp} ends at {fetched.end_offset}, an answer reported offset {upto}"
                    )
                break  # the rest up to the end is markers or aborted records
    finally:
        log.close()
    return records


# ------------------------------------------------------------------------------ the harness
class Bench:
    def __init__(self, cluster: Cluster, root: Path, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.root = root
        self.args = args
        self.operator = Operator(cluster, root / "operator", NAMESPACE)
        self.log_url = ""
        self.service = ""
        self.document: dict[str, Any] = {}
        self.keys = [f"k{index:07d}" for index in range(args.keys)]
        self.producer: Producer | None = None
        self.clients: list[multiprocessing.process.BaseProcess] = []
        self.stop_clients = multiprocessing.get_context("spawn").Event()
        self.windows: dict[str, tuple[float, float]] = {}
        self.replicas: int = args.replicas

    # -------------------------------------------------------------------------- the setup
    def start(self, bootstrap: str | None) -> None:
        operator = self.operator
        operator.install()
        operator.start()
        if bootstrap is None:
            assert self.cluster.provisioner is not None
            claim = self.cluster.provisioner.directory(NAMESPACE, f"{APP}-log")
            claim.mkdir(parents=True)
            self.log_url = f"sqlite:///{claim}/log.db"
        else:
            self.log_url = f"kafka://{bootstrap}"
        log = open_log(self.log_url)
        try:
            for topic in (INPUT, ALERTS_INPUT):
                log.create_topic(topic, PARTITIONS)
        finally:
            log.close()
        if bootstrap is None:
            self.document = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
            self.document["spec"]["replicas"] = self.replicas
            operator.wait_watching()
            self.apply()
            self.service = query_service_when_ready(operator, APP, self.replicas)
        else:
            self.document = manifest(APP, bootstrap, SECRET)
            self.service = deploy(operator, APP, bootstrap, SECRET)  # 3 pods
            if self.replicas != 3:
                self.scale(self.replicas)

    def apply(self) -> int:
        self.operator.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(self.document))
        return int(self.operator.app(APP)["metadata"]["generation"])

    def load(self) -> None:
        """Every key once, then until the input is committed and a sample of the keys (the
        last loaded of each partition among them) is found. Not ``uncommitted_records`` == 0:
        on Kafka a transactional topic's end offset stays past the group's committed offset
        (by its last transaction markers)."""
        started = time.monotonic()
        load_keys(self.log_url, self.keys, partitions=PARTITIONS)
        log = open_log(self.log_url)
        inputs = [TopicPartition(INPUT, p) for p in range(PARTITIONS)]
        try:
            wait_until(
                lambda: all(
                    log.committed_offsets(APP, inputs).get(tp, -1) == log.end_offset(tp)
                    for tp in inputs
                ),
                "the input committed",
                3600,
            )
        finally:
            log.close()
        router = QueryRouter([self.service], timeout=QUERY_TIMEOUT_S)
        sample = self.keys[-10 * PARTITIONS :] + random.Random(3).sample(
            self.keys, min(200, len(self.keys))
        )

        def found() -> bool:
            try:
                return all(router.get(STORE, key).found for key in sample)
            except QueryFailedError:
                return False

        wait_until(found, f"a sample of {len(sample)} keys counted", 3600)
        print(f"{len(self.keys)} keys loaded and counted in {time.monotonic() - started:.1f} s",
              flush=True)  # fmt: skip

    def start_load(self) -> None:
        self.producer = Producer(self.log_url, self.keys, self.args.rate, partitions=PARTITIONS)
        self.producer.start()
        context = multiprocessing.get_context("spawn")
        for index in range(self.args.clients):
            process = context.Process(
                target=client_main,
                kwargs={
                    "service": self.service,
                    "keys": len(self.keys),
                    "qps": self.args.qps / self.args.clients,
                    "max_staleness_ms": self.args.max_staleness_ms,
                    "out": str(self.root / f"client-{index}.jsonl"),
                    "seed": index,
                    "stop": self.stop_clients,
                },
                name=f"query-client-{index}",
                daemon=True,
            )
            process.start()
            self.clients.append(process)

    def stop_load(self) -> None:
        self.stop_clients.set()
        for process in self.clients:
            process.join(30)
            if process.is_alive():
                process.kill()
        if self.producer is not None:
            self.producer.stopped.set()
            self.producer.join(10)

    def check_load(self) -> None:
        if self.producer is not None and self.producer.error is not None:
            raise RuntimeError(f"the input producer failed: {self.producer.error!r}")
        dead = [p.name for p in self.clients if not p.is_alive()]
        if dead:
            raise RuntimeError(f"query client(s) {dead} ended early; see the traceback above")

    # ----------------------------------------------------------------------- observations
    def pods(self) -> dict[str, dict[str, Any]]:
        return self.operator.pods(APP)

    def stateful_tasks(self) -> list[str]:
        ip = next(p["status"]["podIP"] for p in self.pods().values() if p["status"].get("podIP"))
        with urllib.request.urlopen(f"http://{ip}:7070/v1/layout", timeout=10) as response:
            return sorted(json.loads(response.read())["stateful_tasks"])

    def settled(self, replicas: int, generation: int) -> bool:
        """Ready with ``replicas`` pods, the generation observed, no upgrade running, and the
        membership balanced over them with no warm-up left."""
        found = self.operator.app(APP)
        status = found.get("status", {})
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        if (
            status.get("readyReplicas") != replicas
            or conditions.get("Ready") != "True"
            or status.get("observedGeneration", 0) < generation
            or status.get("upgrade") is not None
        ):
            return False
        expected = {f"{APP}-{i}" for i in range(replicas)}
        pods = self.pods()
        if set(pods) != expected or not all(
            _ready(p) and not p["metadata"].get("deletionTimestamp") for p in pods.values()
        ):
            return False
        try:
            stateful = self.stateful_tasks()
        except (OSError, StopIteration, KeyError, ValueError):
            return False
        published = self.operator.get("", "configmaps", f"{APP}-membership")
        if published is None:
            return False
        return balanced(json.loads(published["data"]["membership.json"]), expected, stateful)

    def wait_settled(self, what: str, replicas: int, generation: int) -> None:
        def done() -> bool:
            self.check_load()
            return self.settled(replicas, generation)

        try:
            wait_until(done, what, READY_TIMEOUT)
        except TimeoutError:
            print(self.operator.describe_failure(APP)[-6000:], flush=True)
            raise

    def generation(self) -> int:
        return int(self.operator.app(APP)["metadata"]["generation"])

    def container(self, pod: str) -> dict[str, Any]:
        statuses = self.pods()[pod]["status"].get("containerStatuses", [])
        return dict(statuses[0]) if statuses else {}

    # ------------------------------------------------------------------------ operations
    def upgrade(self, strategy: str) -> None:
        """To whichever of the word count's two topologies does not run (v2 gains a first
        sub-topology: every task id moves), the revision one up, with ``strategy``."""
        running = self.document["spec"].get("topology") or {}
        ref = "wordcount:topology"
        if running.get("ref", ref) == ref:
            ref = "wordcount:topology_v2"
        revision = str(int(running.get("revision", "1")) + 1)
        self.document["spec"]["topology"] = {
            "ref": ref, "revision": revision, "upgradeStrategy": strategy,
        }  # fmt: skip
        generation = self.apply()

        def upgraded() -> bool:
            status = self.operator.app(APP).get("status", {})
            if (status.get("lastUpgrade") or {}).get("outcome") == "RolledBack":
                raise RuntimeError(f"the upgrade was rolled back: {status.get('lastUpgrade')}")
            return (status.get("topology") or {}).get("revision") == revision

        wait_until(upgraded, f"the upgrade to revision {revision}", READY_TIMEOUT)
        self.wait_settled("settled after the upgrade", self.replicas, generation)

    def rolling_restart(self) -> None:
        uids = {name: pod["metadata"]["uid"] for name, pod in self.pods().items()}
        config = self.document["spec"].setdefault("config", {})
        config["commit.interval.ms"] = 200 if config.get("commit.interval.ms") != 200 else 150
        generation = self.apply()
        wait_until(
            lambda: all(
                (pod := self.pods().get(name)) is not None and pod["metadata"]["uid"] != uid
                for name, uid in uids.items()
            ),
            "every pod replaced",
            READY_TIMEOUT,
        )
        self.wait_settled("settled after the rolling restart", self.replicas, generation)

    def scale(self, replicas: int) -> None:
        self.operator.kubectl("scale", "sapp", APP, f"--replicas={replicas}")
        self.document["spec"]["replicas"] = replicas
        self.wait_settled(f"balanced at {replicas} pods", replicas, self.generation())

    def evict(self) -> None:
        victim = f"{APP}-1"
        uid = self.pods()[victim]["metadata"]["uid"]
        evict(self.operator, victim)
        wait_until(
            lambda: (pod := self.pods().get(victim)) is not None and pod["metadata"]["uid"] != uid,
            f"{victim} replaced",
            READY_TIMEOUT,
        )
        self.wait_settled("settled after the eviction", self.replicas, self.generation())

    def node_loss(self) -> None:
        assert self.cluster.kubelets is not None
        before = membership(self.operator, APP)
        assert before is not None
        pods = self.pods()
        nodes = {name: pod["spec"]["nodeName"] for name, pod in pods.items()}
        if len(set(nodes.values())) != len(nodes):
            raise RuntimeError(f"a node loss needs one pod per node (the zone spread): {nodes}")
        victim = next(name for name in sorted(pods) if before.assignment.tasks_of(name).active)
        dead = nodes[victim]
        self.cluster.kubelets.kill_node(dead)
        try:
            wait_dropped(self.operator, APP, victim, f"{victim} (on {dead}) dropped", 180)
        finally:
            self.cluster.kubelets.reboot_node(dead)
        wait_until(lambda: victim in members(self.operator, APP), f"{victim} back", READY_TIMEOUT)
        self.wait_settled(f"settled after {dead} rebooted", self.replicas, self.generation())

    def pod_kill(self) -> None:
        assert self.cluster.kubelets is not None
        victim = f"{APP}-1"
        before = int(self.container(victim).get("restartCount", 0))
        killed_at = _now_seconds()
        self.cluster.kubelets.kill_container(NAMESPACE, victim)
        wait_until(
            lambda: (
                int(self.container(victim).get("restartCount", 0)) > before
                and _ready_since(self.pods()[victim], killed_at)
            ),
            f"{victim} restarted and Ready",
            READY_TIMEOUT,
        )
        self.wait_settled("settled after the kill", self.replicas, self.generation())

    def wiped_restore(self) -> None:
        assert self.cluster.kubelets is not None and self.cluster.provisioner is not None
        kubelets = self.cluster.kubelets
        victim = f"{APP}-2"
        state = self.cluster.provisioner.directory(NAMESPACE, f"state-{victim}")
        if not any(state.glob(f"*_*/{STORE}")):
            raise RuntimeError(f"no copy of {STORE} in {state}: the wipe would prove nothing")
        # A kubelet restarts a first crash at once: the second waits out a back-off, and the
        # claim is emptied while the container is down.
        before = int(self.container(victim).get("restartCount", 0))
        kubelets.kill_container(NAMESPACE, victim)
        wait_until(
            lambda: (
                int(self.container(victim).get("restartCount", 0)) > before
                and "running" in self.container(victim).get("state", {})
            ),
            f"{victim} running again",
            READY_TIMEOUT,
        )
        killed_at = _now_seconds()
        kubelets.kill_container(NAMESPACE, victim)
        wait_until(
            lambda: "running" not in self.container(victim).get("state", {}),
            f"{victim} down",
            READY_TIMEOUT,
        )
        for entry in state.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        wait_until(
            lambda: _ready_since(self.pods()[victim], killed_at),
            f"{victim} restored and Ready",
            READY_TIMEOUT,
        )
        self.wait_settled("settled after the restore", self.replicas, self.generation())

    def run(self, operations: Sequence[str]) -> None:
        started = time.time()
        time.sleep(self.args.steady)
        self.check_load()
        self.windows["steady"] = (started, time.time())
        acts: dict[str, Callable[[], None]] = {
            "upgrade": lambda: self.upgrade("Rolling"),
            "upgrade_recreate": lambda: self.upgrade("Recreate"),
            "rolling_restart": self.rolling_restart,
            "scale_out": lambda: self.scale(self.replicas + 1),
            "scale_in": lambda: self.scale(self.replicas),
            "evict": self.evict,
            "node_loss": self.node_loss,
            "pod_kill": self.pod_kill,
            "wiped_restore": self.wiped_restore,
        }
        for round_ in range(1, self.args.rounds + 1):
            for operation in operations:
                name = window_name(operation, round_)
                started = time.time()
                print(f"{name}: started", flush=True)
                acts[operation]()
                self.windows[name] = (started, time.time())
                print(f"{name}: settled in {time.time() - started:.1f} s", flush=True)
                time.sleep(self.args.settle)
                self.check_load()

    # ---------------------------------------------------------------------------- results
    def results(self) -> dict[str, float]:
        answers = read_answers(sorted(self.root.glob("client-*.jsonl")))
        by_partition: dict[int, list[Answer]] = {}
        for answer in answers:
            if not answer.failed:
                by_partition.setdefault(answer.partition, []).append(answer)
        wrong: dict[int, str] = {}
        for partition, group in sorted(by_partition.items()):
            if not 0 <= partition < PARTITIONS:
                for answer in group:
                    wrong[id(answer)] = f"partition {partition}"
                continue
            upto = max((a.changelog_offset or -1) for a in group)
            records = changelog_records(self.log_url, partition, upto)
            for answer, why in wrong_answers(group, records):
                wrong[id(answer)] = why
        summary: dict[str, float] = {}
        for operation, (start, end) in self.windows.items():
            inside = [a for a in answers if start <= a.started <= end]
            bad = [wrong[id(a)] for a in inside if id(a) in wrong]
            summary.update(summarize(operation, inside, len(bad), end - start))
            prefix = operation + "_"
            shown = ", ".join(
                f"{k.removeprefix(prefix)} {v:g}"
                for k, v in summary.items()
                if k.startswith(prefix)
            )
            roles = collections.Counter(a.role or "failed" for a in inside)
            found = sum(a.found for a in inside)
            print(f"{operation}: {shown}; answered by {dict(roles)}, {found} found", flush=True)
            for line in [a.error for a in inside if a.failed][:3] + bad[:3]:
                print(f"  {line}", flush=True)
        return summary


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _now_seconds() -> datetime.datetime:
    # Second precision, as the API's times: a Ready transition must come after this.
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def _ready_since(pod: Mapping[str, Any], since: datetime.datetime) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    ready: dict[str, Any] = next((c for c in conditions if c["type"] == "Ready"), {})
    return ready.get("status") == "True" and (
        datetime.datetime.fromisoformat(ready["lastTransitionTime"]) >= since
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=50_000, help="distinct words loaded")
    parser.add_argument("--rate", type=int, default=200, help="live input, words/s")
    parser.add_argument("--log", choices=["sqlite", "kafka"], default="sqlite")
    parser.add_argument("--clients", type=int, default=3, help="query client processes")
    parser.add_argument("--replicas", type=int, default=3, help="pods of the app")
    parser.add_argument("--qps", type=float, default=200, help="queries/s, all clients together")
    parser.add_argument("--max-staleness-ms", type=int, default=600_000)
    parser.add_argument("--steady", type=float, default=15, help="baseline window, s")
    parser.add_argument("--settle", type=float, default=5, help="seconds between operations")
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="run the operations this many times (round k's windows are <operation>_r<k>)",
    )  # fmt: skip
    parser.add_argument(
        "--operations", default=",".join(OPERATIONS),
        help=f"comma-separated, in this order: {','.join(OPERATIONS)}",
    )  # fmt: skip
    args = parser.parse_args()
    operations = [op for op in args.operations.split(",") if op]
    unknown = [op for op in operations if op not in OPERATIONS]
    if unknown:
        parser.error(f"--operations: unknown {unknown}; choose from {', '.join(OPERATIONS)}")
    if args.replicas < 3:
        parser.error(f"--replicas {args.replicas}: at least 3 (the operations act on {APP}-2)")
    if args.log == "sqlite" and "node_loss" in operations:
        # The embedded log's one claim pins every pod to one node: losing it loses them all.
        print("node_loss: skipped on the embedded log (every pod on one node); --log kafka "
              "runs it", flush=True)  # fmt: skip
        operations.remove("node_loss")
    root = Path(tempfile.mkdtemp(prefix="bench-queries-"))
    examples = sorted(str(p) for p in (REPO / "examples").iterdir() if p.is_dir())
    summary: dict[str, Any] = {
        "benchmark": "queries", "keys": args.keys, "partitions": PARTITIONS,
        "rate_words_s": args.rate, "clients": args.clients, "log_kafka": int(args.log == "kafka"),
        "replicas": args.replicas,
        "load_average_start": round(os.getloadavg()[0], 2),
    }  # fmt: skip
    with contextlib.ExitStack() as stack:
        bootstrap = None
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        if args.log == "kafka":
            bootstrap = stack.enter_context(KafkaCluster(root / "kafka", 1)).bootstrap
        cluster = Cluster(root / "cluster", pythonpath=examples).start()
        stack.callback(cluster.stop)
        print(f"control plane started in {cluster.startup_seconds:.1f} s", flush=True)
        bench = Bench(cluster, root, args)
        stack.callback(bench.operator.stop)
        bench.start(bootstrap)
        bench.load()
        bench.start_load()
        try:
            bench.run(operations)
        finally:
            bench.stop_load()
        summary.update(bench.results())
        summary["load_average_end"] = round(os.getloadavg()[0], 2)
        summary["words_produced"] = bench.producer.produced if bench.producer else 0
        summary["targets_met"] = targets_met(summary, [w for w in bench.windows if w != "steady"])
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
