"""Operator benchmark on a ``kafka://`` log: lose a pod, time what a user sees.

Part of ``make bench-operator`` (issue 21): the word count of ``bench_operator.py``, but with
every topic on a real Kafka broker (``tests/support/kafka``, started here) and on the real
control plane (``tests/support/control_plane``: kube-apiserver, controllers, scheduler, the
kubelet stand-in running pods as ``eddyline`` processes), the operator installed by Helm.
The pods spread over the three zones, which the embedded log forbids. It is a script, not a
test (``tests/e2e/test_operator_kafka.py`` asserts the behaviour).

Per kill (``--kills``, default 3; SIGKILL of the container holding the active copy of the
most frequent word's partition, while new lines keep arriving), the keys of
``bench_operator.py`` with a ``kafka_`` prefix: ``kafka_kill_to_not_ready_s``,
``kafka_kill_to_stale_answer_s`` (that word answered by another pod),
``kafka_kill_to_membership_s`` and ``kafka_kill_to_processing_s`` (every count exact again,
lines produced after the kill included); medians and maxima.

Then one node loss (issue 23, item 2; ``tests/e2e/test_operator_node_loss.py`` asserts it):
the node of a pod holding active tasks is killed as a machine losing power (no Lease
renewals, no status updates, its processes gone), new lines arrive, and
``node_loss_to_membership_s`` (the operator drops the pod once the node's Lease is older
than the chart's grace) and ``node_loss_to_processing_s`` (the survivors, asked directly,
answer exact counts, the new lines included; target under 15 s) are taken. The node then
boots again and its pod rejoins.

Then, with ``--upgrade-keys N`` (default 100,000), the topology upgrade of
``bench_upgrade.py`` on this log (issue 36): ``N`` distinct words counted, the upgrade to
``topology_v2`` relocating state, and the reverse upgrade with every state claim emptied
(Kafka Streams' reset and rebuild, here from the broker's changelogs), keys ``kafka_upgrade_*``
and ``kafka_rebuild_*``. On the embedded log a restore reads SQLite on the same disk; here it
reads the changelog over the network, which is where relocation must win. ``0`` skips it.

``--merge FILE`` adds these keys to the last JSON line of FILE (``bench_operator.py``'s
output, which the Makefile tees there) so that ``make bench-operator`` still ends with one
JSON object. The machine is shared: numbers taken under load are noisy.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.bench import bench_upgrade
from tests.support.cluster_word_count import (
    PARTITIONS,
    STORE,
    counts_exact,
    produce_lines,
    random_lines,
)
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Operator
from tests.support.kafka.broker import KafkaCluster
from tests.support.kafka.streamapp import READY_TIMEOUT, create_input, deploy, manifest, ready
from tests.support.node_loss import members, membership, survivor_addresses, wait_dropped

REPO = Path(__file__).resolve().parents[2]
APP = "wordcount"
NAMESPACE = "bench-kafka"
SECRET = "wordcount-kafka"
WORDS = [f"w{index:03d}" for index in range(200)]
MARKS = ("kill_to_not_ready_s", "kill_to_stale_answer_s", "kill_to_membership_s",
         "kill_to_processing_s")  # fmt: skip


class Bench:
    def __init__(self, cluster: Cluster, operator: Operator, bootstrap: str) -> None:
        self.cluster = cluster
        self.operator = operator
        self.bootstrap = bootstrap
        self.expected: collections.Counter[str] = collections.Counter()
        self.rng = random.Random(7)
        self.service = ""

    def produce(self, lines: int) -> None:
        batch = random_lines(self.rng, WORDS, lines, most=8)
        self.expected.update(word for line in batch for word in line.split())
        produce_lines(f"kafka://{self.bootstrap}", batch)

    def counts_exact(self) -> bool:
        return counts_exact(QueryRouter([self.service], timeout=2), self.expected)

    def membership_generation(self) -> int:
        found = self.operator.get("", "configmaps", f"{APP}-membership")
        if found is None:
            return -1
        return int(json.loads(found["data"]["membership.json"])["generation"])

    def pod_ready(self, name: str) -> bool:
        pod = self.operator.pods(APP).get(name, {})
        conditions = pod.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def kill_once(self) -> dict[str, float]:
        assert self.cluster.kubelets is not None
        word = self.expected.most_common(1)[0][0]
        before = QueryRouter([self.service], timeout=2).get(STORE, word)
        assert before.host is not None
        address = before.host.split(":")[0]
        victim = next(n for n, p in self.operator.pods(APP).items()
                      if p.get("status", {}).get("podIP") == address)  # fmt: skip
        generation = self.membership_generation()
        killed = time.monotonic()
        self.cluster.kubelets.kill_container(NAMESPACE, victim)
        self.produce(500)  # arrives while the pod is down
        marks: dict[str, float] = {}
        deadline = killed + 90
        while len(marks) < len(MARKS) and time.monotonic() < deadline:
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
        if len(marks) < len(MARKS):
            raise RuntimeError(f"the failover did not finish within 90 s: {marks}\n"
                               + self.operator.describe_failure(APP)[-6000:])  # fmt: skip
        # The container comes back after the kubelet's back-off and rejoins; settle first.
        wait_until(lambda: ready(self.operator, APP), "the killed pod back", READY_TIMEOUT)
        wait_until(self.counts_exact, "exact counts with the pod back", 120)
        return {key: round(value, 3) for key, value in sorted(marks.items())}

    def node_loss(self) -> dict[str, float]:
        """Kill the node of a pod holding active tasks; see the module docstring."""
        assert self.cluster.kubelets is not None
        before = membership(self.operator, APP)
        assert before is not None
        pods = self.operator.pods(APP)
        nodes = {name: pod["spec"]["nodeName"] for name, pod in pods.items()}
        if len(set(nodes.values())) != len(nodes):
            raise RuntimeError(f"a node loss needs one pod per node (the zone spread): {nodes}")
        victim = next(name for name in sorted(pods) if before.assignment.tasks_of(name).active)
        dead = nodes[victim]
        killed = time.monotonic()
        self.cluster.kubelets.kill_node(dead)
        try:
            self.produce(500)  # arrives while the node is gone
            wait_dropped(self.operator, APP, victim, f"{victim} (on {dead}) dropped", 120)
            dropped = time.monotonic() - killed
            survivors = QueryRouter(survivor_addresses(self.operator, APP, victim), timeout=2)
            wait_until(
                lambda: counts_exact(survivors, self.expected),
                "exact counts on the survivors",
                120,
            )
            processing = time.monotonic() - killed
        finally:
            self.cluster.kubelets.reboot_node(dead)
        wait_until(
            lambda: victim in members(self.operator, APP) and ready(self.operator, APP),
            f"{victim} back after {dead} rebooted",
            READY_TIMEOUT,
        )
        wait_until(self.counts_exact, "exact counts with the rebooted node's pod back", 120)
        return {
            "node_loss_to_membership_s": round(dropped, 3),
            "node_loss_to_processing_s": round(processing, 3),
        }


def last_json_line(path: Path) -> dict[str, Any]:
    for line in reversed(path.read_text(encoding="utf-8").splitlines()):
        if line.startswith("{"):
            found: dict[str, Any] = json.loads(line)
            return found
    raise SystemExit(f"no JSON line in {path}: did the embedded-log run above fail?")


def upgrades(
    operator: Operator, bootstrap: str, service: str, keys: int, *, rebuild_first: bool
) -> dict[str, Any]:
    """``bench_upgrade.run`` on the broker: relocating, then resetting and rebuilding."""
    log = KafkaLog.open(f"kafka://{bootstrap}")
    try:
        log.create_topic("watched-words", PARTITIONS)  # topology_v2's new first sub-topology
    finally:
        log.close()
    manifest_path = operator.root / "streamapp-kafka.yaml"
    manifest_path.write_text(yaml.safe_dump(manifest(APP, bootstrap, SECRET)), encoding="utf-8")
    measured = bench_upgrade.run(
        operator, f"kafka://{bootstrap}", service, manifest_path, keys=keys,
        rebuild_first=rebuild_first,
    )  # fmt: skip
    return {f"kafka_{key}": value for key, value in measured.items()}


def run(kills: int, lines: int, upgrade_keys: int, rebuild_first: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-operator-kafka-"))
    examples = sorted(str(p) for p in (REPO / "examples").iterdir() if p.is_dir())
    with KafkaCluster(root / "kafka", 1) as broker:
        cluster = Cluster(root / "cluster", pythonpath=examples).start()
        operator = Operator(cluster, root / "operator", NAMESPACE)
        try:
            operator.install()
            operator.start()
            create_input(broker.bootstrap)
            bench = Bench(cluster, operator, broker.bootstrap)
            applied = time.monotonic()
            bench.service = deploy(operator, APP, broker.bootstrap, SECRET)
            apply_to_ready = time.monotonic() - applied
            produced = time.monotonic()
            bench.produce(lines)
            wait_until(bench.counts_exact, "exact counts", 120)
            first_counts = time.monotonic() - produced
            print(f"kafka: apply -> Ready {apply_to_ready:.2f} s; {lines} lines -> exact "
                  f"counts {first_counts:.2f} s", flush=True)  # fmt: skip
            measured = []
            for index in range(kills):
                marks = bench.kill_once()
                measured.append(marks)
                shown = ", ".join(f"{k} {v:.3f}" for k, v in marks.items())
                print(f"kafka kill {index + 1}: {shown}", flush=True)
            node_loss = bench.node_loss()
            print(f"kafka node loss: {node_loss}", flush=True)
            upgraded: dict[str, Any] = {}
            if upgrade_keys:
                upgraded = upgrades(
                    operator, broker.bootstrap, bench.service, upgrade_keys,
                    rebuild_first=rebuild_first,
                )  # fmt: skip
            operator.kubectl("delete", "sapp", APP)
            wait_until(lambda: not operator.pods(APP), "every pod gone", READY_TIMEOUT)
        finally:
            operator.stop()
            cluster.stop()
            shutil.rmtree(root / "cluster", ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    summary: dict[str, Any] = {
        "kafka_apply_to_ready_s": round(apply_to_ready, 3),
        "kafka_lines_to_exact_counts_s": round(first_counts, 3),
        "kafka_kills": measured,
        **node_loss,
        **upgraded,
    }
    for key in MARKS:
        values = [k[key] for k in measured]
        summary[f"kafka_{key}"] = round(statistics.median(values), 3)
        summary[f"kafka_{key.removesuffix('_s')}_max_s"] = max(values)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--lines", type=int, default=5_000, help="lines before the first kill")
    parser.add_argument(
        "--upgrade-keys", type=int, default=100_000, help="keys for the upgrades (0: none)"
    )
    parser.add_argument(
        "--rebuild-first", action="store_true", help="the reset and rebuild before relocating"
    )
    parser.add_argument("--merge", type=Path, help="a file whose last JSON line to extend")
    args = parser.parse_args()
    summary = last_json_line(args.merge) if args.merge is not None else {}
    summary.update(run(args.kills, args.lines, args.upgrade_keys, args.rebuild_first))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
