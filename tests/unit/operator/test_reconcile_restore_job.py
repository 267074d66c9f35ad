"""Spark restore Jobs, without a server: when one is launched, what it is, how it is judged."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from eddyline_operator.reconcile import restore_executors, restore_job
from eddyline_operator.reconcile.plan import Observed, Plan, parse_app, plan
from eddyline_operator.reconcile.status_record import dump_status
from eddyline_runtime.membership import RESTORE_PENDING, MemberReport, StoreCopy
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.restore.job_result import JobResult, JobState
from eddyline_runtime.spec import ManifestError
from tests.support.k8s_objects import body, stateful_set, three_zones

Obj = dict[str, Any]
TASKS = frozenset(TaskId(0, p) for p in range(4))
NOW = "2026-11-23T10:00:00Z"
RESTORE = {"when": "WhenLagAbove", "lagAbove": 1000, "master": "local[2]"}


def report(member: str, roles: dict[int, tuple[str, int]]) -> MemberReport:
    return MemberReport(
        member=member,
        topology_hash="abc",
        tasks=TASKS,
        stateful=TASKS,
        stores={"counts": {p: StoreCopy(role, lag) for p, (role, lag) in roles.items()}},
        ready=False,
    )


def run(app: Obj, **observed: Any) -> Plan:
    return plan(Observed(body=app, nodes=three_zones(), now=NOW, **observed))


def restoring(result: Plan) -> Obj:
    found = next(c for c in result.status.conditions if c.type == "Restoring")
    return found.model_dump(mode="json", by_alias=True)


def finished_job(job: Obj, *, complete: bool = True) -> Obj:
    kind = "Complete" if complete else "Failed"
    return {
        **job,
        "status": {"startTime": NOW, "conditions": [{"type": kind, "status": "True"}]},
    }


def job_pod(job: Obj, verdict: JobResult | None, exit_code: int = 0) -> Obj:
    terminated: Obj = {"exitCode": exit_code}
    if verdict is not None:
        terminated["message"] = verdict.to_text()
    return {
        "metadata": {"name": f"{job['metadata']['name']}-x", "labels": job["metadata"]["labels"]},
        "status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [{"name": "restore", "state": {"terminated": terminated}}],
        },
    }


def verdict(state: JobState, offsets: dict[int, int], partitions: tuple[int, ...]) -> JobResult:
    return JobResult(
        state=state,
        application="wc",
        store="counts",
        partitions=partitions,
        build_id="20261123T100000Z-abcd",
        offsets=offsets,
        driver_exit_code=0,
        message="the Spark driver exited with status 1" if state is JobState.FAILED else "ok",
    )


def test_restore_is_never_by_default_and_adds_nothing() -> None:
    result = run(body())
    kinds = [o["kind"] for o in result.objects]
    assert "Job" not in kinds and "restore.build.dir" not in str(result.objects)
    assert not any(o["metadata"]["name"] == "wc-restore" for o in result.objects)
    assert not any(c.type == "Restoring" for c in result.status.conditions)
    assert result.status.restore_jobs is None


def test_when_lag_above_needs_its_threshold() -> None:
    with pytest.raises(ManifestError, match="lagAbove"):
        parse_app(body(restore={"when": "WhenLagAbove"}))


def test_a_bad_spark_master_is_refused_naming_the_field() -> None:
    with pytest.raises(ManifestError, match=r"spec\.restore\.master"):
        parse_app(body(restore={"when": "Always", "master": "yarn"}))


def test_with_restore_pods_mount_the_build_claim_and_wait_for_builds() -> None:
    result = run(body(restore=RESTORE))
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in result.objects}
    claim = by_name[("PersistentVolumeClaim", "wc-restore")]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # pods on many nodes read it
    assert ("ServiceAccount", "wc-restore") in by_name
    # A local master never creates a pod: no rights beyond the account (issue 23, item 5).
    assert not any(kind in ("Role", "RoleBinding") and "restore" in name for kind, name in by_name)
    manifest = yaml.safe_load(by_name[("ConfigMap", "wc-config")]["data"]["streamapp.yaml"])
    config = manifest["spec"]["config"]
    assert config["restore.wait.lag.above"] == 1000
    assert config["restore.wait.ms"] == 600000
    assert "restore.build.dir" not in config  # the env names it, beside the volume
    template = stateful_set(result.objects)["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in template["containers"][0]["env"]}
    assert env["EDDYLINE_RESTORE_BUILD_DIR"] == "/var/lib/eddyline/restore"
    assert {"name": "restore", "mountPath": "/var/lib/eddyline/restore"} in template["containers"][
        0
    ]["volumeMounts"]
    for obj in result.objects:
        kubernetes_validate.validate(obj, "1.32", strict=True)
    assert restoring(result)["reason"] == "NoBuild"


def test_pending_partitions_above_the_threshold_launch_one_job_for_the_store() -> None:
    reports = {
        "wc-0": report("wc-0", {0: (RESTORE_PENDING, 5000), 1: (RESTORE_PENDING, 10)}),
        "wc-1": report("wc-1", {2: (RESTORE_PENDING, 2000), 3: ("restoring", 9000)}),
    }
    result = run(body(restore=RESTORE), reports=reports)
    assert len(result.create_jobs) == 1
    job = result.create_jobs[0]
    kubernetes_validate.validate(job, "1.32", strict=True)
    container = job["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[:2] == ["restore", "job"]
    assert args[args.index("--partitions") + 1] == "0,2"  # 1 is below it, 3 is replaying
    assert args[args.index("--master") + 1] == "local[2]"
    assert args[args.index("--result-file") + 1] == container["terminationMessagePath"]
    assert job["spec"]["backoffLimit"] == 0
    # Past waitSeconds (default 600) no pod waits for the build: the Job ends there.
    assert job["spec"]["activeDeadlineSeconds"] == 600
    # Its pods never join the app's Services or membership.
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert "app.kubernetes.io/instance" not in labels
    assert restoring(result)["status"] == "True"
    assert "2 store partitions (7,000 changelog records) wait" in restoring(result)["message"]
    assert [e.reason for e in result.events if e.reason.startswith("Restore")] == ["RestoreStarted"]
    assert result.status.restore_jobs is not None
    assert result.status.restore_jobs[0].state == "Running"


def test_a_k8s_master_binds_the_jobs_account_to_the_charts_executor_cluster_role() -> None:
    """Issue 23, item 5: the executor rights are the chart's ClusterRole, bound in the app's
    namespace (the operator holds ``bind`` on it, not pod creation); no Role is made."""
    spec = {**RESTORE, "master": "k8s://https://kubernetes.default.svc"}
    result = run(body(restore=spec))
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in result.objects}
    binding = by_name[("RoleBinding", "wc-restore")]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": restore_job.DEFAULT_EXECUTOR_ROLE,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "wc-restore", "namespace": "apps"}
    ]
    assert ("Role", "wc-restore") not in by_name
    kubernetes_validate.validate(binding, "1.32", strict=True)


def test_the_jobs_pod_runs_restricted_as_the_apps_pods_do() -> None:
    """Issue 23, item 5: Pod Security ``restricted`` admits the Job's pod, and it names
    resources (the app pods' when spec.restore names none)."""
    reports = {"wc-0": report("wc-0", {0: (RESTORE_PENDING, 5000)})}
    app = body(restore=RESTORE, resources={"requests": {"cpu": "1", "memory": "2Gi"}})
    (job,) = run(app, reports=reports).create_jobs
    pod_spec = job["spec"]["template"]["spec"]
    statefulset = next(o for o in run(app).objects if o["kind"] == "StatefulSet")
    app_pod = statefulset["spec"]["template"]["spec"]
    assert pod_spec["securityContext"] == app_pod["securityContext"]
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    (container,) = pod_spec["containers"]
    assert container["securityContext"] == app_pod["containers"][0]["securityContext"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}}
    own = {**RESTORE, "resources": {"requests": {"cpu": "3"}}}
    (job,) = run(body(restore=own), reports=reports).create_jobs
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"cpu": "3"}}


