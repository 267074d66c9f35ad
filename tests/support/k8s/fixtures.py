"""Fixtures for the emulator's own tests (``tests/k8s_emulator``): a fresh API server and
kubectl per test. Registered by ``pytest_plugins`` in ``tests/conftest.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.k8s.apiserver import ApiServer
from tests.support.k8s.kubectl import KUBECTL, Kubectl

REPO = Path(__file__).resolve().parents[3]
CRD = REPO / "crds" / "streamapps.eddyline.dev.yaml"


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    server = ApiServer().start()
    yield server
    server.stop()


@pytest.fixture
def kubectl(apiserver: ApiServer, tmp_path: Path) -> Kubectl:
    if KUBECTL is None:
        pytest.skip("kubectl is not on PATH")
    return Kubectl(apiserver, tmp_path / "kubectl-home")
