"""The quick start's word count on a ``kafka://`` log, on real kubelets in three zones.

The ``realnode`` tier's second app: the README's chart and the examples' image, as in
``test_realnode_quickstart.py``, but with every topic on a real Kafka broker of the project's
(``tests/support/kafka``) that listens on and advertises the API server's bridge address, so
pods and the host both reach it. Unlike the embedded log, Kafka lets the three pods spread
over the three zones, each with its standbys in another zone. What only a real node shows:

- the operator and the app run in a namespace enforcing Pod Security ``restricted``, and the
  kernel holds each app container to it (seen from the host through its process);
- a container SIGKILLed through the runtime (its host PID, as the kernel or a crashed node
  would, not through the API): a standby answers queries while its kubelet restarts it, and
  the counts are exact after;
- the kubelet's probes and grace period on eddyline's pods: a frozen runtime goes unready at
  once (readiness) and is killed and restarted by its liveness probe; a deleted pod (SIGTERM
  from its kubelet) commits and exits 0 within its ``terminationGracePeriodSeconds``;
- a full-cluster topology upgrade (every ordinal shifts) that restores 0 records (state
  relocated on the pods' claims);
- RocksDB's memory bound under a real cgroup limit, and an OOM kill the operator reports;
- ``kubectl delete`` of the StreamApp leaves nothing, its claims included
  (``storage.whenDeleted: Delete``).

Counts are read from the host straight from the pods' query ports (pod addresses are on the
run's bridges, which the host reaches; Service addresses it does not, docs/nodes.md). One
cluster, broker, operator and app serve the whole module; the tests run in file order and
each leaves the app with three ready pods and exact counts for the next.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.support.cluster_word_count import (
    PARTITIONS,
    STORE,
    counts_exact,
    first_mismatch,
    produce_lines,
    random_lines,
    write_lines,
)
from tests.support.control_plane.client import ApiError, Client, Informer, wait_until
from tests.support.control_plane.operator import Kubectl, helm
from tests.support.control_plane.provisioner import LocalProvisioner
from tests.support.images import Images
from tests.support.kafka.broker import KafkaCluster
from tests.support.kafka.streamapp import create_input, manifest, published
from tests.support.realnode import host
from tests.support.realnode.cluster import API_ADDRESS, RealCluster
from tests.support.realnode.eddyline_images import EXAMPLES_IMAGE, OPERATOR_IMAGE, ensure_images
from tests.support.realnode.host import memory_cgroup

pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "eddyline-kafka"
# Not the quick start's release name: the chart's ClusterRoles are named after the release.
RELEASE = "edl-kafka"
DEPLOYMENT = f"{RELEASE}-eddyline-operator"
APP = "wc-kafka"
SECRET = "wc-kafka-log"
WORDS = [f"k{index:02d}" for index in range(40)]
ZONE_LABEL = "topology.kubernetes.io/zone"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
QUERY_PORT = 7070
RUNTIME_UID = 10001
# The pod template's (operator/src/eddyline_operator/reconcile/objects.py).
GRACE_SECONDS = 60
RESTORE_METRIC = "eddyline_stream_state_metrics_restore_total"
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300
COUNT_TIMEOUT = 180
POD_TIMEOUT = 300


@dataclass
class KafkaApp:
    cluster: RealCluster
    admin: Client
    kubectl: Kubectl
    broker: KafkaCluster
    provisioner: LocalProvisioner
    root: Path
    expected: collections.Counter[str] = field(default_factory=collections.Counter)
    _seed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def path(self, resource: str, group: str = "api/v1") -> str:
        return f"/{group}/namespaces/{NAMESPACE}/{resource}"

    def app(self, name: str = APP) -> dict[str, Any]:
        found = self.admin.get(self.path(f"streamapps/{name}", "apis/eddyline.dev/v1alpha1"))
        if found is None:
            raise LookupError(f"StreamApp {NAMESPACE}/{name} does not exist")
        return found

    def condition(self, kind: str, name: str = APP) -> dict[str, Any] | None:
        conditions = self.app(name).get("status", {}).get("conditions", [])
        return next((dict(c) for c in conditions if c["type"] == kind), None)

    def pods(self, app: str = APP) -> dict[str, dict[str, Any]]:
        listed = self.admin.get(self.path("pods")) or {"items": []}
        return {
            p["metadata"]["name"]: p
            for p in listed["items"]
            if p["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == app
        }

    def produce(self, lines: int) -> None:
        with self._lock:
            self._seed += 1
            seed = self._seed
        batch = random_lines(random.Random(seed), WORDS, lines, most=6)
        produce_lines(f"kafka://{self.bootstrap}", batch)
        with self._lock:
            self.expected.update(word for line in batch for word in line.split())

    @contextlib.contextmanager
    def producing(self) -> Iterator[None]:
        """Input that keeps arriving for the block: 20 lines every 0.2 s, through one log."""
        stop = threading.Event()

        def loop() -> None:
            log = KafkaLog.open(f"kafka://{self.bootstrap}")
            rng = random.Random(99)
            try:
                while not stop.wait(0.2):
                    batch = random_lines(rng, WORDS, 20, most=6)
                    write_lines(log, batch)
                    with self._lock:
                        self.expected.update(word for line in batch for word in line.split())
            finally:
                log.close()

        producer = threading.Thread(target=loop, daemon=True)
        producer.start()
        try:
            yield
        finally:
            stop.set()
            producer.join()

    def create_topic(self, name: str) -> None:
        log = KafkaLog.open(f"kafka://{self.bootstrap}")
        try:
            log.create_topic(name, PARTITIONS)
        finally:
            log.close()

    def router(self) -> QueryRouter:
        """A router that starts from every pod's query port (the host reaches pod addresses)."""
        hosts = [
            f"{p['status']['podIP']}:{QUERY_PORT}"
            for p in self.pods().values()
            if p.get("status", {}).get("podIP")
        ]
        return QueryRouter(hosts, timeout=2)

    def exact(self) -> bool:
        with self._lock:
            expected = self.expected.copy()
        return counts_exact(self.router(), expected)

    def wait_exact(self, what: str) -> None:
        try:
            wait_until(self.exact, what, COUNT_TIMEOUT)
        except TimeoutError:
            raise AssertionError(
                f"{what}: {first_mismatch(self.router(), self.expected)}\n{self.describe()}"
            ) from None

    def ready(self, replicas: int = 3) -> bool:
        found = self.app()
        status = found.get("status", {})
        condition = self.condition("Ready")
        return bool(
            status.get("readyReplicas") == replicas
            and condition is not None
            and condition["status"] == "True"
            and status.get("observedGeneration") == found["metadata"]["generation"]
        )

    def wait_ready(self, what: str) -> None:
        try:
            wait_until(self.ready, what, READY_TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"{what}:\n{self.describe()}") from None

    def output_exactly_once(self) -> None:
        """The output topic read committed: per word the counts only grow (no record
        counted twice, no commit doubled) and the last is the expected count."""

        def last_exact() -> bool:
            latest = {w: counts[-1] for w, counts in published(self.bootstrap).items()}
            return latest == dict(self.expected)

        wait_until(last_exact, "exact last counts on the output topic", COUNT_TIMEOUT)
        for word, counts in published(self.bootstrap).items():
            assert counts == sorted(set(counts)), f"{word}: {counts}"

    def restored_records(self) -> int:
        """Records the running pods restored from changelogs since they started."""
        total, found = 0.0, 0
        for pod in self.pods().values():
            url = f"http://{pod['status']['podIP']}:{QUERY_PORT}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                for line in response.read().decode().splitlines():
                    if line.startswith(RESTORE_METRIC):
                        total += float(line.rsplit(" ", 1)[1])
                        found += 1
        # Every active store partition reports its restore total (a missing metric is no 0).
        assert found >= 4, f"only {found} restore metrics on the pods"
        return int(total)

    def store_copies(self, ordinal: int) -> set[str]:
        """The sub-topologies whose directories hold a copy of word-counts on a pod's claim
        (``<sub-topology>_<partition>/word-counts``)."""
        claim = self.provisioner.directory(NAMESPACE, f"state-{APP}-{ordinal}")
        return {path.parent.name.split("_")[0] for path in claim.glob(f"*_*/{STORE}")}

    def host_pid(self, pod: dict[str, Any]) -> int:
        """The host PID of the pod's container's first process (``eddyline run``)."""
        return self.cluster.pod_pid(pod)

    def apply(self, document: dict[str, Any]) -> str:
        return self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(document))

    def describe(self) -> str:
        try:
            status = json.dumps(self.app().get("status"), indent=1)
        except (LookupError, ApiError) as error:
            status = str(error)
        described = self.kubectl.run("describe", "pods")
        return f"status: {status}\n{described.stdout[-6000:]}"