def test_a_k8s_master_names_the_driver_pod_so_executors_are_owned_by_it() -> None:
    spec = {**RESTORE, "master": "k8s://https://kubernetes.default.svc", "executors": 3}
    reports = {"wc-0": report("wc-0", {0: (RESTORE_PENDING, 5000)})}
    job = run(body(restore=spec), reports=reports).create_jobs[0]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    conf = dict(a.split("=", 1) for a in args[1:] if "=" in a and a.startswith("spark."))
    assert conf["spark.kubernetes.driver.pod.name"] == "$(POD_NAME)"
    assert conf["spark.executor.instances"] == "3"
    assert conf["spark.driver.host"] == "$(POD_IP)"
    assert (
        conf["spark.kubernetes.executor.volumes.persistentVolumeClaim.restore.options.claimName"]
        == "wc-restore"
    )


def test_executors_start_from_the_operators_template_restricted_as_the_restore_account() -> None:
    """Issue 30: the pod template Spark starts executors from (a ConfigMap the Job mounts):
    restricted, the Job's account without its token, a writable /tmp as working directory,
    spread over nodes; the driver's ports fixed; executors labelled with their Job."""
    spec = {**RESTORE, "master": "k8s://https://kubernetes.default.svc", "image": "r:1"}
    reports = {"wc-0": report("wc-0", {0: (RESTORE_PENDING, 5000)})}
    result = run(body(restore=spec), reports=reports)
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in result.objects}
    config_map = by_name[("ConfigMap", "wc-restore-executor")]
    kubernetes_validate.validate(config_map, "1.32", strict=True)
    template = yaml.safe_load(config_map["data"][restore_executors.TEMPLATE_KEY])
    kubernetes_validate.validate(template, "1.32", strict=True)
    pod = template["spec"]
    assert pod["serviceAccountName"] == "wc-restore"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["name"] == restore_executors.EXECUTOR_CONTAINER
    assert container["workingDir"] == "/tmp"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    (job,) = result.create_jobs
    name = job["metadata"]["name"]
    pod_spec = job["spec"]["template"]["spec"]
    args = pod_spec["containers"][0]["args"]
    conf = dict(a.split("=", 1) for a in args[1:] if "=" in a and a.startswith("spark."))
    path = conf["spark.kubernetes.executor.podTemplateFile"]
    mount = next(
        m for m in pod_spec["containers"][0]["volumeMounts"] if m["name"] == "executor-template"
    )
    assert path == f"{mount['mountPath']}/{restore_executors.TEMPLATE_KEY}"
    volume = next(v for v in pod_spec["volumes"] if v["name"] == "executor-template")
    assert volume["configMap"]["name"] == "wc-restore-executor"
    assert conf["spark.kubernetes.executor.podTemplateContainerName"] == "executor"
    assert conf["spark.kubernetes.container.image"] == "r:1"  # Spark sets it in the executors
    # Every setting the executor role and the admission policies rely on is in the Job's.
    assert restore_executors.spark_conf("wc-restore").items() <= conf.items()
    assert conf["spark.kubernetes.authenticate.executor.serviceAccountName"] == "wc-restore"
    assert conf["spark.driver.port"] == str(restore_job.DRIVER_PORT)
    assert conf["spark.driver.blockManager.port"] == str(restore_job.BLOCK_MANAGER_PORT)
    assert conf[f"spark.kubernetes.executor.label.{restore_job.LABEL_JOB}"] == name
    local = run(body(restore=RESTORE), reports=reports)
    assert not any(o["metadata"]["name"] == "wc-restore-executor" for o in local.objects)


