"""The kubelet stand-in: three Nodes whose pods run as real local processes.

Each node is a client of the real API server as ``system:node:<name>`` (group
``system:nodes``, a client certificate from the harness CA), so the Node authorizer and the
NodeRestriction admission plugin hold it to what a kubelet may do. A node:

- registers its Node (zone label, capacity and allocatable) and renews its Lease in
  ``kube-node-lease`` every 10 s, as a kubelet does; the real node lifecycle controller
  judges it by that Lease;
- watches the pods the real scheduler bound to it (``spec.nodeName``) and runs each container
  as a process on the pod's own loopback address (``127.<cluster>.<node>.<n>``, the pod IP;
  ``<cluster>`` from :func:`free_address_octet`), or on one of the routable range of
  :mod:`.pod_network` for a cluster that asks (the API server's pod proxy refuses loopback);
- prepares volumes: claims on the PersistentVolume's directory (from the local provisioner),
  ConfigMaps, Secrets, downward API, and the projected service-account token from the
  TokenRequest API with the cluster CA (``kube-root-ca.crt``), so pods reach the API server over
  HTTPS as in-cluster clients do;
- runs startup, liveness and readiness probes at their periods and reports container states
  and conditions (strategic merge patches of ``pods/status``, as a kubelet sends);
- honours grace periods: SIGTERM, the grace period, then SIGKILL, for deletes and liveness
  kills alike; restarts with a kubelet's back-off (immediately once, then 10 s doubling to
  300 s);
- can be killed (:meth:`Node.kill`): Lease renewals, status updates and its processes stop
  together, as when a machine loses power.

It never writes what a controller owns (StatefulSet and Job pods, claims, bindings): only its
Node, its Lease, its pods' status, and the final deletion of pods it has stopped.
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.control_plane.client import (
    STRATEGIC_MERGE_PATCH,
    ApiError,
    Client,
    Informer,
)
from tests.support.control_plane.pods import (
    Container,
    Obj,
    PodRuntime,
    exited,
    expand,
    field_value,
    kill_all,
    map_paths,
    now_iso,
    now_micro,
    probe,
    resource_field_value,
    signal_container,
    termination_file,
    termination_message,
)

ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"
LEASE_SECONDS = 40
RENEW_SECONDS = 10.0
# A kubelet reports node status at least this often even when nothing changed.
NODE_STATUS_SECONDS = 60.0
# A real kubelet re-reads ConfigMap and Secret volumes about once a minute.
VOLUME_REFRESH_SECONDS = 60.0
TICK_SECONDS = 0.2
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# The runtime reads its service-account files from here when set (no mount namespaces here).
SERVICE_ACCOUNT_ENV = "EDDYLINE_SERVICE_ACCOUNT_DIR"
CAPACITY = {"cpu": "8", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"}


class Node:
    """One node's kubelet, on a thread of its own."""

    def __init__(
        self,
        client: Client,
        name: str,
        zone: str,
        index: int,
        root: Path,
        *,
        api_host: str,
        api_port: int,
        path: list[str],
        pythonpath: list[str],
        restart_backoff: tuple[float, float] = (10.0, 300.0),
        address_octet: int = 10,
        address_first_octet: int = 127,
    ) -> None:
        self.client = client
        self.name = name
        self.zone = zone
        self.index = index
        self.root = root
        self.api_host, self.api_port = api_host, api_port
        self.path = path
        self.pythonpath = pythonpath
        self.restart_backoff = restart_backoff
        self.pods: dict[str, PodRuntime] = {}
        self.address_octet = address_octet
        self.free_ips = [
            f"{address_first_octet}.{address_octet}.{index}.{n}" for n in range(2, 255)
        ]
        self.lock = threading.RLock()
        self.alive = True
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._probes = ThreadPoolExecutor(8, thread_name_prefix=f"probes-{name}")
        self._informer = Informer(
            client, "/api/v1/pods", field_selector=f"spec.nodeName={name}", on_change=self._wake.set
        )
        self._thread = threading.Thread(target=self._run, name=f"kubelet {name}", daemon=True)
        self._lease_renewed = -1e9
        self._status_reported = -1e9
        self.errors: list[str] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Node:
        self.root.mkdir(parents=True, exist_ok=True)
        self._register()
        self._informer.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop this kubelet and SIGKILL its processes (end of a test run)."""
        self._stop.set()
        self._wake.set()
        self._informer.stop()
        self._thread.join(30)
        with self.lock:
            kill_all(list(self.pods.values()))
        self._probes.shutdown(wait=False, cancel_futures=True)

    def kill(self) -> None:
        """The machine dies: no more Lease renewals or status, every process SIGKILLed."""
        self.alive = False
        self.stop()

    def rebooted(self) -> Node:
        """The same machine booted again (not started): a new kubelet with this one's name,
        zone, addresses and directories, which renews the Lease again and restarts the pods
        still bound to the node, as a rebooted kubelet does."""
        return Node(
            self.client, self.name, self.zone, self.index, self.root,
            api_host=self.api_host, api_port=self.api_port, path=self.path,
            pythonpath=self.pythonpath, restart_backoff=self.restart_backoff,
            address_octet=self.address_octet,
        )  # fmt: skip

    # --------------------------------------------------------------------- node
    def _register(self) -> None:
        labels = {
            HOSTNAME_LABEL: self.name,
            ZONE_LABEL: self.zone,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }
        self.client.ensure("/api/v1/nodes", {"metadata": {"name": self.name, "labels": labels}})
        self._report_node()
        self._renew_lease()

    def _report_node(self) -> None:
        now = now_iso()

        def condition(kind: str, status: str, reason: str, message: str) -> Obj:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
            }

        status = {
            "capacity": CAPACITY,
            "allocatable": CAPACITY,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
                condition("Ready", "True", "KubeletReady", "kubelet stand-in is posting ready"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v1.33-eddyline-stand-in",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "local-process://1",
                "kernelVersion": os.uname().release,
                "osImage": "eddyline kubelet stand-in",
                "bootID": "",
                "machineID": "",
                "systemUUID": "",
            },
        }
        self.client.patch(
            f"/api/v1/nodes/{self.name}/status", {"status": status}, kind=STRATEGIC_MERGE_PATCH
        )
        self._status_reported = time.monotonic()

    def _renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        lease = self.client.get(path)
        spec = {
            "holderIdentity": self.name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": now_micro(),
        }
        if lease is None:
            self.client.ensure(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {"metadata": {"name": self.name}, "spec": spec},
            )
        else:
            self.client.request(path, "PUT", {**lease, "spec": {**lease["spec"], **spec}})
        self._lease_renewed = time.monotonic()

    # --------------------------------------------------------------------- loop
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                now = time.monotonic()
                if now - self._lease_renewed >= RENEW_SECONDS:
                    self._renew_lease()
                if now - self._status_reported >= NODE_STATUS_SECONDS:
                    self._report_node()
                with self.lock:
                    self._sync_pods()
            except Exception as error:  # keep the node alive; the test sees the symptom
                message = f"kubelet {self.name}: {type(error).__name__}: {error}"
                self.errors.append(message)
                print(message, file=sys.stderr)
            self._wake.wait(TICK_SECONDS)

    def _sync_pods(self) -> None:
        seen: set[str] = set()
        for pod in self._informer.items():
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            runtime = self.pods.get(uid)
            if runtime is None:
                if pod["metadata"].get("deletionTimestamp") or pod.get("status", {}).get(
                    "phase"
                ) in ("Succeeded", "Failed"):
                    if pod["metadata"].get("deletionTimestamp"):
                        self._finish_deletion(
                            pod["metadata"]["namespace"], pod["metadata"]["name"], uid
                        )
                    continue
                runtime = self._admit(pod)
            try:
                self._sync_pod(pod, runtime)
            except ApiError as error:
                if error.code not in (404, 409):
                    raise
        for uid in [u for u in self.pods if u not in seen]:  # deleted without grace
            runtime = self.pods[uid]
            for container in runtime.containers:
                signal_container(container, signal.SIGKILL)
            if exited(runtime):
                self.free_ips.append(runtime.ip)
                del self.pods[uid]

    def _admit(self, pod: Obj) -> PodRuntime:
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
        return runtime

    def _finish_deletion(self, namespace: str, name: str, uid: str) -> None:
        """The pod's processes are gone: remove it for good (grace 0, this uid only)."""
        with contextlib.suppress(ApiError):
            self.client.request(
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                "DELETE",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
            )

    def _sync_pod(self, pod: Obj, runtime: PodRuntime) -> None:
        now = time.monotonic()
        spec, meta = pod["spec"], pod["metadata"]
        if meta.get("deletionTimestamp"):
            grace = meta.get("deletionGracePeriodSeconds") or 0
            if runtime.terminating_since is None:
                runtime.terminating_since = now
                for container in runtime.containers:
                    signal_container(container, signal.SIGTERM)
            if now - runtime.terminating_since >= grace:
                for container in runtime.containers:
                    signal_container(container, signal.SIGKILL)
            if exited(runtime):
                self._collect_exits(runtime, now, restart=False)
                self._report(pod, runtime)
                self._finish_deletion(runtime.namespace, runtime.name, runtime.uid)
            return
        if runtime.finished:
            return
        mounts = self._volume_dirs(pod, runtime)
        if mounts is None:  # a claim not bound yet: wait, as ContainerCreating
            self._report(pod, runtime)
            return
        runtime.mounts = mounts
        policy = spec.get("restartPolicy", "Always")
        self._collect_exits(runtime, now, restart=True, policy=policy)
        for container in runtime.containers:
            if container.kill_deadline is not None and now >= container.kill_deadline:
                signal_container(container, signal.SIGKILL)
            if container.process is None and now >= container.next_start:
                if container.last_exit is not None and not _restarts(
                    policy, container.last_exit["terminated"]["exitCode"]
                ):
                    continue
                if container.last_exit is not None:
                    container.restarts += 1
                self._start_container(pod, runtime, container)
            self._probe(runtime, container, now, spec)
        self._report(pod, runtime)

    def _collect_exits(
        self, runtime: PodRuntime, now: float, *, restart: bool, policy: str = "Never"
    ) -> None:
        for container in runtime.containers:
            process = container.process
            if process is None or process.poll() is None:
                continue
            code = process.returncode
            exit_code = code if code >= 0 else 128 - code
            reason = "Completed" if code == 0 else "Error"
            if container.killed_reason:
                reason = "Error"
            container.last_exit = {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": reason,
                    "startedAt": container.started_at,
                    "finishedAt": now_iso(),
                    "containerID": f"local://{process.pid}",
                }
            }
            message = termination_message(runtime, container, failed=code != 0)
            if message:
                container.last_exit["terminated"]["message"] = message
            container.process = None
            container.started = container.ready = False
            container.kill_deadline = None
            container.killed_reason = ""
            container.probe_failures.clear()
            container.probe_due.clear()
            if restart and _restarts(policy, exit_code):
                first, limit = self.restart_backoff
                ran = now - container.started_clock
                if ran > 600 or not container.restarts:
                    # A kubelet restarts a first crash (or one after 10 min of running) at once.
                    container.backoff = 0.0 if not container.backoff or ran > 600 else first
                else:
                    container.backoff = min(max(container.backoff * 2, first), limit)
                container.next_start = now + container.backoff
                container.waiting_reason = "CrashLoopBackOff" if container.backoff else ""

    # ------------------------------------------------------------------ volumes
    def _volume_dirs(self, pod: Obj, runtime: PodRuntime) -> dict[str, Path] | None:
        """Each volume's directory (files refreshed every minute), or None while waiting."""
        namespace = runtime.namespace
        dirs: dict[str, Path] = {}
        refresh = time.monotonic() - runtime.volumes_refreshed >= VOLUME_REFRESH_SECONDS
        for volume in pod["spec"].get("volumes", []):
            name = volume["name"]
            if "persistentVolumeClaim" in volume:
                claim_name = volume["persistentVolumeClaim"]["claimName"]
                found = runtime.mounts.get(name) or self._claim_directory(namespace, claim_name)
                if found is None:
                    return None
                dirs[name] = found
                continue
            path = runtime.sandbox / "volumes" / name
            path.mkdir(parents=True, exist_ok=True)
            dirs[name] = path
            if refresh:
                for source in _file_sources(volume):
                    self._write_files(path, source, pod, runtime)
        if refresh:
            runtime.volumes_refreshed = time.monotonic()
        return dirs

    def _claim_directory(self, namespace: str, claim: str) -> Path | None:
        found = self.client.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        if found is None or found.get("status", {}).get("phase") != "Bound":
            return None
        volume = self.client.get(f"/api/v1/persistentvolumes/{found['spec']['volumeName']}")
        if volume is None:
            return None
        source = volume["spec"].get("local") or volume["spec"].get("hostPath") or {}
        if "path" not in source:
            raise RuntimeError(f"PersistentVolume {volume['metadata']['name']} has no local path")
        directory = Path(source["path"])
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def _write_files(self, path: Path, source: Obj, pod: Obj, runtime: PodRuntime) -> None:
        namespace = runtime.namespace
        files: dict[str, bytes] = {}
        items: list[Obj] | None = None
        if "configMap" in source:
            ref = source["configMap"]
            found = self.client.get(f"/api/v1/namespaces/{namespace}/configmaps/{ref['name']}")
            files = {k: v.encode() for k, v in (found or {}).get("data", {}).items()}
            items = ref.get("items")
        elif "secret" in source:
            ref = source["secret"]
            secret = ref.get("secretName") or ref.get("name")
            found = self.client.get(f"/api/v1/namespaces/{namespace}/secrets/{secret}")
            files = {k: base64.b64decode(v) for k, v in (found or {}).get("data", {}).items()}
            items = ref.get("items")
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items", []):
                if "fieldRef" in item:
                    value = field_value(pod, item["fieldRef"]["fieldPath"])
                    files[item["path"]] = str(value).encode()
        elif "serviceAccountToken" in source:
            files[source["serviceAccountToken"]["path"]] = self._token(pod, source).encode()
        if items:
            files = {item["path"]: files[item["key"]] for item in items if item["key"] in files}
        for relative, content in files.items():
            target = path / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(f".{target.name}.tmp")
            temporary.write_bytes(content)
            os.replace(temporary, target)

    def _token(self, pod: Obj, source: Obj) -> str:
        """A projected token bound to the pod, from the TokenRequest API (as a kubelet asks)."""
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName", "default")
        token = source["serviceAccountToken"]
        spec: Obj = {
            "expirationSeconds": token.get("expirationSeconds", 3607),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
            },
        }
        if token.get("audience"):
            spec["audiences"] = [token["audience"]]
        answer = self.client.create(
            f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return str(answer["status"]["token"])

    # --------------------------------------------------------------- containers
    def _start_container(self, pod: Obj, runtime: PodRuntime, container: Container) -> None:
        spec = container.spec
        mounts = {
            mount["mountPath"]: runtime.mounts[mount["name"]]
            for mount in spec.get("volumeMounts", [])
            if mount["name"] in runtime.mounts
        }
        # The kubelet's terminationMessagePath: a file of the pod's own, emptied at each start.
        message_file = termination_file(runtime, spec)
        message_file.write_text("", encoding="utf-8")
        mounts[spec.get("terminationMessagePath", "/dev/termination-log")] = message_file
        env = self._environment(pod, runtime, spec, mounts)
        argv = [expand(a, env) for a in [*spec.get("command", []), *spec.get("args", [])]]
        argv = [map_paths(a, mounts) for a in argv]
        if not argv:
            raise ValueError(f"container {spec['name']} names no command")
        executable = next(
            (str(Path(d) / argv[0]) for d in self.path if (Path(d) / argv[0]).exists()), argv[0]
        )
        workdir = (
            map_paths(spec["workingDir"], mounts) if spec.get("workingDir") else runtime.sandbox
        )
        logs = runtime.sandbox / "logs"
        logs.mkdir(exist_ok=True)
        with (logs / f"{spec['name']}.log").open("ab") as output:
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
        container.started_at = now_iso()
        container.started_clock = time.monotonic()
        container.waiting_reason = ""
        container.started = "startupProbe" not in spec
        container.ready = False

    def _environment(
        self, pod: Obj, runtime: PodRuntime, spec: Obj, mounts: dict[str, Path]
    ) -> dict[str, str]:
        namespace = runtime.namespace
        env = {
            "PATH": os.pathsep.join([*self.path, os.environ.get("PATH", "")]),
            "HOME": str(runtime.sandbox),
            "HOSTNAME": runtime.name,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(self.pythonpath),
            # The API server itself (no Service VIP for it: docs/operator.md).
            "KUBERNETES_SERVICE_HOST": self.api_host,
            "KUBERNETES_SERVICE_PORT": str(self.api_port),
        }
        if SERVICE_ACCOUNT_MOUNT in mounts:
            env[SERVICE_ACCOUNT_ENV] = str(mounts[SERVICE_ACCOUNT_MOUNT])
        status_pod = {
            **pod,
            "status": {**pod.get("status", {}), "podIP": runtime.ip, "hostIP": "127.0.0.1"},
        }
        for source in spec.get("envFrom", []):
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                found = self.client.get(
                    f"/api/v1/namespaces/{namespace}/configmaps/{source['configMapRef']['name']}"
                )
                env.update({prefix + k: v for k, v in (found or {}).get("data", {}).items()})
            if "secretRef" in source:
                found = self.client.get(
                    f"/api/v1/namespaces/{namespace}/secrets/{source['secretRef']['name']}"
                )
                env.update(
                    {
                        prefix + k: base64.b64decode(v).decode()
                        for k, v in (found or {}).get("data", {}).items()
                    }
                )
        for variable in spec.get("env", []):
            if "value" in variable:
                value = expand(variable["value"], env)
            else:
                source = variable.get("valueFrom", {})
                if "resourceFieldRef" in source:
                    value = resource_field_value(spec, source["resourceFieldRef"], CAPACITY)
                else:
                    value = self._env_source(status_pod, namespace, source)
            env[variable["name"]] = map_paths(value, mounts)
        return env

    def _env_source(self, pod: Obj, namespace: str, source: Obj) -> str:
        if "fieldRef" in source:
            return str(field_value(pod, source["fieldRef"]["fieldPath"]) or "")
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            found = self.client.get(f"/api/v1/namespaces/{namespace}/configmaps/{ref['name']}")
            return str((found or {}).get("data", {}).get(ref["key"], ""))
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            found = self.client.get(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")
            raw = (found or {}).get("data", {}).get(ref["key"], "")
            return base64.b64decode(raw).decode()
        return ""

    # ------------------------------------------------------------------- probes
    def _probe(self, runtime: PodRuntime, container: Container, now: float, pod_spec: Obj) -> None:
        if container.process is None or container.kill_deadline is not None:
            return
        spec = container.spec
        if "readinessProbe" not in spec and container.started:
            container.ready = True
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            action = spec.get(kind)
            if action is None or kind in container.probing:
                continue
            if (kind == "startupProbe") == container.started:
                continue
            due = container.probe_due.setdefault(
                kind, container.started_clock + action.get("initialDelaySeconds", 0)
            )
            if now < due:
                continue
            container.probe_due[kind] = now + action.get("periodSeconds", 10)
            container.probing.add(kind)
            self._probes.submit(self._run_probe, runtime, container, kind, action, pod_spec)

    def _run_probe(
        self, runtime: PodRuntime, container: Container, kind: str, action: Obj, pod_spec: Obj
    ) -> None:
        try:
            process = container.process
            ok = probe(runtime.ip, container.spec, action)
            with self.lock:
                if container.process is not process or process is None:
                    return  # the container restarted meanwhile: this answer is stale
                failures = 0 if ok else container.probe_failures.get(kind, 0) + 1
                container.probe_failures[kind] = failures
                threshold = action.get("failureThreshold", 3)
                if kind == "startupProbe" and ok:
                    container.started = True
                elif kind == "readinessProbe":
                    if ok:
                        container.ready = True
                    elif failures >= threshold:
                        container.ready = False
                elif not ok and failures >= threshold:  # liveness, or startup given up
                    grace = action.get("terminationGracePeriodSeconds")
                    if grace is None:
                        grace = pod_spec.get("terminationGracePeriodSeconds", 30)
                    container.ready = False
                    container.killed_reason = kind
                    container.kill_deadline = time.monotonic() + float(grace)
                    signal_container(container, signal.SIGTERM)
        finally:
            container.probing.discard(kind)
            self._wake.set()

    # ------------------------------------------------------------------- status
    def _report(self, pod: Obj, runtime: PodRuntime) -> None:
        statuses = []
        policy = pod["spec"].get("restartPolicy", "Always")
        for container in runtime.containers:
            if container.process is not None:
                state: Obj = {"running": {"startedAt": container.started_at}}
            elif container.last_exit is not None and (
                runtime.terminating_since is not None
                or not _restarts(policy, container.last_exit["terminated"]["exitCode"])
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
            if container.last_exit is not None and state is not container.last_exit:
                entry["lastState"] = container.last_exit
            statuses.append(entry)
        done = [s for s in statuses if "terminated" in s["state"]]
        phase = "Running"
        if done and len(done) == len(statuses) and runtime.terminating_since is None:
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
                return {"type": kind, "status": text}
            return {"type": kind, "status": text, "lastTransitionTime": now_iso()}

        status: Obj = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": runtime.ip,
            "podIPs": [{"ip": runtime.ip}],
            "startTime": old.get("startTime") or now_iso(),
            "conditions": [
                condition("PodReadyToStartContainers", True),
                condition("Initialized", True),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ],
            "containerStatuses": statuses,
        }
        comparable = {
            **status,
            "conditions": [(c["type"], c["status"]) for c in status["conditions"]],
        }
        if comparable == runtime.reported:
            return
        if old.get("podIP") not in (None, runtime.ip):
            # A rebooted node gave the pod another address: replace the list (a strategic
            # merge would add the new IP beside the old one, which the server refuses).
            status["podIPs"] = [{"ip": runtime.ip}, {"$patch": "replace"}]
        self.client.patch(
            f"/api/v1/namespaces/{runtime.namespace}/pods/{runtime.name}/status",
            {"status": status},
            kind=STRATEGIC_MERGE_PATCH,
        )
        runtime.reported = comparable

    # -------------------------------------------------------------- for tests
    def kill_container(self, namespace: str, pod_name: str, sig: int = signal.SIGKILL) -> int:
        """Signal a pod's first container as a crash or the OOM killer would; its pid."""
        with self.lock:
            for runtime in self.pods.values():
                if (runtime.namespace, runtime.name) == (namespace, pod_name) and (
                    runtime.terminating_since is None
                ):
                    process = runtime.containers[0].process
                    if process is None:
                        raise LookupError(f'pod "{pod_name}" has no running container')
                    os.killpg(process.pid, sig)
                    return process.pid
        raise LookupError(f'no pod "{namespace}/{pod_name}" runs on node {self.name}')

    def runs(self, namespace: str, pod_name: str) -> bool:
        with self.lock:
            return any((r.namespace, r.name) == (namespace, pod_name) for r in self.pods.values())


def _restarts(policy: str, exit_code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


def _file_sources(volume: Obj) -> list[Obj]:
    if "projected" in volume:
        return list(volume["projected"].get("sources", []))
    return [{k: v} for k, v in volume.items() if k in ("configMap", "secret", "downwardAPI")]


class Kubelets:
    """The three nodes (``node-a``.. in zones ``zone-a``..) and the test hooks across them."""

    def __init__(
        self,
        nodes: list[Node],
    ) -> None:
        self.nodes = {node.name: node for node in nodes}

    def start(self) -> Kubelets:
        for node in self.nodes.values():
            node.start()
        return self

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.alive:
                node.stop()

    def node_of(self, namespace: str, pod_name: str) -> Node:
        for node in self.nodes.values():
            if node.alive and node.runs(namespace, pod_name):
                return node
        raise LookupError(f'no live node runs pod "{namespace}/{pod_name}"')

    def kill_container(self, namespace: str, pod_name: str, sig: int = signal.SIGKILL) -> int:
        return self.node_of(namespace, pod_name).kill_container(namespace, pod_name, sig)

    def crash_with_volume_emptied(self, namespace: str, pod_name: str, volume: Path) -> int:
        """A pod's container crashes having lost ``volume`` (a claim's directory, emptied):
        the container is frozen (SIGSTOP) so it writes nothing more there, the directory is
        emptied, then the container is killed. A kubelet restarts a first crash at once, so
        the restart finds the volume empty with no back-off to wait out. Its pid."""
        pid = self.kill_container(namespace, pod_name, signal.SIGSTOP)
        try:
            for entry in volume.iterdir():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        finally:
            os.killpg(pid, signal.SIGKILL)
        return pid

    def kill_node(self, name: str) -> None:
        self.nodes[name].kill()

    def reboot_node(self, name: str) -> None:
        """A killed node comes back (so a test that killed one leaves the session's cluster
        with its three nodes)."""
        node = self.nodes[name]
        if node.alive:
            raise RuntimeError(f"node {name} is running: kill_node({name!r}) first")
        self.nodes[name] = node.rebooted().start()

    def pod_log(self, namespace: str, pod_name: str) -> str:
        """Every run's output of a pod's containers (the newest pod of that name)."""
        logs = sorted(
            (
                log
                for node in self.nodes.values()
                for log in (node.root / "pods").glob(f"{namespace}_{pod_name}_*/logs/*.log")
            ),
            key=lambda p: p.stat().st_mtime,
        )
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def service_account_dir(self, namespace: str, pod_name: str) -> Path:
        """The directory a running pod's service-account token and CA are written to."""
        node = self.node_of(namespace, pod_name)
        with node.lock:
            runtime = next(
                r for r in node.pods.values() if (r.namespace, r.name) == (namespace, pod_name)
            )
            for path, directory in runtime.mounts.items():
                if (directory / "token").exists() and path.startswith("kube-api-access"):
                    return directory
        raise LookupError(f'pod "{namespace}/{pod_name}" has no service-account token')

    def errors(self) -> list[str]:
        return [e for node in self.nodes.values() for e in node.errors]


def free_address_octet(
    node_count: int, port: int = 7070, *, first: int = 127, octets: tuple[int, int] = (20, 250)
) -> int:
    """A second octet for one cluster's pod addresses (``<first>.<octet>.<node>.<n>``) that
    no other cluster on this machine uses now.

    Pods bind fixed ports (the query port, 7070) on their own address, so two clusters
    handing out the same addresses (two test sessions, or a bench beside them) would have one
    pod fail to bind and the other's clients read the wrong pod. A random octet in
    ``octets``, checked free on every node's first address, keeps each cluster apart."""
    rng = random.SystemRandom()
    for _ in range(100):
        octet = rng.randint(*octets)
        if first == 127 and octet == 96:  # the Service proxy's range (plane.SERVICE_CIDR)
            continue
        if not any(_listening(f"{first}.{octet}.{index}.2", port) for index in range(node_count)):
            return octet
    raise RuntimeError(
        f"no free {first}.<octet>.x.x range for the kubelet stand-in's pod addresses"
    )


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False
