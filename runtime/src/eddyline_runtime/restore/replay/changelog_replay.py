"""Where changelog replay starts, and one batched replay step: the rule written once.

Active restoration, standby replay and lag reports all ask the same
question: given a store's committed changelog offset and the changelog's
bounds, where does replay start, and can the store be trusted at all? The
offsets follow Kafka's conventions (``docs`` of :mod:`eddyline_runtime.log`):

* a store's *committed offset* is the offset of the **last** changelog record
  its data includes, so replay resumes at ``committed + 1``;
* the log's *start* (``beginning_offset``) is the first offset it still holds,
  and its *end* (``end_offset``) is the **next** offset to be written.

The verdicts, at every boundary (``start <= end`` always):

====================================  =========================================
store's committed offset              verdict
====================================  =========================================
none                                  REPLAY from ``start`` (CAUGHT_UP if the
                                      changelog is empty)
``committed + 1 < start``             GAP: records the store never saw are gone
                                      (retention or truncation). It cannot be
                                      brought up to date: wipe and rebuild it
``start <= committed + 1 < end``      REPLAY from ``committed + 1``
``committed == end - 1``              CAUGHT_UP: nothing to replay
``committed >= end``                  AHEAD: the changelog lost records the
                                      store holds (reset, truncated or
                                      recreated): wipe and rebuild it
====================================  =========================================

Offsets alone cannot tell a changelog that was truncated or recreated and
has since grown back past the store's offset: its offsets now name other
records. So a store keeps the changelog's *epoch*
(:meth:`~eddyline_runtime.log.Log.partition_epoch`, which truncation and
recreation change) beside its committed offset, and two more verdicts come
first:

* REPLACED: the store's epoch is not the changelog's;
* FOREIGN: the store holds no offset for this changelog partition but does
  for another (a directory copied from another task or application): its
  data is not this changelog's, so it is not "a store without offsets".

Kafka Streams marks a task corrupted in these cases and wipes the store; the runtime
sets the store aside in the quarantine (it may be the best copy of the state
left) and rebuilds it from the changelog (:func:`open_trusted`).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log import Log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state import StateStore
from eddyline_runtime.state.state_directory import write_quarantine_note

logger = logging.getLogger(__name__)

# Records per fetch and per WriteBatch: large enough that per-batch costs
# vanish, small enough that a batch stays a few MiB.
DEFAULT_BATCH_RECORDS = 10_000


class ReplayVerdict(enum.Enum):
    REPLAY = "replay"
    CAUGHT_UP = "caught-up"
    GAP = "gap"
    AHEAD = "ahead"
    REPLACED = "replaced"
    FOREIGN = "foreign"


@dataclass(frozen=True, slots=True)
class ReplayStart:
    """The verdict on one store's changelog, and the offsets it was made from."""

    verdict: ReplayVerdict
    committed: int | None  # the store's committed offset (last record included)
    log_start: int  # first offset the changelog holds
    log_end: int  # next offset the changelog will write
    store_epoch: str | None = None
    log_epoch: str | None = None
    other_changelogs: tuple[TopicPartition, ...] = ()

    @property
    def trusted(self) -> bool:
        """Whether replaying from :attr:`first_offset` brings the store up to date."""
        return self.verdict in (ReplayVerdict.REPLAY, ReplayVerdict.CAUGHT_UP)

    @property
    def first_offset(self) -> int:
        """The first changelog offset to apply (``log_end`` when caught up).

        For a store that cannot be trusted this is where a rebuilt store
        starts: the log's start.
        """
        if not self.trusted or self.committed is None:
            return self.log_start
        return self.committed + 1


