"""The objects a StreamApp owns, as plain dicts: what the client wrapper applies.

Each builder is a pure function of the parsed spec and a few observed facts
(the owner reference, the node the embedded log is pinned to). The pod
template follows the pod contract in ``docs/operator.md``: every path a pod
uses appears in its args or env, so a stand-in kubelet can map volumes.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import PurePosixPath
from typing import Any

import yaml

from eddyline_operator.reconcile import names, restore_job, security
from eddyline_runtime.log.kafka_settings import LOG_SETTINGS_ENV
from eddyline_runtime.membership import MEMBERSHIP_FILE
from eddyline_runtime.spec import API_VERSION, KIND, ClaimRetention, SpreadPolicy, StreamApp

Obj = dict[str, Any]

# The runtime image when spec.image is empty (the operator's own image carries both).
DEFAULT_IMAGE = "ghcr.io/eddyline/eddyline:0.1.0"
# The database file on the shared log claim when the spec's sqlite path names none.
DEFAULT_LOG_FILE = "log.db"
# The image's non-root user (Dockerfile: useradd --uid 10001).
RUNTIME_UID = security.RUNTIME_UID
# Readiness is checked every second (the least Kubernetes allows): it gates the query
# Service, the Ready condition and the rollout's next step, and /readyz answers from memory.
READINESS_PERIOD_SECONDS = 1
# Liveness is slower: a container restart costs a restore, so it must really be stuck.
LIVENESS_PERIOD_SECONDS = 10
LIVENESS_FAILURES = 3
# A liveness kill is for a process that stopped answering: it will not use the pod's 60 s
# to commit (a hung one never does), and exactly-once makes the kill safe, so it gets only
# this long between SIGTERM and SIGKILL (the probe-level grace period, Kubernetes >= 1.28)
# instead of stalling its tasks for the pod's whole grace period.
LIVENESS_KILL_GRACE_SECONDS = 5
# Start-up (state relocation, topic resolution) may take a while on big state: 5 minutes.
STARTUP_PERIOD_SECONDS = 2
STARTUP_FAILURES = 150
# A pod gets this long on SIGTERM to hand its active tasks over to caught-up copies (the
# runtime keeps a quarter of it for the final commit and closing its stores).
TERMINATION_GRACE_SECONDS = 60
TERMINATION_GRACE_ENV = "EDDYLINE_TERMINATION_GRACE_SECONDS"
# Where the runtime writes why it stopped (the kubelet's default path).
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
# The runtime's memory.limit.bytes (config.py), filled from the container's limits.memory.
MEMORY_LIMIT_ENV = "EDDYLINE_MEMORY_LIMIT_BYTES"
# Where a Secret with Kafka client settings is mounted (spec.log.secretName).
LOG_SECRET_MOUNT = "/etc/eddyline/log-secret"


def owner_reference(*, name: str, uid: str) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(name: str, namespace: str, app: str, component: str, owner: Obj | None) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace, "labels": names.labels(app, component)}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return meta


def uses_embedded_log(app: StreamApp) -> bool:
    return app.spec.log.url.startswith("sqlite:")


def pod_log_url(app: StreamApp) -> str:
    """The log URL pods open: the embedded log's file moves onto the shared claim."""
    url = app.spec.log.url
    if not uses_embedded_log(app):
        return url
    file_name = PurePosixPath(url.removeprefix("sqlite:///")).name or DEFAULT_LOG_FILE
    return f"sqlite:///{names.LOG_MOUNT}/{file_name}"


# Settings the pod's environment gives (EDDYLINE_<NAME>, pod_template): state.dir and the
# restore build dir are paths on the pod's volumes (every path a pod uses is in its env),
# application.server its own IP. Never in the manifest, so each is set in one place.
POD_ENV_SETTINGS = ("state.dir", "application.server", "restore.build.dir")


def rendered_config(app: StreamApp) -> dict[str, str | int | float | bool]:
    """The Kafka Streams settings pods load: the spec's, and the restore waits of
    spec.restore; what the pod's environment sets is left out (POD_ENV_SETTINGS)."""
    settings = {**app.spec.config, **restore_job.pod_settings(app)}
    return dict(sorted((k, v) for k, v in settings.items() if k not in POD_ENV_SETTINGS))


def rendered_manifest(app: StreamApp, namespace: str) -> Obj:
    """The StreamApp as ``eddyline run`` reads it inside a pod."""
    spec = app.spec.model_dump(by_alias=True, mode="json", exclude_defaults=False)
    spec["config"] = rendered_config(app)
    spec["log"] = {"url": pod_log_url(app)}
    spec.pop("zones", None)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": app.metadata.name, "namespace": namespace},
        "spec": spec,
    }


