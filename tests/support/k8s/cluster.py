"""A cluster stand-in on top of the emulated API server: the controllers and kubelet a test needs.

It plays, on the API server's event loop and through the same write methods clients use:

- the StatefulSet controller: Pods ``<set>-<ordinal>`` and their claims from
  ``volumeClaimTemplates`` (Parallel and OrderedReady; RollingUpdate and OnDelete), status;
- the Job controller: a pod per attempt until one succeeds or ``backoffLimit`` is spent;
- the scheduler: binds pods to three fake Nodes in three zones, honouring nodeSelector, required
  node affinity (labels and ``metadata.name`` fields), ``DoNotSchedule`` topology spread, and
  spreading over the topology key otherwise;
- the kubelet: runs each container as a real local process with its own loopback address
  (127.X.Y.N, the pod IP, so every pod serves on the same container port), volumes as
  directories (a claim's directory outlives its pods; ConfigMaps and Secrets are written as
  files and refreshed no faster than a real kubelet's minute), env with the downward API and
  ``$(VAR)`` expansion; probes at their periods (startup, liveness, readiness; Ready comes
  from the pod's real ``/readyz``), restarts with back-off, graceful deletion (SIGTERM, then
  SIGKILL after the grace period);
- the Service proxy: each ClusterIP Service's address (127.X.Y+1.N) forwards TCP to a ready
  pod that its selector matches.

There are no mount namespaces here, so the kubelet maps each ``mountPath`` to its directory in
the container's command, args, env values and workingDir. The pod contract (docs/operator.md)
promises that every path a pod uses appears there. The process finds the API server through
``EDDYLINE_KUBERNETES_API``: the emulator's port on the pod's own address, where every request
counts as the pod's service account (as through ``kubectl proxy`` with its credentials), so
RBAC holds pods to the roles they are given.

It never writes anything a pod should learn from the operator (membership, assignment).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.control_plane.pods import resource_field_value
from tests.support.k8s.apiserver import ApiError, ApiServer, Obj, match_expressions, now_iso

ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"
# What a Node offers pods (the downward API gives its memory when a container has no limit).
ALLOCATABLE = {"cpu": "2", "memory": "8Gi", "pods": "110"}
# A real kubelet re-reads ConfigMap and Secret volumes about once a minute.
VOLUME_REFRESH_SECONDS = 60.0
# How often the controllers look at the store even when nothing changed (probes, back-off).
TICK_SECONDS = 0.05


@dataclass
class Container:
    """One container's process and what the kubelet knows about it."""

    spec: Obj
    process: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    started_clock: float = 0.0
    restarts: int = 0
    next_start: float = 0.0
    held_until: float = 0.0  # a test keeps the container down (kill_container(keep_down_for=))
    backoff: float = 0.0
    started: bool = False  # the startup probe passed
    ready: bool = False
    last_exit: Obj | None = None
    waiting_reason: str = "ContainerCreating"
    probe_failures: dict[str, int] = field(default_factory=dict)
    probe_due: dict[str, float] = field(default_factory=dict)
    probing: set[str] = field(default_factory=set)


@dataclass
class PodRuntime:
    namespace: str
    name: str
    uid: str
    ip: str
    sandbox: Path
    containers: list[Container]
    mounts: dict[str, Path] = field(default_factory=dict)
    volumes_refreshed: float = 0.0
    terminating_since: float | None = None
    finished: bool = False
    api_url: str = ""  # the pod's own API endpoint, once listening


