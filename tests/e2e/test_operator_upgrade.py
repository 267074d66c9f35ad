"""Full-cluster topology upgrades end to end on the real control plane: kopf against the real
kube-apiserver, the real StatefulSet controller rolling the pods, the kubelet stand-in running
them as real processes.

Word count runs on three pods while input keeps arriving; its topology is upgraded to
``topology_v2`` (a new first sub-topology: every ordinal shifts). The operator is stopped
and started again at every step of that upgrade. Then a revision the runtime refuses to
start (``automatic.state.relocation: false`` with misplaced stores) is rolled back. No store
restores a record from its changelog in either (the pods' restore metrics), and the
counts, through the query Service and on the output topic, stay exact.

Every test runs in a namespace of its own with its own chart release and operator (the
``operator`` fixture) and the app deployed at the revision it starts from (``start_app``): a
test fails on its own, never because another one broke, and never skips. The control plane
is the session's.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_runtime.assignor import assign
from eddyline_runtime.log import open_log
from eddyline_runtime.membership import MEMBERSHIP_FILE, Membership
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryRouter
from eddyline_runtime.serde import serde_for
from tests.support.cluster_word_count import counts_exact, produce_lines, random_lines
from tests.support.control_plane.client import Informer, wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Operator
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
APP = "wordcount"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
STORE = "word-counts"
WORDS = [f"w{index:02d}" for index in range(40)]
PARTITIONS = 4
# Bounds for a broken run only; the operator's own steps take seconds.
TIMEOUT = 180


class App:
    """The word count as seen from outside the cluster, with input that keeps arriving."""

    def __init__(self, harness: Operator, cluster: Cluster, log_url: str, service: str) -> None:
        self.harness = harness
        self.cluster = cluster
        self.log_url = log_url
        self.service = service
        self.expected: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seed = 0

    def produce(self, lines: int) -> None:
        self._seed += 1
        batch = random_lines(random.Random(self._seed), WORDS, lines, most=6)
        produce_lines(self.log_url, batch)
        with self._lock:
            for line in batch:
                self.expected.update(line.split())

    def keep_producing(self) -> None:
        def loop() -> None:
            while not self._stop.wait(0.2):
                self.produce(20)

        self._stop.clear()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop_producing(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def counts_exact(self) -> bool:
        with self._lock:
            expected = self.expected.copy()
        return counts_exact(QueryRouter([self.service], timeout=2), expected)

    def output_is_exactly_once(self) -> None:
        """Per word, the published counts only grow and end at the expected count: a
        record processed twice, or a store restored short, would show."""
        log = open_log(self.log_url)
        keys, values = serde_for("string"), serde_for("long")
        last: dict[str, int] = {}
        try:
            for partition in range(PARTITIONS):
                tp = TopicPartition("word-counts", partition)
                offset = 0
                while True:
                    fetched = log.fetch(tp, offset)
                    if not fetched.records:
                        break
                    for record in fetched.records:
                        word = keys.deserialize(record.key)
                        count = values.deserialize(record.value)
                        assert count >= last.get(word, 0), f"{word}: {count} after {last[word]}"
                        last[word] = count
                    offset = fetched.records[-1].offset + 1
        finally:
            log.close()
        assert last == dict(self.expected)

    def restored_records(self) -> int:
        """Records the running pods restored from changelogs since they started."""
        total, found = 0.0, 0
        for pod in self.harness.pods(APP).values():
            ip = pod.get("status", {}).get("podIP")
            with urllib.request.urlopen(f"http://{ip}:7070/metrics", timeout=5) as response:
                for line in response.read().decode().splitlines():
                    if line.startswith("eddyline_stream_state_metrics_restore_total"):
                        total += float(line.rsplit(" ", 1)[1])
                        found += 1
        # Every active store partition reports its restore total (a missing metric is no 0).
        assert found >= PARTITIONS, f"only {found} restore metrics on the pods"
        return int(total)

    def apply(self, tmp: Path, **spec: Any) -> None:
        document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
        document["spec"].update(spec)
        path = tmp / f"streamapp-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(document), encoding="utf-8")
        self.harness.kubectl("apply", "-f", str(path))


@pytest.fixture
def harness(
    control_plane: Cluster, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Operator]:
    """A namespace, chart release and operator of this test's own: no test depends on what
    another left running."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    namespace = f"up-{name[-40:].strip('-')}"
    running = Operator(control_plane, tmp_path / "operator", namespace)
    running.install()
    running.start()
    try:
        yield running
    finally:
        # The app goes while its operator still runs (kopf's finalizer), and its pods with
        # it (the garbage collector): the next test must not share the machine with them.
        running.kubectl.run("delete", "sapp", "--all", "--timeout=60s")
        try:
            wait_until(lambda: not running.objects("", "pods"), "the test's pods gone", 90)
        finally:
            running.stop()


