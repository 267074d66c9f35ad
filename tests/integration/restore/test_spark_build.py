"""Spark restore builds in local mode: SST-rebuilt stores equal replayed ones, byte for byte.

One Spark session for the module (a JVM starts in 10-25 s here). It runs
``local[2,2]``: two task threads, and a failed task is retried once, which
the killed-attempt test relies on. Faults are injected into the Python
workers by a sink that replaces ``eddyline_sst`` (``faulty_sst_sink.py``,
shipped with ``addPyFile``); the driver killed mid-build runs in its own
process, whose workers load ``faults/sitecustomize.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from eddyline_runtime.log import Log, Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.build_progress import (
    READING,
    STARTING,
    WRITING,
    BuildProgress,
)
from eddyline_runtime.restore.ingest.sst_restore import ingest_latest_manifest
from eddyline_runtime.restore.manifest import MANIFEST_SUFFIX, manifests_for, read_manifest
from eddyline_runtime.restore.replay import restore
from eddyline_runtime.restore.spark.spark_build import build, spark_session
from eddyline_runtime.restore.spark.sst_sink import SstDataSource
from eddyline_runtime.state import RocksDBStore
from tests.integration.restore.restore_changelogs import (
    changelog_records,
    live_keys,
    produce_changelog,
    replay_store,
    store_contents,
)

pytestmark = pytest.mark.slow

APP, STORE = "app", "counts"
TOPIC = f"{APP}-{STORE}-changelog"
PARTITIONS = 3
PER_PARTITION = 4_000
FAULTS = Path(__file__).parent / "faults"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2,2]")
    session.sparkContext.addPyFile(str(Path(__file__).with_name("faulty_sst_sink.py")))
    yield session
    session.stop()


@pytest.fixture
def faulty_sink(spark: SparkSession) -> Iterator[None]:
    """Builds in this test go through the sink whose tasks can be made to die."""
    # By its bare name, as Spark's workers import it: addPyFile shipped the file and put
    # it on the driver's sys.path too, and its classes are pickled by that module name.
    from faulty_sst_sink import FaultySstDataSource

    spark.dataSource.register(FaultySstDataSource)
    yield
    spark.dataSource.register(SstDataSource)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    log = SqliteLog(tmp_path / "log.db")
    produce_changelog(log, TOPIC, PARTITIONS, PER_PARTITION, keys=600)
    yield log
    log.close()


def run_build(spark: SparkSession, log: Log, output: Path, **options: object):  # type: ignore[no-untyped-def]
    return build(
        spark,
        application=APP,
        store=STORE,
        changelog_topic=TOPIC,
        partitions=list(range(PARTITIONS)),
        output=output,
        log_url=log.url,
        split_records=1_500,  # several read tasks per partition
        **options,  # type: ignore[arg-type]
    )


def ingest_partition(log: Log, output: Path, directory: Path, partition: int):  # type: ignore[no-untyped-def]
    changelog = TopicPartition(TOPIC, partition)
    attempt = ingest_latest_manifest(
        output,
        application=APP,
        store=STORE,
        changelog=changelog,
        directory=directory,
        log_start=log.beginning_offset(changelog),
        log_end=log.end_offset(changelog),
        # Judged by epochs as the runtime judges it (engine/store_opener.py).
        changelog_epoch=log.partition_epoch(changelog),
        epoch_end_offset=partial(log.epoch_end_offset, changelog),
    )
    assert attempt.refusals == ()
    assert attempt.result is not None
    return attempt.result


def test_stores_rebuilt_from_sst_files_equal_replayed_stores_byte_for_byte(
    spark: SparkSession, log: SqliteLog, tmp_path: Path
) -> None:
    result = run_build(spark, log, tmp_path / "out")
    for partition in range(PARTITIONS):
        changelog = TopicPartition(TOPIC, partition)
        ingested = ingest_partition(log, tmp_path / "out", tmp_path / "sst" / STORE, partition)
        replay_store(STORE, tmp_path / "replay" / STORE, log, changelog)
        from_files = store_contents(STORE, tmp_path / "sst" / STORE, changelog)
        replayed = store_contents(STORE, tmp_path / "replay" / STORE, changelog)
        assert from_files == replayed
        assert from_files[1] == PER_PARTITION - 1 == ingested.offset  # the last record read
        expected = live_keys(changelog_records(partition, PER_PARTITION, 600))
        assert dict(from_files[0]) == expected
        manifest = read_manifest(result.manifests[partition])
        records = changelog_records(partition, PER_PARTITION, 600)
        keyed = sum(1 for r in records if r.key is not None)
        assert (manifest.keys, manifest.records_read) == (len(expected), keyed)
        for directory in ("sst", "replay"):
            for leftover in (tmp_path / directory).iterdir():
                _remove_tree(leftover)
    # Exactly the listed files and the manifests are in the build directory.
    listed = {f.name for m in result.read().values() for f in m.files}
    names = {p.name for p in result.directory.iterdir()}
    assert names == listed | {f"partition-{p}{MANIFEST_SUFFIX}" for p in range(PARTITIONS)}


def test_ingest_then_tail_replay_lands_on_the_state_of_a_full_replay(
    spark: SparkSession, log: SqliteLog, tmp_path: Path
) -> None:
    run_build(spark, log, tmp_path / "out")
    changelog = TopicPartition(TOPIC, 1)
    tail = changelog_records(99, 700, 600)  # new versions and deletes after the build
    log.produce(changelog, tail)
    ingested = ingest_partition(log, tmp_path / "out", tmp_path / "sst" / STORE, 1)
    with RocksDBStore(STORE, tmp_path / "sst" / STORE) as store:
        replayed_tail = restore(store, log, changelog)
    assert replayed_tail.first_offset == ingested.offset + 1 == PER_PARTITION
    assert replayed_tail.records == sum(1 for r in tail if r.key is not None)
    replay_store(STORE, tmp_path / "replay" / STORE, log, changelog)
    assert store_contents(STORE, tmp_path / "sst" / STORE, changelog) == store_contents(
        STORE, tmp_path / "replay" / STORE, changelog
    )


def test_a_compacted_changelog_with_offset_gaps_builds_the_same_store(
    spark: SparkSession, log: SqliteLog, tmp_path: Path
) -> None:
    assert log.compact(TOPIC) > 0
    run_build(spark, log, tmp_path / "out")
    changelog = TopicPartition(TOPIC, 2)
    ingest_partition(log, tmp_path / "out", tmp_path / "sst" / STORE, 2)
    replay_store(STORE, tmp_path / "replay" / STORE, log, changelog)
    assert store_contents(STORE, tmp_path / "sst" / STORE, changelog) == store_contents(
        STORE, tmp_path / "replay" / STORE, changelog
    )


@pytest.mark.usefixtures("faulty_sink")
def test_a_killed_task_attempt_leaves_no_file_a_manifest_could_pick_up(
    spark: SparkSession, log: SqliteLog, tmp_path: Path
) -> None:
    (tmp_path / "fault-mode").write_text("kill-first-attempt")
    result = run_build(spark, log, tmp_path / "out")
    (tmp_path / "fault-mode").unlink()
    killed_attempts = (tmp_path / "fault-mode.fired").read_text().split()
    assert len(killed_attempts) == 1  # one attempt was killed after writing its files
    killed = f"-a{int(killed_attempts[0]):08d}-"
    listed = {f.name for m in result.read().values() for f in m.files}
    on_disk = {p.name for p in result.directory.glob("*.sst*")}
    assert on_disk == listed  # the killed attempt's files are gone
    # The retried attempt's files made it under their own attempt id, and the store is right.
    retried = [name for name in listed if "-s00001-" in name]
    assert retried and all(killed not in name for name in retried)
    changelog = TopicPartition(TOPIC, 0)
    ingest_partition(log, tmp_path / "out", tmp_path / "sst" / STORE, 0)
    replay_store(STORE, tmp_path / "replay" / STORE, log, changelog)
    assert store_contents(STORE, tmp_path / "sst" / STORE, changelog) == store_contents(
        STORE, tmp_path / "replay" / STORE, changelog
    )


@pytest.mark.usefixtures("faulty_sink")
def test_a_failed_build_writes_no_manifest_and_leaves_no_files(
    spark: SparkSession, log: SqliteLog, tmp_path: Path
) -> None:
    (tmp_path / "fault-mode").write_text("kill-always")
    with pytest.raises(Exception, match=r"17|Python worker exited"):
        run_build(spark, log, tmp_path / "out")
    assert (tmp_path / "fault-mode.fired").exists()
    builds = list((tmp_path / "out" / APP / STORE).iterdir())
    assert len(builds) == 1
    assert list(builds[0].iterdir()) == []
    assert list(manifests_for(tmp_path / "out", APP, STORE, 0)) == []


def test_a_driver_killed_mid_build_leaves_no_manifest(log: SqliteLog, tmp_path: Path) -> None:
    """A second driver in its own process, SIGKILLed (with its JVM and workers) once
    its tasks have written SST files but before any manifest."""
    flag = tmp_path / "hang"
    flag.write_text("hang")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(FAULTS), str(Path(__file__).parent)]),
        "EDDYLINE_TEST_FAULTS": str(flag),
    }
    output = tmp_path / "out"
    driver = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parent / "spark_build_driver.py"),
            log.url,
            str(output),
        ],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Only a guard against a driver that hangs before its tasks write: a JVM, Spark and
        # its workers starting on a machine loaded 10x over its 2 cores took more than 120 s.
        deadline = time.monotonic() + 300
        while not list(output.glob(f"{APP}/{STORE}/*/*.sst")):
            assert driver.poll() is None, "the driver exited before writing any file"
            assert time.monotonic() < deadline, "no SST file within 300 s"
            time.sleep(0.05)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    assert list(output.glob(f"{APP}/{STORE}/*/*{MANIFEST_SUFFIX}")) == []
    assert list(manifests_for(output, APP, STORE, 0)) == []
    # A task finds nothing to ingest: it replays the changelog instead.
    attempt = ingest_latest_manifest(
        output,
        application=APP,
        store=STORE,
        changelog=TopicPartition(TOPIC, 0),
        directory=tmp_path / "sst" / STORE,
        log_start=0,
        log_end=PER_PARTITION,
    )
    assert (attempt.result, attempt.refusals) == (None, ())
    assert not (tmp_path / "sst").exists()


def test_new_records_during_a_build_are_left_to_the_tail(
    spark: SparkSession, log: SqliteLog, tmp_path: Path
) -> None:
    """The driver fixes each partition's end before the job: the manifest covers exactly it."""
    result = run_build(spark, log, tmp_path / "out")
    changelog = TopicPartition(TOPIC, 0)
    built_in = log.partition_epoch(changelog)
    # The task writing the changelog restarts: a new epoch begins at the end, and writes.
    log.start_epoch(changelog)
    log.produce(changelog, [Record(b"late", b"1", 1)])
    manifest = read_manifest(result.manifests[0])
    assert (manifest.offset, manifest.log_end) == (PER_PARTITION - 1, PER_PARTITION)
    # The manifest names the epoch that wrote its last offset, which is no longer the
    # changelog's: it still fits, and the store replays only the late record.
    assert manifest.changelog_epoch == built_in == log.epoch_at(changelog, PER_PARTITION - 1)
    assert manifest.changelog_epoch != log.partition_epoch(changelog)
    ingested = ingest_partition(log, tmp_path / "out", tmp_path / "sst" / STORE, 0)
    assert ingested.offset == PER_PARTITION - 1
    with RocksDBStore(STORE, tmp_path / "sst" / STORE) as store:
        replayed = restore(store, log, changelog)
        assert (replayed.first_offset, replayed.records) == (PER_PARTITION, 1)
        assert store.get(b"late") == b"1"


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


def test_a_build_reports_its_progress_from_start_to_its_finished_stages(
    spark: SparkSession, log: SqliteLog, tmp_path: Path
) -> None:
    reports: list[BuildProgress] = []
    lock = threading.Lock()

    def record(progress: BuildProgress) -> None:
        with lock:  # the watcher thread and, last, the build's own thread
            reports.append(progress)

    run_build(spark, log, tmp_path / "out", on_progress=record)
    offsets = sum(log.end_offset(TopicPartition(TOPIC, p)) for p in range(PARTITIONS))
    assert reports[0] == BuildProgress(STARTING, 0, offsets, "offsets")
    # However fast the build was, the last report is its finished stages: the read done.
    last = reports[-1]
    assert last.phase == WRITING
    assert last.unit == "tasks"
    assert last.total is None
    assert last.done >= 1  # at least the task that wrote the SST files
    # Phases only move forward, and a read never counts past the offsets it covers.
    order = [STARTING, READING, WRITING]
    phases = [order.index(r.phase) for r in reports]
    assert phases == sorted(phases)
    assert all(r.done <= offsets for r in reports if r.phase == READING)
    # The build's job group is gone: the session's next job belongs to no group.
    assert spark.sparkContext.getLocalProperty("spark.jobGroup.id") is None