def test_a_running_job_is_not_launched_twice() -> None:
    reports = {"wc-0": report("wc-0", {0: (RESTORE_PENDING, 5000)})}
    first = run(body(restore=RESTORE), reports=reports)
    job = first.create_jobs[0]
    app = body(restore=RESTORE)
    app["status"] = dump_status(first.status)
    again = run(app, reports=reports, jobs=[job])
    assert again.create_jobs == []
    assert restoring(again)["status"] == "True"
    assert not [e for e in again.events if e.reason == "RestoreStarted"]


def succeeded_cycle(job_verdict: JobResult | None, *, complete: bool = True) -> Plan:
    reports = {"wc-0": report("wc-0", {0: (RESTORE_PENDING, 5000), 1: (RESTORE_PENDING, 5000)})}
    first = run(body(restore=RESTORE), reports=reports)
    job = first.create_jobs[0]
    app = body(restore=RESTORE)
    app["status"] = dump_status(first.status)
    done = finished_job(job, complete=complete)
    return run(app, reports=reports, jobs=[done], job_pods=[job_pod(done, job_verdict)])


def test_a_job_succeeds_only_with_a_verdict_naming_every_manifest() -> None:
    result = succeeded_cycle(verdict(JobState.SUCCEEDED, {0: 41, 1: 77}, (0, 1)))
    cond = restoring(result)
    assert (cond["status"], cond["reason"]) == ("False", "BuildSucceeded")
    assert "0@41, 1@77" in cond["message"]
    assert [e.reason for e in result.events if e.reason.startswith("Restore")] == [
        "RestoreSucceeded"
    ]
    # Pods still report the partitions for a moment: no second Job for them.
    assert result.create_jobs == []


