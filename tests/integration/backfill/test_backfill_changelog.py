"""The backfilled stores' changelogs: a restore from the changelog alone, a standby or a
relocation finds exactly the backfilled state (docs/backfill.md, "The changelog").

On the embedded log and on the project's Kafka broker: backfill, ingest the builds as a
pod does (nothing replayed: the manifest names the changelog's last offset), wipe the
store, restore it from its changelog only: the same bytes as the replay's store. A
re-run writes nothing more; a changelog that holds another state is refused; a writer
SIGKILLed mid-transaction leaves nothing a read_committed reader sees, and the re-run
writes the contents exactly once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eddyline_runtime.backfill import ChangelogWriteError, write_store_changelog
from eddyline_runtime.backfill.changelog_writer import SEND_RECORDS
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.log import Log
from eddyline_runtime.log.port import Record
from eddyline_runtime.log.sqlite_log import SqliteLog
from eddyline_runtime.partitions import TaskId, TopicPartition, changelog_topic
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.restore.replay.restoration import restore
from eddyline_runtime.state import RocksDBStore
from tests.support import backfill_kill
from tests.support.backfill import (
    backfill_in_process,
    backfill_plan,
    committed_changelog,
    rebuilt,
    reference_replay,
    store_contents,
    write_history,
)
from tests.support.kafka.watermarks import high_watermarks
from tests.support.topologies.backfill_topologies import INPUT, keyed_count, windowed_count
from tests.support.waiting import wait_for

PARTITIONS = 3
RECORDS = 3_000


@pytest.mark.parametrize(
    ("build", "store"), [(keyed_count, "counts"), (windowed_count, "window-counts")]
)
def test_a_store_restored_from_the_backfilled_changelog_equals_the_backfilled_store(
    tmp_path: Path, log: Log, build: object, store: str
) -> None:
    topology: Topology = build()  # type: ignore[operator]
    application = f"backfill-{uuid.uuid4().hex[:8]}"
    write_history(log, INPUT, PARTITIONS, RECORDS)
    config, ends = reference_replay(topology, application, log, tmp_path / "replay")
    builds = tmp_path / "builds"
    built = backfill_in_process(
        topology, config, log, backfill_plan(application, store, log, builds, ends), tmp_path / "w"
    )
    for task in built:
        partition = task.task.partition
        expected = store_contents(config, tmp_path / "replay", TaskId(0, partition), store)
        assert expected, "the replay built an empty store: the test proves nothing"
        changelog = TopicPartition(changelog_topic(application, store), partition)
        records = committed_changelog(log, changelog)
        # Exactly the final contents, once each, in key order: no history, no duplicates.
        assert [(key, value) for _, key, value in records] == expected
        assert task.manifests[store].offset == records[-1][0]

        # The pod ingests the build: the manifest's offset is the changelog's last, so
        # nothing is replayed after it.
        directory = tmp_path / f"pod-{partition}" / store
        result, got = rebuilt(
            log, application, store, partition, directory=directory, builds=builds
        )
        assert result.ingested is not None and not result.refusals
        assert result.replayed.records == 0
        assert got == expected

        # The pod loses its disk (or a standby, or a relocation, starts empty) and no
        # build is at hand: the changelog alone gives back the backfilled state.
        shutil.rmtree(directory)
        result, got = rebuilt(
            log, application, store, partition, directory=directory, builds=tmp_path / "none"
        )
        assert result.ingested is None
        assert result.replayed.records == len(expected)
        assert got == expected

    # The job run again (Spark's retry, or the operator's re-run after a kill): the
    # changelogs already hold the contents, nothing more is written, the offsets hold.
    again = backfill_in_process(
        topology,
        config,
        log,
        backfill_plan(application, store, log, builds, ends, build_id="b2"),
        tmp_path / "w",
    )
    for first, second in zip(built, again, strict=True):
        assert second.manifests[store].offset == first.manifests[store].offset
        changelog = TopicPartition(changelog_topic(application, store), first.task.partition)
        assert len(committed_changelog(log, changelog)) == first.keys[store]


def test_a_changelog_holding_another_state_is_refused(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    try:
        topic = changelog_topic("app", "counts")
        log.create_topic(topic, 1, compacted=True)
        tp = TopicPartition(topic, 0)
        log.produce(tp, [Record(b"key-000000", b"an older state", 0)])
        with pytest.raises(ChangelogWriteError, match=f'Delete the topic "{topic}"'):
            write_store_changelog(
                log, tp, backfill_kill.contents, transactional_id="app-backfill-counts-0"
            )
        assert len(committed_changelog(log, tp)) == 1
    finally:
        log.close()


def test_a_writer_killed_mid_transaction_leaves_nothing_and_the_rerun_writes_once(
    tmp_path: Path, log: Log
) -> None:
    topic = "kill-test-store-changelog"
    log.create_topic(topic, 1, compacted=True)
    tp = TopicPartition(topic, 0)
    ready = tmp_path / "ready"
    prefix = getattr(log, "topic_prefix", "")
    root = str(Path(__file__).resolve().parents[3])
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.support.backfill_kill", log.url, prefix, topic, str(ready)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
        start_new_session=True,
    )
    try:
        wait_for(lambda: ready.exists() or writer.poll() is not None, "the writer mid-write", 120)
        assert writer.poll() is None, "the writer ended before it was killed"
        if prefix:
            # Kafka: the open transaction's first send is on the broker before the kill.
            wait_for(
                lambda: _high_watermark(log, tp) >= SEND_RECORDS,
                "the open transaction's records on the broker",
            )
    finally:
        os.killpg(writer.pid, signal.SIGKILL)
        writer.wait()
    assert writer.returncode == -signal.SIGKILL
    assert committed_changelog(log, tp) == []  # read_committed sees nothing of it

    # The re-run fences the killed writer (its open transaction is aborted), finds the
    # changelog empty to read_committed, and writes the contents in one transaction.
    expected = list(backfill_kill.contents())
    written = write_store_changelog(
        log, tp, backfill_kill.contents, transactional_id=backfill_kill.TRANSACTIONAL_ID
    )
    assert written.written == len(expected)
    records = committed_changelog(log, tp)
    assert [(key, value) for _, key, value in records] == expected
    assert written.last_offset == records[-1][0]
    # And once more: already there, nothing written.
    again = write_store_changelog(
        log, tp, backfill_kill.contents, transactional_id=backfill_kill.TRANSACTIONAL_ID
    )
    assert (again.written, again.last_offset) == (0, written.last_offset)
    assert len(committed_changelog(log, tp)) == len(expected)
    with RocksDBStore("restored", tmp_path / "restored") as store:
        restore(store, log, tp)
        assert list(store.scan(KeyRange())) == expected


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
    reason="PySpark needs a Java runtime",
)
def test_the_spark_job_killed_while_writing_changelogs_and_run_again_writes_each_once(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """``eddyline backfill build`` (PySpark, local[2]) SIGKILLed, driver, JVM and all, once
    its first changelog records are on the broker; run again with the same end offsets:
    every changelog partition holds the store's contents once, as read_committed sees
    it, whatever each task's write had reached (open: aborted by the re-run's producer;
    committed: kept, and not written again)."""
    suffix = uuid.uuid4().hex[:8]
    # A key per record, 50,000 per task: the writes last long enough to be caught.
    topic, application, keys = f"kill-events-{suffix}", f"kill-{suffix}", 100_000
    log = backfill_kill.open_test_log(f"kafka://{kafka_bootstrap}", "")
    try:
        log.create_topic(topic, 2)
        for partition in range(2):
            batch = [
                Record(f"k-{index:06d}".encode(), b"v", index)
                for index in range(partition, keys, 2)
            ]
            for start in range(0, len(batch), 5_000):
                log.produce(TopicPartition(topic, partition), batch[start : start + 5_000])
        ends = [f"{topic}:{p}={log.end_offset(TopicPartition(topic, p))}" for p in range(2)]
        root = str(Path(__file__).resolve().parents[3])
        env = {**os.environ, "PYTHONPATH": root, "EDDYLINE_TEST_BACKFILL_INPUT": topic}
        args = [sys.executable, "-m", "eddyline_runtime.cli", "backfill", "build"]
        args += ["--topology", "tests.support.topologies.backfill_topologies:keyed_count_of_env"]
        args += ["--application", application, "--store", "counts", "--log-url", log.url]
        args += ["--output", str(tmp_path / "builds"), "--master", "local[2]"]
        for end in ends:
            args += ["--end-offset", end]
        changelogs = [TopicPartition(changelog_topic(application, "counts"), p) for p in range(2)]
        with _watermark_probe(log) as probe, open(tmp_path / "killed.log", "wb") as output:
            job = subprocess.Popen(
                args, cwd=root, env=env, stdout=output, stderr=output, start_new_session=True
            )
            try:
                wait_for(
                    lambda: (
                        job.poll() is not None
                        or (
                            changelogs[0].topic in log.topics()
                            and any(probe(tp) > 0 for tp in changelogs)
                        )
                    ),
                    "the job's first changelog records",
                    300,
                )
                assert job.poll() is None, (
                    "the job ended before its changelog writes were seen (polling too slow "
                    f"for them?): {(tmp_path / 'killed.log').read_text()[-3000:]}"
                )
            finally:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        rerun = subprocess.run(
            args, cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        for tp in changelogs:
            records = committed_changelog(log, tp)
            written = [key for _, key, _ in records]
            assert len(written) == len(set(written)) == keys // 2, f"{tp}: duplicates or gaps"
            assert all(key.startswith(b"k-") for key in written)
    finally:
        log.close()


def _high_watermark(log: Log, tp: TopicPartition) -> int:
    """The end of ``tp`` including records of open transactions (read_uncommitted)."""
    with _watermark_probe(log) as probe:
        return probe(tp)


@contextlib.contextmanager
def _watermark_probe(log: Log) -> Iterator[Callable[[TopicPartition], int]]:
    """The log's partitions' high watermarks (read_uncommitted), on one consumer."""
    prefix = getattr(log, "topic_prefix", "")
    with high_watermarks(log.url.removeprefix("kafka://")) as high:
        yield lambda tp: high(prefix + tp.topic, tp.partition)
