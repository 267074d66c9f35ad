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
left). When the changelog lost records the copy applied (AHEAD, REPLACED) it
then stops the task until the user decides (:class:`ChangelogLossError`):
a rebuild would publish values lower than ones already published. Otherwise
(GAP, FOREIGN) it rebuilds the store from the changelog (:func:`open_trusted`).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log import Log, TransactionalProducer
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state import StateStore
from eddyline_runtime.state.state_directory import (
    DECISION_PENDING,
    pending_decisions,
    read_quarantine_note,
)

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


def recorded_epoch_end(
    store_epoch: str | None,
    log_epoch: str | None,
    epoch_end_offset: Callable[[str], int | None] | None,
) -> int | None:
    """``store_epoch_end`` for :func:`replay_start`: where the epoch a copy recorded ended
    in the changelog's history (``Log.epoch_end_offset`` of its partition), asked only
    when that epoch is not the changelog's now; None when it need not be or cannot be
    told. Every copy (a store, a standby, a Spark build's manifest) is judged by it."""
    if store_epoch is None or log_epoch is None or store_epoch == log_epoch:
        return None
    return None if epoch_end_offset is None else epoch_end_offset(store_epoch)


# How long a judge waits for a changelog's undecided transactions before it takes an end
# below a copy's offset as final: Kafka's coordinator answers a commit, then writes the
# markers, and the last stable offset moves only when they land (milliseconds; seconds
# under load). A live writer's own open transaction can keep the changelog undecided for
# its whole commit interval, so the bound is well above that, and a real loss is told
# this much later.
DECIDED_WITHIN_S = 30.0
_DECIDED_POLL_S = 0.05


def judge(
    store: StateStore,
    log: Log,
    changelog: TopicPartition,
    *,
    decided_within_s: float = DECIDED_WITHIN_S,
) -> ReplayStart:
    """:func:`replay_start` for ``store`` against the live bounds and epoch of ``changelog``.

    A copy ahead of the end is judged again while the changelog holds undecided records
    (``Log.undecided``), for at most ``decided_within_s``: the copy of a task that just
    committed and moved (an active that stays on as a standby, a restart right after a
    commit) has applied records whose commit markers are still on the way, so the end is
    below them for a moment; taken as final, that moment was a loss, the copy quarantined
    and the task stopped (the soak run of issue 38 met it on a real broker)."""
    deadline = time.monotonic() + decided_within_s
    while True:
        start = _judge_once(store, log, changelog)
        if start.verdict is not ReplayVerdict.AHEAD:
            return start
        if not log.undecided(changelog):
            # Decided now; the end above may have been read before the markers landed,
            # one read from here on is not.
            return _judge_once(store, log, changelog)
        if time.monotonic() >= deadline:
            return start
        time.sleep(_DECIDED_POLL_S)