def replay_start(
    committed: int | None,
    log_start: int,
    log_end: int,
    *,
    store_epoch: str | None = None,
    log_epoch: str | None = None,
    store_epoch_end: int | None = None,
    other_changelogs: Collection[TopicPartition] = (),
) -> ReplayStart:
    """Judge a store against its changelog's bounds (see the module's table).

    ``store_epoch`` is the changelog epoch the store recorded beside its
    offset, ``log_epoch`` the changelog's now (None: unknown, not compared);
    ``store_epoch_end`` where the store's epoch ended in the changelog's
    history (the first offset written in a later epoch; None: unknown). A
    store of an earlier epoch still holds what the changelog holds when its
    offset lies below that point (offsets after it were replaced, not its
    own), as Kafka's leader-epoch check (KIP-101) decides; else it is
    REPLACED. ``other_changelogs`` are the other partitions the store holds
    offsets for.
    """
    if log_start < 0 or log_end < log_start:
        raise ValueError(f"changelog bounds [{log_start}, {log_end}) are not a log's")
    if committed is None and other_changelogs:
        verdict = ReplayVerdict.FOREIGN
    elif (
        committed is not None
        and store_epoch is not None
        and log_epoch is not None
        and store_epoch != log_epoch
        and (store_epoch_end is None or committed >= store_epoch_end)
    ):
        verdict = ReplayVerdict.REPLACED
    elif committed is None:
        verdict = ReplayVerdict.REPLAY if log_start < log_end else ReplayVerdict.CAUGHT_UP
    elif committed >= log_end:
        verdict = ReplayVerdict.AHEAD
    elif committed + 1 < log_start:
        verdict = ReplayVerdict.GAP
    elif committed + 1 == log_end:
        verdict = ReplayVerdict.CAUGHT_UP
    else:
        verdict = ReplayVerdict.REPLAY
    return ReplayStart(
        verdict, committed, log_start, log_end, store_epoch, log_epoch, tuple(other_changelogs)
    )


def judge(store: StateStore, log: Log, changelog: TopicPartition) -> ReplayStart:
    """:func:`replay_start` for ``store`` against the live bounds and epoch of ``changelog``."""
    store_epoch = store.changelog_epoch(changelog)
    log_epoch = log.partition_epoch(changelog)
    epoch_end = None
    if store_epoch is not None and log_epoch is not None and store_epoch != log_epoch:
        epoch_end = log.epoch_end_offset(changelog, store_epoch)
    return replay_start(
        store.committed_offset(changelog),
        log.beginning_offset(changelog),
        log.end_offset(changelog),
        store_epoch=store_epoch,
        log_epoch=log_epoch,
        store_epoch_end=epoch_end,
        other_changelogs=[tp for tp in store.committed_changelogs() if tp != changelog],
    )


def next_offset_after(committed: int | None, log_start: int) -> int:
    """The next changelog offset a store needs: ``committed + 1``, or the log's start."""
    return log_start if committed is None else committed + 1


class ChangelogMismatchError(EddylineError):
    """A store's committed offset does not fit its changelog: the store cannot be trusted.

    ChangelogMismatchError
    ├── ChangelogBehindStoreError   the store committed past the changelog's end (AHEAD)
    ├── ChangelogGapError           records after the store's offset are gone (GAP)
    ├── ChangelogReplacedError      the changelog was truncated or recreated (REPLACED)
    └── ForeignStoreError           the store's offsets are another changelog's (FOREIGN)
    """

    def __init__(
        self, store: str, changelog: TopicPartition, start: ReplayStart, *, copy: str = ""
    ) -> None:
        self.store = store
        self.changelog = changelog
        self.start = start
        self.copy = copy  # which copy, e.g. "standby of task 1_0"; empty for the active one
        super().__init__(
            f"{self._describe()}. To recover, stop the instance, delete the store's directory "
            "and restart: the store is rebuilt from the changelog"
        )

    @property
    def problem(self) -> str:
        """What does not fit, without the way out (for callers that take it themselves)."""
        return self._describe()

    def _describe(self) -> str:
        which = f" ({self.copy})" if self.copy else ""
        return (
            f'state store "{self.store}"{which} has committed changelog offset '
            f"{self.start.committed} but {self.changelog} holds offsets "
            f"[{self.start.log_start}, {self.start.log_end})"
        )


