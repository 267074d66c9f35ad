"""A standby names its committed offset by an epoch that covers the records it applied.

Issue 38's false loss: member "b" opened its standby copy of a task (recording the
changelog's epoch 0) just before member "a", creating the task, began epoch 1 at the
changelog's end; the standby then replayed a's records and committed them as epoch 0's,
and its promotion judged offset 115 of epoch 0 (which ended at offset 0) a loss. Each
test forces one order that the load of a full test run only sometimes gives.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from eddyline_runtime.log import (
    ChangeBatch,
    ProducerFencedError,
    Record,
    SqliteLog,
    TransactionalProducer,
)
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.restore.replay import (
    ChangelogBehindStoreError,
    ReplayVerdict,
    StandbyTask,
    judge,
    open_trusted,
)
from eddyline_runtime.state import RocksDBStore, store_directory
from tests.support.stores import StoreFactory

CHANGELOG = TopicPartition("app-counts-changelog", 0)
TASK = TaskId(1, 0)


def _records(count: int, value: bytes = b"v") -> list[Record]:
    return [Record(b"k%d" % (i % 7), value + b"%d" % i, i) for i in range(count)]


@pytest.fixture
def log(tmp_path: Path) -> SqliteLog:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 1, compacted=True)
    return log


def _standby_copy(store_factory: StoreFactory, log: SqliteLog, state_dir: Path) -> RocksDBStore:
    """A standby's store as the task manager opens it (open_trusted records the epoch)."""
    store, _ = open_trusted(
        store_factory, log, CHANGELOG, copy=f"standby of task {TASK}", state_dir=state_dir
    )
    assert isinstance(store, RocksDBStore)
    return store


def _promote(store: RocksDBStore, log: SqliteLog, state_dir: Path) -> ReplayVerdict:
    """The standby's open store becomes the active task's, as _create_active recycles it."""
    _, verdict = open_trusted(
        lambda: store,
        log,
        CHANGELOG,
        copy=f"task {TASK}",
        state_dir=state_dir,
        writer=True,
        new_epoch=True,
    )
    return verdict.verdict


def test_a_standby_opened_before_the_writer_began_its_epoch_is_promoted_without_a_loss(
    log: SqliteLog, store_factory: StoreFactory, tmp_path: Path
) -> None:
    store = _standby_copy(store_factory, log, tmp_path)  # records epoch 0
    writer_epoch = log.start_epoch(CHANGELOG)  # "a" creates the task: epoch 1 at offset 0
    standby = StandbyTask(TASK, {"counts": store}, {"counts": CHANGELOG})
    standby.start(log)  # after the epoch began: the log's epoch is 1, the store's 0
    log.produce(CHANGELOG, _records(116))  # what "a" wrote, offsets 0..115
    assert standby.replay(log) == 116
    assert (store.committed_offset(CHANGELOG), store.changelog_epoch(CHANGELOG)) == (
        115,
        writer_epoch,
    )
    assert _promote(store, log, tmp_path) is ReplayVerdict.CAUGHT_UP