def app_manifest(bootstrap: str) -> dict[str, Any]:
    """The word count on the broker, spread over the zones, its claims deleted with it."""
    document = manifest(APP, bootstrap, SECRET)
    document["spec"]["storage"]["whenDeleted"] = "Delete"
    return document


def _deployment_ready(admin: Client) -> bool:
    deployment = admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}")
    if deployment is None:
        return False
    want = deployment["spec"]["replicas"]
    status = deployment.get("status", {})
    return bool(status.get("readyReplicas") == want == status.get("replicas"))


@pytest.fixture(scope="module")
def kafka(
    real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaCluster]:
    """A broker on the API server's bridge address (it exists once the cluster started)."""
    broker = KafkaCluster(tmp_path_factory.mktemp("realnode-kafka"), 1, host=API_ADDRESS)
    broker.start()
    try:
        create_input(broker.bootstrap)
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def wordcount(
    real_cluster: RealCluster,
    images: Images,
    kafka: KafkaCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KafkaApp]:
    root = tmp_path_factory.mktemp("realnode-kafka-app")
    ensure_images(real_cluster, images, root)
    admin = real_cluster.admin()
    provisioner = LocalProvisioner(admin, host.DATA / "volumes").start()
    admin.ensure("/api/v1/namespaces", {"metadata": {"name": NAMESPACE, "labels": RESTRICTED}})
    kubeconfig = real_cluster.plane.admin_kubeconfig
    kubectl = Kubectl(kubeconfig, root / "kubectl-home", NAMESPACE)
    app = KafkaApp(real_cluster, admin, kubectl, kafka, provisioner, root)
    seconds: dict[str, float] = {}
    try:
        started = time.monotonic()
        (result,) = helm(
            kubeconfig, root / "helm", NAMESPACE, RELEASE,
            {"action": "install", "values": {"watchNamespaces": [NAMESPACE]}},
        )  # fmt: skip
        assert "error" not in result, result
        wait_until(lambda: _deployment_ready(admin), "the operator Ready", READY_TIMEOUT)
        seconds["helm install to the operator Ready"] = time.monotonic() - started
        kubectl(
            "create", "secret", "generic", SECRET,
            # One broker: eddyline's topics get one replica (docs/kafka.md's client settings).
            "--from-literal=replication.factor=1",
        )  # fmt: skip
        started = time.monotonic()
        applied = app.apply(app_manifest(kafka.bootstrap))
        assert applied.strip() == f"streamapp.eddyline.dev/{APP} created", applied
        app.wait_ready("three ready pods and Ready=True")
        seconds["kubectl apply to the app Ready on Kafka"] = time.monotonic() - started
        print("seconds:", json.dumps({step: round(value, 1) for step, value in seconds.items()}))
        yield app
    finally:
        # The app goes while its operator runs (kopf's finalizer), then the operator.
        kubectl.run("delete", "sapp", "--all", "--wait=true", timeout=READY_TIMEOUT)
        helm(kubeconfig, root / "helm", NAMESPACE, RELEASE, {"action": "uninstall"})
        kubectl.run("delete", "pods", "--all", "--wait=true", timeout=READY_TIMEOUT)
        kubectl.run("delete", "pvc", "--all", "--wait=true", timeout=READY_TIMEOUT)
        provisioner.stop()


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines)


