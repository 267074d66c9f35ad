"""What the real nodes make on this host, and the one way to take it all down again.

Several kubelets share this machine, so everything a run makes has a name of its own that a
later run can find again even after a crash (SIGKILLed pytest, power loss):

- processes: each node's containerd (with the shims it starts and their containers) and
  kubelet live in cgroups under ``/eddyline-realnode/<node>`` in every mounted hierarchy; the
  control plane, kube-proxy and the outside server in ``/eddyline-realnode/<what>``;
- the "outside" network namespace (:data:`OUTSIDE_NAMESPACE`) and its veth pair;
- files and mounts (overlay root file systems, sandbox ``/dev/shm``, network namespaces,
  kubelet volumes): under :data:`STATE` and :data:`DATA`;
- links: bridges named ``edlrn-*`` (:data:`BRIDGE_PREFIX`);
- a blackhole route for :data:`SERVICE_NETWORK`, and kube-proxy's iptables rules;
- IPv4 forwarding, on while a run lasts (pods of different nodes reach each other through the
  host), with :data:`GUARD_CHAIN` letting nothing be forwarded between the run's bridges and
  any other interface; the value found before is kept in :data:`FORWARD_BEFORE` and restored;
- CNI's result cache: files named after the networks (``eddyline-realnode-*``) or after the
  nodes' sandboxes (containerd's loopback network).

:func:`purge` removes all of it and is what both the start (stale state of a crashed run) and
the end of a run call. :func:`exclusive` makes a run the only one on the machine, since two
would purge each other's nodes.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

# Short, fixed paths: containerd's socket path must fit a sockaddr_un (108 bytes), and a run
# after a crash must find what the crashed one left.
STATE = Path("/run/eddyline-realnode")
DATA = Path("/var/lib/eddyline-realnode")
# What a tier needs on DATA's disk: three nodes' image imports (~1.7 GiB each), their
# containers and volumes, and headroom so the kubelets never see disk pressure.
MIN_FREE_BYTES = 10 * 2**30
LOCK = Path("/run/eddyline-realnode.lock")
LOCK_WAIT_VARIABLE = "EDDYLINE_REALNODE_LOCK_WAIT_S"
CGROUP_PARENT = "eddyline-realnode"
CGROUP_MOUNTS = Path("/sys/fs/cgroup")
BRIDGE_PREFIX = "edlrn-"
CNI_NETWORK_PREFIX = "eddyline-realnode-"
CNI_RESULTS = Path("/var/lib/cni/results")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
FORWARD_BEFORE = Path("/run/eddyline-realnode.ip_forward")
# In the mangle table's FORWARD chain, which the kernel walks before the filter table's, where
# kube-proxy's own forwarding rules go: nothing a Service rewrites gets past it either.
GUARD_CHAIN = "EDLRN-GUARD"
# A stand-in for "outside": a network namespace behind a veth whose host end is not a bridge of
# the run's (no dash after the prefix, so the guard treats it as any other interface).
OUTSIDE_NAMESPACE = f"{BRIDGE_PREFIX}outside"
OUTSIDE_LINK = "edlrnout"
OUTSIDE_NETWORK = ipaddress.IPv4Network("10.246.0.0/24")
NETNS_DIR = Path("/var/run/netns")
# Outside servers this process started; the purge kills them with the rest and reaps them.
_servers: list[subprocess.Popen[bytes]] = []
# Every node's pod subnet is a /24 of this; Services take addresses from the next range.
# Neither is used by any interface of this machine, and both exist only while a run does.
POD_NETWORK = ipaddress.IPv4Network("10.244.0.0/16")
SERVICE_NETWORK = ipaddress.IPv4Network("10.245.0.0/16")
# The Debian packages a node needs, by the command that shows each is installed.
PACKAGES = {
    "containerd": "containerd",
    "runc": "runc",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "/bin/busybox": "busybox-static",
    "gcc": "gcc",
    "ip": "iproute2",
    # kube-proxy --cleanup removes IPVS ipsets too, and fails without the command.
    "ipset": "ipset",
    "iptables": "iptables",
    # kube-proxy --cleanup also tears down its nftables mode's rules, and fails without
    # the command (a fresh machine of 2026-11-28 had none: every realnode test errored).
    "nft": "nftables",
}
# Killed processes leave their cgroups a moment after SIGKILL is delivered.
_CGROUP_EMPTY_SECONDS = 30.0


class HostError(RuntimeError):
    """The host cannot hold real nodes; the message names what is missing and the way out."""


def check_host() -> None:
    if os.geteuid() != 0:
        raise HostError(
            "real nodes need root (containerd, cgroups, bridges and mounts): run the "
            "realnode tier as root, or deselect it with `-m 'not realnode'`"
        )
    if not (CGROUP_MOUNTS / "memory" / "cgroup.procs").exists():
        raise HostError(
            f"real nodes are configured for the cgroup v1 hierarchy and found no memory "
            f"controller at {CGROUP_MOUNTS / 'memory'}"
        )
    DATA.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(DATA).free
    if free < MIN_FREE_BYTES:
        raise HostError(
            f"real nodes need {MIN_FREE_BYTES / 2**30:.0f} GiB free where {DATA} lives (each "
            f"node imports the eddyline, examples and restore images, about 1.7 GiB); "
            f"{free / 2**30:.1f} GiB is free: free some space (old git worktrees and their "
            f".venv, `docker image prune`, /tmp/pytest-of-*) and run again"
        )


def install_missing_packages() -> list[str]:
    """apt-get installs what :data:`PACKAGES` lists and this host lacks; returns their names."""
    missing = sorted(
        {
            package
            for probe, package in PACKAGES.items()
            if not (Path(probe).exists() if probe.startswith("/") else shutil.which(probe))
        }
    )
    if missing:
        completed = subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", *missing],
            capture_output=True, text=True, check=False, timeout=900,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )  # fmt: skip
        if completed.returncode != 0:
            raise HostError(
                f"apt-get install {' '.join(missing)} failed (real nodes need them; "
                f"`apt-get update` first if the package lists are stale):\n"
                f"{completed.stdout[-2000:]}{completed.stderr[-2000:]}"
            )
    return missing


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """Hold the machine-wide lock of real nodes for the block, or fail naming the holder."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    # Engineers sharing one machine may queue for it; a test run alone never waits (0).
    patience = float(os.environ.get(LOCK_WAIT_VARIABLE, "0"))
    deadline = time.monotonic() + patience
    with LOCK.open("a+") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(5.0)
                    continue
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                raise HostError(
                    f"another run of real nodes holds {LOCK} (pid {holder}); they share fixed "
                    f"names on this machine, so wait for it to finish (or set "
                    f"{LOCK_WAIT_VARIABLE} to the seconds to queue for it)"
                ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- cgroups
def hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, the named ``systemd`` one, v2)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split(" ", 1)[0]
        if fstype in {"cgroup", "cgroup2"}:
            found.append(Path(left.split(" ")[4]))
    return sorted(found)


