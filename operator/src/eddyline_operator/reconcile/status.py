"""What the app's pods say (ordinals, hashes, revisions, crash loops, standby lag), and the
rolling restart's next step. The conditions made from them are in :mod:`.conditions`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eddyline_operator.reconcile import names
from eddyline_operator.reconcile.membership import is_member, is_ready
from eddyline_runtime.membership import MemberReport, StoreRole

Obj = dict[str, Any]

# "Caught up" before the next pod of a rolling restart: no copy restoring and every
# standby within this many changelog records of its end. Under steady input a standby is
# never exactly at the end; a few commits' worth is what it replays after a promotion.
ROLL_MAX_STANDBY_LAG = 1000


def ordinal(pod: Obj) -> int:
    name: str = pod["metadata"]["name"]
    suffix = name.rsplit("-", 1)[-1]
    return int(suffix) if suffix.isdigit() else -1


def is_deleting(pod: Obj) -> bool:
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def pod_hash(pod: Obj) -> str | None:
    annotations = pod.get("metadata", {}).get("annotations") or {}
    value = annotations.get(names.ANNOTATION_CONFIG_HASH)
    return None if value is None else str(value)


def pod_revision(pod: Obj) -> str | None:
    labels = pod.get("metadata", {}).get("labels") or {}
    value = labels.get(names.LABEL_REVISION)
    return None if value is None else str(value)


def crash_looping(pods: Iterable[Obj]) -> list[str]:
    """Pods whose container the kubelet keeps restarting."""
    found = []
    for pod in pods:
        for status in pod.get("status", {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") == "CrashLoopBackOff":
                found.append(pod["metadata"]["name"])
    return sorted(found)


# At most this much of one termination message goes into a condition (the kubelet keeps
# up to 4096 bytes, or the log's last 80 lines with FallbackToLogsOnError).
CRASH_MESSAGE_CHARS = 400


def crash_message(pod: Obj) -> str | None:
    """Why the pod's container last stopped, as the kubelet recorded it in
    ``lastState.terminated``: the runtime's termination message (or, with the
    FallbackToLogsOnError policy, the end of its log), with the exit code; None when the
    kubelet recorded nothing."""
    for status in pod.get("status", {}).get("containerStatuses") or []:
        terminated = (status.get("lastState") or {}).get("terminated") or {}
        if not terminated:
            continue
        text = " ".join(str(terminated.get("message") or "").split())
        if len(text) > CRASH_MESSAGE_CHARS:
            text = "..." + text[-CRASH_MESSAGE_CHARS:]
        code = terminated.get("exitCode")
        reason = str(terminated.get("reason") or "")
        head = f"exit code {code}" if code is not None else reason
        if reason == OOM_KILLED and code is not None:
            # 137 alone reads as any SIGKILL; the kubelet knows it was the memory limit.
            head = f"{head} ({OOM_KILLED})"
        return f"{head}: {text}" if text else head or None
    return None


# The reason the kubelet gives a container the kernel killed at its cgroup's memory limit.
OOM_KILLED = "OOMKilled"


def oom_kills(pods: Iterable[Obj]) -> list[str]:
    """One note per pod whose container the kernel killed at ``limits.memory``, as the
    kubelet recorded it (the container's current or last termination, reason OOMKilled),
    naming when: a later kill of the same pod makes another note. Such a pod usually
    restarts and runs on, so nothing else in status would say why its tasks moved."""
    notes = []
    for pod in pods:
        limits = {
            c.get("name"): ((c.get("resources") or {}).get("limits") or {}).get("memory")
            for c in pod.get("spec", {}).get("containers") or []
        }
        for status in pod.get("status", {}).get("containerStatuses") or []:
            killed = next(
                (
                    ended
                    for key in ("state", "lastState")
                    if (ended := (status.get(key) or {}).get("terminated") or {}).get("reason")
                    == OOM_KILLED
                ),
                None,
            )
            if killed is None:
                continue
            limit = limits.get(status.get("name"))
            notes.append(
                f"pod {pod['metadata']['name']}: {OOM_KILLED} at "
                f"{killed.get('finishedAt') or 'an unknown time'}, the kernel killed it at "
                f"limits.memory {limit or 'unset'} ({status.get('restartCount', 0)} restarts); "
                "raise resources.limits.memory (RocksDB takes rocksdb.memory.limit.share of "
                "it, the process the rest)"
            )
    return notes


@dataclass(frozen=True)
class RolloutStep:
    """What the rollout does now: pods to delete (maybe none) and why."""

    delete: tuple[str, ...]
    reason: str  # RollingUpdate, TopologyUpgrade, or "" when nothing is outdated
    message: str


def rollout_step(
    pods: Sequence[Obj],
    *,
    template_hash: str,
    revision: str,
    desired_replicas: int,
    reports: Mapping[str, MemberReport],
) -> RolloutStep:
    """Restart outdated pods one at a time, each only when every pod is ready and caught up
    (no restoring copy, standbys close). A change of topology never gets here: it is a
    full-cluster upgrade (``upgrade.py``); pods of another revision label are restarted
    together only as a last resort (their revision never runs beside another)."""
    live = [p for p in pods if not is_deleting(p)]
    outdated = sorted((p for p in live if pod_hash(p) != template_hash), key=ordinal, reverse=True)
    if not outdated:
        return RolloutStep((), "", "")
    if any(pod_revision(p) != revision for p in outdated):
        return RolloutStep(
            tuple(p["metadata"]["name"] for p in outdated),
            "TopologyUpgrade",
            f"topology revision {revision}: restarting {len(outdated)} pods together",
        )
    waiting = f"{len(outdated)} pods to restart for a config change"
    if any(is_deleting(p) for p in pods):
        return RolloutStep((), "RollingUpdate", f"{waiting}; waiting for a pod to terminate")
    if len(live) < desired_replicas or not all(is_ready(p) for p in live):
        return RolloutStep((), "RollingUpdate", f"{waiting}; waiting for every pod to be ready")
    restoring = sorted(
        member
        for member, report in reports.items()
        if any(c.role is StoreRole.RESTORING for p in report.stores.values() for c in p.values())
    )
    if restoring:
        return RolloutStep(
            (), "RollingUpdate", f"{waiting}; waiting for {', '.join(restoring)} to restore"
        )
    lag = max_standby_lag(reports.values())
    if lag is not None and lag > ROLL_MAX_STANDBY_LAG:
        return RolloutStep(
            (), "RollingUpdate", f"{waiting}; waiting for standbys to catch up (lag {lag})"
        )
    victim = outdated[0]["metadata"]["name"]
    return RolloutStep((victim,), "RollingUpdate", f"{waiting}; restarting {victim}")


def max_standby_lag(reports: Iterable[MemberReport]) -> int | None:
    lags = [lag for r in reports if (lag := r.max_standby_lag()) is not None]
    return max(lags) if lags else None


def running_revision(pods: Sequence[Obj], desired: str) -> str:
    """The revision most member pods run (the desired one when no pod runs yet)."""
    counts = Counter(r for p in pods if is_member(p) and (r := pod_revision(p)) is not None)
    if not counts:
        return desired
    return sorted(counts, key=lambda r: (-counts[r], r != desired, r))[0]