def test_a_complete_job_without_a_verdict_or_with_missing_manifests_failed() -> None:
    # spark-submit's exit code alone can lie: Complete is not enough.
    for job_verdict in (None, verdict(JobState.SUCCEEDED, {0: 41}, (0, 1))):
        result = succeeded_cycle(job_verdict)
        cond = restoring(result)
        assert (cond["status"], cond["reason"]) == ("False", "BuildFailed"), job_verdict
        assert [e.type for e in result.events if e.reason == "RestoreFailed"] == ["Warning"]


def test_a_failed_job_reports_the_drivers_reason() -> None:
    result = succeeded_cycle(verdict(JobState.FAILED, {}, (0, 1)), complete=False)
    cond = restoring(result)
    assert cond["reason"] == "BuildFailed"
    assert "exited with status 1" in cond["message"]
    assert result.status.restore_jobs is not None
    assert result.status.restore_jobs[-1].state == "Failed"


def test_pending_again_long_after_a_build_launches_a_new_attempt() -> None:
    reports = {"wc-0": report("wc-0", {0: (RESTORE_PENDING, 5000)})}
    first = run(body(restore=RESTORE), reports=reports)
    old_job = first.create_jobs[0]
    app = body(restore=RESTORE)
    app["status"] = dump_status(first.status)
    app["status"]["restoreJobs"][0] |= {"state": "Succeeded", "finishedAt": "2026-11-23T09:00:00Z"}
    later = run(app, reports=reports)
    assert len(later.create_jobs) == 1
    assert later.create_jobs[0]["metadata"]["name"] != old_job["metadata"]["name"]


def test_pending_partitions_below_the_threshold_or_under_never_wait_for_nothing() -> None:
    app = parse_app(body(restore={"when": "Always"}))
    reports = {"wc-0": report("wc-0", {0: (RESTORE_PENDING, 1), 1: ("active", 0)})}
    assert restore_job.pending_partitions(app, reports) == {"counts": [0]}
    never = parse_app(body())
    assert restore_job.pending_partitions(never, reports) == {}