def config_map(app: StreamApp, namespace: str, owner: Obj) -> Obj:
    """The manifest pods run (``eddyline run /etc/eddyline/streamapp.yaml``): the one copy
    of their settings."""
    name = app.metadata.name
    data = {names.MANIFEST_KEY: _yaml_text(json.dumps(rendered_manifest(app, namespace)))}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(names.config_map(name), namespace, name, "config", owner),
        "data": data,
    }


# The manifest is rendered every cycle and changes only with the spec: PyYAML's dump of it
# was, with the parse of the applied one, most of a settled cycle's CPU with many apps
# (issue 38). Keyed by the document's JSON (key order kept, as the dump keeps it).
@functools.lru_cache(maxsize=1024)
def _yaml_text(document: str) -> str:
    return yaml.safe_dump(json.loads(document), sort_keys=False)


def membership_config_map(app_name: str, namespace: str, owner: Obj, data: str) -> Obj:
    """The membership the operator publishes; pods watch it (cluster_membership.py)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(names.membership_map(app_name), namespace, app_name, "membership", owner),
        "data": {MEMBERSHIP_FILE: data},
    }


def service_account(app: StreamApp, namespace: str, owner: Obj) -> Obj:
    name = app.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(names.runtime_account(name), namespace, name, "runtime", owner),
    }


def membership_role(app: StreamApp, namespace: str, owner: Obj) -> Obj:
    """Pods may read and watch their app's membership ConfigMap, and nothing else."""
    name = app.metadata.name
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(names.membership_map(name), namespace, name, "runtime", owner),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [names.membership_map(name)],
                "verbs": ["get", "list", "watch"],
            }
        ],
    }


def membership_role_binding(app: StreamApp, namespace: str, owner: Obj) -> Obj:
    name = app.metadata.name
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(names.membership_map(name), namespace, name, "runtime", owner),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": names.membership_map(name),
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": names.runtime_account(name), "namespace": namespace}
        ],
    }


def headless_service(app: StreamApp, namespace: str, owner: Obj) -> Obj:
    """Stable DNS per pod; lists pods before they are ready (the operator reaches them)."""
    name = app.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(names.headless_service(name), namespace, name, "headless", owner),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": names.selector_labels(name),
            "ports": [_service_port()],
        },
    }


def query_service(app: StreamApp, namespace: str, owner: Obj, *, upgrading: bool = False) -> Obj:
    """Interactive queries, load-balanced over the pods (they route keys themselves): the
    Ready ones, and while a topology upgrade runs every pod, Ready or not.

    A pod's ``Ready`` is processing readiness. Through a topology upgrade no pod processes
    (Stopping pauses them all, Publishing replaces them, Starting assigns), yet each
    serves the copies it holds (``/readyz/serving``): a Service of Ready pods only had no
    endpoint at all then. So ``publishNotReadyAddresses`` is on while ``status.upgrade``
    exists; a request may then reach a pod that cannot answer it (a 503, refused while it
    starts, a frozen one) and the ``QueryRouter`` asks the other members. Outside an
    upgrade it is off, so a pod its kubelet finds unready (frozen, overloaded, restoring)
    leaves the Service, as Kubernetes users expect (docs/queries.md, "The query Service")."""
    name = app.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(names.query_service(name), namespace, name, "query", owner),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector_labels(name),
            "publishNotReadyAddresses": upgrading,
            "ports": [_service_port()],
        },
    }


def _service_port() -> Obj:
    return {
        "name": names.QUERY_PORT_NAME,
        "port": names.QUERY_PORT,
        "targetPort": names.QUERY_PORT_NAME,
        "protocol": "TCP",
    }


def pod_disruption_budget(app: StreamApp, namespace: str, owner: Obj) -> Obj:
    name = app.metadata.name
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(name, namespace, name, "runtime", owner),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": names.selector_labels(name)},
        },
    }


def log_claim(app: StreamApp, namespace: str, owner: Obj) -> Obj:
    """The one claim every pod shares for the embedded log (all pods on one node).

    Owned by the StreamApp (deleted with it) only when storage.whenDeleted is Delete."""
    name = app.metadata.name
    storage = app.spec.storage
    keep = storage.when_deleted is ClaimRetention.RETAIN
    spec: Obj = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": storage.log_size}},
    }
    if storage.storage_class_name:
        spec["storageClassName"] = storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(names.log_claim(name), namespace, name, "log", None if keep else owner),
        "spec": spec,
    }


