"""The operator end to end on a real control plane: kube-apiserver, controllers, scheduler.

The chart goes in through Helm's library, the word count through the real ``kubectl``; the
real StatefulSet controller makes the pods, the real scheduler places them, and the kubelet
stand-in (``tests/support/control_plane``) runs them as real ``eddyline`` processes that
watch their membership over HTTPS with projected service-account tokens. The namespace
enforces Pod Security ``restricted``. Counts are checked exactly through the query Service.
"""

from __future__ import annotations

import collections
import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from eddyline_runtime.log import Record, open_log
from eddyline_runtime.membership import Membership
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.client import QueryFailedError, QueryRouter
from tests.support.control_plane.client import ApiError, Client, wait_until
from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Kubectl, Operator
from tests.support.control_plane.operator_fixture import operator_fixture

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
APP = "wordcount"
NAMESPACE = "wordcount-real"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
STORE = "word-counts"
WORDS = [f"w{index:02d}" for index in range(40)]
# Bounds for a broken run on a loaded 2-core machine, not expectations.
READY_TIMEOUT = 300
COUNT_TIMEOUT = 120


@dataclass
class WordCount:
    operator: Operator
    log_url: str
    query_service: str
    expected: collections.Counter[str]
    last_mismatch: str = ""

    @property
    def kubectl(self) -> Kubectl:
        return self.operator.kubectl

    def produce(self, lines: int, seed: int) -> None:
        rng = random.Random(seed)
        batch = []
        for _ in range(lines):
            words = rng.choices(WORDS, k=rng.randint(1, 6))
            self.expected.update(words)
            batch.append(" ".join(words))
        log = open_log(self.log_url)
        try:
            now = int(time.time() * 1000)
            for partition in range(4):
                records = [Record(None, line.encode(), now) for line in batch[partition::4]]
                log.produce(TopicPartition("text-lines", partition), records)
        finally:
            log.close()

    def router(self) -> QueryRouter:
        return QueryRouter([self.query_service], timeout=2)

    def counts_exact(self) -> bool:
        router = self.router()
        for word, count in self.expected.items():
            try:
                result = router.get(STORE, word)
            except QueryFailedError as error:
                self.last_mismatch = f"{word}: {error}"
                return False
            if not result.found or int(result.value) != count:
                self.last_mismatch = f"{word}: {result} (expected {count})"
                return False
        return True

    def wait_exact(self, what: str) -> None:
        try:
            wait_until(self.counts_exact, what, COUNT_TIMEOUT)
        except TimeoutError as error:
            print(self.operator.describe_failure(APP))
            raise AssertionError(f"{error}; last answer {self.last_mismatch}") from None


def manifest(**changes: Any) -> dict[str, Any]:
    """The example's manifest with ``spec`` paths (``__``-separated) set."""
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    for path, value in changes.items():
        target = document
        parts = path.split("__")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    return document


operator = operator_fixture(NAMESPACE, directory="operator-real", watching=False)


@pytest.fixture(scope="module")
def wordcount(operator: Operator, control_plane: Cluster) -> WordCount:
    assert control_plane.provisioner is not None
    # The claim's directory is known in advance (the provisioner's layout): the input topic
    # exists before the app, as on a real cluster.
    claim = control_plane.provisioner.directory(NAMESPACE, f"{APP}-log")
    claim.mkdir(parents=True)
    log_url = f"sqlite:///{claim}/log.db"
    log = open_log(log_url)
    log.create_topic("text-lines", 4)
    log.close()
    operator.wait_watching()
    applied = operator.kubectl("apply", "-f", str(MANIFEST))
    assert applied.strip() == f"streamapp.eddyline.dev/{APP} created"
    try:
        wait_until(lambda: _ready(operator), "3 ready pods and Ready=True", READY_TIMEOUT)
    except TimeoutError:
        print(operator.describe_failure(APP))
        raise
    service = operator.get("", "services", f"{APP}-query")
    assert service is not None
    address = f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
    return WordCount(operator, log_url, address, collections.Counter())


def _ready(operator: Operator, replicas: int = 3) -> bool:
    app = operator.app(APP)
    status = app.get("status", {})
    ready = operator.condition(APP, "Ready")
    return bool(
        status.get("readyReplicas") == replicas
        and ready is not None
        and ready["status"] == "True"
        and status.get("observedGeneration") == app["metadata"]["generation"]
    )


