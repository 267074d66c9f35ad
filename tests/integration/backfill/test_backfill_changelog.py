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


def _built(label: str, keys: int) -> Callable[[], Iterator[tuple[bytes, bytes]]]:
    """A store partition's contents (key order): ``keys`` keys, values naming ``label``."""

    def contents() -> Iterator[tuple[bytes, bytes]]:
        for index in range(keys):
            yield f"key-{index:06d}".encode(), f"{label}-{index}".encode()

    return contents


def _restored(log: Log, tp: TopicPartition, directory: Path) -> list[tuple[bytes, bytes]]:
    """What a store restored from ``tp`` alone holds: a standby's, or a wiped pod's."""
    with RocksDBStore("restored", directory) as store:
        restore(store, log, tp)
        return list(store.scan(KeyRange()))


def _last_offset(log: Log, tp: TopicPartition) -> int:
    """The offset of ``tp``'s last committed record (on Kafka the end is past a marker)."""
    position, last = log.beginning_offset(tp), -1
    while columns := log.fetch_columns(tp, position, 10_000).offsets:
        last = columns[-1]
        position = last + 1
    return last


def test_a_revisions_state_in_the_changelog_is_refused_unless_superseded(
    tmp_path: Path, log: Log
) -> None:
    """A rolled-back revision processed into the store's changelog (records without the
    backfill's mark, a delete among them): refused by default, naming the way out; with
    supersede replaced in one transaction, and a restore finds exactly the contents."""
    topic = changelog_topic("app", "counts")
    log.create_topic(topic, 1, compacted=True)
    tp = TopicPartition(topic, 0)
    log.produce(
        tp,
        [
            Record(b"key-000000", b"live", 0),
            Record(b"key-999999", b"live", 0),
            Record(b"key-000000", None, 0),
            Record(b"key-000001", b"live", 0),
        ],
    )
    contents = _built("built", 3)
    with pytest.raises(ChangelogWriteError, match=rf'--supersede.*delete the topic "{topic}"'):
        write_store_changelog(
            log, tp, contents, transactional_id="app-backfill-counts-0", build_id="b1"
        )
    assert log.end_offset(tp) - log.beginning_offset(tp) == 4  # untouched

    written = write_store_changelog(
        log, tp, contents, transactional_id="app-backfill-counts-0", build_id="b1", supersede=True
    )
    # A tombstone for every key the revision wrote (its view cannot be read as it streams
    # past a delete it made), then the contents.
    assert written.written == 3 + 3
    assert written.last_offset == _last_offset(log, tp)
    assert _restored(log, tp, tmp_path / "restored") == list(contents())

    # Run again (a Spark retry): the view is now the backfill's, nothing is written.
    again = write_store_changelog(
        log, tp, contents, transactional_id="app-backfill-counts-0", build_id="b2", supersede=True
    )
    assert (again.written, again.last_offset) == (0, written.last_offset)


