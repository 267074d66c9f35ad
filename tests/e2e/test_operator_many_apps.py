"""Many StreamApps on one operator (issue 23, item 1): the number of apps is bounded by
memory, not by kopf's worker threads.

A sync ``kopf.daemon`` per app held one of kopf's threads for the app's whole life
(``min(32, cpus + 4)``: 6 on 2 CPUs), so the 7th app was never reconciled, could not be
deleted, and pod events stopped being handled for every app. Here 50 apps run on the
real control plane (``tests/support/control_plane/many_apps.py``): 49 suspended (each still has its
daemon), the last with 3 pods. The beat is 60 s, so only a pod event can republish the last
app's membership after its pod is SIGKILLed: it must leave the membership within 10 s. Then
every app deletes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.control_plane.many_apps import OPERATOR_ENV, ManyApps
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture

pytestmark = pytest.mark.slow

APPS = 50


harness = operator_fixture("many-apps", extra_env=OPERATOR_ENV, watching=False)


@pytest.mark.timeout(600)
def test_fifty_apps_reconcile_fail_over_on_pod_events_and_delete(
    harness: Operator, tmp_path: Path
) -> None:
    run = ManyApps.apply(harness, APPS, tmp_path)
    run.wait_reconciled(240)
    victim, seconds = run.kill_last_member(10)
    print(f"kill -> membership without {victim}: {seconds:.2f} s")
    run.delete_all(180)