def stale_answer(host: str, word: str) -> dict[str, Any]:
    """What one copy's host answers for ``word`` (stale allowed), or an ``error``."""
    url = f"http://{host}/v1/stores/{STORE}/keys/{word}?allow_stale=true"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except OSError as error:  # HTTPError included: not ready, not open yet
        return {"error": str(error)}


def restart_count(pod: dict[str, Any]) -> int:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount", 0))


def is_ready(pod: dict[str, Any] | None) -> bool:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_the_operator_and_the_app_run_under_pod_security_restricted_in_three_zones(
    wordcount: KafkaApp,
) -> None:
    admin = wordcount.admin
    namespace = admin.get(f"/api/v1/namespaces/{NAMESPACE}")
    assert namespace is not None
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    listed = (admin.get(wordcount.path("pods")) or {"items": []})["items"]
    operators = [p for p in listed if p["metadata"]["name"].startswith(DEPLOYMENT)]
    assert operators, [p["metadata"]["name"] for p in listed]
    pods = wordcount.pods()
    assert sorted(pods) == [f"{APP}-{ordinal}" for ordinal in range(3)]
    zones = {wordcount.cluster.nodes[p["spec"]["nodeName"]].spec.zone for p in pods.values()}
    assert len(zones) == 3, {n: p["spec"]["nodeName"] for n, p in pods.items()}
    # Seen from the host through each container's first process: what the restricted profile
    # asks of the spec, the kernel holds the process to.
    rss = {}
    for pod in [*operators, *pods.values()]:
        name = pod["metadata"]["name"]
        [container] = pod["spec"]["containers"]
        assert container["image"] in {OPERATOR_IMAGE, EXAMPLES_IMAGE}
        assert pod["status"]["phase"] == "Running", name
        pid = wordcount.host_pid(pod)
        status = proc_status(pid)
        assert status["Uid"].split() == [str(RUNTIME_UID)] * 4, name
        assert status["CapEff"].strip() == "0000000000000000", name
        assert status["NoNewPrivs"].strip() == "1", name  # allowPrivilegeEscalation: false
        assert status["Seccomp"].strip() == "2", name  # RuntimeDefault: a filter installed
        root = next(
            line.split()
            for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
            if line.split()[4] == "/"
        )
        assert "ro" in root[5].split(","), f"{name}: root mounted {root[5]}"
        node = wordcount.cluster.nodes[pod["spec"]["nodeName"]]
        assert memory_cgroup(pid).startswith(f"{node.spec.cgroup_root}/kubepods/"), name
        rss[name] = status["VmHWM"].strip()
    print("peak RSS per container:", json.dumps(rss))
    # The control: the same namespace refuses a pod the profile does not allow.
    unconfined = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "unconfined"},
        "spec": {
            "containers": [
                {"name": "unconfined", "image": EXAMPLES_IMAGE, "imagePullPolicy": "Never"}
            ]
        },
    }
    with pytest.raises(ApiError) as refused:
        admin.create(wordcount.path("pods"), unconfined)
    assert refused.value.code == 403
    assert 'violates PodSecurity "restricted:latest"' in str(refused.value)