class ChangelogBehindStoreError(ChangelogMismatchError):
    """The store has committed past the changelog's end: the changelog was reset or replaced."""

    def _describe(self) -> str:
        return (
            f"{super()._describe()}: the changelog lost records this store holds (it was "
            "reset, truncated or replaced), so the store is ahead of it and cannot be trusted"
        )


class ChangelogGapError(ChangelogMismatchError):
    """Records between the store's committed offset and the changelog's start are gone."""

    def _describe(self) -> str:
        first_missing = next_offset_after(self.start.committed, 0)
        return (
            f"{super()._describe()}: records {first_missing}..{self.start.log_start - 1} that "
            "the store never saw are gone (retention or truncation), so it cannot be brought "
            "up to date from the changelog"
        )


class ChangelogReplacedError(ChangelogMismatchError):
    """The changelog was truncated or recreated since the store committed its offset."""

    def _describe(self) -> str:
        return (
            f"{super()._describe()}, and the changelog is another incarnation than the one the "
            f"store's offset belongs to (epoch {self.start.log_epoch}, the store recorded "
            f"{self.start.store_epoch}): it was truncated or recreated, so its offsets now name "
            "other records"
        )


class ChangelogRecreatedError(EddylineError):
    """A store's whole changelog topic was deleted and created again; rebuilding is refused."""

    def __init__(self, store: str, changelog: TopicPartition, start: ReplayStart, copy: str):
        which = f" ({copy})" if copy else ""
        super().__init__(
            f'the changelog topic "{changelog.topic}" of state store "{store}"{which} was '
            f"deleted and created again (incarnation {start.log_epoch}, the store recorded "
            f"{start.store_epoch}): the new topic holds none of the store's state, so a rebuild "
            "would start from nothing. A deleted changelog is more often a mistake than an "
            "incident: restore the topic if you can. To rebuild from the new topic anyway "
            "(the store is kept aside in the quarantine), set "
            "state.rebuild.after.changelog.recreated=true"
        )


def changelog_recreated(start: ReplayStart) -> bool:
    """Whether the verdict is REPLACED because the whole topic was created again.

    Epochs read ``<topic incarnation>:<partition epoch>`` (see ``Log.partition_epoch``).
    """
    if start.verdict is not ReplayVerdict.REPLACED:
        return False
    if start.store_epoch is None or start.log_epoch is None:
        return False
    return start.store_epoch.partition(":")[0] != start.log_epoch.partition(":")[0]


class ForeignStoreError(ChangelogMismatchError):
    """The store's offsets belong to other changelog partitions than its own."""

    def _describe(self) -> str:
        others = ", ".join(str(tp) for tp in self.start.other_changelogs)
        which = f" ({self.copy})" if self.copy else ""
        return (
            f'state store "{self.store}"{which} holds no offset for its changelog '
            f"{self.changelog} but holds offsets for {others}: its data is another changelog's "
            "(was the directory copied from another task or application?)"
        )


def mismatch_error(
    store: str, changelog: TopicPartition, start: ReplayStart, *, copy: str = ""
) -> ChangelogMismatchError:
    """The error for a verdict a store cannot be trusted under."""
    if start.verdict is ReplayVerdict.AHEAD:
        return ChangelogBehindStoreError(store, changelog, start, copy=copy)
    if start.verdict is ReplayVerdict.GAP:
        return ChangelogGapError(store, changelog, start, copy=copy)
    if start.verdict is ReplayVerdict.REPLACED:
        return ChangelogReplacedError(store, changelog, start, copy=copy)
    if start.verdict is ReplayVerdict.FOREIGN:
        return ForeignStoreError(store, changelog, start, copy=copy)
    raise ValueError(f"verdict {start.verdict.value} is no mismatch")


