"""The operator end to end: kopf against the emulated API server, pods as real processes.

A user's path: the CRD is applied, the operator runs (``eddyline-operator``, kopf, in a
process whose ``sys.path`` lacks ``examples/``), ``kubectl apply`` the word count's cluster
manifest, ``kubectl get sapp`` and ``describe`` it, query counts through the query Service,
lose a pod, and fix or be refused bad manifests. The cluster stand-in
(``tests/support/k8s``) runs each pod as a real ``eddyline`` runtime on its own loopback
address, all on one shared embedded log; it never writes membership: the pods learn it
from the operator.
"""

from __future__ import annotations

import collections
import json
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes_validate
import pytest
import yaml

from eddyline_runtime.log import open_log
from eddyline_runtime.query.client import QueryFailedError, QueryResult, QueryRouter
from tests.support.cluster_word_count import counts_exact, produce_lines, random_lines
from tests.support.k8s.client import request
from tests.support.k8s.kubectl import KUBECTL, Kubectl
from tests.support.k8s.operator_harness import REPO, OperatorHarness
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH"),
]

APP = "wordcount"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
STORE = "word-counts"
WORDS = [f"w{index:02d}" for index in range(40)]
# The operator's own deadlines are seconds; these only bound a broken run.
READY_TIMEOUT = 90


@dataclass
class WordCount:
    """The running app as the tests see it from outside the cluster."""

    harness: OperatorHarness
    log_url: str
    query_service: str
    expected: collections.Counter[str]

    @property
    def kubectl(self) -> Kubectl:
        assert self.harness.kubectl is not None
        return self.harness.kubectl

    def produce(self, lines: int, seed: int) -> None:
        batch = random_lines(random.Random(seed), WORDS, lines, most=6)
        self.expected.update(word for line in batch for word in line.split())
        produce_lines(self.log_url, batch)

    def router(self) -> QueryRouter:
        return QueryRouter([self.query_service], timeout=2)

    def counts_exact(self) -> bool:
        return counts_exact(self.router(), self.expected)


def manifest(**changes: Any) -> dict[str, Any]:
    """The example's cluster manifest with ``spec`` paths (dotted, ``/`` for config keys) set."""
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    for path, value in changes.items():
        target = document
        parts = path.split("__")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    return document


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorHarness]:
    pytest.importorskip("helm_sdkpy")  # the chart is installed as a user would (make setup)
    running = OperatorHarness(tmp_path_factory.mktemp("operator"), examples=["wordcount"])
    running.start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def wordcount(harness: OperatorHarness) -> WordCount:
    claim = harness.claim_dir(f"{APP}-log")
    claim.mkdir(parents=True)
    log_url = f"sqlite:///{claim}/log.db"
    log = open_log(log_url)  # the input topic exists before the app, as on a real cluster
    log.create_topic("text-lines", 4)
    log.close()
    harness.wait_until_operator_watches()
    assert harness.kubectl is not None
    assert harness.kubectl("apply", "-f", str(MANIFEST)).strip() == (
        f"streamapp.eddyline.dev/{APP} created"
    )
    try:
        wait_for(lambda: _ready(harness), "3 ready pods and Ready=True", READY_TIMEOUT)
    except AssertionError:
        print(harness.describe_failure(APP))
        raise
    service = harness.get("", "services", f"{APP}-query")
    assert service is not None
    address = f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
    return WordCount(harness, log_url, address, collections.Counter())


def _ready(harness: OperatorHarness, replicas: int = 3) -> bool:
    status = harness.app(APP).get("status", {})
    ready = harness.condition(APP, "Ready")
    return bool(
        status.get("readyReplicas") == replicas
        and ready is not None
        and ready["status"] == "True"
        and status.get("observedGeneration") == harness.app(APP)["metadata"]["generation"]
    )


def _settled(harness: OperatorHarness) -> bool:
    """Ready, and no rollout under way (every pod runs the current template)."""
    progressing = harness.condition(APP, "Progressing")
    return _ready(harness) and progressing is not None and progressing["status"] == "False"