def pod_template(app: StreamApp, *, default_image: str, log_node: str | None) -> Obj:
    """The pod template, with the hash of everything in it as an annotation.

    Pods whose hash differs are outdated: the operator restarts them itself
    (updateStrategy OnDelete), one at a time, or all together for a topology
    revision change."""
    name = app.metadata.name
    spec = app.spec
    manifest_path = f"{names.CONFIG_MOUNT}/{names.MANIFEST_KEY}"
    container: Obj = {
        "name": names.CONTAINER,
        "image": spec.image or default_image,
        "imagePullPolicy": spec.image_pull_policy.value,
        "command": ["eddyline"],
        "args": [
            "run",
            manifest_path,
            "--instance-id",
            "$(POD_NAME)",
            names.MEMBERSHIP_FLAG,
            names.membership_map(name),
            "--log-url",
            pod_log_url(app),
        ],
        "env": [
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            _field_env("POD_IP", "status.podIP"),
            {"name": "EDDYLINE_APPLICATION_SERVER", "value": f"$(POD_IP):{names.QUERY_PORT}"},
            {"name": "EDDYLINE_STATE_DIR", "value": names.STATE_MOUNT},
            {"name": "EDDYLINE_TOPOLOGY_REVISION", "value": spec.topology.revision},
            {"name": "EDDYLINE_TERMINATION_MESSAGE_PATH", "value": TERMINATION_MESSAGE_PATH},
            # A leaving pod hands its tasks over within this, less a final commit's margin
            # (the downward API does not expose terminationGracePeriodSeconds).
            {"name": TERMINATION_GRACE_ENV, "value": str(TERMINATION_GRACE_SECONDS)},
            # memory.limit.bytes: RocksDB's memory is capped at a share of it (without a
            # limit, Kubernetes gives the node's allocatable memory, still a bound).
            {
                "name": MEMORY_LIMIT_ENV,
                "valueFrom": {
                    "resourceFieldRef": {
                        "containerName": names.CONTAINER,
                        "resource": "limits.memory",
                    }
                },
            },
        ],
        # A pod that refuses to start (KIP-816 relocation refused, say) writes why here; the
        # operator reads it from the container's terminated state to roll an upgrade back.
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "ports": [
            {"name": names.QUERY_PORT_NAME, "containerPort": names.QUERY_PORT, "protocol": "TCP"}
        ],
        "readinessProbe": _probe("/readyz", READINESS_PERIOD_SECONDS, 1),
        "livenessProbe": {
            **_probe("/healthz", LIVENESS_PERIOD_SECONDS, LIVENESS_FAILURES),
            "terminationGracePeriodSeconds": LIVENESS_KILL_GRACE_SECONDS,
        },
        "startupProbe": _probe("/healthz", STARTUP_PERIOD_SECONDS, STARTUP_FAILURES),
        "volumeMounts": [
            {"name": "config", "mountPath": names.CONFIG_MOUNT, "readOnly": True},
            {"name": "state", "mountPath": names.STATE_MOUNT},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "securityContext": security.container_security_context(),
    }
    resources = {
        key: dict(value)
        for key, value in (
            ("requests", spec.resources.requests),
            ("limits", spec.resources.limits),
        )
        if value
    }
    if resources:
        container["resources"] = resources
    volumes: list[Obj] = [
        {"name": "config", "configMap": {"name": names.config_map(name)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if uses_embedded_log(app):
        container["volumeMounts"].append({"name": "log", "mountPath": names.LOG_MOUNT})
        volumes.append(
            {"name": "log", "persistentVolumeClaim": {"claimName": names.log_claim(name)}}
        )
    restore_volume = restore_job.pod_volume(app)
    if restore_volume is not None:
        container["volumeMounts"].append(restore_volume[0])
        volumes.append(restore_volume[1])
        # In the env too, as state.dir is: every path a pod uses appears in its args or env.
        container["env"].append(
            {"name": "EDDYLINE_RESTORE_BUILD_DIR", "value": restore_volume[0]["mountPath"]}
        )
    if spec.log.secret_name:
        container["volumeMounts"].append(
            {"name": "log-secret", "mountPath": LOG_SECRET_MOUNT, "readOnly": True}
        )
        # The Kafka adapter reads its client settings from the directory this names.
        container["env"].append({"name": LOG_SETTINGS_ENV, "value": LOG_SECRET_MOUNT})
        volumes.append({"name": "log-secret", "secret": {"secretName": spec.log.secret_name}})
    pod_spec: Obj = {
        "serviceAccountName": names.runtime_account(name),
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": security.pod_security_context(),
        "containers": [container],
        "volumes": volumes,
        **_placement(app, log_node),
    }
    template: Obj = {
        "metadata": {
            "labels": {
                **names.labels(name, "runtime"),
                names.LABEL_REVISION: spec.topology.revision,
            },
            "annotations": {},
        },
        "spec": pod_spec,
    }
    # Pods load the rendered settings once at start: a change in them restarts pods too.
    template["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH] = template_hash(
        template, rendered_config(app)
    )
    return template


def template_hash(template: Obj, settings: Obj) -> str:
    """A hash of the template (without its own hash annotation) and the settings pods load."""
    bare = json.loads(json.dumps(template))
    bare.get("metadata", {}).get("annotations", {}).pop(names.ANNOTATION_CONFIG_HASH, None)
    text = json.dumps([bare, settings], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _placement(app: StreamApp, log_node: str | None) -> Obj:
    """Where pods may run: one node for the embedded log, else spread over zones."""
    selector = {"matchLabels": names.selector_labels(app.metadata.name)}
    if uses_embedded_log(app):
        if log_node is None:
            return {}
        # SQLite's WAL needs every process on one host: pin to the node, no zone spread.
        return {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [log_node]}
                                ]
                            }
                        ]
                    }
                }
            }
        }
    placement = app.spec.standby_placement
    required = placement.spread is SpreadPolicy.REQUIRED
    return {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": placement.topology_key,
                "whenUnsatisfiable": "DoNotSchedule" if required else "ScheduleAnyway",
                "labelSelector": selector,
            }
        ],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": placement.topology_key,
                            "labelSelector": selector,
                        },
                    }
                ]
            }
        },
    }