def replay_batch(
    store: StateStore,
    log: Log,
    changelog: TopicPartition,
    position: int,
    *,
    max_records: int = DEFAULT_BATCH_RECORDS,
) -> tuple[int, int]:
    """Apply one fetched batch at ``position`` with one ``restore_batch`` call.

    One RocksDB ``WriteBatch`` holds the records and the offset of the last
    of them, never a write per record (the weak spot of Quix Streams'
    recovery). Returns (keyed records applied, the next position); the
    position does not move when the changelog has nothing at or after it.
    """
    batch = log.fetch_changes(changelog, position, max_records)
    if batch.last_offset < 0:
        return 0, position
    store.restore_batch(batch.entries, {changelog: batch.last_offset})
    return len(batch.entries), batch.last_offset + 1


def open_trusted(
    open_store: Callable[[], StateStore],
    log: Log,
    changelog: TopicPartition,
    *,
    copy: str = "",
    on_set_aside: Callable[[Path], None] | None = None,
    rebuild_recreated: bool = False,
) -> tuple[StateStore, ReplayStart]:
    """Open a store for ``changelog`` that replay can bring up to date, rebuilding it if not.

    A store whose offsets do not fit its changelog (any verdict but REPLAY
    and CAUGHT_UP) is set aside into the state directory's quarantine, never
    deleted: when the changelog was truncated, rewritten or deleted, that copy
    may be the best one of the state left. The loss is loud (an error naming
    the store, the verdict and where the copy went, and ``on_set_aside``, which
    counts it); the store is opened again empty and restoration rebuilds it
    from the changelog's start. ``eddyline state republish`` writes a copy set
    aside back into its changelog. The changelog's epoch is recorded on the
    store, to be committed with its next offsets. A whole changelog topic
    created again is refused (:class:`ChangelogRecreatedError`) unless
    ``rebuild_recreated``. Returns the store and its verdict.
    """
    store = open_store()
    try:
        start = judge(store, log, changelog)
        if not start.trusted:
            if changelog_recreated(start) and not rebuild_recreated:
                raise ChangelogRecreatedError(store.name, changelog, start, copy)
            if start.verdict is ReplayVerdict.AHEAD:
                # The changelog lost records this copy applied (a truncation, a log
                # restored from a backup): what is written at those offsets from now
                # on is not what this copy, or any other copy that saw them, holds.
                log.record_divergence(changelog)
            reason = mismatch_error(store.name, changelog, start, copy=copy)
            name = store.name
            kept = store.set_aside(start.verdict.value)
            if kept is not None:
                write_quarantine_note(kept, quarantine_note(name, changelog, start, copy))
                if on_set_aside is not None:
                    on_set_aside(kept)
            logger.error(
                "%s. Rebuilding it from the changelog's start (offset %d); the copy it held %s",
                reason.problem,
                start.log_start,
                "is gone (it had nothing on disk)"
                if kept is None
                else f"is kept at {kept}: to write it back into the changelog, run "
                f"`eddyline state republish {kept} --log LOG_URL`",
            )
            store = open_store()
            start = judge(store, log, changelog)
        if start.log_epoch is not None:
            store.record_changelog_epoch(changelog, start.log_epoch)
    except BaseException:
        store.close()
        raise
    return store, start


def quarantine_note(
    store: str, changelog: TopicPartition, start: ReplayStart, copy: str
) -> dict[str, Any]:
    """What ``eddyline state republish`` and a person need to know of a copy set aside."""
    return {
        "store": store,
        "copy": copy,
        "changelog": {"topic": changelog.topic, "partition": changelog.partition},
        "verdict": start.verdict.value,
        "committed": start.committed,
        "log_start": start.log_start,
        "log_end": start.log_end,
        "store_epoch": start.store_epoch,
        "log_epoch": start.log_epoch,
    }
