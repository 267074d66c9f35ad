"""Two operator replicas, one active (issue 23, item 6): kopf's peering, as the chart sets it.

The chart runs two replicas in one ``KopfPeering``; each takes a priority and every replica
but the one of the highest priority pauses. Here the first operator has the higher priority:
it handles the apps while the second waits; SIGKILLed (no goodbye in the peering), its
keep-alive expires (``PEERING_LIFETIME_SECONDS``) and the second takes over.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from eddyline_operator.handlers import PEERING_LIFETIME_SECONDS
from tests.support.k8s.kubectl import KUBECTL
from tests.support.k8s.operator_harness import REPO, OperatorHarness
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH"),
]

MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"


def suspended_app(name: str) -> str:
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["metadata"]["name"] = name
    document["spec"]["suspend"] = True
    return yaml.safe_dump(document)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorHarness]:
    pytest.importorskip("helm_sdkpy")
    running = OperatorHarness(
        tmp_path_factory.mktemp("leader"),
        examples=["wordcount"],
        extra_env={"EDDYLINE_OPERATOR_PRIORITY": "200"},
    )
    running.start()
    yield running
    running.stop()


def phase(harness: OperatorHarness, name: str) -> str | None:
    value = (harness.app(name).get("status") or {}).get("phase")
    return None if value is None else str(value)


@pytest.mark.timeout(240)
def test_the_standby_replica_takes_over_when_the_active_one_is_killed(
    harness: OperatorHarness,
) -> None:
    assert harness.kubectl is not None and harness.operator is not None
    peering_name = harness.operator_env["EDDYLINE_OPERATOR_PEERING"]
    standby_log = harness.root / "operator-standby.log"

    def peers() -> int:
        found = harness.get("kopf.dev", "kopfpeerings", peering_name) or {}
        return len(found.get("status") or {})

    # The active replica is up and in the peering first; the standby then starts paused (kopf
    # starts every replica paused until it has seen its peers) and stays so, silently.
    harness.wait_until_operator_watches()
    wait_for(lambda: peers() == 1, "the active replica in the peering", 60)
    standby = harness.spawn_operator(standby_log, {"EDDYLINE_OPERATOR_PRIORITY": "100"})
    try:
        wait_for(lambda: peers() == 2, "both replicas in the peering", 60)
        harness.kubectl("apply", "-f", "-", stdin=suspended_app("before"))
        wait_for(lambda: phase(harness, "before") == "Suspended", "the active replica", 60)
        assert "Resuming operations" not in standby_log.read_text(errors="replace")

        harness.operator.send_signal(signal.SIGKILL)  # no goodbye: its keep-alive must expire
        harness.operator.wait(10)
        killed = time.monotonic()
        harness.kubectl("apply", "-f", "-", stdin=suspended_app("after"))
        wait_for(
            lambda: phase(harness, "after") == "Suspended",
            "the standby replica to take over",
            PEERING_LIFETIME_SECONDS + 45,
        )
        took = time.monotonic() - killed
        print(f"active replica SIGKILLed -> the standby reconciled a new app: {took:.1f} s")
        assert "Resuming operations" in standby_log.read_text(errors="replace")
    finally:
        standby.send_signal(signal.SIGINT)
        try:
            standby.wait(10)
        except subprocess.TimeoutExpired:
            standby.kill()
            standby.wait(5)