def test_a_container_sigkilled_through_the_runtime_leaves_its_standby_answering(
    wordcount: KafkaApp,
) -> None:
    """``kill -9`` of the container's process on its node (what the kernel's OOM killer or a
    crashing runtime does; the API server knows nothing of it): the next query for a key it
    held is answered by its standby in another zone, exactly; its kubelet restarts it in the
    same pod, and the counts are exact with input that arrived meanwhile."""
    app = wordcount
    app.produce(1_000)
    app.wait_exact("exact counts before the kill")
    word = app.expected.most_common(1)[0][0]
    before = app.router().get(STORE, word)
    assert before.host is not None and before.role == "active", before
    # A standby trails its active by the changelog records it has not read yet and says
    # so (its lag, KIP-535); exact counts from the active say nothing of it. The copy the
    # router will fall over to is exact once it read the active's last commit: the kill
    # waits for that, as a user who wants an exact answer from a standby would (once a
    # standby answered a moment after the first commit with lag=14 and nothing found).
    standbys = [str(h) for h in app.router().metadata(STORE, word)["standby_hosts"]]
    assert standbys, f"no standby copy of {word}"
    answers: list[dict[str, Any]] = []

    def standbys_exact() -> bool:
        answers[:] = [stale_answer(host, word) for host in standbys]
        return all(a.get("found") and int(a["value"]) == app.expected[word] for a in answers)

    exact_at = time.monotonic()
    first = [stale_answer(host, word) for host in standbys]
    wait_until(standbys_exact, f"the standby copies of {word} at its count", COUNT_TIMEOUT)
    print(
        f"standby copies of {word} exact {time.monotonic() - exact_at:.2f} s after the "
        f"active (count {app.expected[word]}); first seen (lag, value) "
        f"{[(a.get('lag'), a.get('value')) for a in first]}, now {[a.get('lag') for a in answers]}"
    )
    victim_name, victim = next(
        (name, pod)
        for name, pod in app.pods().items()
        if f"{pod['status']['podIP']}:{QUERY_PORT}" == before.host
    )
    restarts = restart_count(victim)
    router = app.router()
    os.kill(app.host_pid(victim), signal.SIGKILL)
    killed_at = time.monotonic()
    # At once: the victim's port refuses (its network namespace stays with the pod), the
    # router falls over to the copy another member holds. Nothing new was produced, so the
    # standby's (stale-allowed) answer is the exact count.
    deadline = killed_at + 30
    while True:
        try:
            during = router.get(STORE, word)
            break
        except QueryFailedError as error:
            assert time.monotonic() < deadline, f"no copy answered for {word}: {error}"
            time.sleep(0.2)
    print(f"answered {time.monotonic() - killed_at:.2f} s after the kill by {during}")
    assert during.host != before.host, f"the killed {victim_name} answered: {during}"
    assert during.role == "standby", during
    assert during.found and int(during.value) == app.expected[word]
    victim_zone = app.cluster.nodes[victim["spec"]["nodeName"]].spec.zone
    standby = next(
        p for p in app.pods().values() if f"{p['status']['podIP']}:{QUERY_PORT}" == during.host
    )
    assert app.cluster.nodes[standby["spec"]["nodeName"]].spec.zone != victim_zone
    app.produce(1_000)  # arrives while the victim restarts

    def restarted() -> dict[str, Any] | None:
        pod = app.pods().get(victim_name)
        return pod if pod and restart_count(pod) > restarts and is_ready(pod) else None

    pod = wait_until(restarted, f"{victim_name} restarted by its kubelet and Ready", POD_TIMEOUT)
    # The same pod (the API never deleted it), its container ended by SIGKILL.
    assert pod["metadata"]["uid"] == victim["metadata"]["uid"]
    ended = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert ended["exitCode"] == 137, ended
    app.wait_exact("exact counts after the kill")
    print(f"exact again {time.monotonic() - killed_at:.2f} s after the kill")
    app.wait_ready("three ready pods after the kill")
    app.produce(500)
    app.wait_exact("exact counts with the pod back")
    app.output_exactly_once()


