"""Routable pod addresses for the kubelet stand-in, for what must reach pods as a cluster does.

The stand-in gives pods loopback addresses (``127.x.y.z``): nothing to set up, and every
local client reaches them. But the API server's pod proxy (``pods/proxy``, what
``kubectl port-forward``-less tools such as ``kubectl eddyline`` use) refuses any pod IP
that is not global unicast (``ResourceLocation`` in k8s.io/kubernetes
pkg/registry/core/pod/strategy.go: "address not allowed"). A cluster built with
``routable_pods=True`` hands out addresses from RFC 6598's shared address space instead,
made local to this host by one route of the kernel's local table (``ip route add local
100.64.0.0/10 dev lo``: every address of the range is then this host's, as 127.0.0.0/8
is). The range is not used on these machines (the route to it went to the default gateway).
Adding the route needs root (CAP_NET_ADMIN).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

NETWORK = "100.64.0.0/10"
FIRST_OCTET = 100
# The second octets of NETWORK: a cluster takes one (free_address_octet), nodes the third.
SECOND_OCTETS = (64, 127)


def _route_present() -> bool:
    shown = subprocess.run(
        ["ip", "route", "show", "table", "local", NETWORK],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return bool(shown.stdout.strip())


@contextmanager
def routed() -> Iterator[None]:
    """The local route for :data:`NETWORK` while the block runs; removed afterwards when
    this block added it (another session's is left alone)."""
    added = False
    if not _route_present():
        done = subprocess.run(
            ["ip", "route", "add", "local", NETWORK, "dev", "lo"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0 and not _route_present():
            raise RuntimeError(
                f"cannot add the local route for {NETWORK} ({done.stderr.strip()}); pods with "
                "routable addresses need root (CAP_NET_ADMIN)"
            )
        added = done.returncode == 0
    try:
        yield
    finally:
        if added:
            subprocess.run(
                ["ip", "route", "del", "local", NETWORK, "dev", "lo"],
                capture_output=True, check=False,
            )  # fmt: skip