def create_cgroup(relative: str) -> None:
    """``/<relative>`` in every hierarchy: a kubelet refuses a cgroupRoot missing in any."""
    for hierarchy in hierarchies():
        directory = hierarchy
        for part in Path(relative.strip("/")).parts:
            parent, directory = directory, directory / part
            directory.mkdir(exist_ok=True)
            # A new cpuset cgroup starts with no CPUs and no memory nodes, and the kernel
            # refuses a process there (ENOSPC) until it is given its parent's.
            for setting in ("cpuset.cpus", "cpuset.mems"):
                wanted = parent / setting
                if wanted.exists() and not (directory / setting).read_text().strip():
                    (directory / setting).write_text(wanted.read_text())


def move_into_cgroup(pid: int, relative: str) -> None:
    """Put ``pid`` (all its threads) into ``/<relative>`` of every hierarchy.

    Whatever it starts later is born there too, so containerd's shims and the containers
    they start are all found again under :data:`CGROUP_PARENT`.
    """
    for hierarchy in hierarchies():
        (hierarchy / relative.strip("/") / "cgroup.procs").write_text(str(pid))


def _processes_under(root: Path) -> set[int]:
    pids: set[int] = set()
    if root.is_dir():
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(line) for line in procs.read_text().split())
    return pids


def kill_cgroup_processes(relative: str) -> None:
    """SIGKILL every process in ``/<relative>`` (and below) of every hierarchy; wait for them."""
    deadline = time.monotonic() + _CGROUP_EMPTY_SECONDS
    while True:
        pids = set().union(*(_processes_under(h / relative) for h in hierarchies()))
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise HostError(f"processes {sorted(pids)} in cgroup /{relative} outlived SIGKILL")
        time.sleep(0.2)