def test_a_new_attempt_under_other_end_offsets_supersedes_the_earlier_attempts_state(
    tmp_path: Path, log: Log
) -> None:
    """The retry under the same store name: an attempt committed its state, the upgrade
    rolled back, the old revision processed more, and the next attempt builds another
    state (fewer keys, other values). Without supersede it is refused; with it the
    changelog's view becomes the new state exactly (the old keys it lacks deleted), a
    re-run writes nothing, and the earlier state can no longer be taken for it."""
    topic = changelog_topic("app", "counts")
    log.create_topic(topic, 1, compacted=True)
    tp = TopicPartition(topic, 0)
    first, second = _built("first", 50), _built("second", 30)
    transactional_id = "app-backfill-counts-0"
    earlier = write_store_changelog(
        log, tp, first, transactional_id=transactional_id, build_id="b1"
    )
    assert earlier.written == 50

    with pytest.raises(ChangelogWriteError, match="holds another state"):
        write_store_changelog(log, tp, second, transactional_id=transactional_id, build_id="b2")
    written = write_store_changelog(
        log, tp, second, transactional_id=transactional_id, build_id="b2", supersede=True
    )
    # The earlier attempt's view is read from its write alone: 50 tombstones, 30 records.
    assert written.written == 50 + 30
    assert _restored(log, tp, tmp_path / "after-second") == list(second())

    # The same attempt again, with or without supersede: the view is its state.
    for supersede in (False, True):
        again = write_store_changelog(
            log, tp, second, transactional_id=transactional_id, build_id="b3", supersede=supersede
        )
        assert (again.written, again.last_offset) == (0, written.last_offset)
    # Back to the first state: another state now, superseded only on request.
    with pytest.raises(ChangelogWriteError, match="holds another state"):
        write_store_changelog(log, tp, first, transactional_id=transactional_id, build_id="b4")
    third = write_store_changelog(
        log, tp, first, transactional_id=transactional_id, build_id="b4", supersede=True
    )
    # Only the view's keys are deleted (30), not every key the changelog ever held.
    assert third.written == 30 + 50
    assert _restored(log, tp, tmp_path / "after-third") == list(first())


@pytest.mark.parametrize("earlier", [False, True], ids=["empty", "superseding"])
def test_a_writer_killed_mid_transaction_leaves_nothing_and_the_rerun_writes_once(
    tmp_path: Path, log: Log, earlier: bool
) -> None:
    """Killed mid-transaction, into an empty changelog or superseding an earlier
    attempt's state: what read_committed sees is what was there before, whole."""
    topic = "kill-test-store-changelog"
    log.create_topic(topic, 1, compacted=True)
    tp = TopicPartition(topic, 0)
    before = _built("earlier", 100) if earlier else _built("none", 0)
    write_store_changelog(
        log, tp, before, transactional_id=backfill_kill.TRANSACTIONAL_ID, build_id="b0"
    )
    ready = tmp_path / "ready"
    prefix = getattr(log, "topic_prefix", "")
    root = str(Path(__file__).resolve().parents[3])
    writer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.backfill_kill",
            log.url,
            prefix,
            topic,
            str(ready),
            *(["--supersede"] if earlier else []),
        ],
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
        start_new_session=True,
    )
    high_before = _high_watermark(log, tp) if prefix else 0
    try:
        wait_for(lambda: ready.exists() or writer.poll() is not None, "the writer mid-write", 120)
        assert writer.poll() is None, "the writer ended before it was killed"
        if prefix:
            # Kafka: the open transaction's first send is on the broker before the kill.
            wait_for(
                lambda: _high_watermark(log, tp) >= high_before + SEND_RECORDS,
                "the open transaction's records on the broker",
            )
    finally:
        os.killpg(writer.pid, signal.SIGKILL)
        writer.wait()
    assert writer.returncode == -signal.SIGKILL
    # read_committed sees nothing of it: the earlier state whole, or nothing.
    assert len(committed_changelog(log, tp)) == len(list(before()))
    assert _restored(log, tp, tmp_path / "after-kill") == list(before())

    # The re-run fences the killed writer (its open transaction is aborted), finds what
    # was committed before it, and writes the contents in one transaction (after the
    # earlier state's tombstones when superseding).
    expected = list(backfill_kill.contents())
    written = write_store_changelog(
        log,
        tp,
        backfill_kill.contents,
        transactional_id=backfill_kill.TRANSACTIONAL_ID,
        build_id="b1",
        supersede=earlier,
    )
    assert written.written == len(expected) + len(list(before()))
    assert written.last_offset == _last_offset(log, tp)
    # And once more: already there, nothing written.
    again = write_store_changelog(
        log,
        tp,
        backfill_kill.contents,
        transactional_id=backfill_kill.TRANSACTIONAL_ID,
        build_id="b2",
    )
    assert (again.written, again.last_offset) == (0, written.last_offset)
    assert _restored(log, tp, tmp_path / "restored") == expected


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