def test_the_operator_creates_valid_children_and_kubectl_shows_the_app_ready(
    wordcount: WordCount,
) -> None:
    harness = wordcount.harness
    children = {
        ("", "configmaps"): [f"{APP}-config", f"{APP}-membership"],
        ("", "services"): [f"{APP}-headless", f"{APP}-query"],
        ("", "serviceaccounts"): [f"{APP}-runtime"],
        ("rbac.authorization.k8s.io", "roles"): [f"{APP}-membership"],
        ("rbac.authorization.k8s.io", "rolebindings"): [f"{APP}-membership"],
        ("policy", "poddisruptionbudgets"): [APP],
        ("", "persistentvolumeclaims"): [f"{APP}-log"],
        ("apps", "statefulsets"): [APP],
    }
    uid = harness.app(APP)["metadata"]["uid"]
    for (group, plural), names in children.items():
        for name in names:
            child = harness.get(group, plural, name)
            assert child is not None, f"{plural}/{name} was not created"
            kubernetes_validate.validate(child, "1.32", strict=True)
            owners = [o["uid"] for o in child["metadata"].get("ownerReferences", [])]
            if plural != "persistentvolumeclaims":  # the log claim is kept by default
                assert owners == [uid], f"{plural}/{name} is not owned by the StreamApp"
    crd = yaml.safe_load((REPO / "crds" / "streamapps.eddyline.dev.yaml").read_text())
    kubernetes_validate.validate(crd, "1.32", strict=True)

    table = wordcount.kubectl("get", "sapp").splitlines()
    assert table[0].split() == ["NAME", "REPLICAS", "READY", "PHASE", "REVISION", "AGE"]
    assert table[1].split()[:5] == [APP, "3", "3", "Running", "1"]
    described = wordcount.kubectl("describe", "sapp", APP)
    print(described)
    assert re.search(r"Reason:\s+AllReplicasReady\s+Status:\s+True\s+Type:\s+Ready", described)
    assert re.search(r"Events:\s+Type\s+Reason\s+Age\s+From\s+Message", described)


def test_counts_are_exact_through_the_query_service(wordcount: WordCount) -> None:
    wordcount.produce(2_000, seed=1)
    wait_for(wordcount.counts_exact, "exact counts through the query Service", 60)


def test_a_killed_pod_fails_over_to_its_standby_and_counts_stay_exact(
    wordcount: WordCount,
) -> None:
    harness = wordcount.harness
    if not wordcount.expected:
        wordcount.produce(1_000, seed=2)
    wait_for(wordcount.counts_exact, "exact counts before the kill", 60)
    word = wordcount.expected.most_common(1)[0][0]
    before = wordcount.router().get(STORE, word)
    victim = _pod_at(harness, before.host)
    killed_at = time.monotonic()
    harness.cluster.kill_container("default", victim)

    def answered_elsewhere() -> bool:
        try:
            result = wordcount.router().get(STORE, word)
        except QueryFailedError:
            return False
        return result.host != before.host and int(result.value) == wordcount.expected[word]

    wait_for(answered_elsewhere, f"{word!r} answered by another pod than {victim}", 30)
    answered = time.monotonic() - killed_at

    def promoted() -> bool:  # before the killed container's back-off ends
        try:
            result = wordcount.router().get(STORE, word)
        except QueryFailedError:
            return False
        return result.role == "active" and result.host != before.host

    wait_for(promoted, f"the standby of {word!r} promoted", 10)
    promoted_after = time.monotonic() - killed_at
    wordcount.produce(1_000, seed=3)
    try:
        wait_for(wordcount.counts_exact, "exact counts after the failover", 60)
    except AssertionError:
        print(harness.describe_failure(APP))
        raise
    print(f"answered {answered:.2f} s and promoted {promoted_after:.2f} s after the kill")
    # The kubelet restarts the container after its back-off; it rejoins as a member.
    wait_for(lambda: _pod_restarted(harness, victim) and _ready(harness), "the pod back", 60)
    wait_for(wordcount.counts_exact, "exact counts with the pod back", 60)


