"""The session-scoped ``control_plane`` fixture (registered in tests/conftest.py).

One control plane per test run: building is cached and starting takes tens of seconds, so
tests share it and isolate themselves by namespace. When a test that used it fails, the end of
each component's log is attached to the report.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.control_plane.cluster import Cluster

REPO = Path(__file__).resolve().parents[3]
_running: list[Cluster] = []


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("control-plane")) as cluster:
        yield cluster


@contextmanager
def running_cluster(root: Path, *, routable_pods: bool = False) -> Iterator[Cluster]:
    """A started cluster, stopped at the block's end; its logs join a failing test's report.
    ``routable_pods``: see :class:`Cluster` (a module that needs the pod proxy overrides
    ``control_plane`` with one of these)."""
    examples = sorted(str(p) for p in (REPO / "examples").iterdir() if p.is_dir())
    # Topologies only the tests run (tests/support/topologies says why each exists).
    examples.append(str(REPO / "tests" / "support" / "topologies"))
    # The chart's CRDs exist before the controllers start, as on a cluster where the operator
    # was installed before (Helm then skips them): the garbage collector watches StreamApps
    # from its start instead of from its next 30 s discovery (see ControlPlane).
    crds = sorted((REPO / "charts" / "eddyline-operator" / "crds").glob("*.yaml"))
    cluster = Cluster(root, pythonpath=examples, crds=crds, routable_pods=routable_pods)
    cluster.start()
    print(f"control plane started in {cluster.startup_seconds:.1f} s")
    # The newest first: a module's own cluster is the one its failures need.
    _running.insert(0, cluster)
    try:
        yield cluster
    finally:
        _running.remove(cluster)
        cluster.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if (
        isinstance(report, pytest.TestReport)
        and report.failed
        and _running
        and "control_plane" in getattr(item, "fixturenames", ())
    ):
        report.sections.append(("control plane logs", _running[0].failure_report()))
    return report
