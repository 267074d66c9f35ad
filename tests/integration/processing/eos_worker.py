"""The process ``test_exactly_once_crash.py`` SIGKILLs and restarts: the word-count example.

Usage::

    eos_worker.py LOG STATE_DIR EVENTS GUARANTEE COMMIT_INTERVAL_MS THREADS \
        LOG_COMMIT_DELAY_MS STORE_COMMIT_DELAY_MS UNTIL [TOPIC_PREFIX]

It runs ``examples/wordcount/wordcount.py`` (application id ``wordcount``) on
the log at LOG (a SQLite file, or ``kafka://host:port`` with its topics under
TOPIC_PREFIX). With UNTIL ``caught-up`` it runs until every input record is
processed and committed, then closes cleanly; with UNTIL ``killed`` it never
ends on its own (it processes whatever input arrives) and the parent SIGKILLs
it: a run meant to be killed then cannot finish its input first, however fast
the machine. It appends one JSON
object per line to EVENTS, each line one ``write()`` on an ``O_APPEND`` file,
so every line written before a SIGKILL survives it:

* ``{"event": "restore", ...}`` per restored store (the runtime's
  :class:`RestoreReport`, i.e. what its ``restore-total`` metric reports);
* ``{"event": "running", "restore_total": ...}`` once every thread runs, with
  the ``restore-total`` metric of every store as the runtime registered it;
* ``{"event": "commit", ...}`` per commit (the runtime's :class:`CommitReport`,
  handed to listeners only after the stores committed);
* ``{"event": "closed", ...}`` after a clean close;
* ``{"event": "store_commit", "store": ...}`` as a delayed store commit
  starts its delay (only with STORE_COMMIT_DELAY_MS > 0): the parent aims
  its kills at that window.

The two delays change no logic; they widen the windows of a commit that a
kill at a random instant rarely hits, so that the parent's kills land in
them often:

* LOG_COMMIT_DELAY_MS > 0 sleeps that long before each log transaction's
  commit, or under at-least-once before each append to a changelog and
  each commit of input offsets (step 2 of the commit protocol in
  ``stream_thread.py``; under exactly-once, a kill then must leave no trace
  of the commit in the log);
* STORE_COMMIT_DELAY_MS > 0 sleeps that long before each store commit
  (step 3: a kill then leaves a changelog tail for the restart to restore).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import InstanceState, StreamsInstance
from eddyline_runtime.engine.stream_thread import CommitReport
from eddyline_runtime.engine.task_manager import RestoreReport
from eddyline_runtime.log import (
    CommittedTransaction,
    Log,
    Record,
    SqliteLog,
    TransactionalProducer,
)
from eddyline_runtime.log.port import StartedProducers
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state import RocksDBStore

EXAMPLE_DIR = Path(__file__).resolve().parents[3] / "examples" / "wordcount"
sys.path.insert(0, str(EXAMPLE_DIR))

import wordcount  # noqa: E402

APPLICATION_ID = "wordcount"
# A safety net: a worker that never catches up (or is never killed) fails instead of
# hanging the suite.
MAX_SECONDS = 240.0
UNTIL = ("caught-up", "killed")


def tp_key(tp: TopicPartition) -> str:
    return f"{tp.topic}:{tp.partition}"


class Events:
    """JSON lines, one ``write()`` each, appended from any thread."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def emit(self, event: dict[str, Any]) -> None:
        line = (json.dumps(event, sort_keys=True) + "\n").encode()
        with self._lock:
            written = os.write(self._fd, line)
        if written != len(line):  # a regular file takes the whole line
            raise OSError(f"short write of an event: {written} of {len(line)} bytes")

    def close(self) -> None:
        os.close(self._fd)


def slow_commits(log: Log, delay_seconds: float) -> Log:
    """``log``, with each commit's writes (step 2) applied ``delay_seconds`` late.

    Under exactly-once that is every transaction's commit; under
    at-least-once, the plain appends to changelog topics, which only commits
    make (outputs are appended as produced, and stay fast), and the input
    offsets' commit. The handle's own methods are wrapped, so this works on
    every adapter.
    """
    if delay_seconds <= 0:
        return log
    open_producer, open_producers, produce, commit_offsets = (
        log.transactional_producer,
        log.transactional_producers,
        log.produce,
        log.commit_offsets,
    )

    def transactional_producer(transactional_id: str) -> TransactionalProducer:
        return delayed(open_producer(transactional_id))

    def transactional_producers(transactional_ids: Sequence[str]) -> StartedProducers:
        # A thread's new tasks start their producers together (Kafka's override does not
        # go through transactional_producer): each one taken is delayed the same way.
        started = open_producers(transactional_ids)
        taken: dict[str, TransactionalProducer | Exception] = {}
        for transactional_id in transactional_ids:
            try:
                taken[transactional_id] = delayed(started.take(transactional_id))
            except Exception as exc:  # raised again by take(), for this id alone
                taken[transactional_id] = exc
        return StartedProducers(taken)

    def delayed(producer: TransactionalProducer) -> TransactionalProducer:
        # producer.commit is what Log.commit_transactions calls too (in worker threads
        # under commit.mode=concurrent, so the delays overlap as the round trips do).
        commit = producer.commit

        def delayed_commit() -> CommittedTransaction:
            time.sleep(delay_seconds)
            return commit()

        producer.commit = delayed_commit  # type: ignore[method-assign]
        return producer

    def delayed_produce(tp: TopicPartition, records: Sequence[Record]) -> list[int]:
        if tp.topic.endswith("-changelog"):
            time.sleep(delay_seconds)
        return produce(tp, records)

    def delayed_commit_offsets(group: str, offsets: Mapping[TopicPartition, int]) -> None:
        time.sleep(delay_seconds)
        commit_offsets(group, offsets)

    log.transactional_producer = transactional_producer  # type: ignore[method-assign]
    log.transactional_producers = transactional_producers  # type: ignore[method-assign]
    log.produce = delayed_produce  # type: ignore[method-assign]
    log.commit_offsets = delayed_commit_offsets  # type: ignore[method-assign]
    return log


