"""Spark restore Jobs: when to launch one, what it looks like, and how it went. Pure.

A pod whose store is missing and whose changelog is longer than
``spec.restore``'s threshold does not replay; it reports the store partition
as ``restorePending`` in ``/v1/layout`` and waits for a build on the claim
``<app>-restore`` it shares with the Jobs. That holds for every copy a pod
opens: an active task's store (the task waits), and a standby's or warm-up
replica's (KIP-441: it waits while the pod's active tasks run on, then
ingests the build and replays only the tail, so the task moves sooner). The
planning here is the same for both: a partition is pending whoever reports
it, and it is built once. This module turns those reports
into at most one Job per store at a time (``eddyline restore job``:
spark-submit in client mode inside the Job's pod, executors owned by that
pod with a ``k8s://`` master), and the Jobs as observed into the
``Restoring`` condition, events and ``status.restoreJobs``.

A Job's success is judged from its own verdict, not from its exit code
alone: the container writes a :class:`~eddyline_runtime.restore.job_result.JobResult`
(the driver's exit status and the manifests on disk) as its termination
message, and only a Complete Job whose message says Succeeded for every
partition it was asked for counts as a success.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml

from eddyline_operator.reconcile import names, restore_executors, security
from eddyline_operator.reconcile.seed import Seed
from eddyline_runtime.membership import RESTORE_PENDING, MemberReport
from eddyline_runtime.restore.job_result import JobResult, JobState
from eddyline_runtime.spec import (
    GROUP,
    ConditionType,
    RestoreJobState,
    RestoreJobStatus,
    RestoreWhen,
    StreamApp,
)

Obj = dict[str, Any]
# What a Job's verdict parses to (pod_verdict): the restore's or the backfill's.
T = TypeVar("T")

# Where pods and Jobs mount the claim that holds builds (every path appears in args/env,
# so a stand-in kubelet can map it; docs/operator.md).
RESTORE_MOUNT = "/var/lib/eddyline/restore"
# Kubernetes' default termination message file; the Job's container writes its verdict there.
TERMINATION_LOG = "/dev/termination-log"
COMPONENT = "restore"
LABEL_JOB = f"{GROUP}/restore-job"
LABEL_STORE = f"{GROUP}/restore-store"
# A pod may still report restorePending for a moment after a Job finished (it polls for the
# manifests or the verdict): no new Job for the same partitions this soon after one.
RELAUNCH_AFTER_SECONDS = 30
# Finished Jobs (and their pods, with the logs) stay a day for whoever investigates.
JOB_TTL_SECONDS = 86_400
# Service-account files the driver authenticates with in client mode (executor pods).
_SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


# With a k8s:// master: the driver's fixed ports, which the executors connect back to (Spark
# picks random ones otherwise; fixed ones can be named in a NetworkPolicy).
EXECUTOR_COMPONENT = "restore-executor"
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079


# The ClusterRole the chart ships with what a Spark driver needs for its executor pods
# (EDDYLINE_RESTORE_EXECUTOR_ROLE names the chart's; this is its default release's).
DEFAULT_EXECUTOR_ROLE = "eddyline-operator-restore-executor"


def enabled(app: StreamApp) -> bool:
    return app.spec.restore.when is not RestoreWhen.NEVER


def claim_name(app: str) -> str:
    return f"{app}-restore"


def service_account_name(app: str) -> str:
    return f"{app}-restore"


def executor_template_name(app: str) -> str:
    return f"{app}-restore-executor"


def executor_template_config_map(app: StreamApp, namespace: str, owner: Obj) -> Obj:
    name = app.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(executor_template_name(name), namespace, name, owner),
        "data": {
            restore_executors.TEMPLATE_KEY: yaml.safe_dump(
                restore_executors.executor_pod_template(
                    service_account_name(name),
                    _labels(name, {names.LABEL_COMPONENT: EXECUTOR_COMPONENT}),
                ),
                sort_keys=True,
            )
        },
    }


def pod_settings(app: StreamApp) -> dict[str, str | int]:
    """The runtime settings that make pods wait for builds (none when restore is Never); the
    build dir itself is the pod's env (EDDYLINE_RESTORE_BUILD_DIR, beside its volume)."""
    if not enabled(app):
        return {}
    restore = app.spec.restore
    return {
        "restore.wait.lag.above": restore.wait_threshold(),
        "restore.wait.ms": restore.wait_seconds * 1000,
    }


