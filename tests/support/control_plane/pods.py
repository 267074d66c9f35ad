"""What a kubelet does inside one pod, without container runtime: processes, env, probes.

Shared pieces of the kubelet stand-in (:mod:`support.control_plane.kubelet`): there are no
mount namespaces, so each ``mountPath`` is mapped to its directory in the container's command,
args, env values and workingDir (the pod contract in docs/operator.md promises that every path
a pod uses appears there), and each pod listens on its own loopback address.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_CEILING
from pathlib import Path
from typing import Any

from eddyline_runtime.spec import quantity_value

Obj = dict[str, Any]

# What a kubelet keeps of a termination message, and of the log's tail with
# FallbackToLogsOnError (80 lines, 2048 bytes).
MESSAGE_BYTES, LOG_TAIL_LINES, LOG_TAIL_BYTES = 4096, 80, 2048


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Container:
    """One container's process and what the kubelet knows about it."""

    spec: Obj
    process: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    started_clock: float = 0.0
    restarts: int = 0
    next_start: float = 0.0
    backoff: float = 0.0
    started: bool = False  # the startup probe passed
    ready: bool = False
    last_exit: Obj | None = None
    waiting_reason: str = "ContainerCreating"
    probe_failures: dict[str, int] = field(default_factory=dict)
    probe_due: dict[str, float] = field(default_factory=dict)
    probing: set[str] = field(default_factory=set)
    # A liveness (or startup) failure: SIGTERM was sent, SIGKILL follows at this clock.
    kill_deadline: float | None = None
    killed_reason: str = ""


@dataclass
class PodRuntime:
    namespace: str
    name: str
    uid: str
    ip: str
    sandbox: Path
    containers: list[Container]
    mounts: dict[str, Path] = field(default_factory=dict)
    volumes_refreshed: float = -1e9
    terminating_since: float | None = None
    finished: bool = False
    reported: Obj | None = None  # the last status written


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion; ``$$`` escapes, unknown names stay as written."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def map_paths(text: str, mounts: dict[str, Path]) -> str:
    """Replace each mount path (as a whole path prefix) by its directory here, in one pass."""
    if not mounts:
        return text
    by_path = {path.rstrip("/") or "/": str(directory) for path, directory in mounts.items()}
    alternatives = "|".join(re.escape(p) for p in sorted(by_path, key=len, reverse=True))
    pattern = r"(?<![\w.-])(" + alternatives + r")(?=/|$|[^\w.-])"
    return re.sub(pattern, lambda match: by_path[match.group(1)], text)


def field_value(pod: Obj, path: str) -> Any:
    if match := re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path):
        return pod["metadata"].get(match.group(1), {}).get(match.group(2))
    value: Any = pod
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def resource_field_value(container: Obj, ref: Obj, allocatable: Obj) -> str:
    """A ``resourceFieldRef`` as the kubelet resolves it: the container's limit (or request),
    else the node's allocatable amount, divided by ``divisor`` and rounded up."""
    kind, _, name = str(ref["resource"]).partition(".")
    quantity = (container.get("resources") or {}).get(kind, {}).get(name)
    if quantity is None and kind == "limits":
        quantity = allocatable.get(name)
    if quantity is None:
        return "0"
    # The API server stores an unset divisor as "0"; the kubelet reads 0 as 1.
    divisor = quantity_value(str(ref.get("divisor") or "1")) or 1
    value = quantity_value(str(quantity)) / divisor
    return str(int(value.to_integral_value(rounding=ROUND_CEILING)))


def container_port(spec: Obj, target: Any) -> int | None:
    """A port by number or by the container's port name."""
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        return int(target)
    for port in spec.get("ports", []):
        if port.get("name") == target:
            return int(port["containerPort"])
    return None


def probe(ip: str, spec: Obj, action: Obj) -> bool:
    """One httpGet or tcpSocket probe (blocking, bounded by its timeoutSeconds)."""
    timeout = float(action.get("timeoutSeconds", 1))
    if "httpGet" in action:
        get = action["httpGet"]
        port = container_port(spec, get["port"])
        url = f"http://{ip}:{port}{get.get('path', '/')}"
        request = urllib.request.Request(url, headers={"User-Agent": "kube-probe/1.33"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return 200 <= int(response.status) < 400
        except urllib.error.HTTPError as error:
            return 200 <= error.code < 400
        except (OSError, ValueError):
            return False
    if "tcpSocket" in action:
        port = container_port(spec, action["tcpSocket"]["port"])
        try:
            with socket.create_connection((ip, port or 0), timeout=timeout):
                return True
        except OSError:
            return False
    return True  # exec probes: there is no container to exec in (no pod here uses one)


def termination_file(runtime: PodRuntime, spec: Obj) -> Path:
    return runtime.sandbox / f"termination-log-{spec['name']}"


def termination_message(runtime: PodRuntime, container: Container, *, failed: bool) -> str:
    """The file at terminationMessagePath, else (FallbackToLogsOnError, a failed container)
    the log's tail, as a kubelet reports it in ``state.terminated.message``."""
    path = termination_file(runtime, container.spec)
    text = path.read_text(errors="replace")[:MESSAGE_BYTES] if path.exists() else ""
    if text or not failed:
        return text
    if container.spec.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        return ""
    log = runtime.sandbox / "logs" / f"{container.spec['name']}.log"
    if not log.exists():
        return ""
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
    return tail[-LOG_TAIL_BYTES:]


def signal_container(container: Container, sig: int) -> None:
    if container.process is not None and container.process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(container.process.pid, sig)


def exited(runtime: PodRuntime) -> bool:
    return all(c.process is None or c.process.poll() is not None for c in runtime.containers)


def kill_all(runtimes: list[PodRuntime]) -> None:
    """SIGKILL every container of these pods and reap them."""
    for runtime in runtimes:
        for container in runtime.containers:
            signal_container(container, signal.SIGKILL)
    deadline = time.monotonic() + 10
    for runtime in runtimes:
        for container in runtime.containers:
            if container.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    container.process.wait(max(0.1, deadline - time.monotonic()))
