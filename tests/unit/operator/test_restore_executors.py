"""The Spark settings the executor role and the admission policy rely on
(``reconcile/restore_executors.py``; the calls are in docs/operator.md)."""

from __future__ import annotations

from eddyline_operator.reconcile import names, restore_executors


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
