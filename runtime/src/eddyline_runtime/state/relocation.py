"""KIP-816: move state stores whose sub-topology was renumbered, instead of rebuilding them.

Sub-topologies are numbered by position, and a store lives under
``state.dir/<sub-topology>_<partition>/<store name>``. Add a sub-topology
before the existing ones and every ordinal shifts: each store is then under a
task directory that the new topology gives to another sub-topology, a task
opens an empty store where its own belongs, and restores it from the
changelog in full. Store names are unique in a topology, so the name alone
says which sub-topology owns a store now; :func:`relocate_state` renames every
misplaced store directory to ``state.dir/<owner>_<same partition>/<name>``
before any store opens (``automatic.state.relocation``, on by default).

How: one scan of state.dir (one ``scandir`` of it and of each task
directory), then renames, no copying. A task directory holding nothing but
stores bound for the same task is renamed whole (``1_3`` to ``2_3``: the
KIP's "move task state directories", and the common case, as every ordinal
shifts together); a task directory that splits (a store stays, or its
stores go to different sub-topologies) has its misplaced stores renamed one
by one into the target task directory. Whole-task renames run highest
ordinal first when ordinals grow and lowest first when they shrink, so in a
chain (``0_p`` to ``1_p`` while ``1_p`` goes to ``2_p``) each target is
vacated before it is needed; a task whose target stays occupied falls back
to per-store renames, where a task directory holding other stores is no
obstacle: only the same store name at the target is a conflict.

What it never does: overwrite a store (a store of that name already at the
target is kept, and the misplaced one goes to ``state.dir/.quarantine``),
delete a store (one whose name the topology no longer has, or keeps in
memory, is left where it is and reported), or move a store another process
holds open (its ``eddyline.lock``: every misplaced store's lock is checked
before anything moves, and held across its rename).

Crash safety. Every move is one ``rename(2)``, of a store directory or of a
task directory: RocksDB files, offsets (in the database) and ``.checkpoint``
go as one, atomically, so at every instant a store is whole at its old path
or whole at its new one. No fsync is needed for that: the files belong to
the directory's inode, not its name, and a journaling filesystem replays a
rename entirely or not at all, so a machine crash can at worst bring back
the old name with every file under it. A second run then finds whatever is
still misplaced and moves it; a run over correctly placed state moves
nothing (idempotent).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.state.state_directory import (
    DirectoryLock,
    LockHolder,
    parse_task_directory,
    quarantine_directory,
)

logger = logging.getLogger(__name__)

SETTING: Final = "automatic.state.relocation"

# rename(2) refusing because the target is a non-empty directory (Linux says
# ENOTEMPTY, some systems EEXIST) or is not a directory at all.
_TARGET_TAKEN: Final = frozenset({errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR})


class StateRelocationError(EddylineError):
    """State in ``state.dir`` that relocation may not or cannot move.

    StateRelocationError
    ├── MisplacedStateError   automatic.state.relocation is false and stores are misplaced
    └── StateInUseError       a misplaced store is open in a running process
    """


@dataclass(frozen=True, slots=True)
class StoreHomes:
    """Where the current topology keeps each store, as relocation needs to know it.

    Store names are unique in a topology, so a name alone says which
    sub-topology owns a store. ``owners`` maps each persistent store to that
    sub-topology; ``homeless`` says, for store names the topology has but
    keeps nowhere on disk, why (they are left in place and reported).
    """

    owners: Mapping[str, int]
    homeless: Mapping[str, str] = field(default_factory=dict)
    # The tasks the topology has (None: not known). A store is only moved into
    # a task that exists: state under a partition the topology does not have
    # (say 9_9 when inputs have 4 partitions) is not ours to place.
    tasks: Collection[TaskId] | None = None
    # Stores with logging disabled: a misplaced one left behind is lost, not restored.
    unlogged: Collection[str] = frozenset()


class StoreMove:
    """A store directory and where the current topology puts it.

    The paths are kept as strings and become ``Path`` objects when read:
    parsing 20,000 of them up front cost more than the 10,000 renames did.
    """

    __slots__ = ("_source", "_target", "store")

    def __init__(
        self, store: str, source: str | os.PathLike[str], target: str | os.PathLike[str]
    ) -> None:
        self.store = store
        self._source = os.fspath(source)
        self._target = os.fspath(target)

    @property
    def source(self) -> Path:
        return Path(self._source)

    @property
    def target(self) -> Path:
        return Path(self._target)

    def target_taken(self) -> bool:
        """Whether something is at the target already (the move would be a conflict)."""
        return os.path.lexists(self._target)

    def _key(self) -> tuple[str, str, str]:
        return (self.store, self._source, self._target)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoreMove):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"StoreMove({self.store!r}, {self._source!r}, {self._target!r})"

    def __str__(self) -> str:
        return f"{self._source} -> {self._target}"


@dataclass(frozen=True, slots=True)
class StoreConflict:
    """A misplaced store whose target already held a store of the same name."""

    store: str
    source: Path  # where the misplaced store was found
    quarantined: Path  # where it is now
    existing: Path  # the store it would have overwritten, untouched


@dataclass(frozen=True, slots=True)
class StoreLeftAlone:
    """A store directory relocation had no place for; never deleted."""

    store: str
    path: Path
    reason: str


@dataclass(frozen=True, slots=True)
class LockedStore:
    """A misplaced store open in a running process (None: it wrote no pid)."""

    store: str
    path: Path
    holder_pid: int | None


@dataclass(frozen=True, slots=True)
class RelocationReport:
    """What one :func:`relocate_state` did."""

    moves: tuple[StoreMove, ...] = ()
    conflicts: tuple[StoreConflict, ...] = ()
    left_alone: tuple[StoreLeftAlone, ...] = ()
    in_place: int = 0  # stores already where the topology puts them
    seconds: float = field(default=0.0, compare=False)


class MisplacedStateError(StateRelocationError):
    """``automatic.state.relocation`` is false and stores are under the wrong task directory."""

    def __init__(
        self,
        state_dir: Path,
        misplaced: Sequence[StoreMove],
        unlogged: Collection[str] = frozenset(),
    ) -> None:
        self.state_dir = state_dir
        self.misplaced = tuple(misplaced)
        lines = [
            f"{len(self.misplaced)} state store(s) in {state_dir} are under a sub-topology that "
            "no longer owns them (the topology's sub-topologies were renumbered); each would "
            "restore from its changelog in full:"
        ]
        for move in self.misplaced:
            taken = " (which already holds a store of that name)" if move.target_taken() else ""
            # Without a changelog there is nothing to restore from: left behind, it is lost.
            lost = (
                " (logging disabled: it has no changelog, so it would start empty and its "
                "state be lost; only moving it keeps it)"
                if move.store in unlogged
                else ""
            )
            lines.append(f'  store "{move.store}": {move}{taken}{lost}')
        lines.append(
            f"set {SETTING}: true (the default) to move them, or move them yourself; "
            "this instance does not start with misplaced state"
        )
        super().__init__("\n".join(lines))


class StateInUseError(StateRelocationError):
    """A misplaced store is locked by a running process, so it cannot move under it.

    ``moved`` is how many stores this run had moved before it found the lock:
    0 unless a process opened the store after the check every run makes first.
    """

    def __init__(self, locked: Sequence[LockedStore], *, moved: int = 0) -> None:
        self.locked = tuple(locked)
        self.moved = moved
        described = "; ".join(
            f'state store "{held.store}" at {held.path} is locked by '
            + (f"pid {held.holder_pid}" if held.holder_pid else "another process")
            for held in self.locked
        )
        done = (
            "Nothing was moved"
            if moved == 0
            else f"{moved} other store(s) were moved already (the next start moves the rest)"
        )
        super().__init__(
            f"cannot relocate state: {described}. {done}. Stop that process (is another "
            "instance running on this state.dir?) and start again, or give this instance "
            "another state.dir"
        )


def relocate_state(
    state_dir: Path | str, homes: StoreHomes, *, automatic: bool = True
) -> RelocationReport:
    """Move every misplaced store in ``state_dir`` to where ``homes`` puts it.

    Run it at start-up, before any store opens. With ``automatic`` false
    (``automatic.state.relocation: false``) nothing moves, and misplaced
    stores raise :class:`MisplacedStateError`, listing each of them.
    Raises :class:`StateInUseError`, having moved nothing, when a misplaced
    store is open in a running process.
    """
    started = time.perf_counter()
    root = os.fspath(state_dir)
    plan = _scan(root, homes.owners, homes.homeless, homes.tasks)
    if not plan.misplaced:
        return _finish(plan, (), (), started)
    if not automatic:
        raise MisplacedStateError(Path(root), [m.as_move() for m in plan.misplaced], homes.unlogged)
    # Check every lock before moving anything: a refusal leaves state.dir as it was.
    locked = []
    for misplaced in plan.misplaced:
        lock = DirectoryLock.try_existing(misplaced.source)
        if isinstance(lock, LockHolder):
            locked.append(LockedStore(misplaced.store, Path(misplaced.source), lock.pid))
        elif lock is not None:
            lock.release()
    if locked:
        raise StateInUseError(locked)

    mover = _Mover(root, plan.task_dirs)
    left = mover.move_tasks(plan.whole_tasks)
    for misplaced in sorted([*plan.single_stores, *left], key=lambda m: (m.task, m.store)):
        mover.move_store(misplaced)
    for task_dir in mover.emptied:
        with contextlib.suppress(OSError):  # not empty: another store moved in (a swap)
            os.rmdir(task_dir)
    return _finish(plan, mover.moves, mover.conflicts, started)


# -- planning ----------------------------------------------------------------------


@dataclass(slots=True)
class _Misplaced:
    store: str
    task: TaskId
    source: str
    target: str
    target_task: str
    # Nothing else in the task directory stays: once every store is out, remove it.
    last_out: bool = False

    def as_move(self) -> StoreMove:
        return StoreMove(self.store, self.source, self.target)


@dataclass(slots=True)
class _WholeTask:
    """A task directory holding nothing but stores that all belong to one other task.

    Renaming the task directory moves them all with one ``rename(2)``, and
    needs no ``mkdir`` of the target nor ``rmdir`` of the source: the common
    case (every ordinal shifts by the same amount) costs one rename per task.
    """

    task: TaskId
    source: str
    target: str
    target_ordinal: int
    stores: list[_Misplaced]

    @property
    def order(self) -> tuple[bool, int]:
        """Shifts up go highest first and shifts down lowest first, so in a chain
        (0_p to 1_p while 1_p goes to 2_p) each target is vacated before it is needed."""
        up = self.target_ordinal > self.task.subtopology
        return (not up, -self.task.subtopology if up else self.task.subtopology)


@dataclass(slots=True)
class _Plan:
    misplaced: list[_Misplaced] = field(default_factory=list)  # every one, in scan order
    whole_tasks: list[_WholeTask] = field(default_factory=list)
    single_stores: list[_Misplaced] = field(default_factory=list)  # the others
    left_alone: list[StoreLeftAlone] = field(default_factory=list)
    in_place: int = 0
    task_dirs: set[str] = field(default_factory=set)  # as found by the scan


_NO_SUCH_STORE: Final = "the topology has no store of that name"


def _scan(
    root: str,
    owners: Mapping[str, int],
    homeless: Mapping[str, str],
    known_tasks: Collection[TaskId] | None,
) -> _Plan:
    """One pass over state.dir and its task directories; nothing is touched."""
    plan = _Plan()
    # f-strings over os.path.join, which cost more than a rename here (10,000 tasks).
    prefix = os.path.join(root, "")
    try:
        with os.scandir(root) as found:
            tasks = [
                (task, entry.path)
                for entry in found
                if (task := parse_task_directory(entry.name)) is not None and entry.is_dir()
            ]
    except FileNotFoundError:
        return plan  # a first start: no state yet
    tasks.sort()
    plan.task_dirs.update(task_dir for _, task_dir in tasks)
    for task, task_dir in tasks:
        with os.scandir(task_dir) as found:
            contents = sorted((entry.name, entry.path, entry.is_dir()) for entry in found)
        misplaced: list[_Misplaced] = []
        targets: set[str] = set()
        for name, path, is_dir in contents:
            if not is_dir or name.startswith("."):
                # A stray file is no store, nor a store being wiped (``.<name>.wiping``);
                # either keeps the task directory in place.
                continue
            owner = owners.get(name)
            if owner == task.subtopology:
                plan.in_place += 1
            elif (
                owner is not None
                and known_tasks is not None
                and (TaskId(owner, task.partition) not in known_tasks)
            ):
                plan.left_alone.append(
                    StoreLeftAlone(
                        name,
                        Path(path),
                        f"its target task {owner}_{task.partition} does not exist in this "
                        f"topology (no input partition {task.partition})",
                    )
                )
            elif owner is not None:
                target_task = f"{prefix}{owner}_{task.partition}"
                misplaced.append(_Misplaced(name, task, path, f"{target_task}/{name}", target_task))
                targets.add(target_task)
            else:
                reason = homeless.get(name, _NO_SUCH_STORE)
                plan.left_alone.append(StoreLeftAlone(name, Path(path), reason))
        if not misplaced:
            continue
        plan.misplaced.extend(misplaced)
        if len(misplaced) == len(contents):
            for store in misplaced:
                store.last_out = True
        if len(misplaced) == len(contents) and len(targets) == 1:
            owner = owners[misplaced[0].store]
            plan.whole_tasks.append(_WholeTask(task, task_dir, targets.pop(), owner, misplaced))
        else:
            plan.single_stores.extend(misplaced)
    return plan


# -- moving ------------------------------------------------------------------------


class _Mover:
    """Carries out a plan, and keeps what it did for the report."""

    def __init__(self, root: str, task_dirs: set[str]) -> None:
        self.root = root
        # Task directories that exist, so a store's target task is created up
        # front when missing rather than after a failed rename.
        self.task_dirs = set(task_dirs)
        self.moves: list[StoreMove] = []
        self.conflicts: list[StoreConflict] = []
        self.emptied: set[str] = set()  # task directories left with nothing in them

    def move_tasks(self, whole_tasks: Sequence[_WholeTask]) -> list[_Misplaced]:
        """Rename each task directory whose target is free (retrying while targets
        are vacated); the stores of the others, to move one by one."""
        pending = sorted(whole_tasks, key=lambda t: t.order)
        while pending:
            deferred = [task for task in pending if not self._move_task(task)]
            if len(deferred) == len(pending):
                break
            pending = deferred
        return [store for task in pending for store in task.stores]

    def _move_task(self, task: _WholeTask) -> bool:
        held: list[DirectoryLock] = []
        try:
            for store in task.stores:
                held.extend(self._lock(store))
            if not _rename(task.source, task.target):
                return False  # the target task holds state already
        finally:
            for lock in held:
                lock.release()
        self.task_dirs.discard(task.source)
        self.task_dirs.add(task.target)
        for store in task.stores:
            self.moves.append(store.as_move())
            logger.debug('relocated state store "%s": %s', store.store, self.moves[-1])
        return True

    def move_store(self, store: _Misplaced) -> None:
        """Rename one store into its target task, or quarantine it if its name is taken there."""
        if store.target_task not in self.task_dirs:
            with contextlib.suppress(FileExistsError):
                os.mkdir(store.target_task)
            self.task_dirs.add(store.target_task)
        held = self._lock(store)
        try:
            quarantined = None if _rename(store.source, store.target) else self._quarantine(store)
        finally:
            for lock in held:
                lock.release()
        if store.last_out:
            self.emptied.add(os.path.dirname(store.source))
        if quarantined is None:
            self.moves.append(store.as_move())
            logger.debug('relocated state store "%s": %s', store.store, self.moves[-1])
            return
        self.conflicts.append(
            StoreConflict(store.store, Path(store.source), Path(quarantined), Path(store.target))
        )
        logger.warning(
            'state store "%s" at %s belongs at %s, which already holds a store of that name: '
            "moved it to %s instead of overwriting %s. Keep the one you need and delete the "
            "other",
            store.store,
            store.source,
            store.target,
            quarantined,
            store.target,
        )

    def _lock(self, store: _Misplaced) -> list[DirectoryLock]:
        """Hold the store's lock across its rename, so no process opens it mid-move."""
        lock = DirectoryLock.try_existing(store.source)
        if isinstance(lock, LockHolder):  # opened since the check; this store is still whole
            held = LockedStore(store.store, Path(store.source), lock.pid)
            raise StateInUseError([held], moved=len(self.moves) + len(self.conflicts))
        return [] if lock is None else [lock]

    def _quarantine(self, store: _Misplaced) -> str:
        """Move a store that found its target taken to ``state.dir/.quarantine``."""
        quarantine = os.fspath(quarantine_directory(self.root))
        os.makedirs(quarantine, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        base = os.path.join(quarantine, f"{store.task}-{store.store}-{stamp}")
        candidate, attempt = base, 0
        while not _rename(store.source, candidate):
            attempt += 1
            candidate = f"{base}-{attempt}"
        return candidate


def _rename(source: str, target: str, *, make_parent: bool = True) -> bool:
    """Rename ``source`` to ``target`` unless something is there; False if something is.

    No exists() check first: rename(2) itself refuses a non-empty directory,
    so nothing can appear between a check and the move. An *empty* directory
    at the target holds no state, and rename replaces it.
    """
    try:
        os.rename(source, target)
    except FileNotFoundError:
        if not make_parent or not os.path.isdir(source):
            raise
        with contextlib.suppress(FileExistsError):  # state.dir itself exists: no makedirs
            os.mkdir(os.path.dirname(target))
        return _rename(source, target, make_parent=False)
    except OSError as exc:
        if exc.errno in _TARGET_TAKEN:
            return False
        if exc.errno == errno.EXDEV:
            raise StateRelocationError(
                f"cannot relocate state store at {source} to {target}: they are on different "
                "filesystems, and relocation only renames. Move it yourself, or delete it "
                "and let the store restore from its changelog"
            ) from exc
        raise
    return True


# -- reporting ---------------------------------------------------------------------


def _finish(
    plan: _Plan,
    moves: Sequence[StoreMove],
    conflicts: Sequence[StoreConflict],
    started: float,
) -> RelocationReport:
    report = RelocationReport(
        moves=tuple(moves),
        conflicts=tuple(conflicts),
        left_alone=tuple(plan.left_alone),
        in_place=plan.in_place,
        seconds=time.perf_counter() - started,
    )
    _log_left_alone(plan.left_alone)
    if moves or conflicts:
        logger.info(
            "relocated %d state store(s) whose sub-topology was renumbered (%d quarantined "
            "instead: a store of the same name was in the way) in %.3f s",
            len(moves),
            len(conflicts),
            report.seconds,
        )
    return report


def _log_left_alone(left_alone: Sequence[StoreLeftAlone]) -> None:
    """One warning per store name: a removed store may sit under thousands of tasks."""
    by_name: dict[str, list[StoreLeftAlone]] = {}
    for store in left_alone:
        by_name.setdefault(store.store, []).append(store)
    for name, stores in by_name.items():
        logger.warning(
            'state store "%s" found in %d task director%s (e.g. %s) was left in place: %s. '
            "Delete it if it is no longer needed",
            name,
            len(stores),
            "y" if len(stores) == 1 else "ies",
            stores[0].path,
            stores[0].reason,
        )