def test_the_kubelets_probes_take_a_frozen_pod_out_of_service_and_restart_it(
    wordcount: KafkaApp,
) -> None:
    """SIGSTOP of a pod's process through its node: the kubelet's readiness probe (every
    second) takes it out of the query Service's endpoints, then its liveness probe (three
    failures ten seconds apart) has the kubelet kill it (a stopped process ignores SIGTERM,
    so SIGKILL after the probe's 5 s grace) and start it again."""
    app = wordcount
    victim_name = f"{APP}-1"
    victim = app.pods()[victim_name]
    address = victim["status"]["podIP"]
    restarts = restart_count(victim)
    pid = app.host_pid(victim)
    endpoints = app.path(f"endpoints/{APP}-query")

    def serving() -> set[str]:
        subsets = (app.admin.get(endpoints) or {}).get("subsets") or []
        return {a["ip"] for s in subsets for a in s.get("addresses") or []}

    assert address in serving()
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: not is_ready(app.pods().get(victim_name)) and address not in serving(),
            f"{victim_name} unready and out of the query Service",
            POD_TIMEOUT,
        )
        pod = wait_until(
            lambda: (p := app.pods().get(victim_name)) and restart_count(p) > restarts and p,
            f"{victim_name} restarted by its liveness probe",
            POD_TIMEOUT,
        )
    finally:
        # Gone already when its kubelet killed it, as it should have.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    ended = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert ended["exitCode"] == 137, ended
    events = (app.admin.get(app.path("events")) or {"items": []})["items"]
    said = [
        (e["reason"], e["message"])
        for e in events
        if e["involvedObject"].get("name") == victim_name and e["involvedObject"]["kind"] == "Pod"
    ]
    assert any(r == "Unhealthy" and m.startswith("Liveness probe failed") for r, m in said), said
    assert any(r == "Killing" and "failed liveness probe" in m for r, m in said), said
    app.wait_ready("three ready pods after the liveness restart")
    wait_until(lambda: address in serving(), f"{victim_name} back in the Service", POD_TIMEOUT)
    app.produce(300)
    app.wait_exact("exact counts after the liveness restart")