def claim_dir(harness: Operator, claim: str) -> Path:
    """Where the local provisioner puts (or will put) a claim's volume."""
    assert harness.cluster.provisioner is not None
    return harness.cluster.provisioner.directory(harness.namespace, claim)


StartApp = Callable[[str, str], App]


@pytest.fixture
def start_app(harness: Operator, control_plane: Cluster, tmp_path: Path) -> StartApp:
    """Deploys the word count at (revision, topology ref) on this test's cluster and waits
    until it runs that revision with exact counts; fails (never skips) if it does not."""

    def start(revision: str, ref: str) -> App:
        claim = claim_dir(harness, f"{APP}-log")
        claim.mkdir(parents=True)
        log_url = f"sqlite:///{claim}/log.db"
        log = open_log(log_url)  # input topics exist before the app, as on a real cluster
        log.create_topic("text-lines", PARTITIONS)
        log.create_topic("watched-words", PARTITIONS)
        log.close()
        harness.wait_watching()
        running = App(
            harness, control_plane, log_url, service=""
        )  # its address once the Service exists
        running.apply(tmp_path, topology={"ref": ref, "revision": revision})
        service = wait_for(
            lambda: harness.get("", "services", f"{APP}-query"), "the query Service", TIMEOUT
        )
        running.service = f"{service['spec']['clusterIP']}:7070"
        running.produce(1_000)
        try:
            wait_for(running.counts_exact, "word count running with exact counts", TIMEOUT)
            wait_for(lambda: _settled(harness, revision), f"revision {revision} settled", TIMEOUT)
        except (AssertionError, TimeoutError):
            print(harness.describe_failure(APP))
            raise
        return running

    return start


def _settled(harness: Operator, revision: str) -> bool:
    status = harness.app(APP).get("status", {})
    ready = harness.condition(APP, "Ready")
    return bool(
        status.get("upgrade") is None
        and (status.get("topology") or {}).get("revision") == revision
        and ready is not None
        and ready["status"] == "True"
    )


class OperatorFreezer:
    """Freezes the operator (SIGSTOP) the moment a watch shows it wrote a given upgrade step
    to status: it has recorded the step and done at most the first requests for it. The
    test then kills it (SIGKILL)."""

    def __init__(self, harness: Operator, step: str, revision: str) -> None:
        self.harness, self.step, self.revision = harness, step, revision
        self.frozen = threading.Event()
        self.informer = Informer(
            harness.admin,
            harness.path("eddyline.dev/v1alpha1", "streamapps"),
            on_change=self._changed,
        )

    def __enter__(self) -> OperatorFreezer:
        self.informer.start()
        wait_for(self.informer.synced.is_set, "the StreamApp watch", 30)
        return self

    def __exit__(self, *_: object) -> None:
        self.informer.stop()

    def _changed(self) -> None:
        if self.frozen.is_set():
            return
        for obj in self.informer.items():
            upgrade = (obj.get("status") or {}).get("upgrade") or {}
            if upgrade.get("step") == self.step and upgrade.get("to", {}).get("revision") == (
                self.revision
            ):
                process = self.harness.process
                if process is not None:
                    os.kill(process.pid, signal.SIGSTOP)
                    self.frozen.set()


def store_directories(harness: Operator) -> dict[str, set[tuple[int, int]]]:
    """Per pod, the (partition, inode) of every ``word-counts`` directory on its state claim,
    active and standby copies alike: a store relocated by rename keeps its inode."""
    found: dict[str, set[tuple[int, int]]] = {}
    for ordinal in range(3):
        claim = claim_dir(harness, f"state-{APP}-{ordinal}")
        found[f"{APP}-{ordinal}"] = {
            (int(path.parent.name.split("_")[1]), path.stat().st_ino)
            for path in claim.glob(f"*_*/{STORE}")
        }
    return found


def kill_and_restart_operator(harness: Operator) -> None:
    harness.kill()  # SIGKILL: a crash, not a clean shutdown
    harness.start()
    harness.wait_watching()


# Each run upgrades to the other topology (word-counts moves between sub-topology 1 and 2),
# and kills the operator right after it recorded one step.
UPGRADES = [
    ("Stopping", "2", "wordcount:topology_v2"),
    ("Publishing", "3", "wordcount:topology"),
    ("Starting", "4", "wordcount:topology_v2"),
]


