"""Scaling benchmark (issue 25): scale out, scale in and evict a busy word count, warm and cold.

Run it with ``make bench-scale`` (``BENCH_SCALE_ARGS="--keys 50000"`` for a quick run). It is a
script, not a test: it measures and reports. It runs on the control plane ``make test`` uses
(``tests/support/control_plane``: the real kube-apiserver, etcd, controller manager and
scheduler, the kubelet stand-in running each pod as a real ``eddyline`` process, the chart
installed through Helm's library, the operator as its own process), as ``make bench-operator``
does, on one shared embedded SQLite log.

The app is the word count of ``examples/wordcount/streamapp.cluster.yaml`` (exactly-once, a
standby per stateful task) reading ``text-lines`` with 6 partitions (6 counting tasks: 2 per pod
at 3 replicas, 1 at 6). First ``--keys`` distinct words (1,000,000 by default) are loaded and
counted, then lines arrive at a steady ``--rate`` words/s for the rest of the run (10 words a
line, words drawn from the loaded ones, every partition every 100 ms). The rate and the pods'
CPU (their processes' user + system time per wall second, in cores of this machine) are printed
for the steady state and for each step. Steps, each measured from its command until balance:

* ``scale_out``: ``kubectl scale sapp wordcount --replicas=6`` (the scale subresource);
* ``scale_in``: back to 3;
* ``evict``: one pod evicted through the Eviction API (the PDB allows one); the StatefulSet
  brings it back on its own volume.

For each step:

* ``<step>_commit_gap_s``: the longest any task (all 12: splitting and counting) went without a
  commit. Every pod exports each task's ``last-commit-timestamp`` (``stream-task-metrics``,
  wall-clock ms) on ``/metrics``; every member is scraped in parallel every 0.25 s, and at each
  scrape a task's gap is the scrape's start minus its newest commit seen on any pod (the old
  owner's until the new one commits). It is a lower bound, short by at most one scrape period.
* ``<step>_critical_path_restored``: records active tasks restored before processing again
  (the pods' ``restore-total`` of the task activations the step caused; a warm-up's or a
  standby's replay is not counted, it runs beside processing).
* ``<step>_keys_unanswered``: keys that got no answer at some point of the step. Each store
  partition is asked for one of its keys through ``QueryRouter`` (stale copies allowed;
  bootstrap: the query Service, then the pods there at the step's start) several times a
  second, a different key each time; when a partition does not answer once, all of its keys
  count as unanswered, and the first failure is printed.
* ``<step>_to_balance_s``: until the membership has no warm-up left, every expected pod is a
  member with its share of the counting tasks (2 or 1), and the app is Ready with every pod.

The same three steps then run with warm-ups disabled (``cold_`` prefix): the operator is
restarted as ``tests/bench/bench_scale_cold_operator.py`` (the same operator, assigning without
a warm-up policy, as before KIP-441), and the state volumes of pods 3 to 5 (retained by the
scale-in) are emptied first, so that new pods start cold as they do on a fresh cluster.

Then the load step (``--skip autoscale`` leaves it out): ``spec.autoscaling`` (min 3, max 6,
target process ratio 0.7, max lag 100,000 records or 30 s, scale-up window 0 s, scale-down
window ``--scale-down-window``, 30 s by default) on the warm operator, the rate x3 until the
app scaled out and balanced and ``--load-seconds`` more, then the rate back:
``autoscale_out_s`` (rate up until balanced at more than 3 pods), ``autoscale_in_s`` (rate
down until balanced at 3 again), ``autoscale_decisions`` (``ScaledOut``/``ScaledIn`` events
of the phase) and ``autoscale_lag_peak`` (the most records the app had not committed on its
input and repartition topics, end offsets minus the group's committed offsets, read from the
log every 0.5 s).

``targets_met``: no record restored on the critical path and every commit gap under 2 s at the
three warm steps, and no key unanswered at any step. The last line is JSON; every value a
number. The machine is shared: timings taken under load are noisy.
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eddyline_runtime.log import Log, Record, open_log
from eddyline_runtime.partitions import TopicPartition, partition_for_key
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import REPO, Operator

APP = "wordcount"
# The autoscaler's targetProcessRatio: this times the busy share at the steady rate.
STEADY_TO_TARGET = 1.5
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
STORE = "word-counts"
INPUT = "text-lines"
PARTITIONS = 6
WORDS_PER_LINE = 10
STEPS = ("scale_out", "scale_in", "evict")
SCRAPE_SECONDS = 0.25
COMMIT_GAP_TARGET_S = 2.0
AUTOSCALING = {
    "minReplicas": 3,
    "maxReplicas": 6,
    "targetProcessRatio": 0.7,
    "maxLagRecords": 100_000,
    "maxLagSeconds": 30,
    "scaleUpStabilizationSeconds": 0,
}

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
LAST_COMMIT = "eddyline_stream_task_metrics_last_commit_timestamp"
RESTORE_TOTAL = "eddyline_stream_state_metrics_restore_total"
PROCESS_RATIO = "eddyline_stream_thread_metrics_process_ratio"


# ------------------------------------------------------------------ pure helpers (unit-tested)
def parse_metrics(text: str, families: Iterable[str]) -> list[tuple[str, dict[str, str], float]]:
    """The samples of ``families`` in a Prometheus text exposition: (family, labels, value)."""
    wanted = set(families)
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) not in wanted:
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        samples.append((match.group(1), labels, float(match.group(3))))
    return samples


def uncommitted_records(log: Log, app: str) -> int:
    """Records ``app`` has not committed yet on its input and repartition topics, from the log
    itself: end offsets minus the group's committed offsets (the pods' ``records-lag`` is the
    lag after their last fetch, near 0 while they keep fetching whatever they buffer)."""
    partitions = [
        TopicPartition(name, p)
        for name, spec in log.topics().items()
        if name == INPUT or (name.startswith(f"{app}-") and name.endswith("-repartition"))
        for p in range(spec.partitions)
    ]
    committed = log.committed_offsets(app, partitions)
    return sum(
        max(0, log.end_offset(tp) - committed.get(tp, log.beginning_offset(tp)))
        for tp in partitions
    )


class CommitGaps:
    """The longest pause between two commits of any task, from repeated scrapes of every pod.

    ``observe`` takes the scrape's start (wall-clock seconds) and each task's newest commit
    time the pods reported (any pod: the old owner until the new one has committed; NaN or
    absent: none there). A task's gap at a scrape is the scrape's start minus the newest
    commit seen so far; the longest over the scrapes is a lower bound of the true longest gap,
    short by at most one scrape period.
    """

    def __init__(self) -> None:
        self.newest: dict[str, float] = {}
        self.longest = 0.0
        self.worst_task = ""

    def observe(self, now: float, commits: Mapping[str, float]) -> None:
        for task, at in commits.items():
            if not math.isnan(at) and at > self.newest.get(task, -math.inf):
                self.newest[task] = at
        for task, at in self.newest.items():
            if now - at > self.longest:
                self.longest = now - at
                self.worst_task = task


@dataclass
class RestoreTally:
    """Records restored by task activations a step caused, from the pods' ``restore-total``.

    A pod registers one sample per (task, store) when an active task finished restoring and
    drops it when the task leaves; samples present before the step with the same value are
    not the step's. A sample seen with several values (the task left and came back) counts
    its largest.
    """

    baseline: Mapping[tuple[str, str, str], float]
    seen: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def observe(self, samples: Mapping[tuple[str, str, str], float]) -> None:
        for key, value in samples.items():
            if self.baseline.get(key) == value:
                continue
            self.seen[key] = max(value, self.seen.get(key, 0.0))

    @property
    def records(self) -> int:
        return int(sum(self.seen.values()))


def balanced(
    membership: Mapping[str, Any], expected: Iterable[str], stateful: Iterable[str]
) -> bool:
    """Whether a published membership is the balance a scaling step ends at: exactly the
    ``expected`` members, no warm-up, and each member active for its share of the
    ``stateful`` tasks (their count divided by the members', rounded down or up)."""
    assignment = membership.get("assignment", {})
    members = {m["id"] for m in assignment.get("members", [])}
    wanted = set(expected)
    if members != wanted or any(assignment.get("warmup", {}).values()):
        return False
    heavy = set(stateful)
    low, high = len(heavy) // len(wanted), -(-len(heavy) // len(wanted))
    active = assignment.get("active", {})
    return (
        all(low <= len(heavy & set(active.get(m, []))) <= high for m in wanted)
        and set().union(*(set(active.get(m, [])) for m in wanted)) >= heavy
    )


def targets_met(summary: Mapping[str, float]) -> bool:
    """The issue's targets: at every warm step no record restored on the critical path and
    every commit gap under 2 s; at every step, warm or cold, every key answered."""
    warm = all(
        summary[f"{step}_critical_path_restored"] == 0
        and summary[f"{step}_commit_gap_s"] < COMMIT_GAP_TARGET_S
        for step in STEPS
    )
    answered = all(value == 0 for key, value in summary.items() if key.endswith("_keys_unanswered"))
    return warm and answered


# ------------------------------------------------------------------------------ the harness
class ColdOperator(Operator):
    """The same operator without warm-ups (``bench_scale_cold_operator``'s docstring)."""

    def __init__(self, cluster: Cluster, root: Path, namespace: str) -> None:
        # The entry point is a module of this repository's tests/, not an installed script.
        super().__init__(cluster, root, namespace, extra_env={"PYTHONPATH": str(REPO)})

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tests.bench.bench_scale_cold_operator"]


class Producer(threading.Thread):
    """Lines of ``WORDS_PER_LINE`` loaded words at ``rate`` words/s, every partition of the
    input (``partitions`` of them) every 100 ms, through a log of its own, until stopped.
    Shared with ``bench_queries.py``."""

    def __init__(
        self, log_url: str, keys: list[str], rate: int, *, partitions: int = PARTITIONS
    ) -> None:
        super().__init__(name="producer", daemon=True)
        self.log_url = log_url
        self.keys = keys
        self.rate = rate
        self.partitions = partitions
        self.produced = 0
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(5)
        log = open_log(self.log_url)
        owed = 0.0
        try:
            tick = time.monotonic()
            while not self.stopped.is_set():
                owed += self.rate * 0.1
                words = int(owed)
                owed -= words
                lines = [
                    " ".join(rng.choices(self.keys, k=WORDS_PER_LINE))
                    for _ in range(max(1, words // WORDS_PER_LINE))
                ]
                now = int(time.time() * 1000)
                for partition in range(self.partitions):
                    part = lines[partition :: self.partitions] or [rng.choice(self.keys)]
                    records = [Record(None, line.encode(), now) for line in part]
                    log.produce(TopicPartition(INPUT, partition), records)
                self.produced += words
                tick += 0.1
                self.stopped.wait(max(0.0, tick - time.monotonic()))
                tick = max(tick, time.monotonic() - 1.0)  # never a burst to catch up
        except BaseException as error:
            self.error = error
        finally:
            log.close()


def load_keys(log_url: str, keys: list[str], *, partitions: int = PARTITIONS) -> None:
    """Every key once, ``WORDS_PER_LINE`` to a line, over the input's ``partitions``."""
    log = open_log(log_url)
    try:
        lines = [
            " ".join(keys[i : i + WORDS_PER_LINE]) for i in range(0, len(keys), WORDS_PER_LINE)
        ]
        now = int(time.time() * 1000)
        for partition in range(partitions):
            part = lines[partition::partitions]
            for start in range(0, len(part), 2_000):
                records = [Record(None, line.encode(), now) for line in part[start : start + 2_000]]
                log.produce(TopicPartition(INPUT, partition), records)
    finally:
        log.close()


class StepWatch:
    """What a step is measured by, on two threads: the pods' commit times and restores
    (every ``SCRAPE_SECONDS``), and a key of every store partition asked in turn."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.gaps = CommitGaps()
        self.tally = RestoreTally(bench.restore_samples(bench.scrape([RESTORE_TOTAL])))
        self.unanswered: set[int] = set()
        self.why: dict[int, str] = {}  # each unanswered partition's first failure
        self.failures: list[BaseException] = []
        self.stopped = threading.Event()
        self.threads = [
            threading.Thread(target=self._guarded, args=(t,), daemon=True)
            for t in (self._watch_commits, self._probe)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(30)

    def check(self, step: str) -> None:
        if self.failures:
            raise RuntimeError(f"{step}: a watcher failed: {self.failures[0]!r}")

    def _guarded(self, target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:
            self.failures.append(error)

    def _watch_commits(self) -> None:
        while not self.stopped.is_set():
            now = time.time()
            scraped = self.bench.scrape([LAST_COMMIT, RESTORE_TOTAL])
            commits: dict[str, float] = {}
            for samples in scraped.values():
                for family, labels, value in samples:
                    if family == LAST_COMMIT and not math.isnan(value):
                        task = labels["task_id"]
                        commits[task] = max(value / 1000, commits.get(task, -math.inf))
            self.gaps.observe(now, commits)
            self.tally.observe(self.bench.restore_samples(scraped))
            self.stopped.wait(max(0.0, SCRAPE_SECONDS - (time.time() - now)))

    def _probe(self) -> None:
        # As a client configured with several bootstrap hosts: the query Service first, then
        # the pods there at the step's start, so that one connection the Service proxy sends to
        # a terminating pod is not taken for the key's unavailability.
        pods = [
            f"{pod['status']['podIP']}:7070"
            for pod in self.bench.pods().values()
            if pod.get("status", {}).get("podIP")
        ]
        router = QueryRouter([self.bench.service, *sorted(pods)], timeout=2)
        turn = 0
        while not self.stopped.is_set():
            for partition, keys in self.bench.probe_keys.items():
                key = keys[turn % len(keys)]
                try:
                    if not router.get(STORE, key).found:
                        self.why.setdefault(partition, f"key {key} not found")
                except QueryFailedError as error:
                    self.why.setdefault(partition, str(error))
            self.unanswered.update(self.why)
            turn += 1
            self.stopped.wait(0.05)


class Bench:
    def __init__(self, cluster: Cluster, root: Path, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.root = root
        self.args = args
        self.harness: Operator = Operator(cluster, root / "operator", "bench-scale")
        self.log_url = ""
        self.service = ""
        self.keys = [f"k{index:07d}" for index in range(args.keys)]
        self.partition_sizes: dict[int, int] = {}
        self.probe_keys: dict[int, list[str]] = {}
        self.stateful: list[str] = []
        self.producer: Producer | None = None
        self.pool = ThreadPoolExecutor(max_workers=8)
        self.cpu_seen: dict[int, float] = {}  # pid -> CPU seconds, the newest read

    # ----------------------------------------------------------------------- observations
    @property
    def namespace(self) -> str:
        return self.harness.namespace

    def pods(self) -> dict[str, dict[str, Any]]:
        return self.harness.pods(APP)

    def membership(self) -> dict[str, Any]:
        found = self.harness.get("", "configmaps", f"{APP}-membership")
        if found is None:
            return {}
        data: dict[str, Any] = json.loads(found["data"]["membership.json"])
        return data

    def app_ready(self, replicas: int) -> bool:
        status = self.harness.app(APP).get("status", {})
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        return bool(status.get("readyReplicas") == replicas and conditions.get("Ready") == "True")

    def balanced(self, replicas: int) -> bool:
        expected = {f"{APP}-{i}" for i in range(replicas)}
        pods = self.pods()
        if set(pods) != expected or not self.app_ready(replicas):
            return False
        if not all(
            any(c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", []))
            and not p["metadata"].get("deletionTimestamp")
            for p in pods.values()
        ):  # fmt: skip
            return False
        return balanced(self.membership(), expected, self.stateful)

    def scrape(self, families: Iterable[str]) -> dict[str, list[tuple[str, dict[str, str], float]]]:
        """Every pod's /metrics (in parallel), by pod name; a pod that does not answer is left
        out."""
        addresses = {
            name: pod["status"]["podIP"]
            for name, pod in self.pods().items()
            if pod.get("status", {}).get("podIP")
        }
        wanted = list(families)

        def one(ip: str) -> list[tuple[str, dict[str, str], float]] | None:
            try:
                with urllib.request.urlopen(f"http://{ip}:7070/metrics", timeout=2) as response:
                    return parse_metrics(response.read().decode(), wanted)
            except OSError:
                return None

        futures = {name: self.pool.submit(one, ip) for name, ip in addresses.items()}
        return {name: found for name, f in futures.items() if (found := f.result()) is not None}

    def restore_samples(
        self, scraped: Mapping[str, list[tuple[str, dict[str, str], float]]]
    ) -> dict[tuple[str, str, str], float]:
        return {
            (pod, labels.get("task_id", ""), labels.get("store", "")): value
            for pod, samples in scraped.items()
            for family, labels, value in samples
            if family == RESTORE_TOTAL
        }

    def pod_cpu_seconds(self) -> float:
        """User + system CPU seconds of every pod process this run has seen (the newest read
        of each; a process that ended keeps its last)."""
        assert self.cluster.kubelets is not None
        ticks = os.sysconf("SC_CLK_TCK")
        for node in self.cluster.kubelets.nodes.values():
            with node.lock:
                processes = [
                    c.process
                    for r in node.pods.values()
                    if r.namespace == self.namespace
                    for c in r.containers
                    if c.process is not None
                ]
            for process in processes:
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
                    self.cpu_seen[process.pid] = (int(stat[11]) + int(stat[12])) / ticks
        return sum(self.cpu_seen.values())

    # -------------------------------------------------------------------------- the setup
    def start(self) -> None:
        harness = self.harness
        harness.install()
        harness.start()
        assert self.cluster.provisioner is not None
        claim = self.cluster.provisioner.directory(self.namespace, f"{APP}-log")
        claim.mkdir(parents=True)
        self.log_url = f"sqlite:///{claim}/log.db"
        log = open_log(self.log_url)
        log.create_topic(INPUT, PARTITIONS)
        log.close()
        harness.wait_watching()
        document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
        document["spec"]["replicas"] = 3
        manifest = self.root / "streamapp.yaml"
        manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
        harness.kubectl("apply", "-f", str(manifest))
        wait_until(lambda: self.app_ready(3), "the word count Ready with 3 pods", 300)
        service = harness.get("", "services", f"{APP}-query")
        assert service is not None
        self.service = f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
        ip = next(iter(self.pods().values()))["status"]["podIP"]
        with urllib.request.urlopen(f"http://{ip}:7070/v1/layout", timeout=10) as response:
            self.stateful = sorted(json.loads(response.read())["stateful_tasks"])
        if len(self.stateful) != PARTITIONS:
            raise RuntimeError(f"expected {PARTITIONS} counting tasks, got {self.stateful}")

    def load(self) -> None:
        started = time.monotonic()
        load_keys(self.log_url, self.keys)
        rng = random.Random(3)
        sizes: dict[int, int] = dict.fromkeys(range(PARTITIONS), 0)
        probes: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
        for key in self.keys:
            partition = partition_for_key(key.encode(), PARTITIONS)
            sizes[partition] += 1
            if len(probes[partition]) < 200 and rng.random() < 0.01 + 200 * PARTITIONS / len(
                self.keys
            ):
                probes[partition].append(key)
        self.partition_sizes, self.probe_keys = sizes, probes
        router = QueryRouter([self.service], timeout=5)
        for key in [self.keys[0], self.keys[-1], *rng.sample(self.keys, 4)]:
            wait_until(lambda key=key: self._answered(router, key), f"key {key} counted", 1800)
            partition = int(router.metadata(STORE, key)["partition"])
            if partition != partition_for_key(key.encode(), PARTITIONS):
                raise RuntimeError(
                    f"key {key}: the store says partition {partition}, the bench computed "
                    f"{partition_for_key(key.encode(), PARTITIONS)}: fix the bench's partitioner"
                )
        sample = [k for ks in probes.values() for k in ks[:50]]
        wait_until(lambda: all(self._answered(router, k) for k in sample), "keys counted", 1800)
        print(
            f"{len(self.keys)} keys loaded and counted in {time.monotonic() - started:.1f} s "
            f"(per partition: {sorted(sizes.values())})",
            flush=True,
        )

    @staticmethod
    def _answered(router: QueryRouter, key: str) -> bool:
        try:
            result = router.get(STORE, key)
        except QueryFailedError:
            return False
        return bool(result.found and int(result.value) >= 1)

    def steady(self, rate: int, seconds: float) -> float:
        """Start (or keep) the input at ``rate`` words/s; the pods' CPU over ``seconds``."""
        if self.producer is None:
            self.producer = Producer(self.log_url, self.keys, rate)
            self.producer.start()
        self.producer.rate = rate
        before, started = self.pod_cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        cores = (self.pod_cpu_seconds() - before) / (time.monotonic() - started)
        return cores

    def check_producer(self) -> None:
        if self.producer is not None and self.producer.error is not None:
            raise RuntimeError(f"the input producer failed: {self.producer.error!r}")

    # ---------------------------------------------------------------------------- a step
    def step(
        self, name: str, act: Callable[[], Any], replicas: int, timeout: float
    ) -> dict[str, float]:
        watch = StepWatch(self)
        watch.start()
        time.sleep(2 * SCRAPE_SECONDS)  # the commits before the step are seen
        cpu_before, started = self.pod_cpu_seconds(), time.monotonic()
        try:
            act()
            deadline = started + timeout
            while not self.balanced(replicas):
                self.check_producer()
                watch.check(name)
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{name}: not balanced at {replicas} pods within {timeout:.0f} s "
                        f"(--step-timeout):\n{self.harness.describe_failure(APP)[-6000:]}"
                    )
                time.sleep(0.1)
            to_balance = time.monotonic() - started
            cpu = (self.pod_cpu_seconds() - cpu_before) / to_balance
            # Tasks that moved last commit within a moment: a gap still open at balance
            # belongs to the step.
            time.sleep(3)
        finally:
            watch.stop()
        watch.check(name)
        result = {
            "commit_gap_s": round(watch.gaps.longest, 3),
            "critical_path_restored": float(watch.tally.records),
            "keys_unanswered": float(sum(self.partition_sizes[p] for p in watch.unanswered)),
            "to_balance_s": round(to_balance, 3),
            "cpu_cores": round(cpu, 3),
        }
        print(
            f"{name}: " + ", ".join(f"{k} {v:g}" for k, v in result.items())
            + f" (longest gap: task {watch.gaps.worst_task}; partitions unanswered: "
            f"{sorted(watch.unanswered)})",
            flush=True,
        )  # fmt: skip
        for partition, why in sorted(watch.why.items()):
            print(f"  partition {partition} unanswered once: {why[:400]}", flush=True)
        return result

    def scale(self, replicas: int) -> None:
        self.harness.kubectl("scale", "sapp", APP, f"--replicas={replicas}")

    def evict(self, pod: str) -> Callable[[], None]:
        return lambda: evict(self.harness, pod)

    def steps(self, prefix: str) -> dict[str, float]:
        results: dict[str, float] = {}
        timeout = self.args.step_timeout
        plan: list[tuple[str, Callable[[], Any], int]] = [
            ("scale_out", lambda: self.scale(6), 6),
            ("scale_in", lambda: self.scale(3), 3),
            ("evict", self.evict(f"{APP}-1"), 3),
        ]
        for step, act, replicas in plan:
            uid = self.pods().get(f"{APP}-1", {}).get("metadata", {}).get("uid")
            measured = self.step(prefix + step, act, replicas, timeout)
            if step == "evict" and self.pods()[f"{APP}-1"]["metadata"]["uid"] == uid:
                raise RuntimeError("the evicted pod was not replaced: the eviction did nothing")
            for key, value in measured.items():
                results[f"{prefix}{step}_{key}"] = value
            time.sleep(self.args.settle)
        return results

    def go_cold(self) -> None:
        """Restart the operator without warm-ups, and empty the retained volumes of pods 3-5."""
        self.harness.stop()
        assert self.cluster.provisioner is not None
        for ordinal in range(3, 6):
            claim = self.cluster.provisioner.directory(self.namespace, f"state-{APP}-{ordinal}")
            if claim.exists():
                for child in claim.iterdir():
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        cold = ColdOperator(self.cluster, self.root / "operator-cold", self.namespace)
        cold.rendered, cold.env = self.harness.rendered, self.harness.env
        cold.service_account, cold.release = self.harness.service_account, self.harness.release
        cold.root.mkdir(parents=True, exist_ok=True)
        cold.start()
        cold.wait_watching()
        self.harness = cold

    def go_warm(self) -> None:
        warm = Operator(self.cluster, self.root / "operator-warm", self.namespace)
        warm.rendered, warm.env = self.harness.rendered, self.harness.env
        warm.service_account, warm.release = self.harness.service_account, self.harness.release
        warm.root.mkdir(parents=True, exist_ok=True)
        self.harness.stop()
        warm.start()
        warm.wait_watching()
        self.harness = warm

    # ------------------------------------------------------------------------ autoscaling
    def autoscale(self, rate: int) -> dict[str, float]:
        harness = self.harness
        # process-ratio is a rate over the pods' last 60 s: read it in the steady state.
        time.sleep(60)
        ratios = [v for samples in self.scrape([PROCESS_RATIO]).values() for _, _, v in samples]
        if not ratios:
            raise RuntimeError("no pod reported process-ratio: cannot set the autoscaler's target")
        steady = sum(ratios) / len(ratios)
        # At the steady rate 3 pods have CPU to spare, so 0.7 would never be reached here: the
        # target is 1.5 times the busy share measured now, so that the steady rate asks for
        # 2 pods (clamped to 3) and 3x the rate for about 5. Not 2 times: the busy share grows
        # less than the rate (bigger batches at 3x: 0.037 -> 0.083, 2.2x, in one run), so 3x
        # sat just above a 2x target and the decision waited minutes for the window's mean.
        target = round(min(0.7, max(0.01, STEADY_TO_TARGET * steady)), 3)
        policy = {
            **AUTOSCALING,
            "targetProcessRatio": target,
            "scaleDownStabilizationSeconds": self.args.scale_down_window,
        }
        print(
            f"autoscale: steady process-ratio {steady:.3f}; spec.autoscaling {policy}", flush=True
        )
        started_at = time.time()
        harness.kubectl(
            "patch", "sapp", APP, "--type=merge",
            "-p", json.dumps({"spec": {"autoscaling": policy}}),
        )  # fmt: skip
        if not harness.app(APP).get("spec", {}).get("autoscaling"):
            raise RuntimeError(
                "the StreamApp kept no spec.autoscaling (the CRD pruned it): this operator does "
                "not autoscale yet; run with --skip autoscale"
            )
        peak = [0.0]
        stop = threading.Event()

        def watch_lag() -> None:
            log = open_log(self.log_url)
            try:
                while not stop.is_set():
                    peak[0] = max(peak[0], float(uncommitted_records(log, APP)))
                    stop.wait(0.5)
            finally:
                log.close()

        watcher = threading.Thread(target=watch_lag, daemon=True)
        watcher.start()
        try:
            self.producer_rate(rate * 3)
            up = time.monotonic()
            out = self._wait_scaled(lambda n: n > 3, up, "scale out under 3x the rate")
            print(f"autoscale: 3x the rate -> balanced at more pods in {out:.1f} s", flush=True)
            time.sleep(self.args.load_seconds)
            self.producer_rate(rate)
            down = time.monotonic()
            back = self._wait_scaled(lambda n: n == 3, down, "scale back to 3 at the rate")
            print(f"autoscale: rate back -> balanced at 3 pods in {back:.1f} s", flush=True)
        finally:
            stop.set()
            watcher.join(10)
        decisions = [
            e
            for e in harness.objects("", "events")
            if e.get("involvedObject", {}).get("name") == APP
            and e.get("reason") in ("ScaledOut", "ScaledIn")
            and _event_time(e) >= started_at - 1
        ]
        count = sum(int(e.get("count") or 1) for e in decisions)
        for event in sorted(decisions, key=_event_time):
            print(f"autoscale: {event.get('reason')}: {event.get('message')}", flush=True)
        if count < 2:
            raise RuntimeError(
                f"autoscaling: {count} ScaledOut/ScaledIn event(s) for a scale out and back; "
                f"status: {harness.app(APP).get('status', {}).get('autoscaling')}"
            )
        return {
            "autoscale_target_process_ratio": target,
            "autoscale_out_s": round(out, 3),
            "autoscale_in_s": round(back, 3),
            "autoscale_decisions": float(count),
            "autoscale_lag_peak": float(peak[0]),
        }

    def producer_rate(self, rate: int) -> None:
        assert self.producer is not None
        self.producer.rate = rate

    def _wait_scaled(self, wanted: Callable[[int], bool], since: float, what: str) -> float:
        deadline = since + self.args.step_timeout
        while True:
            self.check_producer()
            replicas = int(self.harness.app(APP).get("spec", {}).get("replicas", 0))
            if wanted(replicas) and self.balanced(replicas):
                return time.monotonic() - since
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"autoscaling: no {what} within {self.args.step_timeout:.0f} s; status: "
                    f"{self.harness.app(APP).get('status', {}).get('autoscaling')}"
                )
            time.sleep(0.5)


def evict(harness: Operator, pod: str, timeout: float = 120) -> None:
    """Evict ``pod`` through the Eviction API, retrying while the PDB allows none (429) for
    up to ``timeout`` s (``Operator.evict``). Shared with ``bench_queries.py``."""
    harness.evict(pod, retry_seconds=timeout)


def _event_time(event: Mapping[str, Any]) -> float:
    stamp = event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
    if not stamp:
        return 0.0
    return float(calendar.timegm(time.strptime(str(stamp)[:19], "%Y-%m-%dT%H:%M:%S")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct words loaded")
    parser.add_argument(
        "--rate", type=int, default=2_000, help="steady input, words/s (the load step: 3x)"
    )
    parser.add_argument(
        "--skip", action="append", default=[], choices=["cold", "autoscale"],
        help="leave a phase out (repeatable); its keys are then absent",
    )  # fmt: skip
    parser.add_argument("--step-timeout", type=float, default=900, help="seconds per step")
    parser.add_argument("--settle", type=float, default=10, help="seconds between steps")
    parser.add_argument("--load-seconds", type=float, default=60, help="3x rate after scale-out")
    parser.add_argument("--scale-down-window", type=int, default=30, help="autoscaling, s")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    examples = sorted(str(p) for p in (REPO / "examples").iterdir() if p.is_dir())
    cluster = Cluster(root / "cluster", pythonpath=examples).start()
    print(f"control plane started in {cluster.startup_seconds:.1f} s", flush=True)
    bench = Bench(cluster, root, args)
    summary: dict[str, Any] = {"benchmark": "scale", "keys": args.keys, "rate_words_s": args.rate}
    try:
        bench.start()
        bench.load()
        cpu = bench.steady(args.rate, 20)
        ratios = [v for samples in bench.scrape([PROCESS_RATIO]).values() for _, _, v in samples]
        summary["steady_cpu_cores"] = round(cpu, 3)
        summary["steady_process_ratio_max"] = round(max(ratios, default=0.0), 3)
        print(
            f"steady input {args.rate} words/s ({args.rate // WORDS_PER_LINE} lines/s) on 3 pods: "
            f"pods' CPU {cpu:.2f} cores of {os.cpu_count()}, their threads' process-ratio "
            f"{', '.join(f'{r:.2f}' for r in ratios)}",
            flush=True,
        )
        summary.update(bench.steps(""))
        if "cold" not in args.skip:
            bench.go_cold()
            summary.update(bench.steps("cold_"))
        if "autoscale" not in args.skip:
            bench.go_warm()
            summary.update(bench.autoscale(args.rate))
        bench.check_producer()
        if bench.producer is not None:
            summary["words_produced"] = bench.producer.produced
        summary["targets_met"] = targets_met(summary)
    finally:
        if bench.producer is not None:
            bench.producer.stopped.set()
            bench.producer.join(10)
        with contextlib.suppress(Exception):
            bench.harness.stop()
        bench.pool.shutdown(wait=False)
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    missing = [k for k, v in summary.items() if v is None]
    if missing:
        raise RuntimeError(f"no value for {missing}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