# Warm-ups (KIP-441) report a missing store restorePending as an active task's does: a new pod
# warming up partitions another pod runs gets them built (issue 25).


def test_a_warm_up_pending_on_a_new_pod_gets_a_job_for_its_partitions() -> None:
    reports = {
        # wc-0 runs every task; wc-1 joined and warms up 1 and 3, waiting for a build.
        "wc-0": report("wc-0", {p: ("active", 0) for p in range(4)}),
        "wc-1": report("wc-1", {1: (RESTORE_PENDING, 5000), 3: (RESTORE_PENDING, 7000)}),
    }
    result = run(body(restore={"when": "Always", "master": "local[2]"}), reports=reports)
    assert len(result.create_jobs) == 1
    args = result.create_jobs[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--partitions") + 1] == "1,3"
    assert "2 store partitions (12,000 changelog records) wait" in restoring(result)["message"]


def test_a_partition_pending_on_two_pods_is_built_once_in_one_job() -> None:
    # wc-1 lost its volume (active copy of 0 pending); wc-2 warms up 0 and 2.
    reports = {
        "wc-0": report("wc-0", {2: ("active", 0)}),
        "wc-1": report("wc-1", {0: (RESTORE_PENDING, 5000)}),
        "wc-2": report("wc-2", {0: (RESTORE_PENDING, 5000), 2: (RESTORE_PENDING, 3000)}),
    }
    result = run(body(restore=RESTORE), reports=reports)
    assert len(result.create_jobs) == 1
    args = result.create_jobs[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--partitions") + 1] == "0,2"


def test_a_warm_up_pending_after_a_build_gets_a_job_for_its_partitions_only() -> None:
    # A build of 0 and 1 (for wc-0's lost store) finished a moment ago; wc-0 still reports
    # them, and a warm-up of 2 began meanwhile on wc-1: only 2 is built again.
    reports = {
        "wc-0": report("wc-0", {0: (RESTORE_PENDING, 5000), 1: (RESTORE_PENDING, 5000)}),
        "wc-1": report("wc-1", {2: (RESTORE_PENDING, 5000)}),
    }
    first = run(body(restore=RESTORE), reports={"wc-0": reports["wc-0"]})
    job = first.create_jobs[0]
    app = body(restore=RESTORE)
    app["status"] = dump_status(first.status)
    done = finished_job(job)
    built = verdict(JobState.SUCCEEDED, {0: 41, 1: 77}, (0, 1))
    after = run(app, reports=reports, jobs=[done], job_pods=[job_pod(done, built)])
    assert len(after.create_jobs) == 1
    args = after.create_jobs[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--partitions") + 1] == "2"
    # While it runs, no other Job for the store, whoever reports what.
    app["status"] = dump_status(after.status)
    again = run(
        app,
        reports=reports,
        jobs=[done, after.create_jobs[0]],
        job_pods=[job_pod(done, built)],
    )
    assert again.create_jobs == []


def test_a_job_past_its_deadline_says_it_outlived_the_pods_wait() -> None:
    """A driver that hangs is killed by the Job controller at activeDeadlineSeconds (no
    verdict is written): the status says why, and what the pods do instead."""
    reports = {"wc-0": report("wc-0", {0: (RESTORE_PENDING, 5000)})}
    app = body(restore={**RESTORE, "waitSeconds": 120})
    (job,) = run(app, reports=reports).create_jobs
    assert job["spec"]["activeDeadlineSeconds"] == 120
    job["status"] = {
        "startTime": NOW,
        "conditions": [
            {"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
             "message": "Job was active longer than specified deadline"},
        ],
    }  # fmt: skip
    pod = job_pod(job, None, exit_code=137)
    outcome = restore_job.observe_job(job, [pod])
    assert outcome.state.value == "Failed"
    assert "longer than spec.restore.waitSeconds (120 s)" in outcome.message, outcome.message
    assert "replay the changelog" in outcome.message
