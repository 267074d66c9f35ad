"""``kubectl eddyline`` (issue 34) through the real ``kubectl``, on the real control plane.

kubectl finds ``kubectl-eddyline`` (the package's console script) on the PATH and runs it as
a plugin. The word count runs on six pods over the three zones' nodes (its log on the
session's Kafka broker, so the pods spread), and the plugin runs as a ServiceAccount whose
kubeconfig is all it has: a token and the API server's address. The pods' loopback
addresses would route from this machine, so "through the pod proxy" is proven by the rights:
without ``get`` on ``pods/proxy`` the plugin is refused and says which right it lacks; with
the Role docs/operator.md gives, it reads every pod's ``/v1/layout``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_runtime.log import open_log
from eddyline_runtime.partitions import TaskId, partition_for_key
from tests.support.cluster_word_count import create_input_topic, produce_lines
from tests.support.control_plane import pod_network
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.cluster import ZONES, Cluster
from tests.support.control_plane.fixture import running_cluster
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture
from tests.support.kafka.broker import KafkaCluster
from tests.support.kafka.plugin import use_cluster
from tests.support.kafka.streamapp import READY_TIMEOUT, ready
from tests.support.node_loss import membership

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
NAMESPACE = "kubectl-plugin"
APP = "plugged"
PODS = 6
STORE = "word-counts"
# Revision 2's second input (examples/wordcount/wordcount.py, topology_v2).
ALERTS_INPUT_TOPIC = "watched-words"
# The input topic's partitions (tests/support/cluster_word_count.py).
PARTITIONS = 4
VIEWER = "eddyline-user"
# The rules of the chart's kubectlPluginRole, which docs/operator.md ("kubectl eddyline")
# gives a user of the plugin (tests/unit/operator/test_chart_kubectl_role.py holds the two
# equal); the pods/proxy rule is last.
RULES: list[dict[str, Any]] = yaml.safe_load(
    (REPO / "charts" / "eddyline-operator" / "rbac" / "kubectl-eddyline-rules.yaml").read_text()
)
# Bounds for a broken run on a loaded 2-core machine, not expectations.
TIMEOUT = 120
UPGRADE_TIMEOUT = 600

operator = operator_fixture(NAMESPACE, directory="operator-kubectl-plugin")


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """This module's own cluster, its pods on routable addresses: the API server's pod proxy
    refuses the session cluster's loopback pod IPs (tests/support/control_plane/pod_network.py)."""
    with (
        pod_network.routed(),
        running_cluster(
            tmp_path_factory.mktemp("control-plane-routable"), routable_pods=True
        ) as cluster,
    ):
        yield cluster


class Plugin:
    """``kubectl eddyline`` as a user with only a kubeconfig runs it."""

    def __init__(self, kubeconfig: Path, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        # The package's console scripts sit beside this interpreter: kubectl finds the
        # plugin there, and nothing else of the test's environment comes along.
        scripts = Path(sys.executable).parent
        self.env = {
            "PATH": os.pathsep.join([str(scripts), os.environ.get("PATH", "")]),
            "HOME": str(home),
            "KUBECONFIG": str(kubeconfig),
        }

    def run(self, *args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "eddyline", *args, "-n", NAMESPACE],
            capture_output=True, text=True, env=self.env, timeout=timeout, check=False,
        )  # fmt: skip

    def __call__(self, *args: str, timeout: float = TIMEOUT) -> str:
        done = self.run(*args, timeout=timeout)
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        return done.stdout


def _role(rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": VIEWER, "namespace": NAMESPACE},
        "rules": rules,
    }


@pytest.fixture(scope="module")
def user(
    operator: Operator, control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Plugin:
    """A ServiceAccount bound to a Role without ``pods/proxy`` (tests add it), as a kubeconfig
    with its token and nothing else."""
    admin = operator.admin
    base = f"/api/v1/namespaces/{NAMESPACE}"
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}"
    admin.ensure(f"{base}/serviceaccounts", {"metadata": {"name": VIEWER}})
    admin.ensure(f"{rbac}/roles", _role(RULES[:-1]))
    admin.ensure(
        f"{rbac}/rolebindings",
        {
            "metadata": {"name": VIEWER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": VIEWER},
            "subjects": [{"kind": "ServiceAccount", "name": VIEWER, "namespace": NAMESPACE}],
        },
    )
    root = tmp_path_factory.mktemp("kubectl-plugin-user")
    token = control_plane.plane.service_account_token(NAMESPACE, VIEWER)
    return Plugin(control_plane.plane.token_kubeconfig(root / "kubeconfig", token), root / "home")


@pytest.fixture(scope="module")
def six_pods(
    operator: Operator, kafka_broker_of_module: KafkaCluster, request: pytest.FixtureRequest
) -> Iterator[str]:
    """The word count on six pods, its log on the broker; yields the log's URL."""
    # A broker of its own: the session's must not hold the word count's input afterwards.
    kafka_broker = use_cluster(request, kafka_broker_of_module)
    log_url = f"kafka://{kafka_broker.bootstrap}"
    create_input_topic(log_url)
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["metadata"]["name"] = APP
    document["spec"]["log"] = {"url": log_url}
    document["spec"]["replicas"] = PODS
    operator.wait_watching()
    operator.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(document))

    def all_members() -> bool:
        published = membership(operator, APP)
        return (
            ready(operator, APP, replicas=PODS)
            and published is not None
            and len(published.assignment.members) == PODS
        )

    try:
        wait_until(all_members, f"{PODS} ready pods, all members", READY_TIMEOUT)
    except TimeoutError:
        print(operator.describe_failure(APP))
        raise
    produce_lines(log_url, ["alpha beta gamma"] * 20)
    try:
        yield log_url
    finally:
        operator.kubectl("delete", "sapp", APP, "--wait=false")


