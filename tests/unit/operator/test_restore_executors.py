"""The Spark settings the executor role and the admission policy rely on
(``reconcile/restore_executors.py``; the calls are in docs/operator.md)."""

from __future__ import annotations

import yaml

from eddyline_operator.reconcile import names, objects, restore_executors
from eddyline_operator.reconcile.plan import parse_app
from eddyline_runtime.spec import StreamApp
from tests.support.k8s_objects import body


def test_the_settings_turn_off_every_call_the_executor_role_does_not_grant() -> None:
    conf = restore_executors.spark_conf("counts-restore")
    assert conf["spark.kubernetes.executor.disableConfigMap"] == "true"  # no ConfigMaps
    assert conf["spark.kubernetes.driver.service.deleteOnTermination"] == "false"  # no Services
    assert conf["spark.kubernetes.driver.ownPersistentVolumeClaim"] == "false"  # no claims
    assert conf["spark.kubernetes.driver.reusePersistentVolumeClaim"] == "false"
    assert conf["spark.kubernetes.allocation.pods.allocator"] == "direct"  # no pod patches
    assert conf["spark.kubernetes.executor.deleteOnTermination"] == "true"
    assert conf["spark.kubernetes.authenticate.executor.serviceAccountName"] == "counts-restore"


def test_the_executor_template_is_restricted_and_carries_no_api_token() -> None:
    conf = restore_executors.spark_conf("counts-restore")
    path = conf["spark.kubernetes.executor.podTemplateFile"]
    assert path == f"{names.CONFIG_MOUNT}/{restore_executors.POD_TEMPLATE_KEY}"
    spec = restore_executors.executor_pod_template()["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    assert container["name"] == conf["spark.kubernetes.executor.podTemplateContainerName"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def _app(**restore: str) -> StreamApp:
    return parse_app(body(restore=restore))


def test_the_apps_configmap_carries_the_template_only_for_executor_pods() -> None:
    """The driver reads it at spark.kubernetes.executor.podTemplateFile (the Job mounts the
    app's ConfigMap there); a local master and no restore get none."""
    key = restore_executors.POD_TEMPLATE_KEY
    owner: dict[str, str] = {}
    k8s = _app(when="Always", master="k8s://https://kubernetes.default.svc")
    data = objects.config_map(k8s, "ns", owner)["data"]
    assert yaml.safe_load(data[key]) == restore_executors.executor_pod_template()
    local = _app(when="Always", master="local[2]")
    assert key not in objects.config_map(local, "ns", owner)["data"]
    never = _app(when="Never", master="k8s://https://kubernetes.default.svc")
    assert key not in objects.config_map(never, "ns", owner)["data"]
