"""Free local ports, for servers a test starts (or tells a process to start) a moment later.

A port found free can be taken by someone else before it is bound again; the
tests accept that small race rather than pass sockets around.
"""

from __future__ import annotations

import socket

HOST = "127.0.0.1"
# How many times a run of consecutive ports is looked for before giving up.
_ATTEMPTS = 100


def free_port() -> int:
    """A port on 127.0.0.1 nobody listens on now (the kernel's choice)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def free_port_range(count: int) -> int:
    """A port p with p..p+count-1 free now, for replicas that bind consecutive ports."""
    for _ in range(_ATTEMPTS):
        base = free_port()
        if base + count <= 65_536 and all(_is_free(base + i) for i in range(1, count)):
            return base
    raise RuntimeError(
        f"found no {count} consecutive free ports on {HOST} in {_ATTEMPTS} tries; "
        "free some ports or ask for fewer"
    )


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True
