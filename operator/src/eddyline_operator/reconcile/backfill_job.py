"""The backfill Job of a topology upgrade (spec.topology.backfill): what it looks like, how it
went, and the ``Backfilling`` condition. Pure; ``upgrade.py`` decides when it runs.

The Job is a restore Job's twin (:func:`~.restore_job.spark_job`: spec.restore's image,
master, executors and resources, the restore claim mounted at the same path): its
container runs ``eddyline backfill job`` with the *new* revision's topology reference, the
stores to build and a build id fixed when the upgrade began, so a restarted operator names
the same Job and finds it (a create that meets it is a 409, which the handlers pass over).
The Job reads the app's committed positions (no pod processes while it runs), builds the
stores' SSTs and manifests in the restore claim, writes their changelogs, and says how it
went as its termination message (:class:`~eddyline_runtime.spec.BackfillVerdict`). A
Complete Job counts only with a Succeeded verdict.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eddyline_operator.reconcile import names, restore_job
from eddyline_operator.reconcile.seed import Seed
from eddyline_runtime.spec import (
    GROUP,
    BackfillRecord,
    BackfillState,
    BackfillVerdict,
    ConditionType,
    StreamApp,
)

Obj = dict[str, Any]

COMPONENT = "backfill"
LABEL_JOB = f"{GROUP}/backfill-job"


def job_name(app: str, target: str, stores: Sequence[str], started_at: str) -> str:
    """``<app>-backfill-<9 hex>``: one per upgrade (its target and start) and its stores;
    as long as a restore Job's name (``-restore-`` and 10), which the name limit with
    spec.restore on leaves room for."""
    text = f"{target}/{','.join(stores)}/{started_at}"
    return f"{app}-backfill-{hashlib.sha256(text.encode()).hexdigest()[:9]}"


def build_id(job: str, started_at: str) -> str:
    """The build's directory name in the restore claim: restore builds are named by their
    UTC start (restore/manifest.py, new_build_id) and pods ingest the newest that fits, so
    this one is named by the upgrade's start, and by the Job."""
    stamp = started_at.replace("-", "").replace(":", "")
    return f"{stamp}-{job.rsplit('-', 1)[-1]}"


def selector_string(app: str) -> str:
    """Selects an app's backfill Jobs and their pods (never its restore Jobs)."""
    return f"{names.LABEL_APP}={app},{names.LABEL_COMPONENT}={COMPONENT}"


def job(
    app: StreamApp,
    namespace: str,
    owner: Obj,
    *,
    record: BackfillRecord,
    target_ref: str,
    image: str,
    log_node: str | None,
    embedded_log: bool,
    log_url: str,
) -> Obj:
    """The Job that builds ``record.stores`` of the revision ``target_ref`` names."""
    args = [
        "backfill",
        "job",
        # The manifest the pods run until Publishing: application.id, spec.config and the
        # log are the same in both revisions; the topology is the new one's.
        "--manifest",
        f"{names.CONFIG_MOUNT}/{names.MANIFEST_KEY}",
        "--topology",
        target_ref,
        *[arg for store in record.stores for arg in ("--store", store)],
        "--output",
        restore_job.RESTORE_MOUNT,
        "--log-url",
        log_url,
        "--master",
        app.spec.restore.master,
        "--build-id",
        record.build_id,
        "--result-file",
        restore_job.TERMINATION_LOG,
    ]
    if record.from_timestamp is not None:
        args += ["--from-timestamp", record.from_timestamp.isoformat()]
    return restore_job.spark_job(
        app,
        namespace,
        owner,
        job_id=record.job,
        args=args,
        labels={LABEL_JOB: record.job},
        component=COMPONENT,
        image=image,
        log_node=log_node,
        embedded_log=embedded_log,
        # The upgrade waits for the Job, and its deadline is the upgrade's: a hung driver
        # ends there and the upgrade rolls back.
        active_deadline_seconds=app.spec.topology.upgrade_deadline_seconds,
    )


@dataclass(frozen=True)
class Observed:
    """The backfill Job as observed: its state, what it said, and when it started."""

    state: BackfillState
    message: str
    verdict: BackfillVerdict | None


def observe(name: str, jobs: Sequence[Obj], pods: Sequence[Obj]) -> Observed | None:
    """Judge the Job ``name`` from its conditions and its pod's verdict; None: no such Job
    (not created yet, or deleted by someone)."""
    found = next((j for j in jobs if j.get("metadata", {}).get("name") == name), None)
    if found is None:
        return None
    mine = [p for p in pods if (p.get("metadata", {}).get("labels") or {}).get(LABEL_JOB) == name]
    verdict = restore_job.pod_verdict(mine, BackfillVerdict.from_text)
    conditions = {c.get("type"): c for c in (found.get("status") or {}).get("conditions") or []}
    if (conditions.get("Failed") or {}).get("status") == "True":
        why = verdict.message if verdict is not None else conditions["Failed"].get("message")
        if verdict is None and conditions["Failed"].get("reason") == "DeadlineExceeded":
            why = (
                "it ran longer than spec.topology.upgradeDeadlineSeconds and the Job "
                "controller killed its driver; its pod's log says where it was"
            )
        return Observed(
            BackfillState.FAILED, f"Job {name} failed: {why or 'no verdict (pod killed?)'}", verdict
        )
    if (conditions.get("Complete") or {}).get("status") == "True":
        if verdict is None or verdict.state is not BackfillState.SUCCEEDED:
            said = verdict.message if verdict is not None else "no verdict in its pod"
            return Observed(BackfillState.FAILED, f"Job {name} completed but: {said}", verdict)
        return Observed(BackfillState.SUCCEEDED, f"Job {name}: {verdict.message}", verdict)
    phase = next((p.get("status", {}).get("phase") for p in mine), None) or "Pending"
    return Observed(BackfillState.RUNNING, f"Job {name} running: driver pod {phase}", None)


def condition(record: BackfillRecord, *, rolling_back: bool) -> Seed:
    """``Backfilling``: True while the Job is pending or runs; False once it is done (the
    reason says how), kept while the upgrade lasts and as long as status.lastUpgrade says."""
    stores = ", ".join(record.stores)
    state = record.state
    if state in (BackfillState.PENDING, BackfillState.RUNNING):
        text = f"building {stores} from history: {record.message or 'waiting for the pods to stop'}"
        return Seed(ConditionType.BACKFILLING, True, f"Backfill{state}", text)
    if state is BackfillState.SUCCEEDED:
        ends = ", ".join(f"{tp}@{offset}" for tp, offset in sorted(record.end_offsets.items()))
        text = f"built {stores} ({record.records or 0} records; history ends at {ends or '-'})"
        return Seed(ConditionType.BACKFILLING, False, "BackfillSucceeded", text)
    after = "; the upgrade rolls back" if rolling_back else "; the upgrade was rolled back"
    return Seed(ConditionType.BACKFILLING, False, "BackfillFailed", f"{record.message}{after}")
