"""Two operator replicas, one active (issue 23, item 6): kopf's peering, as the chart sets it,
on the real control plane (the ``KopfPeering`` the chart installs, the chart's RBAC).

The chart runs two replicas in one ``KopfPeering``; each takes a priority and every replica
but the one of the highest priority pauses. Here the first operator has the higher priority:
it handles the apps while the second waits; SIGKILLed (no goodbye in the peering), its
keep-alive expires (``PEERING_LIFETIME_SECONDS``) and the second takes over.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_operator.handlers import PEERING_LIFETIME_SECONDS
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture
from tests.support.ports import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
NAMESPACE = "leader-real"


def suspended_app(name: str) -> str:
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["metadata"]["name"] = name
    document["spec"]["suspend"] = True
    return yaml.safe_dump(document)


operator = operator_fixture(
    NAMESPACE,
    directory="leader",
    extra_env={"EDDYLINE_OPERATOR_PRIORITY": "200"},
    watching=False,
)


def phase(operator: Operator, name: str) -> str | None:
    try:
        value = (operator.app(name).get("status") or {}).get("phase")
    except LookupError:
        return None
    return None if value is None else str(value)


@pytest.mark.timeout(300)
def test_the_standby_replica_takes_over_when_the_active_one_is_killed(
    operator: Operator,
) -> None:
    peering_name = operator.env["EDDYLINE_OPERATOR_PEERING"]
    standby_log = operator.root / "operator-standby.log"

    def peers() -> int:
        found = operator.get("kopf.dev/v1", "kopfpeerings", peering_name) or {}
        return len(found.get("status") or {})

    # The active replica is up and in the peering first; the standby then starts paused (kopf
    # starts every replica paused until it has seen its peers) and stays so, silently.
    operator.wait_watching()
    wait_until(lambda: peers() == 1, "the active replica in the peering", 60)
    standby = operator.spawn(
        standby_log,
        {
            "EDDYLINE_OPERATOR_PRIORITY": "100",
            "EDDYLINE_OPERATOR_LIVENESS": f"http://127.0.0.1:{free_port()}/healthz",
        },
    )
    try:
        wait_until(lambda: peers() == 2, "both replicas in the peering", 60)
        operator.kubectl("apply", "-f", "-", stdin=suspended_app("before"))
        wait_until(lambda: phase(operator, "before") == "Suspended", "the active replica", 60)
        assert "Resuming operations" not in standby_log.read_text(errors="replace")

        operator.kill()  # no goodbye: its keep-alive must expire
        killed = time.monotonic()
        operator.kubectl("apply", "-f", "-", stdin=suspended_app("after"))
        wait_until(
            lambda: phase(operator, "after") == "Suspended",
            "the standby replica to take over",
            PEERING_LIFETIME_SECONDS + 45,
        )
        took = time.monotonic() - killed
        print(f"active replica SIGKILLed -> the standby reconciled a new app: {took:.1f} s")
        assert "Resuming operations" in standby_log.read_text(errors="replace")
        # Nothing the standby asked for was refused by the chart's RBAC either.
        assert "Forbidden" not in standby_log.read_text(errors="replace")
    finally:
        standby.send_signal(signal.SIGINT)
        try:
            standby.wait(10)
        except subprocess.TimeoutExpired:
            standby.kill()
            standby.wait(5)