class Cluster:
    """The controllers and kubelet; :meth:`start` installs them on the API server's loop."""

    def __init__(
        self,
        api: ApiServer,
        root: Path,
        *,
        zones: tuple[str, ...] = ("zone-a", "zone-b", "zone-c"),
        path: list[str] | None = None,
        pythonpath: list[str] | None = None,
        restart_backoff: tuple[float, float] = (1.0, 16.0),
    ) -> None:
        self.api = api
        self.root = root
        self.zones = zones
        self.path = path or [str(Path(sys.executable).parent)]
        self.pythonpath = pythonpath or []
        self.restart_backoff = restart_backoff
        self.pods: dict[str, PodRuntime] = {}
        self.free_ips = [f"{api.pod_network}.{n}" for n in range(2, 255)]
        self.proxies: dict[tuple[str, int], tuple[asyncio.AbstractServer, Obj]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._round_robin = 0

    # ------------------------------------------------------------------ running
    def start(self) -> Cluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.api.call(self._install)
        return self

    def stop(self) -> None:
        """Stop every container (SIGKILL) and proxy; the API objects stay."""
        if self.api.loop is None:
            return
        self.api.call(self._uninstall, timeout=30)

    def _install(self) -> None:
        nodes = self.api.resource("", "nodes")
        for index, zone in enumerate(self.zones):
            name = f"node-{chr(ord('a') + index)}"
            if self.api.find(nodes, None, name) is None:
                self.api.create(
                    nodes,
                    None,
                    {
                        "metadata": {
                            "name": name,
                            "labels": {
                                HOSTNAME_LABEL: name,
                                ZONE_LABEL: zone,
                                "kubernetes.io/os": "linux",
                            },
                        },
                        "status": {
                            "conditions": [
                                {
                                    "type": "Ready",
                                    "status": "True",
                                    "reason": "KubeletReady",
                                    "lastHeartbeatTime": now_iso(),
                                }
                            ],
                            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                            "allocatable": ALLOCATABLE,
                        },
                    },
                )
        self._wake = asyncio.Event()
        self.api.listeners.append(self._on_change)
        self._task = asyncio.get_running_loop().create_task(self._run())

    def _uninstall(self) -> None:
        if self._on_change in self.api.listeners:
            self.api.listeners.remove(self._on_change)
        if self._task is not None:
            self._task.cancel()
        for server, _ in self.proxies.values():
            server.close()
        self.proxies.clear()
        for pod in self.pods.values():
            for container in pod.containers:
                _kill(container, signal.SIGKILL)
        for pod in self.pods.values():
            for container in pod.containers:
                if container.process is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        container.process.wait(5)
                    _reap(container)

    def _on_change(self, event: str, resource: Any, obj: Obj) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while True:
            try:
                self._wake.clear()
                self._reconcile()
                await self._proxy_services()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # keep the cluster alive; the test sees the symptom
                print(f"cluster stand-in: {type(error).__name__}: {error}", file=sys.stderr)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_SECONDS * 4)
            await asyncio.sleep(TICK_SECONDS)

    def _reconcile(self) -> None:
        self._stateful_sets()
        self._jobs()
        self._schedule()
        self._kubelet()

    # ----------------------------------------------------------------- helpers
    def _r(self, group: str, plural: str) -> Any:
        return self.api.resource(group, plural)

    def _pods(self, namespace: str | None = None) -> list[Obj]:
        return self.api.select(self._r("", "pods"), namespace)

    def _owned_by(self, pods: list[Obj], uid: str) -> list[Obj]:
        return [
            p
            for p in pods
            if any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences", []))
        ]

    def _write_status(self, resource: Any, obj: Obj, status: Obj) -> None:
        if obj.get("status") == status:
            return
        with contextlib.suppress(ApiError):  # gone or changed meanwhile: next round
            self.api.replace(
                resource,
                obj["metadata"].get("namespace"),
                obj["metadata"]["name"],
                {**obj, "status": status},
                subresource="status",
            )

    @staticmethod
    def _is_ready(pod: Obj) -> bool:
        conditions = pod.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # ------------------------------------------------------- StatefulSet controller
    def _stateful_sets(self) -> None:
        sets = self._r("apps", "statefulsets")
        pods_resource = self._r("", "pods")
        for sts in self.api.select(sets):
            meta, spec = sts["metadata"], sts["spec"]
            namespace, name = meta["namespace"], meta["name"]
            if meta.get("deletionTimestamp"):
                continue
            template = spec["template"]
            revision = f"{name}-{_hash(template)}"
            owned = {
                p["metadata"]["name"]: p for p in self._owned_by(self._pods(namespace), meta["uid"])
            }
            replicas = spec.get("replicas", 1)
            parallel = spec.get("podManagementPolicy") == "Parallel"
            for ordinal in range(replicas):
                pod_name = f"{name}-{ordinal}"
                if pod_name in owned:
                    continue
                if not parallel and not all(
                    self._is_ready(owned[f"{name}-{o}"])
                    for o in range(ordinal)
                    if f"{name}-{o}" in owned
                ):
                    break
                if not parallel and any(f"{name}-{o}" not in owned for o in range(ordinal)):
                    break
                self._create_set_pod(sts, ordinal, revision)
                if not parallel:
                    break
            extra = sorted(
                (p for n, p in owned.items() if _ordinal(n, name) >= replicas),
                key=lambda p: -_ordinal(p["metadata"]["name"], name),
            )
            for pod in extra if parallel else extra[:1]:
                if not pod["metadata"].get("deletionTimestamp"):
                    with contextlib.suppress(ApiError):
                        self.api.delete(pods_resource, namespace, pod["metadata"]["name"])
            strategy = spec.get("updateStrategy", {}).get("type", "RollingUpdate")
            current = [p for n, p in owned.items() if _ordinal(n, name) < replicas]
            if strategy == "RollingUpdate" and current and all(self._is_ready(p) for p in current):
                partition = (
                    spec.get("updateStrategy", {}).get("rollingUpdate", {}).get("partition", 0)
                )
                outdated = [
                    p
                    for p in current
                    if p["metadata"].get("labels", {}).get("controller-revision-hash") != revision
                    and _ordinal(p["metadata"]["name"], name) >= partition
                ]
                if outdated:
                    newest = max(outdated, key=lambda p: _ordinal(p["metadata"]["name"], name))
                    with contextlib.suppress(ApiError):
                        self.api.delete(pods_resource, namespace, newest["metadata"]["name"])
            live = [p for p in owned.values() if not p["metadata"].get("deletionTimestamp")]
            updated = [
                p
                for p in live
                if p["metadata"].get("labels", {}).get("controller-revision-hash") == revision
            ]
            ready = [p for p in live if self._is_ready(p)]
            status = {
                **sts.get("status", {}),
                "observedGeneration": meta.get("generation", 1),
                "replicas": len(live),
                "readyReplicas": len(ready),
                "availableReplicas": len(ready),
                "currentReplicas": len(updated),
                "updatedReplicas": len(updated),
                "currentRevision": revision,
                "updateRevision": revision,
                "collisionCount": 0,
            }
            self._write_status(sets, sts, status)

    def _create_set_pod(self, sts: Obj, ordinal: int, revision: str) -> None:
        meta, spec = sts["metadata"], sts["spec"]
        namespace, name = meta["namespace"], meta["name"]
        template = copy.deepcopy(spec["template"])
        pod_name = f"{name}-{ordinal}"
        claims = self._r("", "persistentvolumeclaims")
        volumes = template["spec"].setdefault("volumes", [])
        for claim in spec.get("volumeClaimTemplates", []):
            claim_name = f"{claim['metadata']['name']}-{pod_name}"
            if self.api.find(claims, namespace, claim_name) is None:
                labels = dict(spec.get("selector", {}).get("matchLabels", {}))
                created = self.api.create(
                    claims,
                    namespace,
                    {
                        "metadata": {"name": claim_name, "labels": labels},
                        "spec": copy.deepcopy(claim.get("spec", {})),
                    },
                )
                self._write_status(
                    claims,
                    created,
                    {
                        "phase": "Bound",
                        "accessModes": claim.get("spec", {}).get("accessModes", []),
                        "capacity": claim.get("spec", {}).get("resources", {}).get("requests", {}),
                    },
                )
            volumes.append(
                {
                    "name": claim["metadata"]["name"],
                    "persistentVolumeClaim": {"claimName": claim_name},
                }
            )
        labels = {
            **template.get("metadata", {}).get("labels", {}),
            "statefulset.kubernetes.io/pod-name": pod_name,
            "apps.kubernetes.io/pod-index": str(ordinal),
            "controller-revision-hash": revision,
        }
        pod = {
            "metadata": {
                **template.get("metadata", {}),
                "name": pod_name,
                "labels": labels,
                "ownerReferences": [_owner(sts)],
            },
            "spec": {
                **template["spec"],
                "hostname": pod_name,
                "subdomain": spec.get("serviceName", ""),
            },
        }
        with contextlib.suppress(ApiError):  # an old pod of that name is still terminating
            self.api.create(self._r("", "pods"), namespace, pod)

    # --------------------------------------------------------------- Job controller
    def _jobs(self) -> None:
        jobs = self._r("batch", "jobs")
        for job in self.api.select(jobs):
            meta, spec = job["metadata"], job["spec"]
            status = job.get("status", {})
            if any(c["type"] in ("Complete", "Failed") for c in status.get("conditions", [])):
                continue
            pods = self._owned_by(self._pods(meta["namespace"]), meta["uid"])
            succeeded = sum(p["status"].get("phase") == "Succeeded" for p in pods)
            failed = sum(p["status"].get("phase") == "Failed" for p in pods)
            active = [p for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")]
            new_status: Obj = {
                **status,
                "startTime": status.get("startTime", now_iso()),
                "active": len(active),
                "succeeded": succeeded,
                "failed": failed,
            }
            if succeeded >= spec.get("completions", 1):
                new_status["completionTime"] = now_iso()
                new_status["conditions"] = [
                    {"type": "Complete", "status": "True", "lastTransitionTime": now_iso()}
                ]
            elif failed > spec.get("backoffLimit", 6):
                new_status["conditions"] = [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "lastTransitionTime": now_iso(),
                        "message": "Job has reached the specified backoff limit",
                    }
                ]
            elif not active:
                template = copy.deepcopy(spec["template"])
                labels = {
                    **template.get("metadata", {}).get("labels", {}),
                    "job-name": meta["name"],
                    "batch.kubernetes.io/job-name": meta["name"],
                    "controller-uid": meta["uid"],
                }
                self.api.create(
                    self._r("", "pods"),
                    meta["namespace"],
                    {
                        "metadata": {
                            "generateName": f"{meta['name']}-",
                            "labels": labels,
                            "ownerReferences": [_owner(job)],
                        },
                        "spec": template["spec"],
                    },
                )
            self._write_status(jobs, job, new_status)

    # ------------------------------------------------------------------ scheduler
    def _schedule(self) -> None:
        pods_resource = self._r("", "pods")
        nodes = self.api.select(self._r("", "nodes"))
        for pod in self._pods():
            if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            choice = self._choose_node(pod, nodes)
            condition = {
                "type": "PodScheduled",
                "status": "True" if choice else "False",
                "lastTransitionTime": now_iso(),
            }
            if choice is None:
                condition.update(
                    reason="Unschedulable",
                    message="0/3 nodes are available: no node matches the pod's "
                    "affinity or topology spread constraints",
                )
                old = pod.get("status", {}).get("conditions", [])
                if not any(c.get("reason") == "Unschedulable" for c in old):
                    self._write_status(
                        pods_resource, pod, {**pod.get("status", {}), "conditions": [condition]}
                    )
                continue
            bound = {**pod, "spec": {**pod["spec"], "nodeName": choice}}
            with contextlib.suppress(ApiError):
                bound = self.api.replace(
                    pods_resource, pod["metadata"]["namespace"], pod["metadata"]["name"], bound
                )
                self._write_status(
                    pods_resource,
                    bound,
                    {**bound.get("status", {}), "phase": "Pending", "conditions": [condition]},
                )

    def _choose_node(self, pod: Obj, nodes: list[Obj]) -> str | None:
        spec = pod["spec"]
        fitting = [n for n in nodes if self._fits(spec, n)]
        others = [
            p
            for p in self._pods(pod["metadata"]["namespace"])
            if p["spec"].get("nodeName")
            and p["metadata"]["uid"] != pod["metadata"]["uid"]
            and not p["metadata"].get("deletionTimestamp")
        ]
        by_node = {n["metadata"]["name"]: n for n in nodes}
        scores: dict[str, tuple[int, int, str]] = {}
        for node in fitting:
            skew_penalty = 0
            for constraint in spec.get("topologySpreadConstraints", []):
                key = constraint["topologyKey"]
                domain = node["metadata"]["labels"].get(key)
                matching = [
                    p
                    for p in others
                    if match_expressions(
                        constraint.get("labelSelector", {}), p["metadata"].get("labels", {})
                    )
                ]
                counts = {n["metadata"]["labels"].get(key): 0 for n in fitting}
                for other in matching:
                    other_domain = (
                        by_node.get(other["spec"]["nodeName"], {})
                        .get("metadata", {})
                        .get("labels", {})
                        .get(key)
                    )
                    if other_domain in counts:
                        counts[other_domain] += 1
                mine = counts.get(domain, 0) + 1
                if constraint.get("whenUnsatisfiable") == "DoNotSchedule" and mine - min(
                    counts.values(), default=0
                ) > constraint.get("maxSkew", 1):
                    skew_penalty = -1
                    break
                skew_penalty += counts.get(domain, 0)
            if skew_penalty < 0:
                continue
            load = sum(p["spec"]["nodeName"] == node["metadata"]["name"] for p in others)
            scores[node["metadata"]["name"]] = (skew_penalty, load, node["metadata"]["name"])
        return min(scores.values())[2] if scores else None

    @staticmethod
    def _fits(spec: Obj, node: Obj) -> bool:
        labels = node["metadata"].get("labels", {})
        if any(labels.get(k) != v for k, v in spec.get("nodeSelector", {}).items()):
            return False
        required = (
            spec.get("affinity", {})
            .get("nodeAffinity", {})
            .get("requiredDuringSchedulingIgnoredDuringExecution")
        )
        if not required:
            return True
        fields = {"metadata.name": node["metadata"]["name"]}
        return any(
            match_expressions({"matchExpressions": term.get("matchExpressions", [])}, labels)
            and match_expressions({"matchExpressions": term.get("matchFields", [])}, fields)
            for term in required.get("nodeSelectorTerms", [])
        )

    # -------------------------------------------------------------------- kubelet
    def _kubelet(self) -> None:
        pods_resource = self._r("", "pods")
        seen: set[str] = set()
        for pod in self._pods():
            uid = pod["metadata"]["uid"]
            if not pod["spec"].get("nodeName"):
                continue
            seen.add(uid)
            runtime = self.pods.get(uid)
            if runtime is None:
                if pod["metadata"].get("deletionTimestamp"):
                    with contextlib.suppress(ApiError):
                        self.api.delete(
                            pods_resource,
                            pod["metadata"]["namespace"],
                            pod["metadata"]["name"],
                            grace_seconds=0,
                        )
                    continue
                runtime = self._admit_pod(pod)
            self._sync_pod(pod, runtime)
        for uid in [u for u in self.pods if u not in seen]:  # deleted without grace
            runtime = self.pods[uid]
            for container in runtime.containers:
                _kill(container, signal.SIGKILL)
            if all(c.process is None or c.process.poll() is not None for c in runtime.containers):
                for container in runtime.containers:
                    _reap(container)
                asyncio.get_running_loop().create_task(self._release(runtime.ip))
                del self.pods[uid]

    async def _release(self, ip: str) -> None:
        await self.api.stop_listening(ip)
        self.free_ips.append(ip)

    def _admit_pod(self, pod: Obj) -> PodRuntime:
        meta = pod["metadata"]
        sandbox = self.root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        sandbox.mkdir(parents=True, exist_ok=True)
        runtime = PodRuntime(
            meta["namespace"],
            meta["name"],
            meta["uid"],
            self.free_ips.pop(0),
            sandbox,
            [Container(spec=c) for c in pod["spec"].get("containers", [])],
        )
        self.pods[meta["uid"]] = runtime
        account = pod["spec"].get("serviceAccountName", "default")

        async def listen() -> None:
            runtime.api_url = await self.api.listen_as(runtime.ip, runtime.namespace, account)
            self._wake.set()

        asyncio.get_running_loop().create_task(listen())
        return runtime

    def _volume_dirs(self, pod: Obj, runtime: PodRuntime) -> dict[str, Path]:
        """Each volume's directory; ConfigMaps and Secrets are (re)written as files."""
        namespace = runtime.namespace
        dirs: dict[str, Path] = {}
        refresh = time.monotonic() - runtime.volumes_refreshed >= VOLUME_REFRESH_SECONDS
        for volume in pod["spec"].get("volumes", []):
            name = volume["name"]
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                path = self.root / "claims" / namespace / claim
            else:
                path = runtime.sandbox / "volumes" / name
            path.mkdir(parents=True, exist_ok=True)
            dirs[name] = path
            if refresh:
                for source in _file_sources(volume):
                    self._write_files(path, source, pod, namespace)
        if refresh:
            runtime.volumes_refreshed = time.monotonic()
        return dirs

    def _write_files(self, path: Path, source: Obj, pod: Obj, namespace: str) -> None:
        files: dict[str, bytes] = {}
        if "configMap" in source:
            found = self.api.find(self._r("", "configmaps"), namespace, source["configMap"]["name"])
            data = (found or {}).get("data", {})
            files = {k: v.encode() for k, v in data.items()}
        elif "secret" in source:
            secret_name = source["secret"].get("secretName") or source["secret"].get("name")
            found = self.api.find(self._r("", "secrets"), namespace, secret_name)
            files = {k: base64.b64decode(v) for k, v in (found or {}).get("data", {}).items()}
            files.update({k: v.encode() for k, v in (found or {}).get("stringData", {}).items()})
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items", []):
                files[item["path"]] = str(_field(pod, item["fieldRef"]["fieldPath"])).encode()
        for key in ("configMap", "secret"):
            items = source.get(key, {}).get("items")
            if items:
                files = {item["path"]: files[item["key"]] for item in items if item["key"] in files}
        for relative, content in files.items():
            target = path / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(f".{target.name}.tmp")
            temporary.write_bytes(content)
            os.replace(temporary, target)

    def _sync_pod(self, pod: Obj, runtime: PodRuntime) -> None:
        now = time.monotonic()
        spec, meta = pod["spec"], pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and grace is not None:
            if runtime.terminating_since is None:
                runtime.terminating_since = now
                for container in runtime.containers:
                    _kill(container, signal.SIGTERM)
            if now - runtime.terminating_since >= grace:
                for container in runtime.containers:
                    _kill(container, signal.SIGKILL)
            if all(c.process is None or c.process.poll() is not None for c in runtime.containers):
                with contextlib.suppress(ApiError):
                    self.api.delete(
                        self._r("", "pods"), runtime.namespace, runtime.name, grace_seconds=0
                    )
            return
        if runtime.finished or not runtime.api_url:
            return
        runtime.mounts = self._volume_dirs(pod, runtime)
        policy = spec.get("restartPolicy", "Always")
        for container in runtime.containers:
            process = container.process
            if process is not None and process.poll() is not None:
                code = process.returncode
                container.last_exit = {
                    "terminated": {
                        "exitCode": code if code >= 0 else 128 - code,
                        "reason": "Completed" if code == 0 else ("Error" if code > 0 else "Killed"),
                        "startedAt": container.started_at,
                        "finishedAt": now_iso(),
                    }
                }
                message = _termination_message(runtime, container, failed=code != 0)
                if message:
                    container.last_exit["terminated"]["message"] = message
                _reap(container)
                container.process = None
                container.started = container.ready = False
                container.probe_failures.clear()
                container.probe_due.clear()
                if policy == "Always" or (policy == "OnFailure" and code != 0):
                    first, limit = self.restart_backoff
                    ran = now - container.started_clock
                    container.backoff = (
                        first
                        if ran > limit * 10 or not container.backoff
                        else min(container.backoff * 2, limit)
                    )
                    container.next_start = now + container.backoff
                    container.waiting_reason = "CrashLoopBackOff"
            if container.process is None and now >= max(container.next_start, container.held_until):
                if container.last_exit is not None and not (
                    policy == "Always"
                    or (
                        policy == "OnFailure" and container.last_exit["terminated"]["exitCode"] != 0
                    )
                ):
                    continue
                if container.last_exit is not None:
                    container.restarts += 1
                self._start_container(pod, runtime, container)
            self._probe(runtime, container, now)
        self._report(pod, runtime)

    def _start_container(self, pod: Obj, runtime: PodRuntime, container: Container) -> None:
        spec = container.spec
        mounts = {
            mount["mountPath"]: runtime.mounts[mount["name"]]
            for mount in spec.get("volumeMounts", [])
            if mount["name"] in runtime.mounts
        }
        # The kubelet's terminationMessagePath: a file of the pod's own, emptied at each start.
        message_file = _termination_file(runtime, spec)
        message_file.write_text("", encoding="utf-8")
        mounts[spec.get("terminationMessagePath", "/dev/termination-log")] = message_file
        env = self._environment(pod, runtime, spec, mounts)
        argv = [_expand(a, env) for a in [*spec.get("command", []), *spec.get("args", [])]]
        argv = [_map_paths(a, mounts) for a in argv]
        if not argv:
            raise ValueError(f"container {spec['name']} names no command")
        executable = next(
            (str(Path(d) / argv[0]) for d in self.path if (Path(d) / argv[0]).exists()), argv[0]
        )
        workdir = (
            _map_paths(spec["workingDir"], mounts) if spec.get("workingDir") else runtime.sandbox
        )
        logs = runtime.sandbox / "logs"
        logs.mkdir(exist_ok=True)
        output = (logs / f"{spec['name']}.log").open("ab")
        output.write(f"--- start {now_iso()} restart {container.restarts}\n".encode())
        output.flush()
        container.process = subprocess.Popen(
            [executable, *argv[1:]],
            cwd=workdir,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        output.close()
        container.started_at = now_iso()
        container.started_clock = time.monotonic()
        container.waiting_reason = ""
        container.started = "startupProbe" not in spec
        container.ready = False

    def _environment(
        self, pod: Obj, runtime: PodRuntime, spec: Obj, mounts: dict[str, Path]
    ) -> dict[str, str]:
        env = {
            "PATH": os.pathsep.join([*self.path, os.environ.get("PATH", "")]),
            "HOME": str(runtime.sandbox),
            "HOSTNAME": runtime.name,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(self.pythonpath),
            "KUBERNETES_SERVICE_HOST": self.api.host,
            "KUBERNETES_SERVICE_PORT": str(self.api.port),
            "EDDYLINE_KUBERNETES_API": runtime.api_url,
        }
        status_pod = {
            **pod,
            "status": {**pod.get("status", {}), "podIP": runtime.ip, "hostIP": "127.0.0.1"},
        }
        for source in spec.get("envFrom", []):
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                found = self.api.find(
                    self._r("", "configmaps"), runtime.namespace, source["configMapRef"]["name"]
                )
                env.update({prefix + k: v for k, v in (found or {}).get("data", {}).items()})
            if "secretRef" in source:
                found = self.api.find(
                    self._r("", "secrets"), runtime.namespace, source["secretRef"]["name"]
                )
                env.update(
                    {
                        prefix + k: base64.b64decode(v).decode()
                        for k, v in (found or {}).get("data", {}).items()
                    }
                )
        for variable in spec.get("env", []):
            if "value" in variable:
                value = _expand(variable["value"], env)
            else:
                source = variable.get("valueFrom", {})
                if "fieldRef" in source:
                    value = str(_field(status_pod, source["fieldRef"]["fieldPath"]) or "")
                elif "configMapKeyRef" in source:
                    ref = source["configMapKeyRef"]
                    found = self.api.find(self._r("", "configmaps"), runtime.namespace, ref["name"])
                    value = (found or {}).get("data", {}).get(ref["key"], "")
                elif "secretKeyRef" in source:
                    ref = source["secretKeyRef"]
                    found = self.api.find(self._r("", "secrets"), runtime.namespace, ref["name"])
                    raw = (found or {}).get("data", {}).get(ref["key"], "")
                    value = base64.b64decode(raw).decode()
                elif "resourceFieldRef" in source:
                    value = resource_field_value(spec, source["resourceFieldRef"], ALLOCATABLE)
                else:
                    value = ""
            env[variable["name"]] = _map_paths(value, mounts)
        return env

    def _probe(self, runtime: PodRuntime, container: Container, now: float) -> None:
        if container.process is None:
            return
        spec = container.spec
        if "readinessProbe" not in spec and container.started:
            container.ready = True
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = spec.get(kind)
            if probe is None or kind in container.probing:
                continue
            if kind == "startupProbe" and container.started:
                continue
            if kind != "startupProbe" and not container.started:
                continue
            due = container.probe_due.setdefault(
                kind, container.started_clock + probe.get("initialDelaySeconds", 0)
            )
            if now < due:
                continue
            container.probe_due[kind] = now + probe.get("periodSeconds", 10)
            container.probing.add(kind)
            asyncio.get_running_loop().create_task(self._run_probe(runtime, container, kind, probe))

    async def _run_probe(
        self, runtime: PodRuntime, container: Container, kind: str, probe: Obj
    ) -> None:
        try:
            ok = await _http_probe(runtime.ip, container.spec, probe)
            if container.process is None:
                return
            failures = 0 if ok else container.probe_failures.get(kind, 0) + 1
            container.probe_failures[kind] = failures
            threshold = probe.get("failureThreshold", 3)
            if kind == "startupProbe":
                if ok:
                    container.started = True
                elif failures >= threshold:
                    _kill(container, signal.SIGKILL)
            elif kind == "livenessProbe" and failures >= threshold:
                _kill(container, signal.SIGKILL)
            elif kind == "readinessProbe":
                if ok:
                    container.ready = True
                elif failures >= threshold:
                    container.ready = False
        finally:
            container.probing.discard(kind)
            self._wake.set()

    def _report(self, pod: Obj, runtime: PodRuntime) -> None:
        statuses = []
        policy = pod["spec"].get("restartPolicy", "Always")
        for container in runtime.containers:
            if container.process is not None:
                state: Obj = {"running": {"startedAt": container.started_at}}
            elif container.last_exit is not None and (
                policy == "Never"
                or (policy == "OnFailure" and container.last_exit["terminated"]["exitCode"] == 0)
            ):
                state = container.last_exit
            else:
                state = {"waiting": {"reason": container.waiting_reason or "ContainerCreating"}}
            entry: Obj = {
                "name": container.spec["name"],
                "image": container.spec.get("image", ""),
                "imageID": "",
                "containerID": f"local://{container.process.pid}" if container.process else "",
                "ready": container.ready,
                "started": container.started and container.process is not None,
                "restartCount": container.restarts,
                "state": state,
            }
            if container.last_exit is not None:
                entry["lastState"] = container.last_exit
            statuses.append(entry)
        done = [s for s in statuses if "terminated" in s["state"]]
        phase = "Running"
        if done and len(done) == len(statuses):
            failed = any(s["state"]["terminated"]["exitCode"] != 0 for s in done)
            phase = "Failed" if failed else "Succeeded"
            runtime.finished = True
        elif not any("running" in s["state"] for s in statuses) and not any(
            c.last_exit for c in runtime.containers
        ):
            phase = "Pending"
        ready = bool(statuses) and all(s["ready"] for s in statuses) and phase == "Running"
        old = pod.get("status", {})
        old_conditions = {c["type"]: c for c in old.get("conditions", [])}

        def condition(kind: str, value: bool) -> Obj:
            text = "True" if value else "False"
            previous = old_conditions.get(kind)
            if previous is not None and previous["status"] == text:
                return dict(previous)
            return {"type": kind, "status": text, "lastTransitionTime": now_iso()}

        status = {
            **old,
            "phase": phase,
            "hostIP": "127.0.0.1",
            "podIP": runtime.ip,
            "podIPs": [{"ip": runtime.ip}],
            "startTime": old.get("startTime", now_iso()),
            "conditions": [
                condition("PodScheduled", True),
                condition("Initialized", True),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ],
            "containerStatuses": statuses,
        }
        self._write_status(self._r("", "pods"), pod, status)

    # -------------------------------------------------------------- Service proxy
    async def _proxy_services(self) -> None:
        wanted: dict[tuple[str, int], Obj] = {}
        for service in self.api.select(self._r("", "services")):
            address = service["spec"].get("clusterIP")
            if not address or address == "None" or not service["spec"].get("selector"):
                continue
            for port in service["spec"].get("ports", []):
                wanted[address, port["port"]] = service
        for key in [k for k in self.proxies if k not in wanted]:
            self.proxies.pop(key)[0].close()
        for (address, port), service in wanted.items():
            if (address, port) in self.proxies:
                self.proxies[address, port] = (self.proxies[address, port][0], service)
                continue
            server = await asyncio.start_server(
                functools.partial(self._forward, (address, port)), address, port
            )
            self.proxies[address, port] = (server, service)

    async def _forward(
        self, key: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        service = self.proxies.get(key, (None, None))[1]
        endpoints = self.endpoints(service, key[1]) if service else []
        if not endpoints:
            writer.close()  # a real proxy rejects the connection when no pod is ready
            return
        self._round_robin += 1
        host, port = endpoints[self._round_robin % len(endpoints)]
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    def endpoints(self, service: Obj, port: int) -> list[tuple[str, int]]:
        """The ready pods behind a Service port, as (pod IP, container port)."""
        spec = service["spec"]
        target = next(
            (p.get("targetPort", p["port"]) for p in spec["ports"] if p["port"] == port), port
        )
        result = []
        for pod in self._pods(service["metadata"]["namespace"]):
            labels = pod["metadata"].get("labels", {})
            if any(labels.get(k) != v for k, v in spec["selector"].items()):
                continue
            if pod["metadata"].get("deletionTimestamp") or not self._is_ready(pod):
                continue
            ip = pod.get("status", {}).get("podIP")
            number = _container_port(pod, target)
            if ip and number:
                result.append((ip, number))
        return result

    # ------------------------------------------------------------ for the tests
    def kill_container(
        self,
        namespace: str,
        pod_name: str,
        sig: int = signal.SIGKILL,
        *,
        keep_down_for: float = 0.0,
    ) -> int:
        """Kill a pod's container process as a crash or the OOM killer would; returns its pid.

        ``keep_down_for`` seconds pass before the kubelet may restart it, whatever its back-off.
        """

        def kill() -> int:
            for runtime in self.pods.values():
                if (runtime.namespace, runtime.name) == (
                    namespace,
                    pod_name,
                ) and not runtime.terminating_since:
                    process = runtime.containers[0].process
                    if process is None:
                        raise LookupError(f'pod "{pod_name}" has no running container')
                    runtime.containers[0].held_until = time.monotonic() + keep_down_for
                    os.killpg(process.pid, sig)
                    return process.pid
            raise LookupError(f'no pod "{namespace}/{pod_name}" runs here')

        return int(self.api.call(kill))

    def pod_log(self, namespace: str, pod_name: str) -> str:
        """Every run's output of a pod's containers (the newest pod of that name)."""
        logs = sorted(
            (self.root / "pods").glob(f"{namespace}_{pod_name}_*/logs/*.log"),
            key=lambda p: p.stat().st_mtime,
        )
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def pod_ips(self) -> Iterator[tuple[str, str]]:
        for runtime in list(self.pods.values()):
            yield runtime.name, runtime.ip


def _owner(obj: Obj) -> Obj:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _hash(template: Obj) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _ordinal(pod_name: str, set_name: str) -> int:
    suffix = pod_name.removeprefix(f"{set_name}-")
    return int(suffix) if suffix.isdigit() else -1


def _file_sources(volume: Obj) -> list[Obj]:
    if "projected" in volume:
        return list(volume["projected"].get("sources", []))
    return [{k: v} for k, v in volume.items() if k in ("configMap", "secret", "downwardAPI")]


def _field(pod: Obj, path: str) -> Any:
    if match := re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path):
        return pod["metadata"].get(match.group(1), {}).get(match.group(2))
    value: Any = pod
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion; ``$$`` escapes, unknown names stay as written."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def _map_paths(text: str, mounts: dict[str, Path]) -> str:
    """Replace each mount path (as a whole path prefix) by its directory here, in one pass."""
    if not mounts:
        return text
    by_path = {path.rstrip("/") or "/": str(directory) for path, directory in mounts.items()}
    alternatives = "|".join(re.escape(p) for p in sorted(by_path, key=len, reverse=True))
    pattern = r"(?<![\w.-])(" + alternatives + r")(?=/|$|[^\w.-])"
    return re.sub(pattern, lambda match: by_path[match.group(1)], text)


def _container_port(pod: Obj, target: Any) -> int | None:
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        return int(target)
    for container in pod["spec"].get("containers", []):
        for port in container.get("ports", []):
            if port.get("name") == target:
                return int(port["containerPort"])
    return None


async def _http_probe(ip: str, container: Obj, probe: Obj) -> bool:
    action = probe.get("httpGet")
    timeout = probe.get("timeoutSeconds", 1)
    if action is None:
        return "tcpSocket" not in probe or await _tcp_probe(ip, container, probe, timeout)
    port = _container_port({"spec": {"containers": [container]}}, action["port"])
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
        try:
            writer.write(
                f"GET {action.get('path', '/')} HTTP/1.1\r\nHost: {ip}\r\n"
                "User-Agent: kube-probe/1.32\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), timeout)
        finally:
            writer.close()
        status = int(line.split()[1]) if len(line.split()) > 1 else 0
        return 200 <= status < 400
    except (OSError, TimeoutError, ValueError):
        return False


async def _tcp_probe(ip: str, container: Obj, probe: Obj, timeout: float) -> bool:
    port = _container_port({"spec": {"containers": [container]}}, probe["tcpSocket"]["port"])
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
        writer.close()
        return True
    except (OSError, TimeoutError):
        return False


def _termination_file(runtime: PodRuntime, spec: Obj) -> Path:
    return runtime.sandbox / f"termination-log-{spec['name']}"


# What a kubelet keeps of a termination message, and of the log's tail with
# FallbackToLogsOnError (80 lines, 2048 bytes).
_MESSAGE_BYTES, _LOG_TAIL_LINES, _LOG_TAIL_BYTES = 4096, 80, 2048


def _termination_message(runtime: PodRuntime, container: Container, *, failed: bool) -> str:
    """The file at terminationMessagePath, else (FallbackToLogsOnError, a failed container)
    the log's tail, as a kubelet reports it in ``state.terminated.message``."""
    path = _termination_file(runtime, container.spec)
    text = path.read_text(errors="replace")[:_MESSAGE_BYTES] if path.exists() else ""
    if text or not failed:
        return text
    if container.spec.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        return ""
    log = runtime.sandbox / "logs" / f"{container.spec['name']}.log"
    if not log.exists():
        return ""
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:])
    return tail[-_LOG_TAIL_BYTES:]


def _kill(container: Container, sig: int) -> None:
    if container.process is not None and container.process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(container.process.pid, sig)


def _reap(container: Container) -> None:
    """Collect an exited process (its log file was closed right after the start)."""
    if container.process is not None:
        with contextlib.suppress(Exception):
            container.process.poll()
