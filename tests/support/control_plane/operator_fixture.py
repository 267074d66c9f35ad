"""The module-scoped operator fixture the real-plane e2e modules share.

Each module runs the chart and its own operator process in a namespace of its own on the
session's control plane (:mod:`.operator` says how). The fixture is the same everywhere:
namespace and Helm release, the operator process started (and, unless told otherwise,
watching), then at the module's end every StreamApp of the namespace deleted while the
operator still runs, and the operator stopped. A module names it with its own attribute::

    operator = operator_fixture("operator-apply", directory="operator-apply")
    harness = operator_fixture("many-apps", extra_env=OPERATOR_ENV, watching=False)

The deletion matters to the modules after this one: kopf puts a finalizer on every StreamApp
it runs a daemon for, so an app still there when its operator stops is never deleted, and its
StatefulSet's pods (real processes on the kubelet stand-in) would keep using the machine's
two cores for the rest of the run. Apps a module deleted itself make it a no-op.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from tests.support.control_plane.cluster import Cluster
from tests.support.control_plane.operator import Operator

# Deleting the apps only waits for the operator to drop its finalizers; the garbage collector
# removes the children afterwards. A bound for a loaded machine, not an expectation.
DELETE_APPS_TIMEOUT = "60s"


def delete_apps(operator: Operator) -> None:
    """Every StreamApp of the operator's namespace deleted, while the operator runs."""
    if operator.process is None or operator.process.poll() is not None:
        operator.start()  # a test left it stopped or killed: only it removes the finalizers
    operator.kubectl.run(
        "delete", "sapp", "--all", "--wait=true", f"--timeout={DELETE_APPS_TIMEOUT}", timeout=120
    )


def operator_fixture(
    namespace: str,
    *,
    directory: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    watching: bool = True,
    before: Callable[[], None] | None = None,
    values: Mapping[str, Any] | None = None,
) -> Any:
    """A module-scoped fixture yielding the :class:`Operator` of ``namespace``.

    ``directory`` names its temporary directory (default: the namespace); ``extra_env`` is
    added to the operator's environment; ``watching`` waits for kopf's liveness endpoint
    before the first test; ``before`` runs first (a prerequisite check that raises);
    ``values`` are the chart's values for the install.
    """

    @pytest.fixture(scope="module")
    def operator(
        control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Operator]:
        if before is not None:
            before()
        running = Operator(
            control_plane,
            tmp_path_factory.mktemp(directory or namespace),
            namespace,
            extra_env=dict(extra_env or {}),
            values=dict(values or {}),
        )
        running.install()  # the release is named after the namespace: no collision
        running.start()
        if watching:
            running.wait_watching()
        try:
            yield running
        finally:
            try:
                delete_apps(running)
            finally:
                running.stop()

    return operator
