"""The one replay-start rule, at every boundary, and what restoration makes of each verdict."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Self

import pytest

from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.restore.replay import (
    ChangelogBehindStoreError,
    ChangelogGapError,
    ChangelogHeldError,
    ChangelogLossError,
    ChangelogReplacedError,
    ReplayVerdict,
    judge,
    open_trusted,
    replay_start,
    restore,
)
from eddyline_runtime.restore.replay.standby_task import StandbyTask
from eddyline_runtime.state import RocksDBStore
from eddyline_runtime.state.state_directory import (
    DECISION_LOSS_ACCEPTED,
    pending_decisions,
    read_quarantine_note,
    record_decision,
)
from tests.support.stores import StoreFactory

CHANGELOG = TopicPartition("app-counts-changelog", 0)


@pytest.mark.parametrize(
    ("committed", "start", "end", "verdict", "first"),
    [
        # no committed offset: replay from the log's start, wherever it is
        (None, 0, 0, ReplayVerdict.CAUGHT_UP, 0),
        (None, 0, 10, ReplayVerdict.REPLAY, 0),
        (None, 4, 10, ReplayVerdict.REPLAY, 4),
        (None, 10, 10, ReplayVerdict.CAUGHT_UP, 10),
        # committed + 1 < start: the records after the store's offset are gone
        (2, 4, 10, ReplayVerdict.GAP, 4),
        (0, 2, 10, ReplayVerdict.GAP, 2),
        # committed + 1 == start: the next record is the first the log holds
        (3, 4, 10, ReplayVerdict.REPLAY, 4),
        (5, 4, 10, ReplayVerdict.REPLAY, 6),
        (8, 0, 10, ReplayVerdict.REPLAY, 9),
        # committed == end - 1: caught up (also when the start moved up to the end)
        (9, 0, 10, ReplayVerdict.CAUGHT_UP, 10),
        (9, 10, 10, ReplayVerdict.CAUGHT_UP, 10),
        # committed >= end: the changelog lost records the store holds
        (10, 0, 10, ReplayVerdict.AHEAD, 0),
        (50, 4, 10, ReplayVerdict.AHEAD, 4),
        (0, 0, 0, ReplayVerdict.AHEAD, 0),
    ],
)
def test_replay_start_verdict_at_every_boundary(
    committed: int | None, start: int, end: int, verdict: ReplayVerdict, first: int
) -> None:
    judged = replay_start(committed, start, end)
    assert judged.verdict is verdict
    assert judged.first_offset == first
    assert judged.trusted == (verdict in (ReplayVerdict.REPLAY, ReplayVerdict.CAUGHT_UP))


def test_bounds_that_no_log_has_are_refused() -> None:
    with pytest.raises(ValueError, match="not a log's"):
        replay_start(None, 5, 4)


@pytest.fixture
def log(tmp_path: Path) -> SqliteLog:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 1, compacted=True)
    log.produce(CHANGELOG, [Record(b"k%d" % (i % 7), b"v%d" % i, i) for i in range(100)])
    return log


def test_a_store_whose_next_records_were_deleted_is_refused_not_skipped(
    log: SqliteLog, store_factory: StoreFactory
) -> None:
    store = store_factory()
    restore(store, log, CHANGELOG, batch_records=30)
    store.close()
    log.produce(CHANGELOG, [Record(b"k0", b"later", 0)] * 20)  # offsets 100..119
    log.delete_records(CHANGELOG, 110)  # retention took 100..109, which the store never saw
    reopened = store_factory()
    with pytest.raises(ChangelogGapError, match=r"records 100\.\.109") as raised:
        restore(reopened, log, CHANGELOG)
    assert "delete the store's directory" in str(raised.value)
    assert reopened.committed_offset(CHANGELOG) == 99  # nothing was applied


def test_a_store_at_the_log_start_after_deletion_replays_from_there(
    log: SqliteLog, store_factory: StoreFactory
) -> None:
    store = store_factory()
    restore(store, log, CHANGELOG)
    log.produce(CHANGELOG, [Record(b"k0", b"later", 0)] * 20)
    log.delete_records(CHANGELOG, 100)  # everything the store has seen, nothing more
    result = restore(store, log, CHANGELOG)
    assert (result.first_offset, result.records) == (100, 20)
    assert store.get(b"k0") == b"later"


def test_a_store_without_offsets_replays_from_the_log_start_not_zero(
    log: SqliteLog, store_factory: StoreFactory
) -> None:
    log.delete_records(CHANGELOG, 60)
    store = store_factory()
    result = restore(store, log, CHANGELOG)
    assert (result.first_offset, result.end_offset, result.records) == (60, 100, 40)
    assert store.committed_offset(CHANGELOG) == 99


def test_a_standby_refuses_a_gap_as_the_active_restore_does(
    log: SqliteLog, store_factory: StoreFactory
) -> None:
    store = store_factory()
    store.restore_batch([(b"k", b"v")], {CHANGELOG: 10})
    log.delete_records(CHANGELOG, 50)
    standby = StandbyTask(TaskId(0, 0), {"counts": store}, {"counts": CHANGELOG})
    with pytest.raises(ChangelogGapError, match=r"standby of task 0_0"):
        standby.start(log)


def test_a_standby_ahead_of_its_changelog_is_refused(
    log: SqliteLog, store_factory: StoreFactory
) -> None:
    store = store_factory()
    store.restore_batch([(b"k", b"v")], {CHANGELOG: 500})
    standby = StandbyTask(TaskId(0, 0), {"counts": store}, {"counts": CHANGELOG})
    with pytest.raises(ChangelogBehindStoreError, match=r"holds offsets \[0, 100\)"):
        standby.start(log)


class MarkersOnTheWay(SqliteLog):
    """The embedded log as Kafka is right after a commit returned: the last ``hidden``
    records wait for their transaction's markers (below the last stable offset, and
    ``undecided``) for ``reads`` more reads of the end. The embedded log decides a
    transaction in one write, so only this stand-in shows the moment (a real broker shows
    it by chance: the soak run did)."""

    def __init__(self, path: Path, *, hidden: int, reads: int) -> None:
        super().__init__(path)
        self.hidden, self.reads = hidden, reads

    @classmethod
    def with_records(cls, tmp_path: Path, records: int, *, hidden: int, reads: int) -> Self:
        log = cls(tmp_path / "log.db", hidden=hidden, reads=reads)
        log.create_topic(CHANGELOG.topic, 1, compacted=True)
        log.produce(CHANGELOG, [Record(b"k%d" % i, b"v", i) for i in range(records)])
        return log

    def end_offset(self, tp: TopicPartition) -> int:
        end = super().end_offset(tp)
        if self.reads <= 0:
            return end
        self.reads -= 1
        return end - self.hidden

    def undecided(self, tp: TopicPartition) -> bool:
        return self.reads > 0


def test_a_copy_ahead_only_of_undecided_records_is_judged_once_they_are_decided(
    tmp_path: Path, store_factory: StoreFactory
) -> None:
    """An active that committed records 95..99 and stays on as the task's standby: its copy
    is at 99 while the end still reads 95. Not a loss: the copy opens caught up, nothing
    set aside, once the markers land."""
    log = MarkersOnTheWay.with_records(tmp_path, 100, hidden=5, reads=3)
    directory = tmp_path / "0_0" / "counts"
    committed = store_factory(directory=directory)
    committed.restore_batch([(b"k99", b"v")], {CHANGELOG: 99})
    committed.close()
    set_aside: list[Path] = []
    store, start = open_trusted(
        lambda: store_factory(directory=directory),
        log,
        CHANGELOG,
        copy="standby of task 0_0",
        on_set_aside=set_aside.append,
        state_dir=tmp_path,
    )
    store.close()
    assert (start.verdict, start.log_end) == (ReplayVerdict.CAUGHT_UP, 100)
    assert set_aside == [] and log.reads == 0


def test_a_copy_ahead_of_a_changelog_that_stays_undecided_is_a_loss_after_the_bound(
    tmp_path: Path, store_factory: StoreFactory
) -> None:
    """A real loss beside a writer whose transactions keep the changelog undecided: told
    once the bound passed, not waited on for ever."""
    log = MarkersOnTheWay.with_records(tmp_path, 10, hidden=0, reads=10**9)
    store = store_factory()
    store.restore_batch([(b"k", b"v")], {CHANGELOG: 500})
    started = time.monotonic()
    assert judge(store, log, CHANGELOG, decided_within_s=0.3).verdict is ReplayVerdict.AHEAD
    assert 0.3 <= time.monotonic() - started < 5


def test_a_running_standby_notices_its_changelog_truncated_and_grown_back(
    log: SqliteLog, store_factory: StoreFactory, tmp_path: Path
) -> None:
    store = store_factory()
    standby = StandbyTask(TaskId(0, 0), {"counts": store}, {"counts": CHANGELOG})
    standby.start(log)
    assert standby.replay(log) == 100
    assert log.truncate(CHANGELOG, 80) == 20  # cut back to 80, then regrow past 100
    log.produce(CHANGELOG, [Record(b"new", b"%d" % i, 0) for i in range(40)])
    with pytest.raises(ChangelogReplacedError, match="truncated or recreated"):
        standby.replay(log)


def test_a_running_standby_refuses_records_it_never_applied_being_deleted(
    log: SqliteLog, store_factory: StoreFactory
) -> None:
    """The one rule's GAP, for a running standby too: replaying on from the log's new start
    would skip records the copy never saw and serve it as caught up."""
    standby = StandbyTask(TaskId(0, 0), {"counts": store_factory()}, {"counts": CHANGELOG})
    standby.start(log)  # at offset 0, nothing applied yet
    log.delete_records(CHANGELOG, 50)
    with pytest.raises(ChangelogGapError, match=r"records 0\.\.49 .* are gone"):
        standby.replay(log)


def test_open_trusted_stops_a_store_the_changelog_lost_records_of_until_a_decision(
    log: SqliteLog, store_factory: StoreFactory, tmp_path: Path
) -> None:
    directory = tmp_path / "0_0" / "counts"
    stale = store_factory(directory=directory)
    stale.restore_batch([(b"stale", b"1")], {CHANGELOG: 500})  # ahead of the changelog
    stale.close()
    set_aside: list[Path] = []

    def opened() -> tuple[RocksDBStore | object, object]:
        return open_trusted(
            lambda: store_factory(directory=directory),
            log,
            CHANGELOG,
            copy="task 0_0",
            on_set_aside=set_aside.append,
            state_dir=tmp_path,
            writer=True,
            new_epoch=True,
        )

    with pytest.raises(ChangelogLossError) as stopped:
        opened()
    # The old copy is not deleted: it went to the state directory's quarantine, with a note
    # that says it waits for the user's decision, and the error says where and what to do.
    [entry] = set_aside
    assert entry.parent == tmp_path / ".quarantine" and entry.name.startswith("0_0-counts-")
    message = str(stopped.value)
    assert 'state store "counts" (task 0_0)' in message and str(entry) in message
    assert "eddyline state republish" in message and "eddyline state accept-loss" in message
    note = read_quarantine_note(entry)
    assert note is not None
    assert (note["verdict"], note["committed"], note["decision"]) == ("ahead", 500, "pending")
    with RocksDBStore("counts", entry) as kept:
        assert kept.get(b"stale") == b"1"
    # Until the user decides, every open stops the same way (the store's place is empty).
    with pytest.raises(ChangelogLossError, match="still waits for your decision"):
        opened()
    assert pending_decisions(tmp_path, "counts", CHANGELOG.topic, CHANGELOG.partition) == [entry]
    # The log holds the changelog too: a writer elsewhere, with no copy to judge, stops.
    elsewhere = tmp_path / "elsewhere"
    with pytest.raises(ChangelogHeldError, match=f"in state directory {tmp_path}"):
        open_trusted(
            lambda: store_factory(directory=elsewhere / "0_0" / "counts"),
            log,
            CHANGELOG,
            state_dir=elsewhere,
            writer=True,
        )
    record_decision(entry, DECISION_LOSS_ACCEPTED)
    log.release_changelog(CHANGELOG)  # what `eddyline state accept-loss` does
    store, start = opened()
    assert isinstance(store, RocksDBStore)
    try:
        assert (start.verdict, start.first_offset) == (ReplayVerdict.REPLAY, 0)
        assert store.get(b"stale") is None
        # A writer starts a new epoch and stamps it on the store.
        assert store.changelog_epoch(CHANGELOG) == log.partition_epoch(CHANGELOG)
        assert store.changelog_epoch(CHANGELOG) != start.log_epoch
        restore(store, log, CHANGELOG, start=start)
        assert store.committed_offset(CHANGELOG) == 99
    finally:
        store.close()


def test_a_gap_still_rebuilds_at_once_the_copy_holds_nothing_newer(
    log: SqliteLog, store_factory: StoreFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "0_0" / "counts"
    behind = store_factory(directory=directory)
    behind.restore_batch([(b"old", b"1")], {CHANGELOG: 2})
    behind.close()
    log.delete_records(CHANGELOG, 50)  # retention took records the copy never saw
    with caplog.at_level(logging.WARNING):
        store, start = open_trusted(
            lambda: store_factory(directory=directory), log, CHANGELOG, state_dir=tmp_path
        )
    try:
        assert "Rebuilding it" in caplog.text
        assert (start.verdict, start.first_offset) == (ReplayVerdict.REPLAY, 50)
        [entry] = (tmp_path / ".quarantine").iterdir()
        assert "decision" not in (read_quarantine_note(entry) or {})
    finally:
        store.close()


def test_a_standby_crosses_a_new_writers_epoch_without_a_rebuild(
    log: SqliteLog, store_factory: StoreFactory
) -> None:
    """Every active task starts an epoch; a standby that applied less than where it began
    resumes, and stamps the new epoch on its copy."""
    store = store_factory()
    standby = StandbyTask(TaskId(0, 0), {"counts": store}, {"counts": CHANGELOG})
    standby.start(log)
    assert standby.replay(log) == 100
    new_epoch = log.start_epoch(CHANGELOG)
    log.produce(CHANGELOG, [Record(b"later", b"%d" % i, 0) for i in range(10)])
    assert standby.replay(log) == 10
    assert store.changelog_epoch(CHANGELOG) == new_epoch
    assert store.committed_offset(CHANGELOG) == 109


@pytest.mark.parametrize(
    ("store_epoch", "log_epoch", "verdict"),
    [
        ("t:0", "t:0", ReplayVerdict.REPLAY),
        ("t:0", "t:1", ReplayVerdict.REPLACED),
        ("t:0", "u:0", ReplayVerdict.REPLACED),
        (None, "t:1", ReplayVerdict.REPLAY),  # recorded by no earlier version: offsets only
        ("t:0", None, ReplayVerdict.REPLAY),  # a log that cannot tell
    ],
)
def test_a_store_of_another_changelog_incarnation_is_not_trusted(
    store_epoch: str | None, log_epoch: str | None, verdict: ReplayVerdict
) -> None:
    judged = replay_start(5, 0, 10, store_epoch=store_epoch, log_epoch=log_epoch)
    assert judged.verdict is verdict


def test_offsets_of_another_changelog_partition_make_a_store_foreign() -> None:
    other = TopicPartition("app-counts-changelog", 3)
    assert replay_start(None, 0, 10, other_changelogs=[other]).verdict is ReplayVerdict.FOREIGN
    assert replay_start(None, 0, 10).verdict is ReplayVerdict.REPLAY
