"""``active-restoring-tasks`` (stream-state-updater-metrics, KIP-869's name): the active tasks a
thread is restoring now. The chart's EddylineStoreRestoringTooLong alert reads it, so it must be
1 while a store replays its changelog (scraped from another thread meanwhile) and 0 after.

The restore is held by the log it reads (a real SQLite log whose changelog fetches wait for
the test), never by reaching into the engine.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import ChangeBatch, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from tests.support.waiting import wait_for
from tests.support.word_count import INPUT, OUTPUT, produce_lines, streams_config, word_count

DEADLINE_SECONDS = 60


class HeldChangelogLog(SqliteLog):
    """A SQLite log whose changelog fetches wait while ``held`` is set."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.held = threading.Event()
        self.waiting = threading.Event()

    def fetch_changes(
        self, tp: TopicPartition, offset: int, max_records: int = 10_000
    ) -> ChangeBatch:
        if tp.topic.endswith("-changelog") and self.held.is_set():
            self.waiting.set()
            while self.held.is_set():
                self.held.wait(0.01)
        return super().fetch_changes(tp, offset, max_records)


def restoring(instance: StreamsInstance) -> float:
    values = {
        name: value
        for name, value in instance.metrics.snapshot().items()
        if name.name == "active-restoring-tasks"
    }
    assert values, "no active-restoring-tasks metric"
    return sum(values.values())


def test_a_thread_counts_its_restoring_task_until_the_store_is_restored(tmp_path: Path) -> None:
    log = HeldChangelogLog(tmp_path / "log.db")
    log.create_topic(INPUT, 1)
    log.create_topic(OUTPUT, 1)
    produce_lines(log, ["a b c", "a b", "a"], 1)
    config = streams_config(tmp_path / "state", **{"num.standby.replicas": 0})
    first = StreamsInstance(word_count(), config, log)
    first.start()
    try:
        first.wait_until_caught_up(DEADLINE_SECONDS)
    finally:
        first.close()
    shutil.rmtree(tmp_path / "state")  # the disk is gone: the next start restores

    log.held.set()
    second = StreamsInstance(word_count(), config, log)
    second.start()
    try:
        assert log.waiting.wait(DEADLINE_SECONDS), "the restore never fetched its changelog"
        assert restoring(second) == 1
        log.held.clear()
        wait_for(lambda: restoring(second) == 0, "the restore to end", DEADLINE_SECONDS)
        second.wait_until_caught_up(DEADLINE_SECONDS)
    finally:
        log.held.clear()
        second.close()
