"""Desired objects: every spec field lands where the pod contract says (docs/operator.md),
and every object is valid against the Kubernetes 1.32 schemas."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from eddyline_operator.reconcile import names, objects
from eddyline_operator.reconcile.plan import parse_app
from eddyline_runtime.config import StreamsConfig
from tests.support.control_plane.kubelet import CAPACITY
from tests.support.control_plane.pods import resource_field_value
from tests.support.k8s_objects import body

Obj = dict[str, Any]
OWNER = objects.owner_reference(name="wc", uid="uid-1")


def build(**spec: Any) -> dict[str, Obj]:
    app = parse_app(body(**spec))
    found = objects.desired_objects(
        app, "apps", OWNER, default_image="eddyline:default", log_node="node-1"
    )
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in found}


def container(built: dict[str, Obj]) -> Obj:
    result: Obj = built["StatefulSet/wc"]["spec"]["template"]["spec"]["containers"][0]
    return result


def pod_spec(built: dict[str, Obj]) -> Obj:
    result: Obj = built["StatefulSet/wc"]["spec"]["template"]["spec"]
    return result


def config_hash(built: dict[str, Obj]) -> str:
    template = built["StatefulSet/wc"]["spec"]["template"]
    return str(template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH])


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"log": {"url": "sqlite:///state/log.db"}},
        {"log": {"url": "kafka://k:9092", "secretName": "kafka-auth"}},
        {"resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}},
        {"storage": {"storageClassName": "fast", "whenDeleted": "Delete"}, "suspend": True},
    ],
)
def test_every_object_is_valid_kubernetes(spec: Obj) -> None:
    for name, obj in build(**spec).items():
        assert kubernetes_validate.validate(obj, "1.32", strict=True) == "1.32", name


def test_every_object_is_owned_by_the_stream_app() -> None:
    for name, obj in build().items():
        assert obj["metadata"]["ownerReferences"] == [OWNER], name
        assert obj["metadata"]["namespace"] == "apps"
        assert obj["metadata"]["labels"][names.LABEL_INSTANCE] == "wc"


def test_the_owned_objects_are_the_ones_the_issue_names() -> None:
    assert set(build()) == {
        "ServiceAccount/wc-runtime",
        "Role/wc-membership",
        "RoleBinding/wc-membership",
        "ConfigMap/wc-config",
        "Service/wc-headless",
        "Service/wc-query",
        "PodDisruptionBudget/wc",
        "StatefulSet/wc",
    }
    assert "PersistentVolumeClaim/wc-log" in build(log={"url": "sqlite:///log.db"})


def test_image_and_pull_policy_reach_the_container() -> None:
    assert container(build())["image"] == "example/wordcount:1"
    assert container(build(image=None))["image"] == "eddyline:default"
    assert container(build(imagePullPolicy="Always"))["imagePullPolicy"] == "Always"
    assert container(build())["imagePullPolicy"] == "IfNotPresent"


def test_replicas_and_suspend_set_the_stateful_set_size() -> None:
    assert build(replicas=5)["StatefulSet/wc"]["spec"]["replicas"] == 5
    assert build(replicas=5, suspend=True)["StatefulSet/wc"]["spec"]["replicas"] == 0


def test_the_stateful_set_runs_pods_in_parallel_and_restarts_them_through_the_operator() -> None:
    spec = build()["StatefulSet/wc"]["spec"]
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    assert spec["serviceName"] == "wc-headless"


def test_the_topology_reference_is_in_the_rendered_manifest_and_the_revision_on_the_pod() -> None:
    built = build(topology={"ref": "wordcount:topology", "revision": "7"})
    manifest = yaml.safe_load(built["ConfigMap/wc-config"]["data"][names.MANIFEST_KEY])
    assert manifest["spec"]["topology"]["ref"] == "wordcount:topology"
    assert manifest["spec"]["topology"]["revision"] == "7"
    template = built["StatefulSet/wc"]["spec"]["template"]
    assert template["metadata"]["labels"][names.LABEL_REVISION] == "7"
    env = {e["name"]: e.get("value") for e in container(built)["env"]}
    assert env["EDDYLINE_TOPOLOGY_REVISION"] == "7"


def test_a_bare_topology_string_is_read_as_its_ref() -> None:
    built = build(topology="wordcount:topology")
    manifest = yaml.safe_load(built["ConfigMap/wc-config"]["data"][names.MANIFEST_KEY])
    assert manifest["spec"]["topology"]["ref"] == "wordcount:topology"


def test_the_pod_runs_eddyline_as_a_cluster_member() -> None:
    c = container(build())
    assert c["command"] == ["eddyline"]
    assert c["args"][:6] == [
        "run",
        "/etc/eddyline/streamapp.yaml",
        "--instance-id",
        "$(POD_NAME)",
        "--membership-configmap",
        "wc-membership",
    ]
    env = {e["name"]: e for e in c["env"]}
    assert env["EDDYLINE_APPLICATION_SERVER"]["value"] == "$(POD_IP):7070"
    assert env["EDDYLINE_STATE_DIR"]["value"] == names.STATE_MOUNT
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    names_in_order = [e["name"] for e in c["env"]]
    assert names_in_order.index("POD_IP") < names_in_order.index("EDDYLINE_APPLICATION_SERVER")
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # A liveness kill (a hung process) waits 5 s, not the pod's 60 s grace (issue 23, item 3).
    assert c["livenessProbe"]["terminationGracePeriodSeconds"] == 5
    assert pod_spec(build())["terminationGracePeriodSeconds"] == 60
    assert c["ports"] == [{"name": "query", "containerPort": 7070, "protocol": "TCP"}]


def test_pods_run_as_non_root_on_a_read_only_root() -> None:
    spec = pod_spec(build())
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["serviceAccountName"] == "wc-runtime"


def test_pods_may_only_read_their_membership() -> None:
    role = build()["Role/wc-membership"]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["wc-membership"],
            "verbs": ["get", "list", "watch"],
        }
    ]


def test_a_kafka_log_spreads_pods_over_the_zone_key() -> None:
    spec = pod_spec(build(standbyPlacement={"topologyKey": "example.com/rack"}))
    constraint = spec["topologySpreadConstraints"][0]
    assert constraint["topologyKey"] == "example.com/rack"
    assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
    anti = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "example.com/rack"
    required = pod_spec(build(standbyPlacement={"spread": "Required"}))
    assert required["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"
    assert container(build())["args"][-1] == "kafka://kafka-0:9092,kafka-1:9092"
    assert "PersistentVolumeClaim/wc-log" not in build()


def test_the_embedded_log_pins_every_pod_to_one_node_on_one_shared_claim() -> None:
    built = build(log={"url": "sqlite:///.eddyline-state/wordcount/log.db"})
    spec = pod_spec(built)
    assert "topologySpreadConstraints" not in spec
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-1"]
    assert {"name": "log", "persistentVolumeClaim": {"claimName": "wc-log"}} in spec["volumes"]
    assert container(built)["args"][-1] == "sqlite:////var/lib/eddyline/log/log.db"
    manifest = yaml.safe_load(built["ConfigMap/wc-config"]["data"][names.MANIFEST_KEY])
    assert manifest["spec"]["log"]["url"] == "sqlite:////var/lib/eddyline/log/log.db"


def test_a_log_secret_is_mounted_for_the_kafka_client() -> None:
    built = build(log={"url": "kafka://k:9092", "secretName": "kafka-auth"})
    assert {"name": "log-secret", "secret": {"secretName": "kafka-auth"}} in pod_spec(built)[
        "volumes"
    ]
    env = {e["name"]: e.get("value") for e in container(built)["env"]}
    assert env["EDDYLINE_LOG_SETTINGS"] == objects.LOG_SECRET_MOUNT


def test_settings_are_rendered_once_and_pod_paths_only_in_the_env() -> None:
    """The ConfigMap holds one copy of the settings (the manifest pods run); state.dir and
    application.server are the pod's env alone, never a local value left in the manifest."""
    built = build(
        config={
            "processing.guarantee": "exactly_once_v2",
            "state.dir": "/somewhere/local",
            "application.server": "localhost:1",
            "max.task.idle.ms": -1,
            "statestore.uncommitted.max.bytes": -1,
        }
    )
    data = built["ConfigMap/wc-config"]["data"]
    assert set(data) == {names.MANIFEST_KEY}
    settings = yaml.safe_load(data[names.MANIFEST_KEY])["spec"]["config"]
    assert "state.dir" not in settings and "application.server" not in settings
    assert settings["max.task.idle.ms"] == -1
    assert settings["statestore.uncommitted.max.bytes"] == -1
    assert settings["processing.guarantee"] == "exactly_once_v2"
    env = {e["name"]: e.get("value") for e in container(built)["env"]}
    assert env["EDDYLINE_STATE_DIR"] == names.STATE_MOUNT
    # What a pod builds from the two: the volume, whatever the spec said for local runs.
    pod_settings = StreamsConfig.from_properties(
        settings, environ={"EDDYLINE_STATE_DIR": env["EDDYLINE_STATE_DIR"]}
    )
    assert str(pod_settings.state_dir) == names.STATE_MOUNT