def test_a_deleted_pod_terminates_gracefully_is_replaced_and_counts_stay_exact(
    wordcount: WordCount,
) -> None:
    harness = wordcount.harness
    wait_for(lambda: _settled(harness), "no rollout under way", 120)
    old_uid = harness.pods(APP)[f"{APP}-2"]["metadata"]["uid"]
    # kubectl waits for the kubelet stand-in: SIGTERM, the runtime commits and exits.
    assert f'pod "{APP}-2" deleted' in wordcount.kubectl("delete", "pod", f"{APP}-2")
    wordcount.produce(500, seed=4)

    def replaced() -> bool:
        pod = harness.pods(APP).get(f"{APP}-2")
        return pod is not None and pod["metadata"]["uid"] != old_uid and _ready(harness)

    wait_for(replaced, f"a new {APP}-2, ready", 60)
    wait_for(wordcount.counts_exact, "exact counts after the replacement", 60)
    log = harness.cluster.pod_log("default", f"{APP}-2")
    assert "Traceback" not in log, log[-3000:]


def test_scaling_through_the_scale_subresource_rebalances_and_counts_stay_exact(
    wordcount: WordCount,
) -> None:
    harness = wordcount.harness
    wait_for(lambda: _settled(harness), "no rollout under way", 120)
    assert "scaled" in wordcount.kubectl("scale", "sapp", APP, "--replicas=4")
    wait_for(lambda: len(harness.pods(APP)) == 4 and _ready(harness, 4), "4 ready pods", 90)
    membership = harness.get("", "configmaps", f"{APP}-membership")
    assert membership is not None
    assigned = json.loads(membership["data"]["membership.json"])["assignment"]
    assert f"{APP}-3" in json.dumps(assigned)  # the new pod holds tasks
    wordcount.produce(500, seed=5)
    wait_for(wordcount.counts_exact, "exact counts on 4 pods", 60)
    assert "scaled" in wordcount.kubectl("scale", "sapp", APP, "--replicas=3")
    wait_for(lambda: len(harness.pods(APP)) == 3 and _ready(harness), "back to 3 pods", 90)
    wordcount.produce(500, seed=6)
    wait_for(wordcount.counts_exact, "exact counts back on 3 pods", 60)


def test_suspending_scales_to_zero_keeps_the_state_and_resuming_counts_on(
    wordcount: WordCount,
) -> None:
    harness = wordcount.harness
    wait_for(lambda: _settled(harness), "no rollout under way", 120)
    merge = '{"spec": {"suspend": true}}'
    wordcount.kubectl("patch", "sapp", APP, "--type=merge", "-p", merge)
    wait_for(lambda: not harness.pods(APP) and not harness.cluster.pods, "no pods", 60)
    wait_for(lambda: harness.app(APP).get("status", {}).get("phase") == "Suspended", "Suspended")
    claims = {c["metadata"]["name"] for c in harness.objects("", "persistentvolumeclaims")}
    assert {f"state-{APP}-0", f"state-{APP}-1", f"state-{APP}-2", f"{APP}-log"} <= claims
    wordcount.produce(500, seed=7)  # arrives while nothing runs
    wordcount.kubectl("patch", "sapp", APP, "--type=merge", "-p", merge.replace("true", "false"))
    wait_for(lambda: _settled(harness), "Ready again after resuming", 90)
    wait_for(wordcount.counts_exact, "exact counts after resuming", 60)