@pytest.mark.parametrize(("step", "revision", "ref"), UPGRADES, ids=[u[0] for u in UPGRADES])
def test_an_upgrade_shifting_every_ordinal_resumes_after_the_operator_dies_at_a_step(
    start_app: StartApp, tmp_path: Path, step: str, revision: str, ref: str
) -> None:
    # Starts from the revision before, running the other topology.
    other = "wordcount:topology" if ref.endswith("_v2") else "wordcount:topology_v2"
    app = start_app(str(int(revision) - 1), other)
    harness = app.harness
    on_disk = store_directories(harness)
    assert all(len(copies) >= PARTITIONS // 3 for copies in on_disk.values()), on_disk
    seen: list[str] = []
    app.keep_producing()
    with OperatorFreezer(harness, step, revision) as freezer:
        app.apply(tmp_path, topology={"ref": ref, "revision": revision})
        deadline = time.monotonic() + TIMEOUT
        restarted = False
        while not _settled(harness, revision):
            assert time.monotonic() < deadline, harness.describe_failure(APP)
            if freezer.frozen.is_set() and not restarted:
                frozen_at = harness.app(APP)["status"]["upgrade"]["step"]
                assert frozen_at == step
                kill_and_restart_operator(harness)
                restarted = True
            upgrading = harness.condition(APP, "Upgrading")
            if (
                upgrading is not None
                and upgrading["status"] == "True"
                and (not seen or seen[-1] != upgrading["reason"])
            ):
                seen.append(upgrading["reason"])
            time.sleep(0.02)
    app.stop_producing()
    assert restarted, f"the operator never wrote step {step}"
    status = harness.app(APP)["status"]
    last = status["lastUpgrade"]
    assert last["outcome"] == "Succeeded" and last["to"]["revision"] == revision
    # Each step once, in order: the restarted operator resumed, it did not start over.
    assert [s["step"] for s in last["steps"]] == ["Stopping", "Publishing", "Starting"]
    assert seen == [s for s in ("Stopping", "Publishing", "Starting") if s in seen]
    wait_for(app.counts_exact, "exact counts after the upgrade", TIMEOUT)
    assert app.restored_records() == 0
    app.output_is_exactly_once()
    pods = harness.pods(APP)
    assert sorted(pods) == [f"{APP}-0", f"{APP}-1", f"{APP}-2"]
    # Every copy, standbys included, is the same directory moved to its new ordinal.
    owner = 2 if ref.endswith("_v2") else 1
    assert store_directories(harness) == on_disk
    for ordinal in range(3):
        claim = claim_dir(harness, f"state-{APP}-{ordinal}")
        assert {p.parent.name.split("_")[0] for p in claim.glob(f"*_*/{STORE}")} <= {str(owner)}
    assert {p["metadata"]["labels"]["eddyline.dev/revision"] for p in pods.values()} == {revision}


def test_a_revision_the_runtime_refuses_is_rolled_back_without_restores(
    start_app: StartApp, tmp_path: Path
) -> None:
    # Revision 4 runs topology_v2 ("word-counts" in sub-topology 2), as after the upgrades.
    app = start_app("4", "wordcount:topology_v2")
    harness = app.harness
    app.produce(500)
    wait_for(app.counts_exact, "exact counts before", TIMEOUT)
    # The counter EddylineUpgradeRolledBack fires on, from the operator's own /metrics.
    assert rollbacks_counted(harness) == 0  # exported at 0 before the first one
    # Revision 5 is the first topology again ("word-counts" goes back from 2 to 1), and
    # relocation is off: the pods refuse to start, naming the misplaced stores.
    config = {"processing.guarantee": "exactly_once_v2", "num.standby.replicas": 1}
    app.apply(
        tmp_path,
        topology={"ref": "wordcount:topology", "revision": "5"},
        config={**config, "automatic.state.relocation": False},
    )
    wait_for(
        lambda: (
            (harness.app(APP)["status"].get("lastUpgrade") or {}).get("outcome") == "RolledBack"
        ),
        "the rollback",
        TIMEOUT,
    )
    wait_for(lambda: _settled(harness, "4"), "revision 4 running again", TIMEOUT)
    degraded = harness.condition(APP, "Degraded")
    assert degraded is not None and degraded["status"] == "True"
    assert degraded["reason"] == "UpgradeRolledBack"
    assert "automatic.state.relocation" in degraded["message"]
    assert "wordcount-" in degraded["message"]  # the pod that refused
    assert rollbacks_counted(harness) == 1
    app.produce(500)
    wait_for(app.counts_exact, "exact counts after the rollback", TIMEOUT)
    assert app.restored_records() == 0
    app.output_is_exactly_once()


def rollbacks_counted(harness: Operator) -> float:
    """``eddyline_operator_upgrade_rollbacks_total`` for the app, as the operator exports it."""
    with urllib.request.urlopen(harness.metrics_url, timeout=10) as response:
        text = response.read().decode()
    series = (
        f'eddyline_operator_upgrade_rollbacks_total{{namespace="{harness.namespace}",app="{APP}"}} '
    )
    values = [
        float(line.removeprefix(series)) for line in text.splitlines() if line.startswith(series)
    ]
    assert len(values) == 1, f"no {series.strip()} in the operator's metrics:\n{text[-3000:]}"
    return values[0]


class MembershipRecorder:
    """Every membership the operator publishes while it runs, in order (a watch of the
    membership ConfigMap: the API server sends each write)."""

    def __init__(self, harness: Operator) -> None:
        self.found: list[Membership] = []
        self.informer = Informer(
            harness.admin,
            harness.path("", "configmaps"),
            field_selector=f"metadata.name={APP}-membership",
            on_change=self._changed,
        )

    def __enter__(self) -> MembershipRecorder:
        self.informer.start()
        wait_for(self.informer.synced.is_set, "the membership watch", 30)
        return self

    def __exit__(self, *_: object) -> None:
        self.informer.stop()

    def _changed(self) -> None:
        for obj in self.informer.items():
            membership = Membership.from_json(json.loads(obj["data"][MEMBERSHIP_FILE]))
            if not self.found or self.found[-1].generation != membership.generation:
                self.found.append(membership)


def test_scaling_3_to_5_to_2_is_no_upgrade_and_moves_tasks_only_as_the_assignor_says(
    start_app: StartApp,
) -> None:
    app = start_app("4", "wordcount:topology_v2")
    harness = app.harness
    upgrades_before = harness.app(APP)["status"].get("lastUpgrade")
    app.keep_producing()
    with MembershipRecorder(harness) as recorder:
        first = recorder.found[0]
        stateful = frozenset(t for t in first.assignment.tasks if t.subtopology == 2)
        for replicas in (5, 2):
            harness.kubectl("scale", "sapp", APP, f"--replicas={replicas}")

            def scaled(n: int = replicas) -> bool:
                return bool(
                    len(harness.pods(APP)) == n
                    and _settled(harness, "4")
                    and harness.app(APP)["status"].get("readyReplicas") == n
                )

            wait_for(
                scaled,
                f"{replicas} ready pods",
                TIMEOUT,
            )
        # Warm-ups (KIP-441) reach balance in steps: wait for the last one to be promoted.
        wait_for(
            lambda: not any(recorder.found[-1].assignment.warmup.values()),
            "no warm-up replica left",
            TIMEOUT,
        )
    app.stop_producing()
    status = harness.app(APP)["status"]
    assert status.get("upgrade") is None and status.get("lastUpgrade") == upgrades_before
    history = recorder.found
    assert len(history) >= 3
    for before, after in itertools.pairwise(history):
        members_before = {m.id for m in before.assignment.members}
        members_after = {m.id for m in after.assignment.members}
        gone, joined = members_before - members_after, members_after - members_before
        for task in stateful:
            owner = before.assignment.active_owner(task)
            new_owner = after.assignment.active_owner(task)
            if owner not in gone:
                # Warm before moving: a task whose owner stays never goes to a pod that has
                # just joined (its copy cannot be caught up yet); it warms up there first.
                assert new_owner not in joined, (task, before, after)
            holders = [h for h in before.assignment.standby_owners(task) if h not in gone]
            if owner in gone and holders:
                # A lost active copy is promoted where its standby state is.
                assert new_owner in holders
    # Once no warm-up is left, the assignment is the balanced, sticky one the assignor makes
    # of the generation before it (the target the warm-ups led to).
    before, final = history[-2].assignment, history[-1].assignment
    assert final == assign(
        final.tasks,
        list(final.members),
        1,
        previous=before,
        stateful=stateful,
    )
    assert sorted(m.id for m in final.members) == [f"{APP}-0", f"{APP}-1"]
    wait_for(app.counts_exact, "exact counts on 2 pods", TIMEOUT)
    app.output_is_exactly_once()
