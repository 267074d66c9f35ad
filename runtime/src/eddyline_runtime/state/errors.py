"""Errors of the state store engine.

    EddylineError (eddyline_runtime.errors)
    ├── StateStoreError                 anything wrong with one named store
    │   ├── StoreLockedError            its directory is held by another process
    │   ├── StoreCorruptedError         RocksDB cannot read its files
    │   ├── StoreClosedError            used after close()
    │   ├── InvalidChangelogOffsetError commit() was given a negative offset
    │   └── StoreCommitError            RocksDB refused the commit's write (the buffer is kept)
    └── CheckpointFileError             a .checkpoint / .position file we cannot parse

Invalid settings (an unknown isolation level, a byte limit below -1) are
:class:`~eddyline_runtime.errors.ConfigError` subclasses, raised where the
value is read.
"""

from __future__ import annotations

import os
from pathlib import Path

from eddyline_runtime.errors import EddylineError


class StateStoreError(EddylineError):
    """Something is wrong with one state store; ``store`` names it."""

    def __init__(self, store: str, message: str) -> None:
        self.store = store
        super().__init__(message)


class StoreLockedError(StateStoreError):
    """Another process (or another open of this store) holds the store's directory."""

    def __init__(self, store: str, directory: Path, holder_pid: int | None) -> None:
        self.directory = directory
        self.holder_pid = holder_pid
        if holder_pid is not None and holder_pid == os.getpid():
            message = (
                f'state store "{store}" is locked by this process (pid {holder_pid}), which '
                f"has it open already (state dir {directory}); close that open of the store "
                "first"
            )
        else:
            holder = f"pid {holder_pid}" if holder_pid else "another process"
            message = (
                f'state store "{store}" is locked by {holder} (state dir {directory}); '
                "stop that process, or give this instance another state.dir"
            )
        super().__init__(store, message)


class StoreCorruptedError(StateStoreError):
    """RocksDB reports the store's files as unreadable."""

    def __init__(self, store: str, directory: Path, cause: str) -> None:
        self.directory = directory
        super().__init__(
            store,
            f'state store "{store}" at {directory} is corrupted ({cause}). '
            "Operator action: stop the application, delete the directory "
            f"{directory}, and restart: restoration rebuilds the store from its changelog",
        )


class StoreClosedError(StateStoreError):
    """An operation on a store after :meth:`close`."""

    def __init__(self, store: str, operation: str) -> None:
        super().__init__(
            store,
            f'state store "{store}" is closed; cannot {operation}. '
            "Open it again (or ask the task that owns it) before using it",
        )


class InvalidChangelogOffsetError(StateStoreError, ValueError):
    """A changelog offset below 0 given to :meth:`commit`."""

    def __init__(self, store: str, partition: object, offset: object) -> None:
        super().__init__(
            store,
            f'state store "{store}": changelog offset {offset!r} for {partition} is not an '
            "offset; pass the offset (>= 0) of the last changelog record the committed data "
            "includes",
        )


class StoreCommitError(StateStoreError):
    """RocksDB refused the commit's write batch; nothing of it was applied."""

    def __init__(self, store: str, directory: Path, cause: str) -> None:
        super().__init__(
            store,
            f'state store "{store}" at {directory} could not commit ({cause}); the '
            "uncommitted writes are kept. Free disk space or fix permissions and commit "
            "again, or close the store to discard them",
        )


class CheckpointFileError(EddylineError, ValueError):
    """A ``.checkpoint`` or ``.position`` file that is not in Kafka's OffsetCheckpoint format."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        super().__init__(
            f"offset file {path} is unreadable ({problem}); delete it and restart: the store "
            "then restores from its changelog"
        )
