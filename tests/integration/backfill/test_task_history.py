"""A backfill's stores equal, byte for byte, those a replay through the engine builds.

The history (thousands of records over several partitions, timestamps partly out of
order) is replayed by an ordinary StreamsInstance to its end (as another application,
so the backfilled app's changelogs stay empty, as a new store's are); the backfill then
runs each task partition's history, up to the offsets the instance committed,
through the engine's task code, and writes SSTs and manifests. The manifests'
files, ingested as a pod's restore ingests them, hold exactly the bytes of the
instance's stores.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from eddyline_runtime.backfill import (
    BackfillPlan,
    backfill_layout,
    ensure_changelogs,
    run_task_history,
    task_history,
    write_manifests,
)
from eddyline_runtime.backfill.spark_job import config_of, fix_plan
from eddyline_runtime.backfill.task_history import (
    HistoryProgress,
    TaskBackfill,
    manifest_directory,
    partition_key,
    read_progress,
    task_progress_writer,
)
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.topics import TopicLayout
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.log import Log
from eddyline_runtime.log.port import Record
from eddyline_runtime.log.sqlite_log import SqliteLog
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.restore.manifest import manifest_name, read_manifest
from eddyline_runtime.state import RocksDBStore, RocksDBStoreOptions
from eddyline_runtime.state.sst_files import build_store_from_sst_files
from tests.support.backfill import (
    backfill_in_process,
    backfill_plan,
    reference_replay,
    store_contents,
    write_history,
)
from tests.support.topologies.backfill_topologies import INPUT, keyed_count, windowed_count

PARTITIONS = 3
RECORDS = 3_000


def ingested_build(
    plan: BackfillPlan, built: TaskBackfill, store: str, config: StreamsConfig, target: Path
) -> list[tuple[bytes, bytes]]:
    """The task's manifests written as the driver writes them, then ingested."""
    paths = write_manifests(plan, built.manifests.values())
    return ingested(paths[f"{store}/{built.task.partition}"], config, target)


def ingested(manifest_path: str, config: StreamsConfig, target: Path) -> list[tuple[bytes, bytes]]:
    """What a pod's restore ingest makes of a manifest: the store's bytes."""
    manifest = read_manifest(Path(manifest_path))
    directory = Path(manifest_path).parent
    build_store_from_sst_files(
        manifest.store,
        target,
        [(directory / f.name, f.sha256, f.keys) for f in manifest.files],
        {},
    )
    store = RocksDBStore(manifest.store, target, RocksDBStoreOptions.from_config(config))
    try:
        return list(store.scan(KeyRange()))
    finally:
        store.close()


@contextmanager
def keyed_count_history(
    tmp_path: Path, application: str, *, partitions: int, records: int
) -> Iterator[tuple[StreamsConfig, SqliteLog, dict[TopicPartition, int], TopicLayout]]:
    """An embedded log with ``records`` of history over ``partitions``, the changelogs a
    backfill of :func:`keyed_count`'s store writes, its layout and the app's config."""
    config = StreamsConfig.from_properties(
        {"application.id": application, "state.dir": str(tmp_path / "s")}, environ={}
    )
    log = SqliteLog(tmp_path / "log.db")
    try:
        ends = write_history(log, INPUT, partitions, records)
        layout = backfill_layout(keyed_count(), application, {INPUT: partitions})
        ensure_changelogs(log, layout, ["counts"])
        yield config, log, ends, layout
    finally:
        log.close()


@pytest.mark.parametrize(
    ("build", "store"), [(keyed_count, "counts"), (windowed_count, "window-counts")]
)
def test_backfilled_stores_equal_a_replay_byte_for_byte(
    tmp_path: Path, log: Log, build: object, store: str
) -> None:
    """On the embedded log, and on Kafka up to the positions an exactly-once replay
    committed (the history read read_committed)."""
    topology: Topology = build()  # type: ignore[operator]
    application = f"backfill-{uuid.uuid4().hex[:8]}"
    ends = write_history(log, INPUT, PARTITIONS, RECORDS)
    config, committed = reference_replay(
        topology,
        application,
        log,
        tmp_path / "replay-state",
        {"processing.guarantee": "exactly_once_v2", "commit.interval.ms": 100},
    )
    assert committed == ends  # the batch ends where the app's stream continues
    plan = backfill_plan(application, store, log, tmp_path / "builds", committed)
    built = backfill_in_process(topology, config, log, plan, tmp_path / "work")
    for task in built:
        expected = store_contents(config, tmp_path / "replay-state", task.task, store)
        assert expected, "the replay built an empty store: the test proves nothing"
        path = manifest_directory(plan, store) / manifest_name(task.task.partition)
        got = ingested(str(path), config, tmp_path / f"ingested-{task.task}")
        assert got == expected, f"task {task.task}: backfilled {store} differs from the replay"
        assert task.keys[store] == len(expected)
    assert sum(task.records for task in built) == RECORDS


