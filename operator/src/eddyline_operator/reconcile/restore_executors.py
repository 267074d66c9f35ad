"""What a restore Job's Spark driver must set so its executor pods get by with the chart's
executor role and pass its admission policies, and the pod template they start from. Pure.

The chart's ClusterRole ``<release>-restore-executor`` (``templates/rbac.yaml``) grants a
restore account pod calls only, and the ValidatingAdmissionPolicies
``<release>-restore-executors`` and ``<release>-restore-executor-image``
(``templates/admission.yaml``) let it create only executor pods of its own Job. Spark 4.2 in
client mode (fabric8 7.6) stays inside both only with :func:`spark_conf` (a ``k8s://`` Job's
``--conf`` settings include it, ``reconcile/restore_job.py``) and the pod template
:func:`executor_pod_template`, which the operator writes to the ConfigMap
``<app>-restore-executor`` (key :data:`TEMPLATE_KEY`) that the Job's pod mounts at
:data:`TEMPLATE_MOUNT`. ``docs/operator.md`` ("What restore executors may do") lists the
calls the driver makes, as recorded on real nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eddyline_operator.reconcile import security

Obj = dict[str, Any]

# Where the Job's pod mounts the template ConfigMap, and its key there.
TEMPLATE_MOUNT = "/etc/eddyline/restore-executor"
TEMPLATE_KEY = "pod-template.yaml"
# The template's container; Spark puts the executor into it (podTemplateContainerName).
EXECUTOR_CONTAINER = "executor"
# Spark's labels on the pods it creates: the role, and the application they serve.
SPARK_ROLE_LABEL = "spark-role"
SPARK_APP_LABEL = "spark-app-selector"


def uses_executor_pods(master: str) -> bool:
    """Whether a Spark master runs executors as pods (``k8s://``); a local one runs none."""
    return master.startswith("k8s://")


def spark_conf(service_account: str) -> dict[str, str]:
    """Settings the executor role and the admission policies rely on, for a ``k8s://``
    master (``service_account``: the Job's, ``<app>-restore``)."""
    return {
        # The role grants no ConfigMaps, and the policy refuses a ConfigMap volume: without
        # this the driver creates one per application (SPARK_CONF_DIR's files, ours has none)
        # and mounts it into every executor. Executors get the settings when they register.
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
        "spark.kubernetes.executor.podTemplateFile": f"{TEMPLATE_MOUNT}/{TEMPLATE_KEY}",
        "spark.kubernetes.executor.podTemplateContainerName": EXECUTOR_CONTAINER,
    }


def executor_pod_template(service_account: str, labels: Mapping[str, str]) -> Obj:
    """The pod template Spark starts every executor pod from. Spark keeps what it does not
    set itself: the identity without its API token (executors never call the API, so none
    can make more pods), Pod Security ``restricted`` (as the app's pods), the working
    directory ``/tmp`` under a read-only root, and the spread over nodes. It adds the image
    (``spark.kubernetes.container.image``), the ``executor`` argument, its environment, cpu
    and memory, the claims, its local-dir volume and the driver pod as controlling owner."""
    container: Obj = {
        "name": EXECUTOR_CONTAINER,
        # Spark fetches the jars the driver serves (the Kafka connector) into the working
        # directory, and the Python workers write there: it must be writable, and the root
        # file system is not. /tmp is: Spark mounts an emptyDir at each spark.local.dir path
        # (the Job sets /tmp), so the template mounts nothing there itself (a second volume
        # at /tmp makes the pod invalid: the API server answers 422).
        "workingDir": "/tmp",
        "securityContext": security.container_security_context(),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"labels": dict(labels)},
        "spec": {
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,
            "securityContext": security.pod_security_context(),
            "containers": [container],
            # One application's executors spread over nodes, so a build uses the cluster's
            # cores rather than one node's; a node the build's claim cannot reach does not
            # count (nodeAffinityPolicy Honor, the default).
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {SPARK_ROLE_LABEL: "executor"}},
                    "matchLabelKeys": [SPARK_APP_LABEL],
                }
            ],
        },
    }
