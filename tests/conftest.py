"""Fixtures shared by every test, registered once here (they live in ``tests/support``)."""

pytest_plugins = [
    "tests.support.stores",
    "tests.support.logs",
    "tests.support.k8s.fixtures",
]