def test_a_backfill_ending_earlier_holds_only_the_history_before_its_end(
    tmp_path: Path,
) -> None:
    """End offsets bound the history: records at or after them are not in the state."""
    topology = keyed_count()
    application = "backfill-end"
    with keyed_count_history(tmp_path, application, partitions=1, records=500) as (
        config,
        log,
        ends,
        layout,
    ):
        (tp,) = ends
        plan = BackfillPlan(
            application=application,
            topology="tests.support.topologies.backfill_topologies:keyed_count",
            stores=("counts",),
            log_url=log.url,
            output=str(tmp_path / "builds"),
            build_id="b1",
            end_offsets={partition_key(tp): 100},
        )
        built = run_task_history(
            topology,
            config,
            layout=layout,
            task_id=TaskId(0, 0),
            log=log,
            plan=plan,
            work_dir=tmp_path / "w",
        )
        assert built.records == 100
        # A failed attempt's file, which no manifest names: the driver's write removes it.
        stray = (
            Path(plan.output) / application / "counts" / "b1" / "p00000-s00000-a00000009-000.sst"
        )
        stray.write_bytes(b"a killed attempt's half-written file")
        contents = ingested_build(plan, built, "counts", config, tmp_path / "ingested")
        assert not stray.exists()
        total = sum(int.from_bytes(value[-8:], "big") for _, value in contents)
        assert total == 100


def test_a_backfill_from_a_timestamp_holds_the_history_from_the_first_record_at_or_after_it(
    tmp_path: Path,
) -> None:
    """``from: Timestamp``: the driver fixes each partition's start at its first record at
    or after the time (late records after it included, as Kafka's offsetsForTimes
    finds it); a time past a partition's end leaves that partition no history."""
    topology = keyed_count()
    application = "backfill-from"
    with keyed_count_history(tmp_path, application, partitions=2, records=1_000) as (
        config,
        log,
        ends,
        layout,
    ):
        first, second = sorted(ends)
        history = {tp: log.fetch(tp, 0).records for tp in ends}
        # A time inside the first partition's history (7 ms a record; the partitions
        # hold about 500 each), and past the second partition's end offset given.
        since = history[first][200].timestamp
        plan = fix_plan(
            topology,
            application=application,
            reference="tests.support.topologies.backfill_topologies:keyed_count",
            stores=["counts"],
            log_url=log.url,
            output=tmp_path / "builds",
            build_id="b1",
            end_offsets={first: ends[first], second: 100},
            from_timestamp_ms=since,
        )
        start = next(r.offset for r in history[first] if r.timestamp >= since)
        assert plan.start_offsets == {partition_key(first): start, partition_key(second): 100}
        assert start > 0 and any(r.timestamp < since for r in history[first][start:])
        counted = []
        for task in layout.tasks():
            built = run_task_history(
                topology,
                config,
                layout=layout,
                task_id=task,
                log=log,
                plan=plan,
                work_dir=tmp_path / f"w{task.partition}",
            )
            contents = ingested_build(plan, built, "counts", config, tmp_path / f"i{task}")
            counted.append(sum(int.from_bytes(value[-8:], "big") for _, value in contents))
            assert built.records == counted[-1]
        assert counted == [ends[first] - start, 0]


def test_aborted_records_in_the_history_are_not_in_the_backfilled_state(
    tmp_path: Path,
) -> None:
    """The history is read read_committed: an aborted transaction's records, between
    committed ones, count neither in the replay nor in the backfill."""
    topology = keyed_count()
    application = "backfill-aborted"
    state_dir = tmp_path / "replay-state"
    log = SqliteLog(tmp_path / "log.db")
    try:
        write_history(log, INPUT, 1, 300)
        (tp,) = [TopicPartition(INPUT, 0)]
        producer = log.transactional_producer("history-writer")
        producer.begin()
        producer.send_batch(tp, [Record(b"user-1", b"aborted", 10_000)] * 50)
        producer.abort()
        write_history(log, INPUT, 1, 200, seed=36, create=False)
        end = log.end_offset(tp)
        config, committed = reference_replay(topology, application, log, state_dir)
        assert committed == {tp: end}
        plan = backfill_plan(application, "counts", log, tmp_path / "builds", committed)
        (built,) = backfill_in_process(topology, config, log, plan, tmp_path / "w")
        assert built.records == 500
        expected = store_contents(config, state_dir, TaskId(0, 0), "counts")
        path = manifest_directory(plan, "counts") / manifest_name(0)
        got = ingested(str(path), config, tmp_path / "ingested")
        assert got == expected
    finally:
        log.close()


def test_a_task_reports_how_far_its_history_has_got_and_its_file_keeps_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a running job shows (records read of the history): each report of a task
    partition counts its input read, never goes back, and ends with all of it; the file
    the task writes for its driver holds the last report."""
    monkeypatch.setattr(task_history, "PROGRESS_SECONDS", 0.0)  # every turn of the loop
    topology = keyed_count()
    application = f"backfill-{uuid.uuid4().hex[:8]}"
    log = SqliteLog(tmp_path / "log.db")
    try:
        ends = write_history(log, INPUT, 1, 25_000)  # more than two fetches' worth
        plan = backfill_plan(application, "counts", log, tmp_path / "builds", ends)
        layout = backfill_layout(topology, application, {INPUT: 1})
        ensure_changelogs(log, layout, plan.stores)
        reports: list[HistoryProgress] = []
        write = task_progress_writer(plan, 0)

        def heard(progress: HistoryProgress) -> None:
            reports.append(progress)
            write(progress)

        built = run_task_history(
            topology,
            config_of(plan),
            layout=layout,
            task_id=TaskId(0, 0),
            log=log,
            plan=plan,
            work_dir=tmp_path / "work",
            on_progress=heard,
        )
    finally:
        log.close()
    reads = [report.read for report in reports]
    assert {report.total for report in reports} == {25_000}
    assert reads[0] == 0 and reads[-1] == 25_000 == built.records
    assert reads == sorted(reads) and len(set(reads)) >= 4, reads
    assert read_progress(plan) == {0: HistoryProgress(25_000, 25_000)}