def test_storage_fields_shape_the_claims_and_their_retention() -> None:
    built = build(
        log={"url": "sqlite:///log.db"},
        storage={"size": "20Gi", "storageClassName": "fast", "logSize": "5Gi"},
    )
    claim = built["StatefulSet/wc"]["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    retention = built["StatefulSet/wc"]["spec"]["persistentVolumeClaimRetentionPolicy"]
    assert retention == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    log_claim = built["PersistentVolumeClaim/wc-log"]
    assert log_claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert "ownerReferences" not in log_claim["metadata"]  # kept: state is expensive
    deleting = build(log={"url": "sqlite:///log.db"}, storage={"whenDeleted": "Delete"})
    assert deleting["PersistentVolumeClaim/wc-log"]["metadata"]["ownerReferences"] == [OWNER]
    policy = deleting["StatefulSet/wc"]["spec"]["persistentVolumeClaimRetentionPolicy"]
    assert policy["whenDeleted"] == "Delete"


def test_resources_reach_the_container() -> None:
    c = container(build(resources={"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}))
    assert c["resources"] == {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}
    assert "resources" not in container(build())


def test_the_pdb_allows_one_pod_down() -> None:
    assert build()["PodDisruptionBudget/wc"]["spec"]["maxUnavailable"] == 1


def test_services_select_the_pods_and_serve_the_query_port() -> None:
    built = build()
    headless, query = built["Service/wc-headless"], built["Service/wc-query"]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    selector = built["StatefulSet/wc"]["spec"]["selector"]["matchLabels"]
    assert headless["spec"]["selector"] == query["spec"]["selector"] == selector
    assert query["spec"]["ports"][0]["port"] == 7070
    # Ready pods only, outside a topology upgrade (test_reconcile_upgrade: every pod during).
    assert query["spec"]["publishNotReadyAddresses"] is False


def test_the_config_hash_changes_with_what_pods_run_and_only_with_that() -> None:
    base = config_hash(build())
    assert config_hash(build()) == base
    assert config_hash(build(image="example/wordcount:2")) != base
    assert config_hash(build(config={"num.standby.replicas": 2})) != base
    assert config_hash(build(topology={"ref": "wordcount:topology", "revision": "2"})) != base
    assert config_hash(build(replicas=5)) == base  # scaling restarts nothing
    assert config_hash(build(suspend=True)) == base


def test_local_only_fields_are_not_rendered_for_pods() -> None:
    manifest = yaml.safe_load(
        build(zones=["a", "b"])["ConfigMap/wc-config"]["data"][names.MANIFEST_KEY]
    )
    assert "zones" not in manifest["spec"]


@pytest.mark.parametrize("example", ["wordcount", "click_enrichment", "custom_processor"])
def test_each_example_has_a_cluster_manifest_the_operator_accepts(example: str) -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    document = yaml.safe_load((root / "examples" / example / "streamapp.cluster.yaml").read_text())
    app = parse_app({**document, "metadata": {**document["metadata"], "namespace": "default"}})
    assert app.spec.replicas == 3
    assert app.streams_config().num_standby_replicas == 1
    assert objects.uses_embedded_log(app)
    built = objects.desired_objects(app, "default", OWNER, default_image="x", log_node="node-0")
    assert "PersistentVolumeClaim" in [o["kind"] for o in built]


def test_the_pod_learns_its_memory_limit_through_the_downward_api() -> None:
    c = container(build(resources={"limits": {"memory": "2Gi"}}))
    env = {e["name"]: e for e in c["env"]}
    ref = env["EDDYLINE_MEMORY_LIMIT_BYTES"]["valueFrom"]["resourceFieldRef"]
    # The runtime reads memory.limit.bytes from this variable (EDDYLINE_ + the key).
    assert ref == {"containerName": c["name"], "resource": "limits.memory"}
    assert c["resources"]["limits"]["memory"] == "2Gi"
    assert env["EDDYLINE_MEMORY_LIMIT_BYTES"].get("value") is None


@pytest.mark.parametrize(
    ("resources", "expected"),
    [({"limits": {"memory": "2Gi"}}, 2 * 2**30), ({}, 16 * 2**30)],
    ids=["the container's limit", "no limit: the node's allocatable memory"],
)
def test_the_runtime_reads_the_limit_the_kubelet_resolves(
    resources: Obj, expected: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = container(build(resources=resources))
    ref = next(e for e in c["env"] if e["name"] == "EDDYLINE_MEMORY_LIMIT_BYTES")
    # The control plane's kubelet stand-in resolves it as a kubelet does.
    field_ref = ref["valueFrom"]["resourceFieldRef"]
    value = resource_field_value(c, field_ref, CAPACITY)
    # As the API server returns it: an unset divisor comes back as "0", read as 1.
    assert resource_field_value(c, {**field_ref, "divisor": "0"}, CAPACITY) == value
    assert resource_field_value(c, {**field_ref, "divisor": "1Mi"}, CAPACITY) == str(
        expected // 2**20
    )
    monkeypatch.setenv("EDDYLINE_MEMORY_LIMIT_BYTES", value)
    assert StreamsConfig.from_properties({}).memory_limit_bytes == expected
