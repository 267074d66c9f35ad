"""``tests/support/ports``: ports for servers started later come from outside the ephemeral range.

The kernel hands ephemeral ports to every outgoing connection on the machine,
so one chosen there can be taken before the server binds it (a replica-group
test saw a replica restarted forever on a port someone's connection held).
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.support import ports


def test_a_range_of_ports_lies_outside_the_ephemeral_range_and_binds() -> None:
    low, high = ports._ephemeral_range()
    for _ in range(20):
        base = ports.free_port_range(3)
        assert all(not low <= base + i <= high for i in range(3)), (base, low, high)
        for i in range(3):
            with socket.socket() as server:
                server.bind((ports.HOST, base + i))


def test_one_port_lies_outside_the_ephemeral_range() -> None:
    low, high = ports._ephemeral_range()
    port = ports.free_port()
    assert not low <= port <= high


def test_the_ports_above_the_ephemeral_range_are_used_when_none_lie_below(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ephemeral = tmp_path / "ip_local_port_range"
    ephemeral.write_text("1024\t60999\n")
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", ephemeral)
    assert 61_000 <= ports.free_port_range(3) <= 65_533


def test_an_ephemeral_range_covering_every_port_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ephemeral = tmp_path / "ip_local_port_range"
    ephemeral.write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", ephemeral)
    with pytest.raises(RuntimeError, match=r"outside the ephemeral range \(\(1024, 65535\)\)"):
        ports.free_port_range(3)


def test_a_port_handed_out_is_not_handed_out_again_while_unbound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ten candidate ports, none bound: a server between a stop and a start of its own. Every
    # port is handed out once, then none is left (before claims, one went out twice).
    base = ports.free_port_range(10)
    monkeypatch.setattr(ports, "_CLAIMS", tmp_path / "claims")
    monkeypatch.setattr(ports, "_starts", lambda count: range(base, base + 10 - count + 1))
    handed = {ports.free_port() for _ in range(10)}
    assert handed == set(range(base, base + 10))
    with pytest.raises(RuntimeError, match="found no 1 consecutive"):
        ports.free_port()


def test_a_claim_of_a_process_that_has_exited_lapses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ports.free_port()
    claims = tmp_path / "claims"
    claims.mkdir()
    monkeypatch.setattr(ports, "_CLAIMS", claims)
    monkeypatch.setattr(ports, "_starts", lambda count: range(base, base + 1))
    child = subprocess.Popen(["sleep", "60"])
    try:
        (claims / str(base)).write_text(str(child.pid))
        with pytest.raises(RuntimeError, match="found no 1 consecutive"):
            ports.free_port()  # a live process's claim holds
    finally:
        child.kill()
        child.wait()
    assert ports.free_port() == base  # its process gone, the port is handed out again