def _grant_proxy(operator: Operator) -> None:
    path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles/{VIEWER}"
    operator.admin.patch(path, {"rules": RULES})


def test_status_without_pods_proxy_is_refused_naming_the_right(
    operator: Operator, six_pods: str, user: Plugin
) -> None:
    # Pod addresses here are global unicast, as on a cluster (the proxy refuses loopback).
    for pod in operator.pods(APP).values():
        assert not ipaddress.ip_address(pod["status"]["podIP"]).is_loopback
    done = user.run("status", APP)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: "), done.stderr
    assert '"get" on "pods/proxy"' in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_status_shows_six_pods_in_three_zones_and_every_tasks_copies(
    operator: Operator, six_pods: str, user: Plugin
) -> None:
    _grant_proxy(operator)
    # RBAC reaches the API server's authorizer through its informers: within moments.
    wait_until(lambda: user.run("status", APP, "-o", "json").returncode == 0, "the grant", 30)

    def settled_view() -> tuple[dict[str, Any], Any] | None:
        """The view once every pod's layout reads through the proxy and the app has settled:
        right after its pods turn Ready the operator may still move tasks (warm-ups, then
        the move), and a pod is not Ready while a task moving to it restores (seen once)."""
        view: dict[str, Any] = json.loads(user("status", APP, "-o", "json"))
        published = membership(operator, APP)
        if published is None or published.assignment.warmup_count:
            return None
        if not all(
            p["layoutError"] is None and p["ready"] and p["topologyHash"] for p in view["pods"]
        ):
            return None
        return view, published.assignment

    view, assignment = wait_until(settled_view, "every pod's layout through the proxy", TIMEOUT)
    pods = {p["name"]: p for p in view["pods"]}
    assert sorted(pods) == sorted(f"{APP}-{i}" for i in range(PODS))
    assert {p["zone"] for p in pods.values()} == set(ZONES)
    assert all(p["ready"] and p["topologyHash"] for p in pods.values())
    # The running revision's describe hash (every pod's) and how to draw it.
    assert {p["topologyHash"] for p in pods.values()} == {view["topologyHash"]}
    assert view["drawCommand"] == f"eddyline describe MANIFEST --format svg > {APP}.svg"
    # Each pod's /metrics, through the proxy as well: busy share, rate and input lag.
    assert all(p["busy"] is not None and p["inputLag"] is not None for p in pods.values())
    assert view["status"]["phase"] == "Running" and view["status"]["revision"] == "1"
    assert view["stores"] == {STORE: 1}
    # Each task as published: the active copy and the standby, in another zone, with lags.
    assert {t["task"] for t in view["tasks"]} == {str(t) for t in assignment.tasks}
    for task in view["tasks"]:
        active = task["active"]
        owner = assignment.active_owner(_task(task["task"]))
        assert active["pod"] == owner
        assert active["zone"] == assignment.member(owner).zone
        if task["task"].startswith("1_"):  # the counting sub-topology: stateful
            (standby,) = task["standbys"]
            assert standby["zone"] != active["zone"], task
            assert active["lag"] is not None and standby["lag"] is not None, task

    text = user("status", APP)
    assert "\033[" not in text  # not a terminal: no colour
    print(text)  # the sample docs/operator.md shows
    assert f"{APP} in {NAMESPACE}: Running" in text
    for pod in pods:
        assert pod in text
    for zone in ZONES:
        assert zone in text
    assert "Ready" in text and "revision 1" in text
    assert f"(describe hash {view['topologyHash']})" in text
    assert f"draw it: eddyline describe MANIFEST --format svg > {APP}.svg" in text


def test_where_names_the_partition_and_the_pod_that_serves_a_key(
    operator: Operator, six_pods: str, user: Plugin
) -> None:
    _grant_proxy(operator)
    published = membership(operator, APP)
    assert published is not None
    place = json.loads(user("where", APP, "gamma", "-o", "json"))
    partition = partition_for_key(b"gamma", PARTITIONS)
    assert (place["store"], place["partition"], place["task"]) == (
        STORE,
        partition,
        f"1_{partition}",
    )
    owner = published.assignment.active_owner(_task(f"1_{partition}"))
    assert place["active"]["pod"] == owner
    assert place["active"]["zone"] == published.assignment.member(owner).zone
    text = user("where", APP, "gamma")
    print(text)  # the sample docs/operator.md shows
    assert f'key "gamma" of store "{STORE}": partition {partition}' in text
    assert owner in text
    missing = user.run("where", APP, "gamma", "--store", "nope")
    assert missing.returncode == 1
    assert f'"{APP}" has no store "nope"; its stores: {STORE}' in missing.stderr


