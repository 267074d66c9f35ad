"""Waiting for a restore Job's build, and the Job's own verdict on it (no Spark needed)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from eddyline_runtime.restore.ingest.build_wait import (
    BuildWatch,
    PendingRestore,
    WaitOutcome,
    WaitResult,
    should_wait,
    wait_for_build,
)
from eddyline_runtime.restore.job_result import JobResult, JobState, job_results, write_job_result
from eddyline_runtime.restore.spark.job_runner import judge_build, spark_submit_command
from eddyline_runtime.state import KeyRange, RocksDBStore
from eddyline_runtime.state.sst_files import store_exists
from tests.unit.restore.test_sst_restore import APP, CHANGELOG, ENTRIES, STORE, make_manifest

BUILD_ID = "20260101T000000Z-00000001"


def pending(seconds: float = 5.0, since: float | None = None) -> PendingRestore:
    now = time.time() if since is None else since
    return PendingRestore(STORE, CHANGELOG, 0, 150, now, now + seconds)


def wait(output: Path, target: Path, waiting: PendingRestore, stop: threading.Event) -> WaitResult:
    return wait_for_build(
        output,
        waiting,
        application=APP,
        directory=target,
        changelog_epoch=None,
        stopped=stop,
        bounds=lambda: (0, 150),
        poll_seconds=0.02,
    )


def failed(partitions: tuple[int, ...], finished_at: float | None = None) -> JobResult:
    extra = {} if finished_at is None else {"finished_at": finished_at}
    return JobResult(
        state=JobState.FAILED,
        application=APP,
        store=STORE,
        partitions=partitions,
        driver_exit_code=1,
        message="the Spark driver exited with status 1",
        **extra,  # type: ignore[arg-type]
    )


def test_a_store_waits_only_when_its_changelog_is_above_the_threshold() -> None:
    assert not should_wait(-1, 0, 10**9)  # Never
    assert should_wait(0, 5, 6) and not should_wait(0, 5, 5)  # Always: any record
    assert should_wait(100, 0, 101) and not should_wait(100, 0, 100)


def test_a_build_that_appears_while_waiting_is_ingested(tmp_path: Path) -> None:
    output, target = tmp_path / "out", tmp_path / "state" / "1_2" / STORE
    writer = threading.Timer(0.2, lambda: make_manifest(output, BUILD_ID))
    writer.start()
    result = wait(output, target, pending(), threading.Event())
    writer.join()
    assert result.outcome is WaitOutcome.INGESTED
    assert result.ingested is not None and result.ingested.offset == 99
    assert result.seconds >= 0.15
    with RocksDBStore(STORE, target) as store:
        assert store.committed_offset(CHANGELOG) == 99
        assert list(store.scan(KeyRange.closed(None, None))) == ENTRIES


def test_a_failed_job_for_the_partition_ends_the_wait_and_nothing_is_left(tmp_path: Path) -> None:
    output, target = tmp_path / "out", tmp_path / "state" / "1_2" / STORE
    write_job_result(output, "app-restore-1", failed((CHANGELOG.partition,)))
    result = wait(output, target, pending(since=time.time() - 1), threading.Event())
    assert result.outcome is WaitOutcome.JOB_FAILED
    assert "exited with status 1" in result.message
    assert not store_exists(target)


def test_an_old_failure_or_another_partitions_does_not_end_the_wait(tmp_path: Path) -> None:
    output, target = tmp_path / "out", tmp_path / "state" / "1_2" / STORE
    write_job_result(output, "app-restore-old", failed((CHANGELOG.partition,), time.time() - 60))
    write_job_result(output, "app-restore-other", failed((CHANGELOG.partition + 1,)))
    result = wait(output, target, pending(seconds=0.3, since=time.time() - 1), threading.Event())
    assert result.outcome is WaitOutcome.DEADLINE
    assert len(list(job_results(output, APP, STORE))) == 2


def test_a_refused_build_is_judged_once_and_the_wait_runs_to_its_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    output, target = tmp_path / "out", tmp_path / "state" / "1_2" / STORE
    make_manifest(output, BUILD_ID, application="another-app")
    with caplog.at_level(logging.WARNING):
        result = wait(output, target, pending(seconds=0.3), threading.Event())
    assert result.outcome is WaitOutcome.DEADLINE
    assert result.refusals and "another-app" in result.refusals[0]
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1
    assert not store_exists(target)


def test_stopping_the_instance_ends_the_wait(tmp_path: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    result = wait(tmp_path / "out", tmp_path / "target", pending(), stop)
    assert result.outcome is WaitOutcome.STOPPED


def judge(output: Path, *, before: set[str], code: int = 0) -> JobResult:
    return judge_build(
        output, application=APP, store=STORE, partitions=[2], before=before, driver_exit_code=code
    )


def test_the_job_succeeds_only_with_a_zero_exit_and_every_manifest_on_disk(
    tmp_path: Path,
) -> None:
    output = tmp_path / "out"
    assert judge(output, before=set()).state is JobState.FAILED  # exit 0, nothing written
    make_manifest(output, BUILD_ID)
    nonzero = judge(output, before=set(), code=1)
    assert nonzero.state is JobState.FAILED and "status 1" in nonzero.message
    good = judge(output, before=set())
    assert (good.state, good.build_id, good.offsets) == (JobState.SUCCEEDED, BUILD_ID, {2: 99})
    # A build from before the Job does not count as its result.
    assert judge(output, before={BUILD_ID}).state is JobState.FAILED
    missing = judge_build(
        output,
        application=APP,
        store=STORE,
        partitions=[2, 3],
        before=set(),
        driver_exit_code=0,
    )
    assert missing.state is JobState.FAILED and "partition 3" in missing.message
    sst = next((output / APP / STORE / BUILD_ID).glob("*.sst"))
    sst.unlink()
    assert "missing files" in judge(output, before=set()).message


def test_a_verdict_reads_back_from_its_text_and_garbage_is_none() -> None:
    result = failed((1, 2))
    assert JobResult.from_text(result.to_text()) == result
    assert JobResult.from_text("Error: OOMKilled") is None


def test_spark_submit_runs_the_driver_in_client_mode_with_the_settings(tmp_path: Path) -> None:
    command = spark_submit_command(
        manifest=tmp_path / "app.yaml",
        store=STORE,
        partitions=[0, 3],
        output=tmp_path / "out",
        master="k8s://https://kubernetes.default.svc",
        conf={"spark.kubernetes.driver.pod.name": "pod-1"},
        spark_submit="spark-submit",
    )
    assert command[:5] == [
        "spark-submit",
        "--master",
        "k8s://https://kubernetes.default.svc",
        "--deploy-mode",
        "client",
    ]
    assert "spark.kubernetes.driver.pod.name=pod-1" in command
    driver = Path(command[command.index("--conf") + 2])
    assert driver.name == "restore_driver.py" and driver.is_file()
    assert command[command.index("--partitions") + 1] == "0,3"


def test_a_watch_polls_without_blocking_until_a_build_a_failed_job_or_the_deadline(
    tmp_path: Path,
) -> None:
    """What a standby or warm-up waits with: each poll returns at once."""

    def watch(output: Path, partition_dir: str, waiting: PendingRestore) -> BuildWatch:
        return BuildWatch(
            output,
            waiting,
            application=APP,
            directory=tmp_path / "state" / partition_dir / STORE,
            changelog_epoch=None,
            bounds=lambda: (0, 150),
        )

    built = watch(tmp_path / "out", "1_2", pending(60))
    assert built.poll() is None
    make_manifest(tmp_path / "out", BUILD_ID)
    done = built.poll()
    assert done is not None and done.outcome is WaitOutcome.INGESTED
    assert done.ingested is not None and done.ingested.offset == 99

    doomed = watch(tmp_path / "none", "1_3", pending(60))
    assert doomed.poll() is None
    write_job_result(tmp_path / "none", "app-restore-1", failed((CHANGELOG.partition,)))
    done = doomed.poll()
    assert done is not None and done.outcome is WaitOutcome.JOB_FAILED
    assert not store_exists(tmp_path / "state" / "1_3" / STORE)

    late = watch(tmp_path / "never", "1_4", pending(-1))
    done = late.poll()
    assert done is not None and done.outcome is WaitOutcome.DEADLINE