def test_a_deleted_pod_commits_and_exits_within_its_grace_period(wordcount: KafkaApp) -> None:
    """``kubectl delete pod``: its kubelet sends SIGTERM and would SIGKILL at the end of
    ``terminationGracePeriodSeconds`` (exit code 137). The runtime hands its tasks over,
    commits and exits 0 before that; the StatefulSet makes the pod again and the counts
    stay exact, each committed once."""
    app = wordcount
    victim_name = f"{APP}-2"
    victim = app.pods()[victim_name]
    assert victim["spec"]["terminationGracePeriodSeconds"] == GRACE_SECONDS
    app.produce(500)
    app.wait_exact("exact counts before the delete")
    ends: list[dict[str, Any]] = []

    def seen() -> None:
        for item in informer.items():
            for status in item.get("status", {}).get("containerStatuses") or []:
                terminated = (status.get("state") or {}).get("terminated")
                if item["metadata"]["uid"] == victim["metadata"]["uid"] and terminated:
                    ends.append(terminated)

    informer = Informer(
        app.admin, app.path("pods"), field_selector=f"metadata.name={victim_name}", on_change=seen
    ).start()
    try:
        wait_until(informer.synced.is_set, "the pod watch", 30)
        started = time.monotonic()
        app.kubectl("delete", "pod", victim_name, "--wait=true", timeout=2 * GRACE_SECONDS)
        seconds = time.monotonic() - started
    finally:
        informer.stop()
    print(f"{victim_name} deleted in {seconds:.1f} s (grace {GRACE_SECONDS} s): {ends[-1:]}")
    assert ends, "the kubelet never reported how the container ended"
    assert ends[-1]["exitCode"] == 0, ends[-1]
    app.wait_ready("three ready pods after the delete")
    app.produce(500)
    app.wait_exact("exact counts after the delete")
    app.output_exactly_once()


def test_a_full_cluster_topology_upgrade_relocates_state_and_restores_nothing(
    wordcount: KafkaApp,
) -> None:
    """As ``test_operator_upgrade.py`` on the stand-in: ``topology_v2`` adds a first
    sub-topology, so every ordinal shifts; the operator stops every pod, publishes, starts
    them on the new revision; each pod moves its stores on its claim (KIP-816) and none
    restores a record from its changelog, with input arriving throughout."""
    app = wordcount
    # topology_v2 also reads watched-words: its input topic exists before it runs, as the
    # user makes it (a first try without it was rolled back, naming the missing topic).
    app.create_topic("watched-words")
    app.produce(1_000)
    app.wait_exact("exact counts before the upgrade")
    # Every copy of word-counts (active and standby) sits in sub-topology 1's directories.
    assert {ordinal: app.store_copies(ordinal) for ordinal in range(3)} == {
        ordinal: {"1"} for ordinal in range(3)
    }
    document = app_manifest(app.bootstrap)
    document["spec"]["topology"] = {"ref": "wordcount:topology_v2", "revision": "2"}
    reasons: list[str] = []
    with app.producing():
        app.apply(document)

        def settled() -> bool:
            upgrading = app.condition("Upgrading")
            if (
                upgrading is not None
                and upgrading["status"] == "True"
                and (not reasons or reasons[-1] != upgrading["reason"])
            ):
                reasons.append(upgrading["reason"])
            status = app.app().get("status", {})
            last = status.get("lastUpgrade") or {}
            if last.get("outcome") == "RolledBack" and last["from"]["revision"] == "2":
                raise AssertionError(f"the upgrade was rolled back: {last}")
            return bool(
                status.get("upgrade") is None
                and (status.get("topology") or {}).get("revision") == "2"
                and app.ready()
            )

        try:
            wait_until(settled, "revision 2 running on three ready pods", READY_TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"upgrade not done:\n{app.describe()}") from None
    last = app.app()["status"]["lastUpgrade"]
    assert last["outcome"] == "Succeeded" and last["to"]["revision"] == "2", last
    assert [s["step"] for s in last["steps"]] == ["Stopping", "Publishing", "Starting"]
    print(f"Upgrading reasons seen: {reasons}")
    app.wait_exact("exact counts after the upgrade")
    restored = app.restored_records()
    print(f"records restored from changelogs by the upgrade: {restored}")
    assert restored == 0
    app.output_exactly_once()
    pods = app.pods()
    assert {p["metadata"]["labels"]["eddyline.dev/revision"] for p in pods.values()} == {"2"}
    # Moved on each claim, not rebuilt: every copy now sits in sub-topology 2's directories.
    assert {ordinal: app.store_copies(ordinal) for ordinal in range(3)} == {
        ordinal: {"2"} for ordinal in range(3)
    }


OOM_APP = "wc-oom"
# Far below what `eddyline run` needs to import its modules (the peak RSS per container the
# first test prints), so the kernel kills the runtime as it starts, every time.
OOM_LIMIT = "32Mi"


