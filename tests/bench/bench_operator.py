"""Operator benchmark: apply a StreamApp, lose a pod, time what a user sees.

Run it with ``make bench-operator``. It is a script, not a test: it measures and reports
(``tests/e2e/test_operator_real_cluster.py`` asserts the behaviour). It runs on the real
control plane (``tests/support/control_plane``: kube-apiserver, etcd, the controller manager
and the scheduler built by ``make control-plane``): the chart goes in through Helm's library,
the operator runs under kopf (``eddyline-operator``) with the chart's ServiceAccount, the real
StatefulSet controller makes the pods and the kubelet stand-in runs each as a real
``eddyline`` runtime process on its own loopback address, all on one shared embedded SQLite
log. The kubelet stand-in restarts a first crash at once, as a kubelet does.

The app is ``examples/wordcount/streamapp.cluster.yaml`` (3 replicas, a standby for every
stateful task, exactly-once). Measured:

* ``apply_to_children_s``: ``kubectl apply`` until every object the operator creates for the
  spec exists (``kubectl_apply_s`` of it is the kubectl command itself);
* ``apply_to_membership_s``: until the operator publishes the first membership, which needs
  the pods running and reporting their task layout;
* ``apply_to_ready_s``: until ``Ready=True`` with 3 ready pods;
* per kill (``--kills``, default 3; SIGKILL of the container holding the active copy of the
  most frequent word's partition, while new lines keep arriving):
  ``kill_to_not_ready_s`` (the kubelet stand-in's probe and status: when the operator can
  first see it), ``kill_to_stale_answer_s`` (a query of that word answered by another
  pod), ``kill_to_membership_s`` (the operator published a new membership generation),
  ``kill_to_processing_s`` (every count exact again, lines produced after the kill
  included: the promoted standby processes). The targets (issue 10) are a stale answer
  within 2 s and processing within 5 s of the operator seeing the pod not ready.

Then many apps on a second operator (issue 23, item 1; ``--apps``, default 50): ``apps - 1``
suspended copies of the word count and the word count with 3 pods, the operator's beat at
60 s so that only pod events republish a membership
(``tests/support/control_plane/many_apps.py``), in a namespace of its own on the same cluster:
``apps``, ``apps_reconciled`` (in their phase), ``apps_to_reconciled_s``,
``last_app_kill_to_membership_s`` (SIGKILL of the last app's pod until it left the membership;
target under 1 s) and ``operator_rss_mb_per_app`` (the operator's resident memory growth from
before the apps to when all are reconciled, per app).

Then the chart's beat (issue 38; ``--beat-apps``, default 200; ``--beat-only`` runs it alone):
the same mix of apps on an operator with no ``EDDYLINE_OPERATOR_RESYNC_SECONDS`` (the chart's
2 s beat), measured over ``--beat-window`` seconds once all are reconciled: ``beat_p50_s`` /
``beat_p99_s`` / ``beat_max_s`` (the interval between two cycles of one app, over every app,
from the operator's own cycle counters scraped every BEAT_SCRAPE_SECONDS),
``beat_cycles_per_s``, ``beat_operator_cores`` and ``beat_operator_rss_mb``,
``beat_apiserver_cores``, ``beat_apiserver_requests_per_s`` (every client's) and the top
kinds of them, ``beat_requests_per_cycle`` (those requests over the operator's cycles),
``beat_pool_warnings`` ("Connection pool is full" in the operator's log) and
``beat_load_1m`` (the machine's 1-minute load average before and after the window).

The last line is JSON. The machine is shared: numbers taken under load are noisy.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from eddyline_runtime.log import open_log
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.bench import bench_upgrade
from tests.support.cluster_word_count import counts_exact, produce_lines, random_lines
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.many_apps import OPERATOR_ENV, ManyApps, reconciled
from tests.support.control_plane.operator import REPO, Operator
from tests.support.ports import free_port

APP = "wordcount"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
STORE = "word-counts"
WORDS = [f"w{index:03d}" for index in range(200)]
CHILDREN = [
    ("", "configmaps", f"{APP}-config"),
    ("", "services", f"{APP}-headless"),
    ("", "services", f"{APP}-query"),
    ("", "serviceaccounts", f"{APP}-runtime"),
    ("rbac.authorization.k8s.io", "roles", f"{APP}-membership"),
    ("rbac.authorization.k8s.io", "rolebindings", f"{APP}-membership"),
    ("policy", "poddisruptionbudgets", APP),
    ("", "persistentvolumeclaims", f"{APP}-log"),
    ("apps", "statefulsets", APP),
]


class Bench:
    def __init__(self, harness: Operator, log_url: str) -> None:
        self.harness = harness
        self.log_url = log_url
        self.expected: collections.Counter[str] = collections.Counter()
        self.rng = random.Random(7)
        self.service = ""

    def produce(self, lines: int) -> None:
        batch = random_lines(self.rng, WORDS, lines, most=8)
        self.expected.update(word for line in batch for word in line.split())
        produce_lines(self.log_url, batch)

    def counts_exact(self) -> bool:
        return counts_exact(QueryRouter([self.service], timeout=2), self.expected)

    def ready(self) -> bool:
        status = self.harness.app(APP).get("status", {})
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        return bool(
            status.get("readyReplicas") == 3
            and conditions.get("Ready") == "True"
            and conditions.get("Progressing") == "False"
        )

    def membership_generation(self) -> int:
        found = self.harness.get("", "configmaps", f"{APP}-membership")
        if found is None:
            return -1
        return int(json.loads(found["data"]["membership.json"])["generation"])

    def pod_ready(self, name: str) -> bool:
        pod = self.harness.pods(APP).get(name, {})
        conditions = pod.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def kill_once(self) -> dict[str, float]:
        word = self.expected.most_common(1)[0][0]
        before = QueryRouter([self.service], timeout=2).get(STORE, word)
        assert before.host is not None
        address = before.host.split(":")[0]
        victim = next(n for n, p in self.harness.pods(APP).items()
                      if p.get("status", {}).get("podIP") == address)  # fmt: skip
        generation = self.membership_generation()
        killed = time.monotonic()
        assert self.harness.cluster.kubelets is not None
        self.harness.cluster.kubelets.kill_container(self.harness.namespace, victim)
        self.produce(500)  # arrives while the pod is down
        marks: dict[str, float] = {}
        deadline = killed + 60
        while len(marks) < 4 and time.monotonic() < deadline:
            now = time.monotonic() - killed
            if "kill_to_not_ready_s" not in marks and not self.pod_ready(victim):
                marks["kill_to_not_ready_s"] = now
            if "kill_to_membership_s" not in marks and self.membership_generation() > generation:
                marks["kill_to_membership_s"] = now
            if "kill_to_stale_answer_s" not in marks:
                try:
                    result = QueryRouter([self.service], timeout=1).get(STORE, word)
                    if result.found and result.host != before.host:
                        marks["kill_to_stale_answer_s"] = time.monotonic() - killed
                except QueryFailedError:
                    pass
            if "kill_to_processing_s" not in marks and self.counts_exact():
                marks["kill_to_processing_s"] = time.monotonic() - killed
            time.sleep(0.01)
        if len(marks) < 4:
            raise RuntimeError(f"the failover did not finish within 60 s: {marks}\n"
                               + self.harness.describe_failure(APP)[-6000:])  # fmt: skip
        # The container comes back after the kubelet's back-off and rejoins; settle first.
        wait_until(self.ready, "the killed pod back and the app settled", 180)
        wait_until(self.counts_exact, "exact counts with the pod back", 120)
        return {key: round(value, 3) for key, value in sorted(marks.items())}


def operator_rss_mb(operator: Operator) -> float:
    """The operator process's resident memory (Linux /proc), in MiB."""
    assert operator.process is not None
    status = Path(f"/proc/{operator.process.pid}/status").read_text(encoding="utf-8")
    rss = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(rss.split()[1]) / 1024


