"""The Spark settings and the executor pod template the executor role and the admission
policies rely on (``reconcile/restore_executors.py``; the calls are in docs/operator.md)."""

from __future__ import annotations

import kubernetes_validate

from eddyline_operator.reconcile import restore_executors


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
    assert path == f"{restore_executors.TEMPLATE_MOUNT}/{restore_executors.TEMPLATE_KEY}"
    template = restore_executors.executor_pod_template("counts-restore", {"a": "b"})
    kubernetes_validate.validate(template, "1.32", strict=True)
    assert template["metadata"]["labels"] == {"a": "b"}
    spec = template["spec"]
    assert spec["serviceAccountName"] == "counts-restore"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # Spark adds the only volume at /tmp (its local dir); the template adds none.
    assert "volumes" not in spec
    (container,) = spec["containers"]
    assert container["name"] == conf["spark.kubernetes.executor.podTemplateContainerName"]
    assert container["workingDir"] == "/tmp"
    assert "volumeMounts" not in container
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_only_a_kubernetes_master_runs_executor_pods() -> None:
    assert restore_executors.uses_executor_pods("k8s://https://kubernetes.default.svc")
    assert not restore_executors.uses_executor_pods("local[2]")