def test_an_oom_killed_pod_shows_oomkilled_in_the_streamapps_status_and_events(
    wordcount: KafkaApp,
) -> None:
    app = wordcount
    document = manifest(OOM_APP, app.bootstrap, SECRET)
    document["spec"]["replicas"] = 1
    document["spec"]["resources"] = {"limits": {"memory": OOM_LIMIT}}
    document["spec"]["storage"]["whenDeleted"] = "Delete"
    app.apply(document)
    try:

        def reported() -> tuple[str, str] | None:
            status = app.app(OOM_APP).get("status", {})
            degraded: dict[str, Any] = next(
                (c for c in status.get("conditions", []) if c["type"] == "Degraded"), {}
            )
            if "OOMKilled" in (status.get("message") or "") and "OOMKilled" in degraded.get(
                "message", ""
            ):
                return status["message"], degraded["message"]
            return None

        try:
            message, degraded = wait_until(reported, "OOMKilled in status", READY_TIMEOUT)
        except TimeoutError:
            raise AssertionError(
                f"{app.app(OOM_APP).get('status')}\n{app.kubectl.run('describe', 'pods').stdout}"
            ) from None
        print(f"status.message: {message}\nDegraded: {degraded}")
        assert f"pod {OOM_APP}-0: OOMKilled" in message
        assert f"limits.memory {OOM_LIMIT}" in message
        assert f"{OOM_APP}-0: exit code 137 (OOMKilled)" in degraded
        events = (app.admin.get(app.path("events")) or {"items": []})["items"]
        about = [
            (e["type"], e["reason"], e["message"])
            for e in events
            if e["involvedObject"].get("kind") == "StreamApp"
            and e["involvedObject"].get("name") == OOM_APP
        ]
        assert any(t == "Warning" and r == "OOMKilled" for t, r, _ in about), about
        [pod] = app.pods(OOM_APP).values()
        ended = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
        assert (ended["reason"], ended["exitCode"]) == ("OOMKilled", 137), ended
    finally:
        app.kubectl("delete", "sapp", OOM_APP, "--wait=true", timeout=READY_TIMEOUT)
    wait_until(lambda: not app.pods(OOM_APP), f"{OOM_APP}'s pod gone", READY_TIMEOUT)


WRITER = REPO / "tests" / "integration" / "state" / "memory_writer.py"
# The writer puts 256 MiB of incompressible values through 64 RocksDB stores; without a
# bound RocksDB keeps all of it in memtables (365 MB peak RSS measured on the host).
WRITER_LIMIT = 256 * 1024 * 1024


def writer_pod(name: str, *, bounded: bool) -> dict[str, Any]:
    """The examples image runs the writer under ``limits.memory``; ``bounded`` gives it the
    limit through the downward API as the operator's pods get it (EDDYLINE_MEMORY_LIMIT_BYTES)."""
    env = [
        {
            "name": "EDDYLINE_MEMORY_LIMIT_BYTES",
            "valueFrom": {
                "resourceFieldRef": {"containerName": "writer", "resource": "limits.memory"}
            },
        }
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUNTIME_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumes": [
                {"name": "writer", "configMap": {"name": "memory-writer"}},
                {"name": "tmp", "emptyDir": {}},
            ],
            "containers": [
                {
                    "name": "writer",
                    "image": EXAMPLES_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "/opt/writer/memory_writer.py", "/tmp/stores"],
                    "env": env if bounded else [],
                    "resources": {
                        "requests": {"memory": str(WRITER_LIMIT)},
                        "limits": {"memory": str(WRITER_LIMIT)},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [
                        {"name": "writer", "mountPath": "/opt/writer", "readOnly": True},
                        {"name": "tmp", "mountPath": "/tmp"},
                    ],
                }
            ],
        },
    }