def pod_volume(app: StreamApp) -> tuple[Obj, Obj] | None:
    """The build claim's (volumeMount, volume) for the app's pods, or None."""
    if not enabled(app):
        return None
    return (
        {"name": "restore", "mountPath": RESTORE_MOUNT},
        {"name": "restore", "persistentVolumeClaim": {"claimName": claim_name(app.metadata.name)}},
    )


def _labels(app: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    # Never the pods' selector labels: a Job's pod must not join the app's Services,
    # StatefulSet or membership.
    return {
        names.LABEL_MANAGED_BY: names.OPERATOR,
        names.LABEL_COMPONENT: COMPONENT,
        names.LABEL_APP: app,
        **(extra or {}),
    }


def selector_string(app: str) -> str:
    """Selects an app's restore Jobs and their pods."""
    return f"{names.LABEL_APP}={app},{names.LABEL_COMPONENT}={COMPONENT}"


def _meta(name: str, namespace: str, app: str, owner: Obj | None) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace, "labels": _labels(app)}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return meta


def owned_objects(
    app: StreamApp,
    namespace: str,
    owner: Obj,
    *,
    embedded_log: bool,
    executor_role: str = DEFAULT_EXECUTOR_ROLE,
) -> list[Obj]:
    """The build claim, the Jobs' identity, and with a k8s:// master only, a RoleBinding of
    that identity to the chart's executor ClusterRole (``executor_role``): a local master
    never creates a pod, and the operator holds ``bind`` on that ClusterRole by name instead
    of holding pod creation itself to hand it on."""
    if not enabled(app):
        return []
    name = app.metadata.name
    restore = app.spec.restore
    claim: Obj = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(claim_name(name), namespace, name, owner),
        "spec": {
            # With the embedded log every pod and Job runs on one node; otherwise pods on
            # many nodes read what one Job wrote.
            "accessModes": ["ReadWriteOnce" if embedded_log else "ReadWriteMany"],
            "resources": {"requests": {"storage": restore.storage_size}},
        },
    }
    if app.spec.storage.storage_class_name:
        claim["spec"]["storageClassName"] = app.spec.storage.storage_class_name
    account: Obj = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(service_account_name(name), namespace, name, owner),
    }
    if not restore_executors.uses_executor_pods(restore.master):
        return [claim, account]
    template = executor_template_config_map(app, namespace, owner)
    binding: Obj = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(service_account_name(name), namespace, name, owner),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": executor_role,
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": service_account_name(name), "namespace": namespace}
        ],
    }
    return [claim, account, binding, template]


def pending_copies(
    app: StreamApp, reports: Mapping[str, MemberReport]
) -> dict[tuple[str, int], int]:
    """(store, partition) -> changelog records, for copies reported restorePending above
    the threshold."""
    threshold = app.spec.restore.wait_threshold()
    if threshold < 0:
        return {}
    found: dict[tuple[str, int], int] = {}
    for report in reports.values():
        for store, partitions in report.stores.items():
            for partition, copy in partitions.items():
                if copy.role == RESTORE_PENDING and copy.lag > threshold:
                    found[(store, partition)] = copy.lag
    return found


def pending_partitions(app: StreamApp, reports: Mapping[str, MemberReport]) -> dict[str, list[int]]:
    """Store -> partitions that pods report restorePending above the threshold."""
    found: dict[str, set[int]] = {}
    for store, partition in pending_copies(app, reports):
        found.setdefault(store, set()).add(partition)
    return {store: sorted(parts) for store, parts in sorted(found.items())}