def _judge_once(store: StateStore, log: Log, changelog: TopicPartition) -> ReplayStart:
    store_epoch = store.changelog_epoch(changelog)
    log_epoch = log.partition_epoch(changelog)
    return replay_start(
        store.committed_offset(changelog),
        log.beginning_offset(changelog),
        log.end_offset(changelog),
        store_epoch=store_epoch,
        log_epoch=log_epoch,
        store_epoch_end=recorded_epoch_end(
            store_epoch, log_epoch, partial(log.epoch_end_offset, changelog)
        ),
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


def loses_records(start: ReplayStart) -> bool:
    """Whether the changelog lost records the copy applied, so that a rebuild from it would
    go back on values already published: AHEAD, or REPLACED (truncated, rewritten, a log
    put back from a backup). A recreated topic has its own rule (``rebuild_recreated``)."""
    if start.verdict is ReplayVerdict.AHEAD:
        return True
    return start.verdict is ReplayVerdict.REPLACED and not changelog_recreated(start)


class ChangelogLossError(EddylineError):
    """A copy holds changelog records its changelog lost: its task stops until the user
    republishes the copy or accepts the loss (docs/state.md)."""

    def __init__(
        self, store: str, changelog: TopicPartition, entry: Path, copy: str, problem: str
    ) -> None:
        self.store = store
        self.changelog = changelog
        self.entry = entry
        which = f" ({copy})" if copy else ""
        super().__init__(
            f'state store "{store}"{which} holds changelog records that {changelog} lost '
            f"({problem}); the task is stopped so that no value lower than one already "
            f"published is published. Its copy is kept at {entry}. Decide, then start "
            f"again: `eddyline state republish {entry} --log LOG_URL` writes the copy back "
            "into the changelog (nothing is lost), or `eddyline state accept-loss "
            f"{entry} --log LOG_URL` rebuilds the store from what the changelog holds (values "
            "published higher may be published lower)"
        )


class ChangelogHeldError(EddylineError):
    """Another instance's copy found the changelog's loss and waits for the user's decision:
    no task rebuilds from the changelog meanwhile."""

    def __init__(self, store: str, changelog: TopicPartition, copy: str, hold: str) -> None:
        which = f" ({copy})" if copy else ""
        super().__init__(
            f'state store "{store}"{which} cannot start: {changelog} lost records that a '
            "copy of the store applied, so the task is stopped so that no value lower than "
            f"one already published is published: {hold}. Decide on that copy, then start "
            "again: `eddyline state republish ENTRY --log LOG_URL` writes it back into the "
            "changelog, or `eddyline state accept-loss ENTRY --log LOG_URL` lets the store "
            "be rebuilt from what the changelog holds"
        )


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


@dataclass(frozen=True, slots=True)
class StampedBatch:
    """What :func:`replay_stamped_batch` did."""

    records: int  # keyed records applied
    next_position: int  # the next offset to apply (unchanged when nothing was applied)
    # An epoch began while the batch was read: nothing was applied; judge again.
    epoch_began: bool = False


def replay_stamped_batch(
    store: StateStore,
    log: Log,
    changelog: TopicPartition,
    position: int,
    *,
    epoch: str | None,
    max_records: int = DEFAULT_BATCH_RECORDS,
) -> StampedBatch:
    """:func:`replay_batch` for a copy that keeps replaying (a standby), its offset named by
    the epoch in force while its records were read (docs/state.md, "Epochs").

    ``epoch`` is the changelog's epoch read (and judged) before this call. The batch is
    committed with it only if the changelog's epoch read again after the fetch is still
    ``epoch``: no epoch began in between, so every record fetched was written in
    ``epoch`` or before it, and that epoch's history covers the offset committed. When
    one began, nothing says whether the fetch returned records written before it or its
    writer's first ones (a new active task begins its epoch at the changelog's end and
    writes on at once): committing them with the old epoch would be judged a loss where
    nothing was lost (the offset lies past where that epoch ended), with the new one a
    truncation's replaced records would be trusted. So nothing is applied, and the
    caller judges the copy again against the epoch now and fetches again.
    """
    batch = log.fetch_changes(changelog, position, max_records)
    if batch.last_offset < 0:
        return StampedBatch(0, position)
    if log.partition_epoch(changelog) != epoch:
        return StampedBatch(0, position, epoch_began=True)
    if epoch is not None:
        # One WriteBatch with the records and their offset (the store commits both).
        store.record_changelog_epoch(changelog, epoch)
    store.restore_batch(batch.entries, {changelog: batch.last_offset})
    return StampedBatch(len(batch.entries), batch.last_offset + 1)


def open_trusted(
    open_store: Callable[[], StateStore],
    log: Log,
    changelog: TopicPartition,
    *,
    copy: str = "",
    on_set_aside: Callable[[Path], None] | None = None,
    rebuild_recreated: bool = False,
    state_dir: Path | None = None,
    writer: bool = False,
    new_epoch: bool = False,
    fence: TransactionalProducer | None = None,
) -> tuple[StateStore, ReplayStart]:
    """Open a store for ``changelog`` that replay can bring up to date, or refuse to.

    A store whose offsets do not fit its changelog (any verdict but REPLAY
    and CAUGHT_UP) is set aside into the state directory's quarantine, never
    deleted: when the changelog was truncated, rewritten or deleted, that copy
    may be the best one of the state left. The loss is loud (an error naming
    the store, the verdict and where the copy went, and ``on_set_aside``, which
    counts it). When the changelog lost records the copy applied
    (:func:`loses_records`) the copy waits for the user's decision and
    :class:`ChangelogLossError` stops the task; so does every later open while
    a copy of this store in ``state_dir`` still waits. Otherwise the store is
    opened again empty and restoration rebuilds it from the changelog's start.
    A whole changelog topic created again is refused
    (:class:`ChangelogRecreatedError`) unless ``rebuild_recreated``.

    A ``writer`` (an active task) also stops while the log holds the
    changelog (``Log.changelog_hold``: a copy elsewhere waits for a decision).
    The changelog's epoch is recorded on the store, to be committed with its
    next offsets; with ``new_epoch`` (a writer that fenced the previous owner)
    a new epoch is started first (``Log.start_epoch``, refused with ProducerFencedError
    when ``fence``, the writer's producer, was fenced since) and that one recorded.
    Returns the store and its verdict.
    """
    store = open_store()
    try:
        if state_dir is not None:
            waiting = pending_decisions(state_dir, store.name, changelog.topic, changelog.partition)
            if waiting:
                raise _still_waiting(store.name, changelog, waiting[0], copy)
        if writer:
            # Another instance's copy found the loss: an empty or rebuilt copy here would
            # publish what that copy's decision is about.
            hold = log.changelog_hold(changelog)
            if hold is not None:
                raise ChangelogHeldError(store.name, changelog, copy, hold)
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
            note = quarantine_note(name, changelog, start, copy)
            held = loses_records(start)
            if held:
                note["decision"] = DECISION_PENDING
                # In the log first: a crash before the copy moves leaves it in place, to be
                # found again; every other instance stops writing from here on.
                log.hold_changelog(changelog, _hold_reason(name, copy, state_dir))
            kept = store.set_aside(start.verdict.value, note)
            if kept is not None and on_set_aside is not None:
                on_set_aside(kept)
            if held and kept is not None:
                raise ChangelogLossError(name, changelog, kept, copy, _loss(start))
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
        epoch = start.log_epoch
        if writer and new_epoch and epoch is not None:
            epoch = log.start_epoch(changelog, fence=fence) or log.partition_epoch(changelog)
        if epoch is not None:
            store.record_changelog_epoch(changelog, epoch)
    except BaseException:
        store.close()
        raise
    return store, start


def _loss(start: ReplayStart) -> str:
    """What the changelog lost, for the error that stops the task."""
    if start.verdict is ReplayVerdict.AHEAD:
        return (
            f"the copy committed offset {start.committed}, the changelog ends at "
            f"{start.log_end}: it was truncated, or put back from a backup"
        )
    return (
        f"the copy committed offset {start.committed} in epoch {start.store_epoch}, and the "
        f"changelog's records there are not that epoch's any more (epoch {start.log_epoch}): "
        "it was truncated, rewritten, or put back from a backup"
    )


def _hold_reason(store: str, copy: str, state_dir: Path | None) -> str:
    where = "" if state_dir is None else f" in state directory {state_dir}"
    which = f" ({copy})" if copy else ""
    listing = "" if state_dir is None else f" (eddyline state quarantined {state_dir} lists it)"
    return (
        f'the copy of state store "{store}"{which}{where} holds records the changelog lost '
        f"and waits for a decision in the quarantine{listing}"
    )


def _still_waiting(
    store: str, changelog: TopicPartition, entry: Path, copy: str
) -> ChangelogLossError:
    note = read_quarantine_note(entry) or {}
    return ChangelogLossError(
        store,
        changelog,
        entry,
        copy,
        f"found earlier, verdict {note.get('verdict')}, offset {note.get('committed')}; the "
        "copy still waits for your decision",
    )


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