def _active_tasks(operator: Operator, pod: str) -> int:
    found = operator.get("", "configmaps", f"{APP}-membership")
    if found is None:
        return 0
    membership = Membership.from_json(json.loads(found["data"]["membership.json"]))
    return len(membership.assignment.active.get(pod, ()))


def test_the_real_controllers_run_the_app_and_kubectl_shows_it_ready(
    wordcount: WordCount, control_plane: Cluster
) -> None:
    operator = wordcount.operator
    pods = operator.pods(APP)
    assert sorted(pods) == [f"{APP}-0", f"{APP}-1", f"{APP}-2"]
    # The embedded log pins every pod to the node of its claim's local volume.
    assert len({p["spec"]["nodeName"] for p in pods.values()}) == 1
    for pod in pods.values():
        # Made by the real StatefulSet controller, placed by the real scheduler.
        owner = pod["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("StatefulSet", APP)
        assert any(
            c["type"] == "PodScheduled" and c["status"] == "True"
            for c in pod["status"]["conditions"]
        )
    claims = {c["metadata"]["name"]: c for c in operator.objects("", "persistentvolumeclaims")}
    assert claims[f"{APP}-log"]["status"]["phase"] == "Bound"
    # The server stamps its version as Kubernetes' release build does.
    assert "Server Version: v1.33.13" in wordcount.kubectl("version")
    table = wordcount.kubectl("get", "sapp").splitlines()
    assert table[0].split() == ["NAME", "REPLICAS", "READY", "PHASE", "REVISION", "AGE"]
    assert table[1].split()[:5] == [APP, "3", "3", "Running", "1"]
    described = wordcount.kubectl("describe", "sapp", APP)
    assert re.search(r"Reason:\s+AllReplicasReady\s+Status:\s+True\s+Type:\s+Ready", described)
    assert re.search(r"Events:\s+Type\s+Reason\s+Age\s+From\s+Message", described)
    # Every child is owned by the app (the log claim is kept by default) and valid for the
    # schemas of the Kubernetes version kubernetes-validate knows, beyond what the server took.
    uid = operator.app(APP)["metadata"]["uid"]
    for (group, plural), names in CHILDREN.items():
        for name in names:
            child = operator.get(group, plural, name)
            assert child is not None, f"{plural}/{name} was not created"
            kubernetes_validate.validate(child, "1.32", strict=True)
            owners = [o["uid"] for o in child["metadata"].get("ownerReferences", [])]
            if plural != "persistentvolumeclaims":
                assert owners == [uid], f"{plural}/{name} is not owned by the StreamApp"
    # Nothing the operator asked for was refused (RBAC the chart forgot, a child refused).
    assert "Forbidden" not in operator.output()
    # Without each line's timestamp: its milliseconds are "403" one run in a thousand.
    logged = re.sub(r"(?m)^\[[^\]]*\]", "", operator.output())
    assert "403" not in logged


CHILDREN = {
    ("", "configmaps"): [f"{APP}-config", f"{APP}-membership"],
    ("", "services"): [f"{APP}-headless", f"{APP}-query"],
    ("", "serviceaccounts"): [f"{APP}-runtime"],
    ("rbac.authorization.k8s.io/v1", "roles"): [f"{APP}-membership"],
    ("rbac.authorization.k8s.io/v1", "rolebindings"): [f"{APP}-membership"],
    ("policy/v1", "poddisruptionbudgets"): [APP],
    ("", "persistentvolumeclaims"): [f"{APP}-log"],
    ("apps/v1", "statefulsets"): [APP],
}


def test_counts_are_exact_through_the_query_service(wordcount: WordCount) -> None:
    wordcount.produce(2_000, seed=1)
    wordcount.wait_exact("exact counts through the query Service")


def test_a_sigkilled_pod_fails_over_and_counts_stay_exact(
    wordcount: WordCount, control_plane: Cluster
) -> None:
    operator = wordcount.operator
    assert control_plane.kubelets is not None
    if not wordcount.expected:
        wordcount.produce(1_000, seed=2)
    wordcount.wait_exact("exact counts before the kill")
    word = wordcount.expected.most_common(1)[0][0]
    before = wordcount.router().get(STORE, word)
    assert before.host is not None
    victim = next(
        name
        for name, pod in operator.pods(APP).items()
        if pod["status"].get("podIP") == before.host.split(":")[0]
    )
    killed_at = time.monotonic()
    control_plane.kubelets.kill_container(NAMESPACE, victim)

    def promoted_elsewhere() -> bool:
        try:
            result = wordcount.router().get(STORE, word)
        except QueryFailedError:
            return False
        return result.host != before.host and result.role == "active"

    wait_until(promoted_elsewhere, f"{word!r} active on another pod than {victim}", 60)
    print(f"promoted {time.monotonic() - killed_at:.2f} s after the kill")
    wordcount.produce(1_000, seed=3)
    try:
        wordcount.wait_exact("exact counts after the failover")
    except TimeoutError:
        print(operator.describe_failure(APP))
        raise

    def restarted() -> bool:
        statuses = operator.pods(APP)[victim]["status"].get("containerStatuses", [])
        return bool(statuses and statuses[0]["restartCount"] > 0) and _ready(operator)

    wait_until(restarted, f"{victim} restarted by its kubelet and ready", READY_TIMEOUT)
    wordcount.wait_exact("exact counts with the pod back")


def test_a_deleted_pod_terminates_gracefully_is_replaced_and_counts_stay_exact(
    wordcount: WordCount, control_plane: Cluster
) -> None:
    """kubectl waits while the kubelet sends SIGTERM and the runtime commits and exits (well
    within the grace period); the real StatefulSet controller makes the pod again."""
    operator = wordcount.operator
    assert control_plane.kubelets is not None
    wait_until(lambda: _ready(operator), "the app ready", READY_TIMEOUT)
    old_uid = operator.pods(APP)[f"{APP}-2"]["metadata"]["uid"]
    started = time.monotonic()
    assert f'pod "{APP}-2" deleted' in wordcount.kubectl("delete", "pod", f"{APP}-2")
    # Far below the 60 s grace period: the process exited on SIGTERM, it was not killed.
    assert time.monotonic() - started < 45
    wordcount.produce(500, seed=4)

    def replaced() -> bool:
        pod = operator.pods(APP).get(f"{APP}-2")
        return pod is not None and pod["metadata"]["uid"] != old_uid and _ready(operator)

    wait_until(replaced, f"a new {APP}-2, ready", READY_TIMEOUT)
    wordcount.wait_exact("exact counts after the replacement")
    log = control_plane.kubelets.pod_log(NAMESPACE, f"{APP}-2")
    assert "Traceback" not in log, log[-3000:]


def test_scaling_through_the_scale_subresource_and_back_keeps_counts_exact(
    wordcount: WordCount,
) -> None:
    operator = wordcount.operator
    wait_until(lambda: _ready(operator), "the app ready", READY_TIMEOUT)
    assert "scaled" in wordcount.kubectl("scale", "sapp", APP, "--replicas=4")
    wait_until(
        lambda: len(operator.pods(APP)) == 4 and _ready(operator, 4), "4 ready pods", READY_TIMEOUT
    )
    # The new pod warms up first (KIP-441) and then runs tasks: the warm-ups report being
    # caught up and the operator moves them, with no timer in between.
    wait_until(lambda: _active_tasks(operator, f"{APP}-3") > 0, "tasks moved to the new pod", 60)
    wordcount.produce(500, seed=5)
    wordcount.wait_exact("exact counts on 4 pods")
    assert "scaled" in wordcount.kubectl("scale", "sapp", APP, "--replicas=3")
    wait_until(
        lambda: len(operator.pods(APP)) == 3 and _ready(operator), "back to 3 pods", READY_TIMEOUT
    )
    wordcount.produce(500, seed=6)
    wordcount.wait_exact("exact counts back on 3 pods")


def test_pods_reach_the_api_over_https_as_their_service_account_with_only_the_membership(
    wordcount: WordCount, control_plane: Cluster
) -> None:
    """Each pod's projected token (TokenRequest, bound to the pod) and the cluster CA: the
    real RBAC lets it read its membership and nothing else the operator did not grant."""
    assert control_plane.kubelets is not None
    account = control_plane.kubelets.service_account_dir(NAMESPACE, f"{APP}-0")
    token = (account / "token").read_text(encoding="utf-8")
    pod = Client(control_plane.plane.url, account / "ca.crt", token=token)
    base = f"/api/v1/namespaces/{NAMESPACE}"
    assert pod.request(f"{base}/configmaps/{APP}-membership")["data"]["membership.json"]
    for forbidden in (f"{base}/configmaps/{APP}-config", f"{base}/pods", f"{base}/secrets"):
        with pytest.raises(ApiError) as refused:
            pod.request(forbidden)
        assert refused.value.code == 403, forbidden
    review = pod.create(
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    user = review["status"]["userInfo"]
    # The runtime's own ServiceAccount, named so no two apps' children can collide.
    assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{APP}-runtime"
    # Bound to the pod, as a kubelet's projected token is.
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == [f"{APP}-0"]


# Each manifest is refused by the real API server (schema or CEL) or, where the schema
# cannot tell, by the operator (Degraded, InvalidSpec); either way the message names the field.
INVALID = {
    "isolation level": (
        {"spec__config": {"default.state.isolation.level": "SERIALIZABLE"}},
        "spec.config.default.state.isolation.level",
    ),
    "uncommitted bytes below -1": (
        {"spec__config": {"statestore.uncommitted.max.bytes": -2}},
        "spec.config.statestore.uncommitted.max.bytes",
    ),
    "idle time below -1": (
        {"spec__config": {"max.task.idle.ms": -5}},
        "spec.config.max.task.idle.ms",
    ),
    "guarantee": (
        {"spec__config": {"processing.guarantee": "exactly_once"}},
        "spec.config.processing.guarantee",
    ),
    "unknown field": ({"spec__replica": 3}, 'unknown field "spec.replica"'),
    # spec.config keeps unknown keys (x-kubernetes-preserve-unknown-fields), so a typo is
    # not pruned for clients without strict validation: the operator refuses it by name.
    "unknown setting": (
        {"spec__config": {"num.stream.thread": 2}},
        'spec.config."num.stream.thread"',
    ),
    "revision": ({"spec__topology": {"ref": "wordcount:topology", "revision": "v 2!"}},
                 "spec.topology.revision"),
    "topology ref": ({"spec__topology": {"ref": "wordcount"}}, "spec.topology.ref"),
    "zone key": ({"spec__standbyPlacement": {"topologyKey": "zone key!"}},
                 "spec.standbyPlacement.topologyKey"),
    "negative storage": ({"spec__storage": {"size": "-1Gi", "logSize": "1Gi"}},
                         "spec.storage.size"),
    "resized storage": (
        {"spec__storage": {"size": "2Gi", "logSize": "1Gi"}},
        'spec.storage: Invalid value: "object": size is immutable',
    ),
    "negative replicas": ({"spec__replicas": -1}, "spec.replicas"),
    # A CEL rule of the CRD's (the model says the same, for the operator's own check).
    "backfill from a time without one": (
        {
            "spec__topology": {
                "ref": "wordcount:topology",
                "backfill": {"stores": ["counts"], "from": "Timestamp"},
            }
        },
        "from: Timestamp needs fromTimestamp",
    ),
    "pull policy": ({"spec__imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
    "secret with sqlite": (
        {"spec__log": {"url": "sqlite:///wordcount/log.db", "secretName": "kafka-client"}},
        "spec.log",
    ),
    "required spread on one node": (
        {"spec__standbyPlacement": {"spread": "Required"}},
        "standbyPlacement.spread Required",
    ),
    "log url": ({"spec__log": {"url": "postgres://db"}}, "spec.log.url"),
}  # fmt: skip


def _running_state(operator: Operator) -> dict[str, Any]:
    sts = operator.get("apps", "statefulsets", APP)
    config = operator.get("", "configmaps", f"{APP}-config")
    assert sts is not None and config is not None
    return {
        "statefulset": (sts["metadata"]["generation"], sts["spec"]),
        "config": config["data"],
        "pods": sorted(p["metadata"]["uid"] for p in operator.pods(APP).values()),
    }


def _settled(operator: Operator) -> bool:
    """Ready, and no rollout under way (every pod runs the current template)."""
    progressing = operator.condition(APP, "Progressing")
    return _ready(operator) and progressing is not None and progressing["status"] == "False"


def _degraded(operator: Operator) -> dict[str, Any] | None:
    condition = operator.condition(APP, "Degraded")
    return condition if condition and condition["status"] == "True" else None


@pytest.mark.parametrize(("changes", "field"), INVALID.values(), ids=INVALID.keys())
def test_an_invalid_manifest_is_refused_naming_the_field_and_nothing_running_changes(
    wordcount: WordCount, changes: dict[str, Any], field: str
) -> None:
    operator = wordcount.operator
    wait_until(lambda: _settled(operator), "no rollout under way", READY_TIMEOUT)
    before = _running_state(operator)
    generation = operator.app(APP)["metadata"]["generation"]
    result = wordcount.kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(manifest(**changes)))
    if result.returncode != 0:
        assert field in result.stderr, result.stderr
        assert operator.app(APP)["metadata"]["generation"] == generation
    else:  # the schema let it through: the operator must refuse it
        condition = wait_until(
            lambda: _degraded(operator), "Degraded=True for the invalid spec", 60
        )
        assert condition["reason"] == "InvalidSpec"
        assert field in condition["message"]
        wordcount.kubectl("apply", "-f", str(MANIFEST))
        wait_until(lambda: _ready(operator), "Ready again after the fix", 60)
    assert _running_state(operator) == before


def test_standbys_beyond_replicas_are_capped_not_refused(wordcount: WordCount) -> None:
    operator = wordcount.operator
    capped = manifest(spec__config={"processing.guarantee": "exactly_once_v2",
                                    "num.standby.replicas": 5})  # fmt: skip
    wordcount.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(capped))

    def noted() -> bool:
        return "capped" in str(operator.app(APP).get("status", {}).get("message", ""))

    wait_until(noted, "the standby cap in status.message", 60)
    degraded = operator.condition(APP, "Degraded")
    assert degraded is None or degraded["status"] == "False"
    assert "StandbysCapped" in wordcount.kubectl("describe", "sapp", APP)
    wordcount.kubectl("apply", "-f", str(MANIFEST))
    # A settings change rolls the pods one at a time; let it finish.
    wait_until(lambda: _settled(operator), "the rollout to finish", READY_TIMEOUT)
    wordcount.wait_exact("exact counts after the rollouts")


def test_an_invalid_spec_past_an_old_crd_degrades_the_app_and_changes_nothing(
    wordcount: WordCount,
) -> None:
    """Helm never upgrades CRDs: a cluster may run a CRD without today's rules. The CRD is
    the session's, so it is put back before the test ends."""
    operator = wordcount.operator
    crd = yaml.safe_load((REPO / "crds" / "streamapps.eddyline.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    lax = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema["properties"]["spec"] = lax
    schema.pop("x-kubernetes-validations", None)
    wait_until(lambda: _settled(operator), "no rollout under way", READY_TIMEOUT)
    wordcount.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(crd))
    before = _running_state(operator)
    try:
        for changes, field in (
            ({"default.state.isolation.level": "SERIALIZABLE"}, "default.state.isolation.level"),
            ({"max.task.idle.ms": -5}, "max.task.idle.ms"),
        ):
            config = {"processing.guarantee": "exactly_once_v2", "num.standby.replicas": 1}
            bad = manifest(spec__config={**config, **changes})

            def applied(document: dict[str, Any] = bad) -> bool:
                # The API server serves the lax schema a moment after the CRD update.
                result = wordcount.kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(document))
                return result.returncode == 0

            wait_until(applied, f"the lax CRD to take {field}", 30)

            def refused(field: str = field) -> dict[str, Any] | None:
                condition = _degraded(operator)
                return condition if condition and field in condition["message"] else None

            condition = wait_until(refused, f"Degraded=True naming {field}", 60)
            assert condition["reason"] == "InvalidSpec"
            assert "InvalidSpec" in wordcount.kubectl("describe", "sapp", APP)
            assert _running_state(operator) == before
    finally:
        wordcount.kubectl("apply", "-f", str(REPO / "crds" / "streamapps.eddyline.dev.yaml"))
        wordcount.kubectl("apply", "-f", str(MANIFEST))
    wait_until(lambda: _ready(operator), "Ready again after the fix", 60)
    degraded = operator.condition(APP, "Degraded")
    assert degraded is not None and degraded["status"] == "False"
    assert _running_state(operator) == before


def test_the_operator_is_held_to_the_charts_rbac(wordcount: WordCount) -> None:
    """Least privilege under the real RBAC: the chart grants the operator no Secrets."""
    operator = wordcount.operator
    plane = operator.cluster.plane
    as_operator = Client(plane.url, plane.pki.ca_cert, token=operator.token)
    with pytest.raises(ApiError) as refused:
        as_operator.request(f"/api/v1/namespaces/{NAMESPACE}/secrets")
    assert refused.value.code == 403
    assert "Forbidden" not in operator.output()


def test_a_pod_lost_while_the_operator_is_down_fails_over_once_it_is_back(
    wordcount: WordCount, control_plane: Cluster
) -> None:
    operator = wordcount.operator
    kubelets = control_plane.kubelets
    assert kubelets is not None
    wait_until(lambda: _settled(operator), "no rollout under way", READY_TIMEOUT)
    wordcount.wait_exact("exact counts before")
    word = wordcount.expected.most_common(1)[0][0]
    before = wordcount.router().get(STORE, word)
    assert before.host is not None
    victim = next(
        name
        for name, pod in operator.pods(APP).items()
        if pod["status"].get("podIP") == before.host.split(":")[0]
    )
    generation = operator.app(APP)["status"]["membershipGeneration"]
    operator.stop()
    # A kubelet restarts a first crash at once; the second waits out its back-off (10 s),
    # so the pod stays down while the operator is away, as a lost pod would.
    restarts = _restarts(operator, victim)
    kubelets.kill_container(NAMESPACE, victim)
    wait_until(lambda: _restarts(operator, victim) > restarts, f"{victim} restarted", 60)
    wait_until(lambda: _running(kubelets, victim), f"{victim} running again", 60)
    kubelets.kill_container(NAMESPACE, victim)
    wordcount.produce(500, seed=8)

    def stale() -> bool:  # nobody reassigns the dead pod's tasks, but its standbys answer
        try:
            result = wordcount.router().get(STORE, word)
        except QueryFailedError:
            return False
        return result.host != before.host and result.role == "standby"

    wait_until(stale, "a stale answer from a standby", 30)
    assert operator.app(APP)["status"]["membershipGeneration"] == generation
    operator.start()
    operator.wait_watching()

    def republished() -> dict[str, Any] | None:
        membership = operator.get("", "configmaps", f"{APP}-membership")
        assert membership is not None
        published: dict[str, Any] = json.loads(membership["data"]["membership.json"])
        return published if published["generation"] > generation else None

    published = wait_until(republished, "a membership from the operator back", 60)
    assert victim not in [m["id"] for m in published["assignment"]["members"]]
    wordcount.wait_exact("exact counts once the operator is back")
    wait_until(lambda: _settled(operator), "the pod back and the app settled", READY_TIMEOUT)
    wordcount.wait_exact("exact counts with the pod back")


def _restarts(operator: Operator, name: str) -> int:
    statuses = operator.pods(APP)[name]["status"].get("containerStatuses", [])
    return int(statuses[0]["restartCount"]) if statuses else 0


def _running(kubelets: Any, name: str) -> bool:
    try:
        node = kubelets.node_of(NAMESPACE, name)
    except LookupError:
        return False
    with node.lock:
        runtime = next(r for r in node.pods.values() if (r.namespace, r.name) == (NAMESPACE, name))
        process = runtime.containers[0].process
        return process is not None and process.poll() is None


def test_suspending_scales_to_zero_keeps_the_claims_and_resuming_counts_on(
    wordcount: WordCount,
) -> None:
    operator = wordcount.operator
    wait_until(lambda: _ready(operator), "the app ready", READY_TIMEOUT)
    merge = '{"spec": {"suspend": true}}'
    wordcount.kubectl("patch", "sapp", APP, "--type=merge", "-p", merge)
    wait_until(lambda: not operator.pods(APP), "no pods", READY_TIMEOUT)
    wait_until(
        lambda: operator.app(APP).get("status", {}).get("phase") == "Suspended", "Suspended", 60
    )
    claims = {c["metadata"]["name"] for c in operator.objects("", "persistentvolumeclaims")}
    assert {f"state-{APP}-0", f"state-{APP}-1", f"state-{APP}-2", f"{APP}-log"} <= claims
    wordcount.produce(500, seed=7)  # arrives while nothing runs
    wordcount.kubectl("patch", "sapp", APP, "--type=merge", "-p", merge.replace("true", "false"))
    wait_until(lambda: _ready(operator), "Ready again after resuming", READY_TIMEOUT)
    wordcount.wait_exact("exact counts after resuming")


def test_deleting_the_app_lets_the_real_garbage_collector_remove_its_children_not_claims(
    wordcount: WordCount,
) -> None:
    operator = wordcount.operator
    assert f'streamapp.eddyline.dev "{APP}" deleted' in wordcount.kubectl("delete", "sapp", APP)
    wait_until(lambda: not operator.pods(APP), "every pod gone", READY_TIMEOUT)
    wait_until(
        lambda: (
            operator.get("apps", "statefulsets", APP) is None
            and operator.get("", "configmaps", f"{APP}-config") is None
            and operator.get("", "services", f"{APP}-query") is None
        ),
        "the garbage collector to remove the owned children",
        120,
    )
    claims = {c["metadata"]["name"] for c in operator.objects("", "persistentvolumeclaims")}
    assert f"{APP}-log" in claims and f"state-{APP}-0" in claims