def test_a_pod_lost_while_the_operator_is_down_fails_over_once_it_is_back(
    wordcount: WordCount,
) -> None:
    harness = wordcount.harness
    wait_for(lambda: _settled(harness), "no rollout under way", 120)
    word = wordcount.expected.most_common(1)[0][0]
    before = wordcount.router().get(STORE, word)
    victim = _pod_at(harness, before.host)
    generation = harness.app(APP)["status"]["membershipGeneration"]
    harness.stop_operator()
    harness.cluster.kill_container("default", victim, keep_down_for=10)
    wordcount.produce(500, seed=8)
    # Nobody reassigns the dead pod's tasks, but its standbys still answer (stale).
    stale = wait_for(lambda: _answer_elsewhere(wordcount, word, before.host), "a stale answer")
    assert stale.role == "standby"
    assert harness.app(APP)["status"]["membershipGeneration"] == generation
    harness.start_operator()
    wait_for(wordcount.counts_exact, "exact counts once the operator is back", 90)
    membership = harness.get("", "configmaps", f"{APP}-membership")
    assert membership is not None
    published = json.loads(membership["data"]["membership.json"])
    assert published["generation"] > generation
    assert victim not in [m["id"] for m in published["assignment"]["members"]]
    wait_for(lambda: _settled(harness), "the pod back and the app settled", 90)


def _answer_elsewhere(wordcount: WordCount, word: str, host: str | None) -> QueryResult | None:
    try:
        result = wordcount.router().get(STORE, word)
    except QueryFailedError:
        return None
    return result if result.host != host else None


def _pod_at(harness: OperatorHarness, host: str | None) -> str:
    assert host is not None
    address = host.split(":")[0]
    for name, pod in harness.pods(APP).items():
        if pod.get("status", {}).get("podIP") == address:
            return name
    raise AssertionError(f"no pod has the address {host}")


def _pod_restarted(harness: OperatorHarness, name: str) -> bool:
    pod = harness.pods(APP)[name]
    statuses = pod.get("status", {}).get("containerStatuses", [])
    return bool(statuses and statuses[0]["restartCount"] > 0)


# Each manifest is refused by the API server (schema or CEL) or, where the schema cannot
# tell, by the operator (Degraded, InvalidSpec); either way the message names the field.
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
    "unknown setting": (
        {"spec__config": {"num.stream.thread": 2}},
        'unknown field "spec.config.num.stream.thread"',
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


def _running_state(harness: OperatorHarness) -> dict[str, Any]:
    sts = harness.get("apps", "statefulsets", APP)
    config = harness.get("", "configmaps", f"{APP}-config")
    assert sts is not None and config is not None
    return {
        "statefulset": (sts["metadata"]["generation"], sts["spec"]),
        "config": config["data"],
        "pods": sorted(p["metadata"]["uid"] for p in harness.pods(APP).values()),
    }


@pytest.mark.parametrize(("changes", "field"), INVALID.values(), ids=INVALID.keys())
def test_an_invalid_manifest_is_refused_naming_the_field_and_nothing_running_changes(
    wordcount: WordCount, changes: dict[str, Any], field: str
) -> None:
    harness = wordcount.harness
    before = _running_state(harness)
    result = wordcount.kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(manifest(**changes)))
    if result.returncode != 0:
        assert field in result.stderr, result.stderr
    else:  # the schema let it through: the operator must refuse it

        def degraded() -> dict[str, Any] | None:
            condition = harness.condition(APP, "Degraded")
            return condition if condition and condition["status"] == "True" else None

        condition = wait_for(degraded, "Degraded=True for the invalid spec", 30)
        assert condition["reason"] == "InvalidSpec"
        assert field in condition["message"]
        wordcount.kubectl("apply", "-f", str(MANIFEST))
        wait_for(lambda: _ready(harness), "Ready again after the fix", 30)
    assert _running_state(harness) == before


def test_standbys_beyond_replicas_are_capped_not_refused(wordcount: WordCount) -> None:
    harness = wordcount.harness
    capped = manifest(spec__config={"processing.guarantee": "exactly_once_v2",
                                    "num.standby.replicas": 5})  # fmt: skip
    wordcount.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(capped))

    def noted() -> bool:
        return "capped" in str(harness.app(APP).get("status", {}).get("message", ""))

    wait_for(noted, "the standby cap in status.message", 30)
    degraded = harness.condition(APP, "Degraded")
    assert degraded is None or degraded["status"] == "False"
    assert "StandbysCapped" in wordcount.kubectl("describe", "sapp", APP)
    wordcount.kubectl("apply", "-f", str(MANIFEST))
    # A settings change rolls the pods one at a time; let it finish.
    wait_for(lambda: _settled(harness), "the rollout to finish", 120)