class ChangedDuringFetchLog(SqliteLog):
    """The embedded log, where another member changes the changelog while the next fetch
    runs: ``change`` is called once, before the fetch reads the records or right after."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.change: Callable[[], None] | None = None
        self.after_read = False

    def fetch_changes(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> ChangeBatch:
        change, self.change = self.change, None
        if change is not None and not self.after_read:
            change()
        batch = super().fetch_changes(tp, offset, max_records)
        if change is not None and self.after_read:
            change()
        return batch


@pytest.fixture
def changing_log(tmp_path: Path) -> ChangedDuringFetchLog:
    log = ChangedDuringFetchLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 1, compacted=True)
    return log


def _running_standby(
    store_factory: StoreFactory, log: SqliteLog, state_dir: Path
) -> tuple[RocksDBStore, StandbyTask]:
    """A standby that applied offsets 0..99 of the first writer's epoch, opened after that
    epoch began (the order that always worked)."""
    log.start_epoch(CHANGELOG)
    store = _standby_copy(store_factory, log, state_dir)
    log.produce(CHANGELOG, _records(100))
    standby = StandbyTask(TASK, {"counts": store}, {"counts": CHANGELOG})
    standby.start(log)
    assert standby.replay(log) == 100
    return store, standby


def test_a_new_writers_epoch_begun_during_a_fetch_is_not_judged_a_loss(
    changing_log: ChangedDuringFetchLog, store_factory: StoreFactory, tmp_path: Path
) -> None:
    """The task moved on: its new owner began an epoch at the end (offset 105) and wrote
    on after the standby read the epoch and before its fetch, which returned records of
    both epochs."""
    log = changing_log
    store, standby = _running_standby(store_factory, log, tmp_path)
    log.produce(CHANGELOG, _records(5))  # offsets 100..104, the first writer's last

    def new_owner_writes() -> None:
        log.start_epoch(CHANGELOG)
        log.produce(CHANGELOG, _records(10, b"new"))  # offsets 105..114

    log.change = new_owner_writes
    replayed = standby.replay(log)
    replayed += standby.replay(log)  # was: the copy judged replaced here (offset 114, epoch 1)
    assert replayed == 15
    assert store.committed_offset(CHANGELOG) == 114
    assert store.changelog_epoch(CHANGELOG) == log.partition_epoch(CHANGELOG)
    assert _promote(store, log, tmp_path) is ReplayVerdict.CAUGHT_UP


def test_records_replaced_right_after_a_fetch_read_them_are_not_trusted_as_the_new_ones(
    changing_log: ChangedDuringFetchLog, store_factory: StoreFactory, tmp_path: Path
) -> None:
    """The other side of the same race: the fetch read offsets 100..114, then the changelog
    was truncated to 105 and written again. Stamping the batch with the epoch read after
    the fetch would name those old records by the new epoch (a loss never found); the
    copy applies nothing of that fetch and reads the new records."""
    log = changing_log
    store, standby = _running_standby(store_factory, log, tmp_path)
    log.produce(CHANGELOG, _records(15, b"old"))  # offsets 100..114

    def truncated_and_rewritten() -> None:
        assert log.truncate(CHANGELOG, 105) == 10
        log.produce(CHANGELOG, _records(10, b"new"))  # offsets 105..114 again

    log.after_read = True
    log.change = truncated_and_rewritten
    assert standby.replay(log) == 0  # an epoch began during the fetch: nothing applied
    assert store.committed_offset(CHANGELOG) == 99
    assert standby.replay(log) == 15
    # offset 114 is the 10th new record: key k9 % 7 == k2
    assert store.get(b"k2") == b"new9"
    assert judge(store, log, CHANGELOG).verdict is ReplayVerdict.CAUGHT_UP
    assert _promote(store, log, tmp_path) is ReplayVerdict.CAUGHT_UP


def test_a_running_standby_past_a_truncated_changelogs_end_is_ahead_whatever_the_epoch(
    log: SqliteLog, store_factory: StoreFactory, tmp_path: Path
) -> None:
    """The truncation began an epoch too, but a copy past the end is judged AHEAD (the log
    lost records it applied), as at its open, not by the epoch."""
    _, standby = _running_standby(store_factory, log, tmp_path)
    assert log.truncate(CHANGELOG, 80) == 20
    with pytest.raises(ChangelogBehindStoreError, match=r"holds offsets \[0, 80\)"):
        standby.replay(log)


class NoEpochsLog(SqliteLog):
    """A log that names no epochs (the port's default): offsets alone judge a copy."""

    def partition_epoch(self, tp: TopicPartition) -> None:  # type: ignore[override]
        return None


def test_a_standby_on_a_log_without_epochs_replays_and_stamps_none(
    tmp_path: Path, store_factory: StoreFactory
) -> None:
    log = NoEpochsLog(tmp_path / "log.db")
    log.create_topic(CHANGELOG.topic, 1, compacted=True)
    store = _standby_copy(store_factory, log, tmp_path)
    standby = StandbyTask(TASK, {"counts": store}, {"counts": CHANGELOG})
    standby.start(log)
    log.produce(CHANGELOG, _records(30))
    assert standby.replay(log) == 30
    assert (store.committed_offset(CHANGELOG), store.changelog_epoch(CHANGELOG)) == (29, None)


def _writer_store(
    store_factory: StoreFactory, log: SqliteLog, state_dir: Path, producer: TransactionalProducer
) -> RocksDBStore:
    """An active task's store as _create_active opens it: a new epoch fenced by its producer."""
    store, _ = open_trusted(
        lambda: store_factory(directory=store_directory(state_dir, TASK, "counts")),
        log,
        CHANGELOG,
        copy=f"task {TASK}",
        state_dir=state_dir,
        writer=True,
        new_epoch=True,
        fence=producer,
    )
    assert isinstance(store, RocksDBStore)
    return store


def _write(producer: TransactionalProducer, store: RocksDBStore, records: int) -> None:
    producer.begin()
    producer.send_batch(CHANGELOG, _records(records))
    committed = producer.commit()
    store.commit({CHANGELOG: committed.last_offsets[CHANGELOG]})


def test_a_member_whose_producer_was_fenced_before_it_reached_the_task_begins_no_epoch(
    log: SqliteLog, store_factory: StoreFactory, tmp_path: Path
) -> None:
    # The cold CI run's false loss: member "a" starts the producers of all its new tasks,
    # then creates them one after another; before it reaches this one a newer membership
    # moved it to "b", which fenced a's producer, began its epoch and wrote. When "a" got
    # to the task it began an epoch of its own at the end (a zombie writes no record, but
    # it could begin an epoch), so b's later records lay in a's epoch and b's copy, which
    # had stamped them with its own, was judged to hold records the changelog lost.
    zombie = log.transactional_producer(f"app-{TASK}")
    owner = log.transactional_producer(f"app-{TASK}")  # fences the zombie
    owner_store = _writer_store(store_factory, log, tmp_path / "b", owner)
    _write(owner, owner_store, 10)
    with pytest.raises(ProducerFencedError):
        _writer_store(store_factory, log, tmp_path / "a", zombie)
    for _ in range(3):
        _write(owner, owner_store, 10)
    start = judge(owner_store, log, CHANGELOG)
    assert (start.verdict, start.committed) == (ReplayVerdict.CAUGHT_UP, 39), start