def remove_cgroup(relative: str) -> None:
    """rmdir ``/<relative>`` and what is below it, deepest first, in every hierarchy."""
    for hierarchy in hierarchies():
        top = hierarchy / relative
        if not top.is_dir():
            continue
        directories = sorted(
            (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        )
        for directory in [*directories, top]:
            # A cgroup directory holds only its kernel files: rmdir, never a recursive delete.
            with contextlib.suppress(FileNotFoundError):
                directory.rmdir()


# --------------------------------------------------------------------------- mounts
def unmount_below(*roots: Path) -> int:
    """Unmount every mount point under ``roots``, deepest first; returns how many."""
    prefixes = tuple(f"{root}/" for root in roots)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split(" ")[4].replace("\\040", " ")
        if point.startswith(prefixes):
            points.append(point)
    for point in sorted(set(points), key=lambda p: p.count("/"), reverse=True):
        # Lazily: a mount a dying process still holds goes as soon as it lets go.
        subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=30)
    return len(points)


# --------------------------------------------------------------------------- links
def run_ip(*args: str) -> None:
    completed = subprocess.run(
        ["ip", *args], capture_output=True, text=True, check=False, timeout=30
    )
    if completed.returncode != 0:
        raise HostError(f"ip {' '.join(args)} failed: {completed.stderr.strip()}")


def create_bridge(name: str, address_with_prefix: str) -> None:
    """A bridge holding a host address (no ports: the host answers on it itself)."""
    if len(name) > 15 or not name.startswith(BRIDGE_PREFIX):
        raise ValueError(f"bridge name {name!r}: at most 15 characters, starting {BRIDGE_PREFIX}")
    run_ip("link", "add", name, "type", "bridge")
    run_ip("addr", "add", address_with_prefix, "dev", name)
    run_ip("link", "set", name, "up")


def blackhole_services() -> None:
    """Service addresses the host itself sends to go nowhere, never out by the default route.

    Pods' packets to a Service are rewritten by kube-proxy before routing (nat PREROUTING),
    so they never meet this route; it only stops a packet to an unproxied Service address.
    """
    run_ip("route", "replace", "blackhole", str(SERVICE_NETWORK))


def open_forwarding() -> None:
    """Forward between the run's bridges only: the guard first, then ``ip_forward`` on.

    The CNI bridge plugin turns ``ip_forward`` on by itself for a gateway bridge; doing it
    here, behind the guard, makes that explicit and undoable.
    """
    if not FORWARD_BEFORE.exists():
        FORWARD_BEFORE.write_text(IP_FORWARD.read_text())
    _iptables("-N", GUARD_CHAIN)
    ours = f"{BRIDGE_PREFIX}+"
    _iptables("-A", GUARD_CHAIN, "-i", ours, "!", "-o", ours, "-j", "DROP")
    _iptables("-A", GUARD_CHAIN, "!", "-i", ours, "-o", ours, "-j", "DROP")
    _iptables("-I", "FORWARD", "1", "-j", GUARD_CHAIN)
    IP_FORWARD.write_text("1")


def close_forwarding() -> None:
    """Restore ``ip_forward`` as found before the first run, then drop the guard."""
    if FORWARD_BEFORE.exists():
        IP_FORWARD.write_text(FORWARD_BEFORE.read_text())
        FORWARD_BEFORE.unlink()
    while _iptables("-C", "FORWARD", "-j", GUARD_CHAIN, check=False) == 0:
        _iptables("-D", "FORWARD", "-j", GUARD_CHAIN)
    if _iptables("-L", GUARD_CHAIN, check=False) == 0:
        _iptables("-F", GUARD_CHAIN)
        _iptables("-X", GUARD_CHAIN)


