"""The session-scoped ``real_cluster`` fixture (registered in tests/conftest.py).

Started only when a test asks for it (the ``realnode`` tier): it builds the kubelet, holds the
machine-wide lock of real nodes and runs three containerds and kubelets, so it is started once
per run and shared; tests isolate themselves by namespace. When a test that used it fails, the
end of every component's log is attached to the report; step timings are printed at start.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.realnode.cluster import RealCluster

_running: list[RealCluster] = []


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    cluster = RealCluster(tmp_path_factory.mktemp("real-cluster")).start()
    timings = {step: round(seconds, 1) for step, seconds in cluster.timings.items()}
    print(f"real cluster started, seconds per step: {json.dumps(timings)}")
    _running.append(cluster)
    yield cluster
    _running.remove(cluster)
    cluster.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if (
        isinstance(report, pytest.TestReport)
        and report.failed
        and _running
        and "real_cluster" in getattr(item, "fixturenames", ())
    ):
        report.sections.append(("real cluster logs", _running[0].failure_report()))
    return report