def job_name(app: str, store: str, partitions: Sequence[int], attempt: int) -> str:
    """``<app>-restore-<10 hex>``: unique per store, partitions and attempt, and short
    enough for a Job (its pods add a suffix; labels hold at most 63 characters)."""
    text = f"{store}/{','.join(map(str, partitions))}/{attempt}"
    return f"{app}-restore-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def job(
    app: StreamApp,
    namespace: str,
    owner: Obj,
    *,
    store: str,
    partitions: Sequence[int],
    attempt: int,
    image: str,
    log_node: str | None,
    embedded_log: bool,
    log_url: str,
) -> Obj:
    """The Job that builds ``store``'s ``partitions``; with the embedded log it mounts the
    shared log claim and runs on the log's node."""
    job_id = job_name(app.metadata.name, store, partitions, attempt)
    args = [
        "restore",
        "job",
        "--manifest",
        f"{names.CONFIG_MOUNT}/{names.MANIFEST_KEY}",
        "--store",
        store,
        "--partitions",
        ",".join(str(p) for p in partitions),
        "--output",
        RESTORE_MOUNT,
        "--log-url",
        log_url,
        "--master",
        app.spec.restore.master,
        "--job-name",
        job_id,
        "--result-file",
        TERMINATION_LOG,
    ]
    return spark_job(
        app,
        namespace,
        owner,
        job_id=job_id,
        args=args,
        labels={LABEL_JOB: job_id, LABEL_STORE: store},
        component=COMPONENT,
        image=image,
        log_node=log_node,
        embedded_log=embedded_log,
        # A driver that hangs (an API server or a broker that never answers) must not
        # hold its pods and the store's next build forever. Past waitSeconds the pods
        # that reported the partitions have stopped waiting and replay the changelog, so
        # a build finishing later serves no one: the Job controller ends it there.
        active_deadline_seconds=app.spec.restore.wait_seconds,
    )


