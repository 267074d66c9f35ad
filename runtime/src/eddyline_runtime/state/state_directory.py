"""State on disk: where stores live under ``state.dir``, the quarantine folder, the one lock.

The layout, as in Kafka Streams::

    state.dir/
      <sub-topology>_<partition>/     a task directory, named by its TaskId ("1_3")
        <store name>/                 a store directory: RocksDB files, .checkpoint,
          eddyline.lock               and the lock naming the process holding it open
      global/<store name>/            a global store (GlobalKTable): every instance holds it
                                      whole, fed by its topic; no task's, so relocation
                                      (which reads only task directories) never moves it
      .quarantine/                    stores relocation found in the way (never deleted),
        <task>-<store>-<when>-<verdict>/   and stores set aside instead of wiped when their
          eddyline-quarantine.json         changelog no longer fits them (kept up to
                                           state.quarantine.max.stores and
                                           state.quarantine.retention.ms; the note says
                                           what they were)

Everything that spells these paths or takes the lock goes through this
module: stores, relocation (KIP-816), restore jobs and the tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from eddyline_runtime.partitions import TaskId
from eddyline_runtime.state.errors import StoreLockedError

LOCK_FILE_NAME: Final = "eddyline.lock"
QUARANTINE_DIR_NAME: Final = ".quarantine"
# Global stores' home: not a task id, so relocation and task scans pass it by.
GLOBAL_DIR_NAME: Final = "global"

# The note beside a store set aside by a rebuild: what it was, and why it was set aside.
QUARANTINE_NOTE_NAME: Final = "eddyline-quarantine.json"
# A copy set aside because its changelog lost records it applied waits for the user's
# decision (docs/state.md, "Changelog loss waits for your decision"): its note's
# "decision" is PENDING until ``eddyline state republish`` or ``accept-loss`` says.
DECISION_PENDING: Final = "pending"
DECISION_REPUBLISHED: Final = "republished"
DECISION_LOSS_ACCEPTED: Final = "loss-accepted"
# Beside a store being built from SST files: its staging database and ``.files``.
STAGING_PREFIX: Final = ".ingest-"

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


def global_store_directory(state_dir: str | os.PathLike[str], store: str) -> Path:
    """``state.dir/global/<store>``: a global store, held whole by every instance."""
    return Path(state_dir) / GLOBAL_DIR_NAME / store


def quarantine_directory(state_dir: str | os.PathLike[str]) -> Path:
    """Where stores go that relocation found in the way; eddyline never deletes them."""
    return Path(state_dir) / QUARANTINE_DIR_NAME


def quarantine_entry(store_dir: str | os.PathLike[str], store: str, reason: str) -> Path:
    """A new place for a store set aside: ``.quarantine/<task>-<store>-<UTC time>-<reason>``.

    The quarantine folder is the state directory's (``store_dir`` is
    ``state.dir/<task>/<store>``); a store outside that layout keeps its own
    beside it.
    """
    path = Path(store_dir)
    task = path.parent
    root = task.parent if parse_task_directory(task.name) is not None else task
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = quarantine_directory(root) / f"{task.name}-{store}-{stamp}-{reason.lower()}"
    entry, attempt = base, 1
    while entry.exists():
        attempt += 1
        entry = base.with_name(f"{base.name}-{attempt}")
    return entry


def write_quarantine_note(entry: Path, note: Mapping[str, Any]) -> None:
    """Say what a store set aside was (its store, changelog, verdict, offsets, when)."""
    temporary = entry / f".{QUARANTINE_NOTE_NAME}.tmp"
    temporary.write_text(json.dumps({**note, "set_aside_at": time.time()}), encoding="utf-8")
    os.replace(temporary, entry / QUARANTINE_NOTE_NAME)


def read_quarantine_note(entry: Path) -> dict[str, Any] | None:
    """The note of a store set aside, or None where there is none (relocation's entries)."""
    try:
        note = json.loads((entry / QUARANTINE_NOTE_NAME).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None  # unreadable: leave the entry alone, as one we did not write
    return note if isinstance(note, dict) else None


def waiting_for_decision(note: Mapping[str, Any] | None) -> bool:
    """Whether a copy set aside still waits for the user to republish it or accept its loss."""
    return note is not None and note.get("decision") == DECISION_PENDING


def pending_decisions(
    state_dir: str | os.PathLike[str], store: str, topic: str, partition: int
) -> list[Path]:
    """The copies of ``store`` (changelog ``topic``-``partition``) in this state directory's
    quarantine that wait for the user's decision, oldest first."""
    folder = quarantine_directory(state_dir)
    if not folder.is_dir():
        return []
    found: list[tuple[float, Path]] = []
    for entry in folder.iterdir():
        note = read_quarantine_note(entry) if entry.is_dir() else None
        if note is None or not waiting_for_decision(note) or note.get("store") != store:
            continue
        changelog = note.get("changelog") or {}
        if changelog.get("topic") == topic and changelog.get("partition") == partition:
            found.append((float(note.get("set_aside_at", 0.0)), entry))
    return [entry for _, entry in sorted(found)]


def record_decision(entry: Path, decision: str) -> dict[str, Any]:
    """Mark what the user decided for a copy waiting in the quarantine; returns its note.

    The note is replaced in one rename, so a crash leaves the old or the new one.
    """
    note = read_quarantine_note(entry)
    if note is None:
        raise FileNotFoundError(entry / QUARANTINE_NOTE_NAME)
    temporary = entry / f".{QUARANTINE_NOTE_NAME}.tmp"
    updated = {**note, "decision": decision, "decided_at": time.time()}
    temporary.write_text(json.dumps(updated), encoding="utf-8")
    os.replace(temporary, entry / QUARANTINE_NOTE_NAME)
    return updated


def prune_quarantine(
    state_dir: str | os.PathLike[str], *, max_stores: int, retention_seconds: float
) -> list[Path]:
    """Delete stores set aside by rebuilds beyond the newest ``max_stores`` or older than
    ``retention_seconds``; returns what went. Relocation's entries (no note) are kept."""
    folder = quarantine_directory(state_dir)
    if not folder.is_dir():
        return []
    noted: list[tuple[float, Path]] = []
    for entry in folder.iterdir():
        note = read_quarantine_note(entry) if entry.is_dir() else None
        if note is not None and not waiting_for_decision(note):
            noted.append((float(note.get("set_aside_at", 0.0)), entry))
    noted.sort(reverse=True)  # newest first
    now = time.time()
    gone = [
        entry
        for index, (when, entry) in enumerate(noted)
        if index >= max_stores or now - when > retention_seconds
    ]
    for entry in gone:
        shutil.rmtree(entry, ignore_errors=True)
    return gone


def staging_directory(target: str | os.PathLike[str]) -> Path:
    """Where a build of the store at ``target`` from SST files stages it, beside it.

    ``.ingest-<store>-<pid>-<token>``: the pid says whose it is, so leftovers
    are cleared only once their process is gone.
    """
    path = Path(target)
    return path.parent / f"{STAGING_PREFIX}{path.name}-{os.getpid()}-{secrets.token_hex(4)}"


def remove_staging_directories(target: str | os.PathLike[str]) -> list[Path]:
    """Remove what interrupted builds of the store at ``target`` left beside it.

    A build SIGKILLed mid-way leaves its staging database (a whole copy of
    the store) and its ``.files``; opening the store, or building it again,
    clears them. A staging directory whose process still runs is another
    build in progress and is left alone. Returns what was removed.
    """
    target = Path(target)
    if not target.parent.is_dir():
        return []
    removed = []
    for leftover in target.parent.glob(f"{STAGING_PREFIX}{target.name}-*"):
        owner = leftover.name[len(f"{STAGING_PREFIX}{target.name}-") :].split("-", 1)[0]
        if owner.isdigit() and int(owner) != os.getpid() and _alive(int(owner)):
            continue
        shutil.rmtree(leftover, ignore_errors=True)
        removed.append(leftover)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


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


# How stale a store's reported size may be. A size is read by people (`kubectl eddyline
# status`) and by nothing that decides; RocksDB's files change at flushes and compactions
# (seconds apart under load), so a walk per 10 s per store is as current as anyone can use,
# however often /v1/layout is asked (the operator asks every pod on its reconcile beat).
DISK_USAGE_MAX_AGE_S: Final = 10.0
# st_blocks counts 512-byte units whatever the file system's block size (POSIX).
_STAT_BLOCK_BYTES: Final = 512


def disk_usage(directory: str | os.PathLike[str]) -> int:
    """Bytes ``directory`` takes on disk, as ``du`` counts them: allocated blocks of every file
    under it (a preallocated write-ahead log counts what it holds on the volume, a sparse file
    only what it uses). Files that vanish while it walks (a compaction deleting the SST files
    it merged) are skipped; a missing directory is 0."""
    total = 0
    pending = [os.fspath(directory)]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                else:
                    total += entry.stat(follow_symlinks=False).st_blocks * _STAT_BLOCK_BYTES
            except FileNotFoundError:
                continue
    return total


class DiskUsage:
    """A store directory's :func:`disk_usage`, walked at most once per ``max_age_s``.

    Asked from any thread (the query server's, for ``/v1/layout``) while the store's owner
    writes: a read never waits for a walk another thread is doing, it may walk too (both
    answers are right), and the answer swaps in as one tuple.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_age_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = Path(directory)
        # None: DISK_USAGE_MAX_AGE_S as it is when asked (a test sets it to 0).
        self._max_age_s = max_age_s
        self._clock = clock
        self._last: tuple[float, int] | None = None

    def bytes(self) -> int:
        now = self._clock()
        last = self._last
        max_age = DISK_USAGE_MAX_AGE_S if self._max_age_s is None else self._max_age_s
        if last is not None and now - last[0] < max_age:
            return last[1]
        size = disk_usage(self.directory)
        self._last = (now, size)
        return size
