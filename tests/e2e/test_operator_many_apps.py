"""Many StreamApps on one operator (issue 23, item 1): the number of apps is bounded by
memory, not by kopf's worker threads.

A sync ``kopf.daemon`` per app held one of kopf's threads for the app's whole life
(``min(32, cpus + 4)``: 6 on 2 CPUs), so the 7th app was never reconciled, could not be
deleted, and pod events stopped being handled for every app. Here 50 apps run on the
emulated cluster (``tests/support/k8s/many_apps.py``): 49 suspended (each still has its
daemon), the last with 3 pods. The beat is 60 s, so only a pod event can republish the last
app's membership after its pod is SIGKILLed: it must leave the membership within 10 s. Then
every app deletes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.k8s.kubectl import KUBECTL
from tests.support.k8s.many_apps import OPERATOR_ENV, ManyApps
from tests.support.k8s.operator_harness import OperatorHarness

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH"),
]

APPS = 50


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorHarness]:
    pytest.importorskip("helm_sdkpy")
    running = OperatorHarness(
        tmp_path_factory.mktemp("many-apps"), examples=["wordcount"], extra_env=OPERATOR_ENV
    )
    running.start()
    yield running
    running.stop()


@pytest.mark.timeout(600)
def test_fifty_apps_reconcile_fail_over_on_pod_events_and_delete(
    harness: OperatorHarness, tmp_path: Path
) -> None:
    run = ManyApps.apply(harness, APPS, tmp_path)
    run.wait_reconciled(240)
    victim, seconds = run.kill_last_member(10)
    print(f"kill -> membership without {victim}: {seconds:.2f} s")
    run.delete_all(180)