def _iptables(*args: str, check: bool = True) -> int:
    completed = subprocess.run(
        ["iptables", "-w", "-t", "mangle", *args],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if check and completed.returncode != 0:
        raise HostError(f"iptables -t mangle {' '.join(args)}: {completed.stderr.strip()}")
    return completed.returncode


def start_outside_server(port: int) -> str:
    """An HTTP server in a namespace of its own that the host routes to like any network.

    It stands for an address outside the run's bridges: the host reaches it, pods must not
    (the guard drops what would be forwarded to it). Returns its address; the purge ends it.
    """
    host_end, far_end = list(OUTSIDE_NETWORK.hosts())[:2]
    run_ip("netns", "add", OUTSIDE_NAMESPACE)
    run_ip("link", "add", OUTSIDE_LINK, "type", "veth", "peer", "name", "eth0",
           "netns", OUTSIDE_NAMESPACE)  # fmt: skip
    run_ip("addr", "add", f"{host_end}/{OUTSIDE_NETWORK.prefixlen}", "dev", OUTSIDE_LINK)
    run_ip("link", "set", OUTSIDE_LINK, "up")
    inside = ("ip", "-n", OUTSIDE_NAMESPACE)
    for args in (
        ("addr", "add", f"{far_end}/{OUTSIDE_NETWORK.prefixlen}", "dev", "eth0"),
        ("link", "set", "eth0", "up"),
        ("link", "set", "lo", "up"),
        # Back to anything, pods included: only the guard stands between them.
        ("route", "add", "default", "via", str(host_end)),
    ):
        run_ip(*inside[1:], *args)
    create_cgroup(f"{CGROUP_PARENT}/outside")
    server = subprocess.Popen(
        ["ip", "netns", "exec", OUTSIDE_NAMESPACE, "busybox", "httpd", "-f",
         "-p", f"{far_end}:{port}", "-h", "/proc/self"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    move_into_cgroup(server.pid, f"{CGROUP_PARENT}/outside")
    _servers.append(server)
    return str(far_end)


def guard_drops() -> int:
    """Packets the guard has dropped since it was set up."""
    listing = subprocess.run(
        ["iptables", "-w", "-t", "mangle", "-L", GUARD_CHAIN, "-v", "-x", "-n"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    return sum(int(line.split()[0]) for line in listing.splitlines()[2:] if line.strip())


def bridges() -> list[str]:
    return sorted(
        path.name
        for path in Path("/sys/class/net").iterdir()
        if path.name.startswith(BRIDGE_PREFIX) and (path / "bridge").is_dir()
    )


# --------------------------------------------------------------------------- everything
def purge() -> None:
    """Take down every trace of real nodes on this host (a no-op when there is none).

    kube-proxy's rules are its own to remove (``kube_proxy.cleanup``, which the cluster runs
    right after).

    Order matters: processes first (they hold mounts and namespaces), then mounts (a network
    namespace goes with its last mount, and with it the pod's veth pair), then files,
    cgroups, bridges and CNI's cache.
    """
    kill_cgroup_processes(CGROUP_PARENT)
    while _servers:
        _servers.pop().wait(timeout=30)
    close_forwarding()
    unmount_below(STATE, DATA)
    sandboxes = {
        path.name for path in STATE.glob("*/containerd/io.containerd.grpc.v1.cri/sandboxes/*")
    }
    for root in (STATE, DATA):
        shutil.rmtree(root, ignore_errors=True)
    remove_cgroup(CGROUP_PARENT)
    for name in bridges():
        run_ip("link", "del", name)
    if (NETNS_DIR / OUTSIDE_NAMESPACE).exists():
        # Its veth pair goes with it.
        run_ip("netns", "del", OUTSIDE_NAMESPACE)
    routes = subprocess.run(
        ["ip", "route", "show", "type", "blackhole", str(SERVICE_NETWORK)],
        capture_output=True, text=True, check=False, timeout=30,
    ).stdout  # fmt: skip
    if routes.strip():
        run_ip("route", "del", "blackhole", str(SERVICE_NETWORK))
    if CNI_RESULTS.is_dir():
        for cached in CNI_RESULTS.iterdir():
            # <network>-<sandbox>-<interface>: the nodes' own networks, and the loopback
            # network containerd's CRI sets up in each of their sandboxes.
            if cached.name.startswith(CNI_NETWORK_PREFIX) or any(
                f"-{sandbox}-" in cached.name for sandbox in sandboxes
            ):
                cached.unlink(missing_ok=True)


def memory_cgroup(pid: int) -> str:
    """The memory cgroup (v1) path of a host process, as the kubelet placed it."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    raise AssertionError(f"process {pid} has no memory cgroup")


def memory_limit(pid: int) -> int:
    """The memory limit of a host process's cgroup, in bytes."""
    limit = Path("/sys/fs/cgroup/memory") / memory_cgroup(pid).lstrip("/") / "memory.limit_in_bytes"
    return int(limit.read_text())
