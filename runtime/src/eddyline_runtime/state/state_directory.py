"""State on disk: where stores live under ``state.dir``, the quarantine folder, the one lock.

The layout, as in Kafka Streams::

    state.dir/
      <sub-topology>_<partition>/     a task directory, named by its TaskId ("1_3")
        <store name>/                 a store directory: RocksDB files, .checkpoint,
          eddyline.lock               and the lock naming the process holding it open
      .quarantine/                    stores relocation found in the way (never deleted)

Everything that spells these paths or takes the lock goes through this
module: stores, relocation (KIP-816), restore jobs and the tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from eddyline_runtime.partitions import TaskId
from eddyline_runtime.state.errors import StoreLockedError

LOCK_FILE_NAME: Final = "eddyline.lock"
QUARANTINE_DIR_NAME: Final = ".quarantine"

# Only canonical task ids name task directories (str(TaskId) spells "0_1", never
# "00_1"), so anything else in state.dir is not ours.
_TASK_DIR: Final = re.compile(r"(0|[1-9][0-9]*)_(0|[1-9][0-9]*)")
# Bytes of eddyline.lock worth reading: a pid.
_PID_BYTES: Final = 32


def task_directory(state_dir: str | os.PathLike[str], task: TaskId) -> Path:
    """``state.dir/<task>``: where a task's stores live."""
    return Path(state_dir) / str(task)


def store_directory(state_dir: str | os.PathLike[str], task: TaskId, store: str) -> Path:
    """``state.dir/<task>/<store>``: one store of one task."""
    return task_directory(state_dir, task) / store


def quarantine_directory(state_dir: str | os.PathLike[str]) -> Path:
    """Where stores go that relocation found in the way; eddyline never deletes them."""
    return Path(state_dir) / QUARANTINE_DIR_NAME


def trash_directory(store_dir: str | os.PathLike[str]) -> Path:
    """Where a store being wiped goes first: ``<task>/.<store>.wiping`` (no store's name)."""
    path = Path(store_dir)
    return path.with_name(f".{path.name}.wiping")


def move_to_trash(store_dir: str | os.PathLike[str]) -> Path:
    """Take a store directory out of its place in one ``rename(2)``; returns where it went.

    The store disappears atomically: a crash leaves it whole where it was or
    gone, never half deleted under its own name. Delete the trash after.
    """
    trash = trash_directory(store_dir)
    shutil.rmtree(trash, ignore_errors=True)  # a wipe a crash interrupted
    os.rename(store_dir, trash)
    return trash


def empty_trash(store_dir: str | os.PathLike[str]) -> None:
    """Delete what a wipe of ``store_dir`` moved aside (also after a crash cut it short)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(trash_directory(store_dir))


def parse_task_directory(name: str) -> TaskId | None:
    """The task a directory name stands for, or None when it names no task."""
    match = _TASK_DIR.fullmatch(name)
    return None if match is None else TaskId(int(match[1]), int(match[2]))


@dataclass(frozen=True, slots=True)
class LockHolder:
    """Another open holds a store's lock; ``pid`` is what it wrote (None: unreadable)."""

    pid: int | None


class DirectoryLock:
    """An exclusive ``flock`` on ``<store directory>/eddyline.lock``, naming its holder's pid.

    RocksDB has its own LOCK file, but its error does not say who holds it;
    ours does, and an ``flock`` is per open file description, so it also
    refuses a second open from the same process. Closing the descriptor
    (or the process dying) drops it: a crash never leaves a stale lock.
    """

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, store: str, directory: Path) -> DirectoryLock:
        """Take the lock of a store being opened, creating the lock file; write our pid.

        Raises :class:`StoreLockedError` naming the holder when another open holds it.
        """
        held = cls.try_create(directory)
        if isinstance(held, LockHolder):
            raise StoreLockedError(store, directory, held.pid)
        return held

    @classmethod
    def try_create(cls, directory: Path) -> DirectoryLock | LockHolder:
        """Take the lock of ``directory``, creating its lock file and writing our pid.

        A :class:`LockHolder` when another open holds it (a store being
        opened twice, or a second supervisor on one state directory).
        """
        fd = os.open(directory / LOCK_FILE_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        held = _flock(fd)
        if isinstance(held, LockHolder):
            return held
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
        return cls(fd)

    @classmethod
    def try_existing(cls, directory: str | os.PathLike[str]) -> DirectoryLock | LockHolder | None:
        """Take the lock of a store that is not being opened (to move it, say).

        None when the directory has no lock file (eddyline never opened a
        store there); a :class:`LockHolder` when another open holds it. The
        lock file is left as it is.
        """
        try:
            fd = os.open(Path(directory) / LOCK_FILE_NAME, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        held = _flock(fd)
        return held if isinstance(held, LockHolder) else cls(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _flock(fd: int) -> LockHolder | None:
    """Lock ``fd`` (None), or close it and say who holds the lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, _PID_BYTES, 0).decode("ascii", "replace").strip()
        os.close(fd)
        return LockHolder(int(holder) if holder.isdigit() else None)
    except BaseException:
        os.close(fd)
        raise
    return None
