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

Kafka Streams marks a task corrupted in the GAP and AHEAD cases; the runtime
wipes the store and rebuilds it from the changelog (``restoration.py``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log import Log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state import StateStore

# Records per fetch and per WriteBatch: large enough that per-batch costs
# vanish, small enough that a batch stays a few MiB.
DEFAULT_BATCH_RECORDS = 10_000


class ReplayVerdict(enum.Enum):
    REPLAY = "replay"
    CAUGHT_UP = "caught-up"
    GAP = "gap"
    AHEAD = "ahead"


@dataclass(frozen=True, slots=True)
class ReplayStart:
    """The verdict on one store's changelog, and the offsets it was made from."""

    verdict: ReplayVerdict
    committed: int | None  # the store's committed offset (last record included)
    log_start: int  # first offset the changelog holds
    log_end: int  # next offset the changelog will write

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

    @property
    def records_behind(self) -> int:
        """Offsets between where replay starts and the end (an upper bound on records)."""
        return self.log_end - self.first_offset


def replay_start(committed: int | None, log_start: int, log_end: int) -> ReplayStart:
    """Judge a store against its changelog's bounds (see the module's table)."""
    if log_start < 0 or log_end < log_start:
        raise ValueError(f"changelog bounds [{log_start}, {log_end}) are not a log's")
    if committed is None:
        verdict = ReplayVerdict.REPLAY if log_start < log_end else ReplayVerdict.CAUGHT_UP
    elif committed >= log_end:
        verdict = ReplayVerdict.AHEAD
    elif committed + 1 < log_start:
        verdict = ReplayVerdict.GAP
    elif committed + 1 == log_end:
        verdict = ReplayVerdict.CAUGHT_UP
    else:
        verdict = ReplayVerdict.REPLAY
    return ReplayStart(verdict, committed, log_start, log_end)


def judge(store: StateStore, log: Log, changelog: TopicPartition) -> ReplayStart:
    """:func:`replay_start` for ``store`` against the live bounds of ``changelog``."""
    return replay_start(
        store.committed_offset(changelog),
        log.beginning_offset(changelog),
        log.end_offset(changelog),
    )


def next_offset_after(committed: int | None, log_start: int) -> int:
    """The next changelog offset a store needs: ``committed + 1``, or the log's start."""
    return log_start if committed is None else committed + 1


class ChangelogMismatchError(EddylineError):
    """A store's committed offset does not fit its changelog: the store cannot be trusted.

    ChangelogMismatchError
    ├── ChangelogBehindStoreError   the store committed past the changelog's end (AHEAD)
    └── ChangelogGapError           records after the store's offset are gone (GAP)
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


def mismatch_error(
    store: str, changelog: TopicPartition, start: ReplayStart, *, copy: str = ""
) -> ChangelogMismatchError:
    """The error for a verdict a store cannot be trusted under."""
    if start.verdict is ReplayVerdict.AHEAD:
        return ChangelogBehindStoreError(store, changelog, start, copy=copy)
    if start.verdict is ReplayVerdict.GAP:
        return ChangelogGapError(store, changelog, start, copy=copy)
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