def _field_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _probe(path: str, period: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": names.QUERY_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 1,
        "failureThreshold": failures,
    }


def stateful_set(
    app: StreamApp, namespace: str, owner: Obj, *, default_image: str, log_node: str | None
) -> Obj:
    name = app.metadata.name
    storage = app.spec.storage
    claim_spec: Obj = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": storage.size}},
    }
    if storage.storage_class_name:
        claim_spec["storageClassName"] = storage.storage_class_name
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(name, namespace, name, "runtime", owner),
        "spec": {
            "replicas": 0 if app.spec.suspended else app.spec.replicas,
            "serviceName": names.headless_service(name),
            # Membership never waits on readiness, so neither does pod creation.
            "podManagementPolicy": "Parallel",
            # The operator restarts outdated pods itself: one at a time once the previous
            # is ready and caught up, or all at once for a topology revision change.
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": names.selector_labels(name)},
            "template": pod_template(app, default_image=default_image, log_node=log_node),
            "volumeClaimTemplates": [
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "state", "labels": names.selector_labels(name)},
                    "spec": claim_spec,
                }
            ],
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": storage.when_deleted.value,
                # Scaling down keeps state: scaling back up finds it (a restore of the tail).
                "whenScaled": "Retain",
            },
        },
    }


def desired_objects(
    app: StreamApp, namespace: str, owner: Obj, *, default_image: str, log_node: str | None
) -> list[Obj]:
    """Everything the app owns except the membership ConfigMap (published separately); the
    StatefulSet last, so that what its pods mount exists when they start."""
    return [
        *owned_objects(app, namespace, owner),
        stateful_set(app, namespace, owner, default_image=default_image, log_node=log_node),
    ]


def owned_objects(
    app: StreamApp,
    namespace: str,
    owner: Obj,
    *,
    executor_role: str = restore_job.DEFAULT_EXECUTOR_ROLE,
    upgrading: bool = False,
) -> list[Obj]:
    """What the app owns besides its StatefulSet and the membership ConfigMap
    (``upgrading``: a topology upgrade runs, see :func:`query_service`)."""
    objects = [
        service_account(app, namespace, owner),
        membership_role(app, namespace, owner),
        membership_role_binding(app, namespace, owner),
        config_map(app, namespace, owner),
        headless_service(app, namespace, owner),
        query_service(app, namespace, owner, upgrading=upgrading),
        pod_disruption_budget(app, namespace, owner),
    ]
    if uses_embedded_log(app):
        objects.append(log_claim(app, namespace, owner))
    objects.extend(
        restore_job.owned_objects(
            app,
            namespace,
            owner,
            embedded_log=uses_embedded_log(app),
            executor_role=executor_role,
        )
    )
    return objects