def many_apps(cluster: Cluster, root: Path, apps: int) -> dict[str, Any]:
    """The many-apps run with an operator and namespace of its own (the module docstring)."""
    harness = Operator(cluster, root / "many-apps", "bench-many-apps", extra_env=OPERATOR_ENV)
    try:
        harness.install()
        harness.start()
        harness.wait_watching()
        rss_before = operator_rss_mb(harness)
        applied = time.monotonic()
        run = ManyApps.apply(harness, apps, root)
        with contextlib.suppress(TimeoutError):  # reported as apps_reconciled below
            run.wait_reconciled(300)
        to_reconciled = time.monotonic() - applied
        done = len(reconciled(harness, run.names))
        rss_after = operator_rss_mb(harness)
        _, kill_to_membership = run.kill_last_member(30)
        print(
            f"{apps} apps: {done} reconciled in {to_reconciled:.2f} s; last app's killed pod "
            f"out of the membership in {kill_to_membership:.3f} s; operator RSS "
            f"{rss_before:.1f} -> {rss_after:.1f} MiB"
        )
        run.delete_all(180)
        return {
            "apps": apps,
            "apps_reconciled": done,
            "apps_to_reconciled_s": round(to_reconciled, 3),
            "last_app_kill_to_membership_s": round(kill_to_membership, 3),
            "operator_rss_mb_per_app": round((rss_after - rss_before) / apps, 3),
        }
    finally:
        harness.stop()