def test_pause_and_resume_set_the_annotation_the_operator_honours(
    operator: Operator, six_pods: str, user: Plugin
) -> None:
    out = user("pause", APP)
    assert "reconciliation paused" in out
    annotations = operator.app(APP)["metadata"].get("annotations") or {}
    assert annotations.get("eddyline.dev/pause-reconciliation") == "true"
    paused = operator.condition(APP, "Paused")
    assert paused is not None and paused["status"] == "True"
    assert "PAUSED" in user("status", APP)
    out = user("resume", APP)
    assert "reconciliation resumed" in out
    annotations = operator.app(APP)["metadata"].get("annotations") or {}
    assert "eddyline.dev/pause-reconciliation" not in annotations
    condition = operator.condition(APP, "Paused")
    assert condition is None or condition["status"] != "True"


def test_an_upgrade_the_operator_rolls_back_is_followed_to_its_end_and_exits_2(
    operator: Operator, six_pods: str, user: Plugin
) -> None:
    wait_until(lambda: ready(operator, APP, replicas=PODS), "Ready after resume", READY_TIMEOUT)
    # The pods cannot load it: the new revision's pods fail and the operator rolls back.
    done = user.run(
        "upgrade", APP, "--topology", "wordcount:no_such_topology", timeout=UPGRADE_TIMEOUT
    )
    assert done.returncode == 2, (done.stdout, done.stderr, operator.describe_failure(APP))
    print(done.stdout)
    lines = done.stdout.splitlines()
    assert lines[0] == f"{APP}: upgrading from wordcount:topology@1 to wordcount:no_such_topology@2"
    steps = [line.split()[1] for line in lines[1:-1]]
    # The first pod replaced with the new revision fails while Publishing rolls the pods:
    # the rollback starts there, before any pod of the new revision processes.
    assert steps[:3] == ["Stopping", "Publishing", "RollBackStopping"], done.stdout
    assert "RollBackStopping" in steps and steps[-1] == "RollBackStarting", done.stdout
    assert lines[-1].startswith(
        f"{APP}: wordcount:no_such_topology@2 was rolled back; wordcount:topology@1 runs again"
    ), done.stdout
    assert "\r" not in done.stdout  # no progress line when stdout is not a terminal
    status = operator.app(APP)["status"]
    assert status["lastUpgrade"]["outcome"] == "RolledBack"


def test_upgrade_follows_the_operators_steps_until_the_new_revision_runs(
    operator: Operator, six_pods: str, user: Plugin
) -> None:
    wait_until(lambda: ready(operator, APP, replicas=PODS), "Ready", READY_TIMEOUT)
    log = open_log(six_pods)
    try:  # revision 2's new input (examples/wordcount); one already there is kept
        log.create_topic(ALERTS_INPUT_TOPIC, PARTITIONS)
    finally:
        log.close()
    # The spec still asks for the rolled-back revision 2: the next is 3.
    done = user.run("upgrade", APP, "--topology", "wordcount:topology_v2", timeout=UPGRADE_TIMEOUT)
    assert done.returncode == 0, (done.stdout, done.stderr, operator.describe_failure(APP))
    print(done.stdout)
    lines = done.stdout.splitlines()
    assert lines[0] == f"{APP}: upgrading from wordcount:topology@1 to wordcount:topology_v2@3"
    steps = [line.split()[1] for line in lines[1:-1]]
    assert steps == ["Stopping", "Publishing", "Starting"], done.stdout
    assert lines[-1].startswith(f"{APP}: wordcount:topology_v2@3 runs"), done.stdout
    status = operator.app(APP)["status"]
    assert status["topology"]["ref"] == "wordcount:topology_v2"
    assert status["lastUpgrade"]["outcome"] == "Succeeded"
    # The store moved with its sub-topology's ordinal (KIP-816); the plugin shows it.
    view = json.loads(user("status", APP, "-o", "json"))
    assert view["stores"] == {STORE: 2} and view["status"]["revision"] == "3"
    text = user("status", APP)
    print(text)  # the last upgrade's steps with their durations, as docs/operator.md shows
    assert "Last upgrade: wordcount:topology@1 -> wordcount:topology_v2@3, Succeeded" in text
    assert "not tried again until spec.topology changes: wordcount:no_such_topology@2" not in text
    again = user.run("upgrade", APP, "--topology", "wordcount:topology_v2", "--revision", "3")
    assert again.returncode == 1
    assert "already is wordcount:topology_v2@3" in again.stderr


def _task(text: str) -> TaskId:
    return TaskId.parse(text)
