"""Fixtures shared by every test: real stores on temporary directories."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eddyline_runtime.partitions import TaskId
from eddyline_runtime.state import RocksDBStore, RocksDBStoreOptions, store_directory

StoreFactory = Callable[..., RocksDBStore]


@pytest.fixture
def store_factory(tmp_path: Path) -> Iterator[StoreFactory]:
    """Open RocksDB stores under tmp_path; every store still open is closed at the end."""
    opened: list[RocksDBStore] = []

    def open_store(
        name: str = "counts",
        options: RocksDBStoreOptions | None = None,
        directory: Path | None = None,
        **kwargs: object,
    ) -> RocksDBStore:
        store = RocksDBStore(
            name, directory or store_directory(tmp_path, TaskId(0, 0), name), options, **kwargs
        )  # type: ignore[arg-type]
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


# The real control plane (tests/support/control_plane): its session-scoped `control_plane`
# fixture, for any test that requests it.
pytest_plugins = ["support.control_plane.fixture"]