# -- the chart's beat with many apps (issue 38, "Scale of the operator") -------------------

# The operator's own cycle counter (eddyline_operator.metrics.CYCLES), one sample per app.
_CYCLES_LINE = re.compile(
    r'^eddyline_operator_reconcile_cycles_total\{namespace="[^"]*",app="([^"]*)",'
    r'outcome="[^"]*"\} (\d+)'
)
# How often the counters are scraped: an interval between two cycles is measured to this.
BEAT_SCRAPE_SECONDS = 0.25
# What urllib3 logs when a request's connection finds the pool full (a connection made and
# thrown away: the pool is smaller than the threads sharing it).
POOL_WARNING = "Connection pool is full"


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cycle_counts(url: str) -> dict[str, int]:
    """Cycles per app so far, from the operator's /metrics."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    counts: dict[str, int] = collections.Counter()
    for line in text.splitlines():
        found = _CYCLES_LINE.match(line)
        if found:
            counts[found.group(1)] += int(found.group(2))
    return counts


def beat_intervals(samples: list[tuple[float, dict[str, int]]]) -> list[float]:
    """The intervals between one app's consecutive cycles, over every app, from scrapes of
    the cycle counters: a cycle is placed at the scrape that first counts it (so each
    interval is known to BEAT_SCRAPE_SECONDS), the first one seen per app starts the count."""
    seen: dict[str, float] = {}
    intervals: list[float] = []
    for (_, before), (at, after) in itertools.pairwise(samples):
        for app, count in after.items():
            new = count - before.get(app, count)
            if new <= 0:
                continue
            if app in seen:
                intervals.append(at - seen[app])
                intervals.extend([0.0] * (new - 1))  # two cycles within one scrape
            seen[app] = at
    return intervals


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def chart_beat(
    cluster: Cluster, root: Path, apps: int, window: float, extra_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """``apps`` StreamApps (``apps - 1`` suspended and the word count, as in the many-apps
    run) on an operator at the chart's beat (no EDDYLINE_OPERATOR_RESYNC_SECONDS), measured
    over ``window`` seconds once every app is reconciled: the beat achieved (interval between
    an app's cycles), the operator's CPU (cores) and RSS, kube-apiserver's CPU, the API
    requests per second and the connection-pool warnings in the operator's log."""
    metrics_url = f"http://127.0.0.1:{free_port()}/metrics"
    harness = Operator(
        cluster, root / "chart-beat", "bench-chart-beat",
        extra_env={"EDDYLINE_OPERATOR_METRICS": metrics_url, **(extra_env or {})},
    )  # fmt: skip
    apiserver = cluster.plane.processes["kube-apiserver"].pid
    try:
        harness.install()
        harness.start()
        harness.wait_watching()
        assert harness.process is not None
        operator = harness.process.pid
        run = ManyApps.apply(harness, apps, root)
        with contextlib.suppress(TimeoutError):  # reported as beat_apps_reconciled below
            run.wait_reconciled(600)
        done = len(reconciled(harness, run.names))
        time.sleep(10)  # the first cycles' applies and status writes behind
        load_before = os.getloadavg()[0]
        requests_before = apiserver_requests(cluster)
        cpu_before = (cpu_seconds(operator), cpu_seconds(apiserver))
        started = time.monotonic()
        samples = [(started, cycle_counts(metrics_url))]
        while time.monotonic() - started < window:
            time.sleep(BEAT_SCRAPE_SECONDS)
            samples.append((time.monotonic(), cycle_counts(metrics_url)))
        elapsed = time.monotonic() - started
        operator_cores = (cpu_seconds(operator) - cpu_before[0]) / elapsed
        apiserver_cores = (cpu_seconds(apiserver) - cpu_before[1]) / elapsed
        by_kind = apiserver_requests(cluster) - requests_before
        requests = sum(by_kind.values()) / elapsed
        load_after = os.getloadavg()[0]
        intervals = beat_intervals(samples)
        cycles = sum(samples[-1][1].values()) - sum(samples[0][1].values())
        result = {
            "beat_apps": apps,
            "beat_apps_reconciled": done,
            "beat_window_s": round(elapsed, 1),
            "beat_p50_s": round(percentile(intervals, 0.5), 2) if intervals else None,
            "beat_p99_s": round(percentile(intervals, 0.99), 2) if intervals else None,
            "beat_max_s": round(max(intervals), 2) if intervals else None,
            "beat_cycles_per_s": round(cycles / elapsed, 1),
            "beat_operator_cores": round(operator_cores, 3),
            "beat_operator_rss_mb": round(operator_rss_mb(harness), 1),
            "beat_apiserver_cores": round(apiserver_cores, 3),
            "beat_apiserver_requests_per_s": round(requests, 1),
            # Every client's requests, over the operator's cycles: most are the operator's.
            "beat_requests_per_cycle": round(requests * elapsed / cycles, 2) if cycles else None,
            "beat_apiserver_requests_top": {
                kind: round(count / elapsed, 1) for kind, count in by_kind.most_common(6)
            },
            "beat_pool_warnings": harness.output().count(POOL_WARNING),
            "beat_load_1m": [round(load_before, 2), round(load_after, 2)],
        }
        print(
            f"{apps} apps at the chart's beat: interval between an app's cycles p50 "
            f"{result['beat_p50_s']} s, p99 {result['beat_p99_s']} s; operator "
            f"{operator_cores:.2f} cores, {result['beat_operator_rss_mb']} MiB; kube-apiserver "
            f"{apiserver_cores:.2f} cores, {requests:.0f} requests/s; "
            f"{result['beat_pool_warnings']} pool warnings; load {load_before:.1f} -> "
            f"{load_after:.1f}"
        )
        run.delete_all(300)
        return result
    finally:
        harness.stop()


_REQUEST_LABELS = re.compile(r'(?<![a-z])(resource|subresource|verb)="([^"]*)"')


def apiserver_requests(cluster: Cluster) -> collections.Counter[str]:
    """Requests kube-apiserver has served so far (apiserver_request_total, every client), by
    "VERB resource"."""
    with cluster.admin().open("/metrics") as response:
        text = response.read().decode()
    counts: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(_REQUEST_LABELS.findall(line))
            sub = labels.get("subresource")
            key = f"{labels.get('verb', '?')} {labels.get('resource', '?')}" + (
                f"/{sub}" if sub else ""
            )
            counts[key] += int(float(line.rsplit(" ", 1)[1]))
    return counts


def start_cluster(root: Path) -> Cluster:
    examples = sorted(str(p) for p in (REPO / "examples").iterdir() if p.is_dir())
    cluster = Cluster(root / "cluster", pythonpath=examples).start()
    print(f"control plane started in {cluster.startup_seconds:.1f} s")
    return cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--apps", type=int, default=50, help="StreamApps in the many-apps run")
    parser.add_argument(
        "--apps-only", action="store_true", help="only the many-apps run (its keys alone)"
    )
    parser.add_argument(
        "--beat-apps", type=int, default=200, help="StreamApps in the run at the chart's beat"
    )
    parser.add_argument(
        "--beat-window", type=float, default=60.0, help="seconds the chart's beat is measured"
    )
    parser.add_argument(
        "--beat-only", action="store_true", help="only the run at the chart's beat (its keys)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="the chart's-beat operator writes its cProfile here (EDDYLINE_OPERATOR_PROFILE)",
    )
    parser.add_argument("--lines", type=int, default=5_000, help="lines before the first kill")
    parser.add_argument(
        "--upgrade-keys", type=int, default=100_000, help="keys in the store for the upgrades"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    profile = {"EDDYLINE_OPERATOR_PROFILE": str(args.profile.resolve())} if args.profile else {}
    cluster = start_cluster(root)
    try:
        if args.apps_only:
            print(json.dumps({"benchmark": "operator", **many_apps(cluster, root, args.apps)}))
            return 0
        if args.beat_only:
            beat = chart_beat(cluster, root, args.beat_apps, args.beat_window, profile)
            print(json.dumps({"benchmark": "operator", **beat}))
            return 0
        summary = single_app(cluster, root, args)
        # Issue 23: many apps on one operator (its own namespace, the first operator stopped).
        summary.update(many_apps(cluster, root, args.apps))
        # Issue 38: as many apps as the chart's 2 s beat must serve on 2 cores.
        summary.update(chart_beat(cluster, root, args.beat_apps, args.beat_window, profile))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(summary))
    return 0


def single_app(cluster: Cluster, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    harness = Operator(cluster, root / "operator", "bench-operator")
    try:
        harness.install()
        harness.start()
        assert cluster.provisioner is not None
        claim = cluster.provisioner.directory(harness.namespace, f"{APP}-log")
        claim.mkdir(parents=True)
        log_url = f"sqlite:///{claim}/log.db"
        log = open_log(log_url)
        log.create_topic("text-lines", 4)
        log.create_topic("watched-words", 4)  # topology_v2's new first sub-topology reads it
        log.close()
        bench = Bench(harness, log_url)
        harness.wait_watching()
        applied = time.monotonic()
        harness.kubectl("apply", "-f", str(MANIFEST))
        kubectl_apply = time.monotonic() - applied
        wait_until(lambda: all(harness.get(g, p, n) for g, p, n in CHILDREN), "children", 60)
        apply_to_children = time.monotonic() - applied
        wait_until(lambda: bench.membership_generation() > 0, "the first membership", 120)
        apply_to_membership = time.monotonic() - applied
        wait_until(bench.ready, "Ready with 3 pods", 120)
        apply_to_ready = time.monotonic() - applied
        service = harness.get("", "services", f"{APP}-query")
        assert service is not None
        bench.service = f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
        print(
            f"apply -> children {apply_to_children:.2f} s, -> membership "
            f"{apply_to_membership:.2f} s, -> Ready {apply_to_ready:.2f} s"
        )
        produced = time.monotonic()
        bench.produce(args.lines)
        wait_until(bench.counts_exact, "exact counts", 120)
        first_counts = time.monotonic() - produced
        print(f"{args.lines} lines -> exact counts through the query Service {first_counts:.2f} s")
        kills: list[dict[str, float]] = []
        for index in range(args.kills):
            marks = bench.kill_once()
            kills.append(marks)
            print(f"kill {index + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in marks.items()))
        summary: dict[str, Any] = {
            "benchmark": "operator",
            "kubectl_apply_s": round(kubectl_apply, 3),
            "apply_to_children_s": round(apply_to_children, 3),
            "apply_to_membership_s": round(apply_to_membership, 3),
            "apply_to_ready_s": round(apply_to_ready, 3),
            "lines_to_exact_counts_s": round(first_counts, 3),
            "kills": kills,
        }
        for key in ("kill_to_not_ready_s", "kill_to_stale_answer_s", "kill_to_membership_s",
                    "kill_to_processing_s"):  # fmt: skip
            values = [k[key] for k in kills]
            summary[key] = round(statistics.median(values), 3)
            summary[key.removesuffix("_s") + "_max_s"] = max(values)
        summary["not_ready_to_processing_s"] = round(
            statistics.median(k["kill_to_processing_s"] - k["kill_to_not_ready_s"] for k in kills),
            3,
        )
        # Issue 11: a full-cluster topology upgrade, relocating vs. resetting and rebuilding.
        summary.update(
            bench_upgrade.run(harness, log_url, bench.service, MANIFEST, keys=args.upgrade_keys)
        )
        # The app goes before the many-apps run shares the machine with it.
        harness.kubectl("delete", "sapp", APP, "--timeout=120s")
        wait_until(lambda: not harness.pods(APP), "the app's pods gone", 120)
    finally:
        harness.stop()
    return summary


if __name__ == "__main__":
    sys.exit(main())
