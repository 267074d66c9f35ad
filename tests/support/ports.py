"""Free local ports, for servers a test starts (or tells a process to start) a moment later.

The ports come from outside the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``). A port the kernel picks for
``bind(0)`` is an ephemeral one, and so is the local port of every outgoing
connection any process on the machine opens: while the full suite runs
(brokers, control planes, other test runs), one of them took a replica's port
between the test choosing it and the replica binding it, and the replica,
restarted on the same port, never became ready. Outside the ephemeral range
only an explicit ``bind`` takes a port; the choice is random there, so two
test runs rarely pick the same one, and it is still checked free.

A port handed out is also *claimed* (a file per port in a directory shared by
every process of this user, under one lock) and not handed out again while
the process that claimed it lives, up to an hour. "Free now" alone was not
enough: a server that restarts on its port (the operator's liveness endpoint
across a stop and a start) leaves it unbound for a moment, and another test's
``free_port`` handed the same port out then; the operator, started again, found
it taken (CI: ``address already in use`` for kopf's liveness). A claim also
keeps two test runs on one machine (several engineers) from choosing one port
before either binds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HOST = "127.0.0.1"
# How many times a run of consecutive free ports is looked for before giving up.
_ATTEMPTS = 100
# The lowest port chosen: clear of the well-known and most registered services' ports.
_LOWEST = 20_000
# Kubernetes' default NodePort range, which the real-node tests' kube-proxy serves: not chosen.
_NODE_PORTS = (30_000, 32_767)
_HIGHEST = 65_535
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Linux's default, where the file cannot be read.
_DEFAULT_EPHEMERAL = (32_768, 60_999)
# Where claims are kept: one directory per user, shared by all its test processes.
_CLAIMS = Path(tempfile.gettempdir()) / f"eddyline-ports-{os.getuid()}"
# A claim lapses after this long even if its process lives (longer than a full test run, so a
# run never gets a port twice; shorter than forever, so a long-lived shell cannot hold many).
_CLAIM_S = 3600.0


def free_port() -> int:
    """A port on 127.0.0.1 nobody listens on now, outside the ephemeral range."""
    return free_port_range(1)


def free_port_range(count: int) -> int:
    """A port p with p..p+count-1 free now, for replicas that bind consecutive ports."""
    starts = _starts(count)
    if not starts:
        raise RuntimeError(
            f"no {count} consecutive ports between {_LOWEST} and {_HIGHEST} lie outside the "
            f"ephemeral range ({_ephemeral_range()}); narrow net.ipv4.ip_local_port_range"
        )
    for _ in range(_ATTEMPTS):
        base = random.choice(starts)
        if _claim(range(base, base + count)):
            return base
    raise RuntimeError(
        f"found no {count} consecutive free ports on {HOST} outside the ephemeral range "
        f"({_ephemeral_range()}) in {_ATTEMPTS} tries; free some ports or ask for fewer"
    )


def _starts(count: int) -> range | list[int]:
    """First ports of the runs of ``count`` ports that lie outside the ephemeral range."""
    low, high = _ephemeral_range()
    below = range(_LOWEST, max(_LOWEST, min(low, _NODE_PORTS[0]) - count + 1))
    above = range(max(_LOWEST, high + 1, _NODE_PORTS[1] + 1), _HIGHEST - count + 2)
    if not above:
        return below
    if not below:
        return above
    return [*below, *above]


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return low, high


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def _claim(ports: range) -> bool:
    """Claims every port of ``ports`` for this process if none is claimed by a live one and
    all are free now; all or none."""
    with _claims_locked():
        if any(_claimed(port) for port in ports) or not all(_is_free(p) for p in ports):
            return False
        for port in ports:
            (_CLAIMS / str(port)).write_text(str(os.getpid()))
    return True


def _claimed(port: int) -> bool:
    path = _CLAIMS / str(port)
    try:
        age = time.time() - path.stat().st_mtime
        pid = int(path.read_text())
    except (OSError, ValueError):
        return False
    return age < _CLAIM_S and _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process with that pid: alive
        return True
    return True


@contextlib.contextmanager
def _claims_locked() -> Iterator[None]:
    _CLAIMS.mkdir(mode=0o700, exist_ok=True)
    with (_CLAIMS / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
