"""What a restore Job's Spark driver must set so its executor pods get by with the chart's
executor role and pass its admission policy. Pure.

The chart's ClusterRole ``<release>-restore-executor`` (``templates/rbac.yaml``) grants a
restore account pod calls only, and the ValidatingAdmissionPolicy
``<release>-restore-executors`` (``templates/admission.yaml``) lets it create only executor
pods of its own Job. Spark 4.2 in client mode (fabric8 7.6) stays inside both only with
the settings below; ``docs/operator.md`` ("What restore executors may do") lists the calls.
A ``k8s://`` Job's ``--conf`` settings (``reconcile/restore_job.py``) must include
:func:`spark_conf`; the executor pod template (:func:`executor_pod_template`) it names is in
the app's ConfigMap under :data:`POD_TEMPLATE_KEY` (``objects.config_map``), which the Job's
pod mounts at ``names.CONFIG_MOUNT``.
"""

from __future__ import annotations

from typing import Any

from eddyline_operator.reconcile import names, security

Obj = dict[str, Any]

# The ConfigMap key, and where the Job's pod (which mounts the app's ConfigMap) finds it.
POD_TEMPLATE_KEY = "executor-pod-template.yaml"
POD_TEMPLATE_PATH = f"{names.CONFIG_MOUNT}/{POD_TEMPLATE_KEY}"
# Spark's name for the executor container (BasicExecutorFeatureStep's default).
EXECUTOR_CONTAINER = "spark-kubernetes-executor"


def uses_executor_pods(master: str) -> bool:
    """Whether a Spark master runs executors as pods (``k8s://``); a local one runs none."""
    return master.startswith("k8s://")


def spark_conf(service_account: str) -> dict[str, str]:
    """Settings the executor role and the admission policy rely on, for a ``k8s://`` master
    (``service_account``: the Job's, ``<app>-restore``)."""
    return {
        # The role grants no ConfigMaps: without this the driver's start creates one (and
        # fails on the refusal). It only carries SPARK_CONF_DIR's files to executors; ours has
        # none, and executors get the Spark settings from the driver when they register.
        "spark.kubernetes.executor.disableConfigMap": "true",
        # The role grants no Services: client mode makes no driver Service, and this stops
        # the driver from deleting Services by label when it stops.
        "spark.kubernetes.driver.service.deleteOnTermination": "false",
        # The role grants no claims: executors mount the app's own claims by name (no
        # OnDemand claims); these stop the driver listing claims to reuse and deleting them by
        # label at the end (both true by default since Spark 3.4).
        "spark.kubernetes.driver.ownPersistentVolumeClaim": "false",
        "spark.kubernetes.driver.reusePersistentVolumeClaim": "false",
        # Spark's own allocator (executor ids in the pod); "statefulset" and "deployment" need
        # other kinds and patching pods.
        "spark.kubernetes.allocation.pods.allocator": "direct",
        # A finished executor is deleted (the role's delete), not labelled inactive (patch).
        "spark.kubernetes.executor.deleteOnTermination": "true",
        # The policy wants executors to run as the Job's account; Spark's default is none
        # (the namespace's "default") in client mode.
        "spark.kubernetes.authenticate.executor.serviceAccountName": service_account,
        # The policy's securityContext and no API token: Spark has settings for neither.
        "spark.kubernetes.executor.podTemplateFile": POD_TEMPLATE_PATH,
        "spark.kubernetes.executor.podTemplateContainerName": EXECUTOR_CONTAINER,
    }


def executor_pod_template() -> Obj:
    """The pod Spark starts each executor from: Pod Security ``restricted``, as the app's
    pods, and no API token (executors never call the API, so none can make more pods)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": security.pod_security_context(),
            "containers": [
                {
                    "name": EXECUTOR_CONTAINER,
                    "securityContext": security.container_security_context(),
                }
            ],
        },
    }