def test_rocksdbs_memory_bound_keeps_a_pod_under_its_cgroup_limit_that_it_would_outgrow(
    wordcount: KafkaApp,
) -> None:
    """Two pods write the same 256 MiB through 64 RocksDB stores under a 256 MiB
    ``limits.memory``: the one told its limit (the downward API, as the operator's pods are)
    bounds RocksDB and finishes under it; the other is OOM-killed by the kernel."""
    app = wordcount
    app.admin.create(
        app.path("configmaps"),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "memory-writer"},
            "data": {"memory_writer.py": WRITER.read_text(encoding="utf-8")},
        },
    )
    for name, bounded in (("bounded", True), ("unbounded", False)):
        app.admin.create(app.path("pods"), writer_pod(name, bounded=bounded))

    def finished(name: str) -> dict[str, Any] | None:
        pod = app.admin.get(app.path(f"pods/{name}")) or {}
        return pod if pod.get("status", {}).get("phase") in {"Succeeded", "Failed"} else None

    try:
        bounded = wait_until(lambda: finished("bounded"), "the bounded writer", POD_TIMEOUT)
        unbounded = wait_until(lambda: finished("unbounded"), "the unbounded writer", POD_TIMEOUT)
        log = app.kubectl("logs", "bounded")
        assert bounded["status"]["phase"] == "Succeeded", f"{bounded['status']}\n{log}"
        measured = json.loads(log.strip().splitlines()[-1])
        print(f"bounded writer under {WRITER_LIMIT} bytes: {measured}")
        assert measured["budget"] == WRITER_LIMIT // 2
        assert measured["written"] >= WRITER_LIMIT
        assert 0 < measured["most_reported"] <= measured["budget"]
        assert measured["peak_rss"] < WRITER_LIMIT
        ended = unbounded["status"]["containerStatuses"][0]["state"]["terminated"]
        print(f"unbounded writer: {ended}")
        assert (ended["reason"], ended["exitCode"]) == ("OOMKilled", 137), ended
    finally:
        for name in ("bounded", "unbounded"):
            app.kubectl.run("delete", "pod", name, "--wait=true")
        app.kubectl.run("delete", "configmap", "memory-writer")


# What the operator makes for an app (objects.py), each carrying the app's instance label.
CHILDREN = (
    "api/v1/pods",
    "api/v1/services",
    "api/v1/configmaps",
    "api/v1/serviceaccounts",
    "api/v1/persistentvolumeclaims",
    "apis/apps/v1/statefulsets",
    "apis/policy/v1/poddisruptionbudgets",
    "apis/rbac.authorization.k8s.io/v1/roles",
    "apis/rbac.authorization.k8s.io/v1/rolebindings",
)


def leftovers(app: KafkaApp) -> list[str]:
    """The app's children the API still holds, its claims' volumes and their directories."""
    found = []
    for collection in CHILDREN:
        group, _, resource = collection.rpartition("/")
        listed = app.admin.get(
            f"/{group}/namespaces/{NAMESPACE}/{resource}?labelSelector="
            f"app.kubernetes.io/instance%3D{APP}"
        ) or {"items": []}
        found += [f"{resource}/{item['metadata']['name']}" for item in listed["items"]]
    claims = (app.admin.get(app.path("persistentvolumeclaims")) or {"items": []})["items"]
    found += [
        f"persistentvolumeclaims/{c['metadata']['name']}"
        for c in claims
        if c["metadata"]["name"].endswith(tuple(f"{APP}-{i}" for i in range(3)))
    ]
    volumes = (app.admin.get("/api/v1/persistentvolumes") or {"items": []})["items"]
    found += [
        f"persistentvolumes/{v['metadata']['name']}"
        for v in volumes
        if v["spec"].get("claimRef", {}).get("namespace") == NAMESPACE
        and v["spec"]["claimRef"]["name"].endswith(tuple(f"{APP}-{i}" for i in range(3)))
    ]
    found += [str(p) for p in (host.DATA / "volumes" / NAMESPACE).glob(f"*{APP}*")]
    return sorted(set(found))


def test_kubectl_delete_of_the_streamapp_leaves_nothing_behind(wordcount: KafkaApp) -> None:
    """``storage.whenDeleted: Delete``: the claims go with the app, then their volumes and
    directories; the kubelets stop every container. The log's Secret is the user's: it
    stays, as do the topics on the broker (the log is not the app's to delete)."""
    app = wordcount
    pods = app.pods()
    assert len(pods) == 3
    before = leftovers(app)
    assert any(item.startswith("persistentvolumes/") for item in before), before
    app.kubectl("delete", "sapp", APP, "--wait=true", timeout=READY_TIMEOUT)
    try:
        wait_until(lambda: not leftovers(app), "nothing of the app left", READY_TIMEOUT)
    except TimeoutError:
        raise AssertionError(f"left behind: {leftovers(app)}") from None
    running = [
        name
        for name, pod in pods.items()
        for node in [app.cluster.nodes[pod["spec"]["nodeName"]]]
        if any(node.task_pid(c) for c in node.pod_containers(NAMESPACE, name))
    ]
    assert not running, f"containers still running: {running}"
    assert app.admin.get(app.path(f"secrets/{SECRET}")) is not None