def open_worker_log(where: str, topic_prefix: str) -> Log:
    if where.startswith("kafka://"):
        from eddyline_runtime.log.kafka import KafkaLog

        return KafkaLog.open(where, {}, topic_prefix=topic_prefix)
    return SqliteLog(Path(where))


def delay_store_commits(seconds: float, events: Events) -> None:
    """Sleep before every store commit, saying so first; the commit itself is untouched."""
    commit = RocksDBStore.commit

    def delayed_commit(self: RocksDBStore, changelog_offsets: Any) -> None:
        events.emit({"event": "store_commit", "store": str(self.directory)})
        time.sleep(seconds)
        commit(self, changelog_offsets)

    RocksDBStore.commit = delayed_commit  # type: ignore[method-assign]


def finished(instance: StreamsInstance, until: str) -> bool:
    """Whether the run is over: never in the ``killed`` mode. Either way a failed
    stream thread raises here (``check``), and the state moves on to RUNNING."""
    if until == "killed":
        instance.check()
        return False
    return instance.caught_up()


def main() -> None:
    where, state_dir, events_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    guarantee, commit_interval_ms, threads = sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
    log_commit_delay_ms, store_commit_delay_ms = int(sys.argv[7]), int(sys.argv[8])
    until = sys.argv[9]
    if until not in UNTIL:
        raise SystemExit(f"UNTIL must be one of {', '.join(UNTIL)}, not {until!r}")
    topic_prefix = sys.argv[10] if len(sys.argv) > 10 else ""
    events = Events(events_path)
    if store_commit_delay_ms:
        delay_store_commits(store_commit_delay_ms / 1000, events)

    def committed(report: CommitReport) -> None:
        events.emit(
            {
                "event": "commit",
                "thread": report.thread,
                "reason": report.reason,
                "records": report.records,
                "input_offsets": {tp_key(tp): o for tp, o in report.input_offsets.items()},
                "changelog_records": {tp_key(tp): n for tp, n in report.changelog_records.items()},
                "changelog_last_offsets": {
                    tp_key(tp): o for tp, o in report.changelog_last_offsets.items()
                },
                "output_records": report.output_records,
            }
        )

    def restored(report: RestoreReport) -> None:
        result = report.result
        events.emit(
            {
                "event": "restore",
                "task": str(report.task),
                "store": result.store,
                "changelog": tp_key(result.changelog),
                "first_offset": result.first_offset,
                "end_offset": result.end_offset,
                "records": result.records,
            }
        )

    config = StreamsConfig.from_properties(
        {
            "application.id": APPLICATION_ID,
            "state.dir": str(state_dir),
            "processing.guarantee": guarantee,
            "commit.interval.ms": commit_interval_ms,
            "num.stream.threads": threads,
        }
    )
    log = slow_commits(open_worker_log(where, topic_prefix), log_commit_delay_ms / 1000)
    instance = StreamsInstance(
        wordcount.topology().build(),
        config,
        log,
        on_commit=[committed],
        on_restore=[restored],
    )
    started = time.monotonic()
    instance.start()
    running = False
    try:
        while not finished(instance, until):
            if not running and instance.state is InstanceState.RUNNING:
                running = True
                restore_total = {
                    f"{dict(name.tags)['task-id']}/{dict(name.tags)['store']}": value
                    for name, value in instance.metrics.snapshot().items()
                    if name.group == "stream-state-metrics" and name.name == "restore-total"
                }
                events.emit({"event": "running", "restore_total": restore_total})
            if time.monotonic() - started > MAX_SECONDS:
                raise TimeoutError(
                    f"not {'killed' if until == 'killed' else 'caught up'} after "
                    f"{MAX_SECONDS} s: {instance.input_lags()}"
                )
            time.sleep(0.01)
    finally:
        instance.close()
        log.close()
    events.emit({"event": "closed", "processed": instance.processed})
    events.close()


if __name__ == "__main__":
    main()