def spark_job(
    app: StreamApp,
    namespace: str,
    owner: Obj,
    *,
    job_id: str,
    args: Sequence[str],
    labels: Mapping[str, str],
    component: str,
    image: str,
    log_node: str | None,
    embedded_log: bool,
    active_deadline_seconds: int,
) -> Obj:
    """A Job whose one container runs ``eddyline <args>`` as a Spark driver with
    spec.restore's settings (image, master, executors, resources) and the restore claim
    mounted: restore Jobs, and the backfill Job of a topology upgrade (backfill_job.py).
    ``labels`` (beside the app's and ``component``) go on the Job, its pod and its
    executors; the Spark conf is appended to ``args`` as ``--conf KEY=VALUE``."""
    name = app.metadata.name
    log_mount = (
        (
            {"name": "log", "mountPath": names.LOG_MOUNT},
            {"name": "log", "persistentVolumeClaim": {"claimName": names.log_claim(name)}},
        )
        if embedded_log
        else None
    )
    restore = app.spec.restore
    restore_image = restore.image or image
    conf: dict[str, str] = {"spark.local.dir": "/tmp"}
    if restore_executors.uses_executor_pods(restore.master):
        conf.update(
            {
                "spark.kubernetes.namespace": "$(POD_NAMESPACE)",
                # Executors are owned by this pod: they go when the Job's pod goes.
                "spark.kubernetes.driver.pod.name": "$(POD_NAME)",
                "spark.kubernetes.container.image": restore_image,
                "spark.kubernetes.authenticate.caCertFile": f"{_SERVICE_ACCOUNT_DIR}/ca.crt",
                "spark.kubernetes.authenticate.oauthTokenFile": f"{_SERVICE_ACCOUNT_DIR}/token",
                "spark.driver.host": "$(POD_IP)",
                "spark.driver.bindAddress": "0.0.0.0",
                "spark.driver.port": str(DRIVER_PORT),
                "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
                "spark.executor.instances": str(restore.executors),
                "spark.executor.cores": str(restore.executor_cores),
                "spark.executor.memory": restore.executor_memory,
                # Spark sets the cpu request; a limit too, so a namespace whose ResourceQuota
                # counts limits admits the executors.
                "spark.kubernetes.executor.limit.cores": str(restore.executor_cores),
            }
        )
        for key, value in labels.items():
            conf[f"spark.kubernetes.executor.label.{key}"] = value
        conf.update(restore_executors.spark_conf(service_account_name(name)))
        claims = [("restore", claim_name(name), RESTORE_MOUNT)]
        if embedded_log:
            claims.append(("log", names.log_claim(name), names.LOG_MOUNT))
        for volume, claim, path in claims:
            prefix = f"spark.kubernetes.executor.volumes.persistentVolumeClaim.{volume}"
            conf[f"{prefix}.options.claimName"] = claim
            conf[f"{prefix}.mount.path"] = path
    args = list(args)
    for key, value in sorted(conf.items()):
        args += ["--conf", f"{key}={value}"]
    mounts: list[Obj] = [
        {"name": "config", "mountPath": names.CONFIG_MOUNT, "readOnly": True},
        {"name": "restore", "mountPath": RESTORE_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[Obj] = [
        {"name": "config", "configMap": {"name": names.config_map(name)}},
        {"name": "restore", "persistentVolumeClaim": {"claimName": claim_name(name)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if log_mount is not None:
        mounts.append(log_mount[0])
        volumes.append(log_mount[1])
    if restore_executors.uses_executor_pods(restore.master):
        template = executor_template_name(name)
        mounts.append({"name": "executor-template", "mountPath": restore_executors.TEMPLATE_MOUNT,
                       "readOnly": True})  # fmt: skip
        volumes.append({"name": "executor-template", "configMap": {"name": template}})
    container: Obj = {
        "name": component,
        "image": restore_image,
        "imagePullPolicy": app.spec.image_pull_policy.value,
        "command": ["eddyline"],
        "args": args,
        # The root file system is read-only: whatever Spark writes to its working directory
        # lands on the /tmp volume.
        "workingDir": "/tmp",
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "volumeMounts": mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "securityContext": security.container_security_context(),
    }
    # spec.restore.resources, else the app pods' own: a namespace with a ResourceQuota
    # refuses a pod that names none.
    chosen = restore.resources
    if not (chosen.requests or chosen.limits):
        chosen = app.spec.resources
    resources = {
        key: dict(value)
        for key, value in (("requests", chosen.requests), ("limits", chosen.limits))
        if value
    }
    if resources:
        container["resources"] = resources
    all_labels = _labels(name, {names.LABEL_COMPONENT: component, **labels})
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "serviceAccountName": service_account_name(name),
        "securityContext": security.pod_security_context(),
        "containers": [container],
        "volumes": volumes,
    }
    if log_node is not None:
        # The embedded sqlite log is read on its own node only.
        pod_spec["affinity"] = {
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
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {**_meta(job_id, namespace, name, owner), "labels": all_labels},
        "spec": {
            # One attempt: a failed build writes its verdict and whoever waits for it (pods,
            # or an upgrade) acts at once; a retry would only race that.
            "backoffLimit": 0,
            "activeDeadlineSeconds": active_deadline_seconds,
            "ttlSecondsAfterFinished": JOB_TTL_SECONDS,
            "template": {"metadata": {"labels": all_labels}, "spec": pod_spec},
        },
    }


@dataclass(frozen=True)
class JobOutcome:
    """A restore Job as observed: Running, Succeeded or Failed, and why."""

    name: str
    store: str
    partitions: tuple[int, ...]
    state: RestoreJobState
    message: str
    started: str | None


def pod_verdict(pods: Sequence[Obj], parse: Callable[[str], T | None]) -> T | None:
    """The verdict a Spark Job's driver wrote as its termination message, parsed by ``parse``
    (the restore's JobResult or the backfill's verdict); None while no pod has said one."""
    for pod in pods:
        for status in pod.get("status", {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated") or {}
            message = terminated.get("message")
            if message:
                found = parse(str(message))
                if found is not None:
                    return found
    return None


def observe_job(job_obj: Obj, pods: Sequence[Obj]) -> JobOutcome:
    """Judge one Job from its conditions and its pod's verdict (the termination message)."""
    meta = job_obj.get("metadata", {})
    name = str(meta.get("name"))
    labels = meta.get("labels") or {}
    store = str(labels.get(LABEL_STORE, ""))
    status = job_obj.get("status") or {}
    started = status.get("startTime")
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    # The Job's own pod, not its executors (which carry the Job's label too).
    mine = [
        p
        for p in pods
        if (p.get("metadata", {}).get("labels") or {}).get(LABEL_JOB) == name
        and (p.get("metadata", {}).get("labels") or {}).get(names.LABEL_COMPONENT) == COMPONENT
    ]
    verdict = pod_verdict(mine, JobResult.from_text)
    partitions = tuple(verdict.partitions) if verdict is not None else _partitions_of(job_obj)

    def outcome(state: RestoreJobState, message: str) -> JobOutcome:
        return JobOutcome(name, store, partitions, state, message, started)

    complete = (conditions.get("Complete") or {}).get("status") == "True"
    failed = (conditions.get("Failed") or {}).get("status") == "True"
    if failed:
        reason = verdict.message if verdict is not None else conditions["Failed"].get("message")
        if verdict is None and conditions["Failed"].get("reason") == "DeadlineExceeded":
            deadline = (job_obj.get("spec") or {}).get("activeDeadlineSeconds")
            reason = (
                f"it ran longer than spec.restore.waitSeconds ({deadline} s), after which the "
                "waiting pods replay the changelog, and the Job controller killed its driver; "
                "its pod's log says where it was stuck"
            )
        return outcome(
            RestoreJobState.FAILED, f"Job {name} failed: {reason or 'no verdict (pod killed?)'}"
        )
    if complete:
        if verdict is None:
            return outcome(
                RestoreJobState.FAILED, f"Job {name} completed without a verdict in its pod"
            )
        if verdict.state is not JobState.SUCCEEDED:
            return outcome(RestoreJobState.FAILED, f"Job {name}: {verdict.message}")
        missing = sorted(set(verdict.partitions) - set(verdict.offsets))
        if missing:
            return outcome(
                RestoreJobState.FAILED, f"Job {name}: no manifest for partitions {missing}"
            )
        offsets = ", ".join(f"{p}@{o}" for p, o in sorted(verdict.offsets.items()))
        return outcome(
            RestoreJobState.SUCCEEDED,
            f"Job {name} built store {store} (build {verdict.build_id}; partition@offset "
            f"{offsets}); pods ingest it and replay the tail",
        )
    phase = next((p.get("status", {}).get("phase") for p in mine), None) or "Pending"
    return outcome(
        RestoreJobState.RUNNING, f"Job {name} building store {store}: driver pod {phase}"
    )


def _partitions_of(job_obj: Obj) -> tuple[int, ...]:
    containers = job_obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
    args: list[str] = (containers or [{}])[0].get("args") or []
    if "--partitions" in args:
        text = args[args.index("--partitions") + 1]
        return tuple(int(p) for p in text.split(",") if p)
    return ()


@dataclass
class RestorePlan:
    """What the restore part of a cycle wants: Jobs to create, status, condition, events."""

    create: list[Obj] = field(default_factory=list)
    jobs: list[RestoreJobStatus] = field(default_factory=list)  # status.restoreJobs
    condition: Seed | None = None  # Restoring
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


def plan_restores(
    app: StreamApp,
    namespace: str,
    owner: Obj,
    *,
    reports: Mapping[str, MemberReport],
    jobs: Sequence[Obj],
    job_pods: Sequence[Obj],
    previous: Sequence[RestoreJobStatus],
    image: str,
    log_node: str | None,
    embedded_log: bool,
    log_url: str,
    now: str,
) -> RestorePlan:
    """Launch a Job per store with pending partitions and none running; report the Jobs.

    ``log_url`` is the log as pods open it (the embedded log's file on its claim).
    ``previous`` is ``status.restoreJobs`` as last written: a Job already
    recorded there is never launched again (status as the write-ahead log:
    a restarted operator resumes instead of launching twice), and events fire
    only on a change of a Job's state.
    """
    result = RestorePlan()
    if not enabled(app) and not jobs:
        return result
    outcomes = [observe_job(j, job_pods) for j in jobs]
    before = {entry.name: entry for entry in previous}
    recorded = dict(before)
    for seen in outcomes:
        old = before.get(seen.name)
        changed = old is None or old.state != seen.state
        finished = None
        if seen.state is not RestoreJobState.RUNNING:
            finished = now if changed or old is None else (old.finished_at or now)
        recorded[seen.name] = RestoreJobStatus(
            name=seen.name,
            store=seen.store,
            partitions=list(seen.partitions),
            state=seen.state,
            message=seen.message,
            startedAt=seen.started or (old.started_at if old is not None else None) or now,
            finishedAt=finished,
        )
        if changed:
            if seen.state is RestoreJobState.SUCCEEDED:
                result.events.append(("Normal", "RestoreSucceeded", seen.message))
            elif seen.state is RestoreJobState.FAILED:
                result.events.append(("Warning", "RestoreFailed", seen.message))
    running_stores = {o.store for o in outcomes if o.state is RestoreJobState.RUNNING}
    attempts: dict[str, int] = {}
    for entry in recorded.values():
        attempts[entry.store] = attempts.get(entry.store, 0) + 1
    for store, wanted in pending_partitions(app, reports).items():
        if store in running_stores:
            continue
        # Right after a Job for some partitions finished, pods may still report them for a
        # moment (they poll for its manifests or its verdict): no second build of them that
        # soon. Partitions that turned pending since (a warm-up that started meanwhile) get
        # a Job of their own.
        just_built = {
            partition
            for entry in recorded.values()
            if entry.store == store
            and entry.state is not RestoreJobState.RUNNING
            and _seconds_between(entry.finished_at, now) < RELAUNCH_AFTER_SECONDS
            for partition in entry.partitions
        }
        partitions = [p for p in wanted if p not in just_built]
        if not partitions:
            continue
        attempt = attempts.get(store, 0) + 1
        new = job(
            app,
            namespace,
            owner,
            store=store,
            partitions=partitions,
            attempt=attempt,
            image=image,
            log_node=log_node,
            embedded_log=embedded_log,
            log_url=log_url,
        )
        name = new["metadata"]["name"]
        if name in recorded:
            continue
        result.create.append(new)
        message = (
            f"Job {name} building store {store} partitions "
            f"{','.join(map(str, partitions))} ({app.spec.restore.master})"
        )
        recorded[name] = RestoreJobStatus(
            name=name,
            store=store,
            partitions=list(partitions),
            state=RestoreJobState.RUNNING,
            message=message,
            startedAt=now,
        )
        running_stores.add(store)
        result.events.append(("Normal", "RestoreStarted", message))
    # The newest few, so status stays small.
    result.jobs = sorted(recorded.values(), key=lambda e: (str(e.started_at), e.name))[-_KEEP_JOBS:]
    result.condition = _restoring(app, reports, result.jobs, now)
    return result


def _restoring(
    app: StreamApp,
    reports: Mapping[str, MemberReport],
    jobs: Sequence[RestoreJobStatus],
    now: str,
) -> Seed:
    """The Restoring condition."""
    running = [e for e in jobs if e.state is RestoreJobState.RUNNING]
    if running:
        # Progress as the pods see it: how many store partitions still wait, and how many
        # changelog records a replay of them would read.
        waiting = pending_copies(app, reports)
        records = sum(waiting.values())
        parts = []
        for entry in running:
            elapsed = _seconds_between(entry.started_at, now)
            took = f", {elapsed:.0f} s so far" if elapsed != float("inf") else ""
            parts.append(f"{entry.message}{took}")
        return Seed(
            ConditionType.RESTORING,
            True,
            "BuildRunning",
            "; ".join(parts)
            + f"; {len(waiting)} store partitions ({records:,} changelog records) wait for it",
        )
    if jobs:
        last = jobs[-1]
        reason = "BuildSucceeded" if last.state is RestoreJobState.SUCCEEDED else "BuildFailed"
        return Seed(ConditionType.RESTORING, False, reason, last.message)
    return Seed(ConditionType.RESTORING, False, "NoBuild", "no store waits for a Spark build")


def _seconds_between(earlier: Any, later: str) -> float:
    try:
        start = datetime.datetime.fromisoformat(str(earlier).replace("Z", "+00:00"))
        end = datetime.datetime.fromisoformat(later.replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    return (end - start).total_seconds()


# How many restore Jobs status.restoreJobs keeps (the newest).
_KEEP_JOBS = 10