def test_an_invalid_spec_past_an_old_crd_degrades_the_app_and_changes_nothing(
    wordcount: WordCount,
) -> None:
    """Helm never upgrades CRDs: a cluster may run a CRD without today's rules."""
    harness = wordcount.harness
    crd = yaml.safe_load((REPO / "crds" / "streamapps.eddyline.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    lax = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema["properties"]["spec"] = lax
    schema.pop("x-kubernetes-validations", None)
    wait_for(lambda: _settled(harness), "no rollout under way", 120)
    wordcount.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(crd))
    before = _running_state(harness)
    try:
        for changes, field in (
            ({"default.state.isolation.level": "SERIALIZABLE"}, "default.state.isolation.level"),
            ({"max.task.idle.ms": -5}, "max.task.idle.ms"),
        ):
            config = {"processing.guarantee": "exactly_once_v2", "num.standby.replicas": 1}
            bad = manifest(spec__config={**config, **changes})
            wordcount.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(bad))

            def refused(field: str = field) -> dict[str, Any] | None:
                condition = harness.condition(APP, "Degraded")
                if condition and condition["status"] == "True" and field in condition["message"]:
                    return condition
                return None

            condition = wait_for(refused, f"Degraded=True naming {field}", 30)
            assert condition["reason"] == "InvalidSpec"
            assert "InvalidSpec" in wordcount.kubectl("describe", "sapp", APP)
            assert _running_state(harness) == before
    finally:
        wordcount.kubectl("apply", "-f", str(REPO / "crds" / "streamapps.eddyline.dev.yaml"))
        wordcount.kubectl("apply", "-f", str(MANIFEST))
    wait_for(lambda: _ready(harness), "Ready again after the fix", 30)
    degraded = harness.condition(APP, "Degraded")
    assert degraded is not None and degraded["status"] == "False"
    assert _running_state(harness) == before


def test_the_operator_needed_nothing_beyond_the_charts_rbac(wordcount: WordCount) -> None:
    harness = wordcount.harness
    assert harness.api.denied == []
    token = {"Authorization": f"Bearer {harness.operator_token}"}
    secrets = request(harness.url("/api/v1/namespaces/default/secrets"), headers=token)
    assert secrets.status == 403  # least privilege: the chart grants no Secrets
    assert harness.api.denied[-1].startswith(
        'secrets is forbidden: User "system:serviceaccount:default:'
    )


def test_pods_reach_the_api_as_their_service_account_with_only_the_membership(
    wordcount: WordCount,
) -> None:
    """The pods watched their membership under the Role the operator gave them, and no more."""
    harness = wordcount.harness
    assert harness.api.denied[:-1] == []  # the one refusal is the previous test's
    pod = harness.pods(APP)[f"{APP}-0"]
    own_api = f"http://{pod['status']['podIP']}:{harness.api.port}/api/v1/namespaces/default"
    assert harness.api.address_identities[pod["status"]["podIP"]] == ("default", f"{APP}-runtime")
    assert request(f"{own_api}/configmaps/{APP}-membership").status == 200
    assert request(f"{own_api}/configmaps/{APP}-config").status == 403
    assert request(f"{own_api}/pods").status == 403


def test_deleting_the_app_removes_what_it_owns_and_keeps_the_claims(wordcount: WordCount) -> None:
    harness = wordcount.harness
    assert f'streamapp.eddyline.dev "{APP}" deleted' in wordcount.kubectl("delete", "sapp", APP)
    wait_for(lambda: not harness.pods(APP), "every pod gone", 60)
    assert harness.get("apps", "statefulsets", APP) is None
    assert harness.get("", "configmaps", f"{APP}-config") is None
    assert harness.get("", "services", f"{APP}-query") is None
    claims = {c["metadata"]["name"] for c in harness.objects("", "persistentvolumeclaims")}
    assert f"{APP}-log" in claims and f"state-{APP}-0" in claims
    wait_for(lambda: not harness.cluster.pods, "every pod process stopped", 60)
