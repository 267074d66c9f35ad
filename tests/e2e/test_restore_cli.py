"""``eddyline restore build`` and ``eddyline restore ingest`` on the word-count example.

The app runs until caught up; a Spark build (local[2]) turns its changelog
into SST files; a task's store is wiped and ``restore ingest`` rebuilds it
from the build, replaying only the changelog written after the build.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import shutil
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import eddyline_runtime.restore.spark
from eddyline_runtime import cli
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.job_result import JobResult, JobState, write_job_result
from eddyline_runtime.restore.manifest import (
    MANIFEST_FORMAT_VERSION,
    ChangelogRef,
    ManifestFile,
    RestoreManifest,
    build_directory,
    sst_name,
)
from eddyline_runtime.restore.manifest import (
    write_manifest as write_restore_manifest,
)
from eddyline_runtime.runner import load_app, run_app
from eddyline_runtime.state import KeyRange, RocksDBStore
from eddyline_runtime.state.sst_files import SortedFileWriter
from tests.support.ports import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wordcount"
STORE = "word-counts"
WORDS = [f"w{i}" for i in range(300)]


def write_manifest(directory: Path) -> Path:
    shutil.copy(EXAMPLE / "wordcount.py", directory / "wordcount.py")
    document = yaml.safe_load((EXAMPLE / "streamapp.yaml").read_text(encoding="utf-8"))
    document["spec"]["log"]["url"] = f"sqlite:///{directory / 'log.db'}"
    document["spec"]["config"]["state.dir"] = str(directory / "state")
    manifest = directory / "streamapp.yaml"
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    return manifest


def produce_lines(log: SqliteLog, seed: int, count: int) -> None:
    lines = [
        " ".join(WORDS[(seed * 7 + i * j) % len(WORDS)] for j in range(1, 6)) for i in range(count)
    ]
    for partition in range(2):
        log.produce(
            TopicPartition("text-lines", partition),
            [Record(None, line.encode(), 0) for line in lines[partition::2]],
        )


def run_until_caught_up(manifest: Path) -> None:
    app = load_app(manifest)
    log = SqliteLog(Path(app.spec.log.url.removeprefix("sqlite:///")))
    try:
        run_app(app, log, search_path=[manifest.parent], until_caught_up=True, out=io.StringIO())
    finally:
        log.close()


def eddyline(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        code = cli.main(list(args))
    finally:
        sys.stdout, sys.stderr = saved
    return code, out.getvalue(), err.getvalue()


def contents(
    directory: Path, changelog: TopicPartition
) -> tuple[list[tuple[bytes, bytes]], int | None]:
    with RocksDBStore(STORE, directory) as store:
        return list(store.scan(KeyRange.closed(None, None))), store.committed_offset(changelog)


def summary_offsets(output: Path) -> dict[int, int]:
    """The offset each partition's manifest covers, from the one build under ``output``."""
    offsets = {}
    for path in output.glob("*/*/*/*.manifest.json"):
        manifest = json.loads(path.read_text(encoding="utf-8"))
        offsets[manifest["changelog"]["partition"]] = manifest["offset"]
    return offsets


@pytest.fixture
def app_dir(tmp_path: Path) -> Iterator[Path]:
    manifest = write_manifest(tmp_path)
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("text-lines", 2)
    produce_lines(log, 1, 400)
    log.close()
    run_until_caught_up(manifest)
    yield tmp_path


@pytest.mark.slow
def test_a_wiped_store_is_rebuilt_from_a_spark_build_and_its_tail(
    app_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = app_dir / "streamapp.yaml"
    output = app_dir / "restore"
    code, out, err = eddyline(
        "restore", "build", "--manifest", str(manifest), "--store", STORE,
        "--output", str(output), "--master", "local[2]",
        "--conf", "spark.ui.showConsoleProgress=false",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["partitions"] == 2 and 0 < summary["keys"] <= len(WORDS)
    assert "partition 0:" in out and "records read" in out
    # More input after the build: its changelog records are the tail.
    log = SqliteLog(app_dir / "log.db")
    produce_lines(log, 2, 100)
    log.close()
    run_until_caught_up(manifest)
    store_dir = next((app_dir / "state").glob(f"*_0/{STORE}"))
    changelog = TopicPartition(f"wordcount-{STORE}-changelog", 0)
    before = contents(store_dir, changelog)
    shutil.rmtree(store_dir)  # the volume was lost
    code, out, err = eddyline(
        "restore", "ingest", "--manifest", str(manifest), "--store", STORE,
        "--partition", "0", "--from", str(output),
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert report["ingested_manifest"] is not None and report["ingested_keys"] > 0
    assert report["replayed_from"] == report["ingested_offset"] + 1
    assert 0 < report["replayed_records"] < before[1] - report["ingested_offset"] + 1
    assert contents(store_dir, changelog) == before

    # The runtime does the same by itself with restore.build.dir: partition 1's store is lost.
    document = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    document["spec"]["config"]["restore.build.dir"] = str(output)
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    store_dir = next((app_dir / "state").glob(f"*_1/{STORE}"))
    changelog = TopicPartition(f"wordcount-{STORE}-changelog", 1)
    before = contents(store_dir, changelog)
    shutil.rmtree(store_dir)
    build_offset = summary_offsets(output)[1]
    with caplog.at_level(logging.INFO, logger="eddyline_runtime"):
        run_until_caught_up(manifest)
    restored = [
        r.getMessage() for r in caplog.records if f"restored store {STORE}" in r.getMessage()
    ]
    tail = [line for line in restored if f"{changelog} offsets {build_offset + 1}.." in line]
    assert len(tail) == 1, restored  # replayed from just after the build's offset
    assert contents(store_dir, changelog) == before


def build_by_hand(store_dir: Path, changelog: TopicPartition, output: Path) -> int:
    """A build of one store partition without Spark: the store's own keys as one SST file
    and a manifest at its committed offset. Returns that offset."""
    with RocksDBStore(STORE, store_dir) as store:
        entries = list(store.scan(KeyRange.closed(None, None)))
        offset = store.committed_offset(changelog)
        epoch = store.changelog_epoch(changelog)
    assert offset is not None
    directory = build_directory(output, "wordcount", STORE, "20260101T000000Z-by-hand")
    directory.mkdir(parents=True)
    writer = SortedFileWriter(directory / sst_name(changelog.partition, 0, 0, 0), store=STORE)
    writer.add([k for k, _ in entries], [v for _, v in entries])
    finished = writer.finish()
    assert finished is not None
    manifest = RestoreManifest(
        format_version=MANIFEST_FORMAT_VERSION,
        eddyline_version="test",
        build_id=directory.name,
        created_at="2026-01-01T00:00:00+00:00",
        application="wordcount",
        store=STORE,
        changelog=ChangelogRef(topic=changelog.topic, partition=changelog.partition),
        offset=offset,
        log_start=0,
        log_end=offset + 1,
        changelog_epoch=epoch,
        records_read=len(entries),
        keys=len(entries),
        files=(
            ManifestFile(
                name=finished.path.name,
                sha256=finished.sha256,
                bytes=finished.size,
                keys=finished.entries,
            ),
        ),
    )
    write_restore_manifest(directory, manifest)
    return offset


def test_the_runtime_rebuilds_a_lost_store_from_a_build_then_replays_only_the_tail(
    app_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = app_dir / "streamapp.yaml"
    changelog = TopicPartition(f"wordcount-{STORE}-changelog", 0)
    store_dir = next((app_dir / "state").glob(f"*_0/{STORE}"))
    build_offset = build_by_hand(store_dir, changelog, app_dir / "restore")
    log = SqliteLog(app_dir / "log.db")
    produce_lines(log, 3, 100)  # the tail, after the build
    log.close()
    run_until_caught_up(manifest)
    before = contents(store_dir, changelog)
    assert before[1] is not None and before[1] > build_offset
    shutil.rmtree(store_dir)  # the volume was lost
    document = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    document["spec"]["config"]["restore.build.dir"] = str(app_dir / "restore")
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="eddyline_runtime"):
        run_until_caught_up(manifest)
    restored = [r.getMessage() for r in caplog.records if f"{changelog} offsets" in r.getMessage()]
    assert len(restored) == 1 and f"offsets {build_offset + 1}.." in restored[0], restored
    assert contents(store_dir, changelog) == before


def test_restore_build_without_pyspark_says_how_to_install_it_in_one_line(
    app_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if PySpark were not installed: importing the Spark job fails.
    monkeypatch.setitem(sys.modules, "eddyline_runtime.restore.spark.spark_build", None)
    monkeypatch.delattr(eddyline_runtime.restore.spark, "spark_build", raising=False)
    code, out, err = eddyline(
        "restore", "build", "--manifest", str(app_dir / "streamapp.yaml"), "--store", STORE,
        "--output", str(app_dir / "restore"),
    )  # fmt: skip
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "pip install 'eddyline[spark]'" in err and "JRE" in err


def test_restore_build_without_java_says_how_to_get_one_in_one_line(
    app_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(app_dir / "empty"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    code, _, err = eddyline(
        "restore", "build", "--manifest", str(app_dir / "streamapp.yaml"), "--store", STORE,
        "--output", str(app_dir / "restore"),
    )  # fmt: skip
    assert code == 2
    assert err.count("\n") == 1 and "Java 17+" in err


def test_restore_build_of_an_unknown_store_names_the_topic_it_looked_for(app_dir: Path) -> None:
    code, _, err = eddyline(
        "restore", "build", "--manifest", str(app_dir / "streamapp.yaml"), "--store", "nope",
        "--output", str(app_dir / "restore"),
    )  # fmt: skip
    assert code == 1 and '"wordcount-nope-changelog"' in err


def test_restore_ingest_with_no_build_replays_the_whole_changelog(app_dir: Path) -> None:
    store_dir = next((app_dir / "state").glob(f"*_1/{STORE}"))
    changelog = TopicPartition(f"wordcount-{STORE}-changelog", 1)
    before = contents(store_dir, changelog)
    shutil.rmtree(store_dir)
    code, out, err = eddyline(
        "restore", "ingest", "--manifest", str(app_dir / "streamapp.yaml"), "--store", STORE,
        "--partition", "1", "--from", str(app_dir / "no-build"),
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert (report["ingested_manifest"], report["replayed_from"]) == (None, 0)
    assert contents(store_dir, changelog) == before


def test_restore_output_on_object_storage_is_refused_clearly(app_dir: Path) -> None:
    code, _, err = eddyline(
        "restore", "ingest", "--manifest", str(app_dir / "streamapp.yaml"), "--store", STORE,
        "--partition", "0", "--from", "s3://bucket/restore",
    )  # fmt: skip
    assert code == 1 and "only local directories and file:// URIs" in err


def get_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
        return json.load(response)


def when_pending(port: int, seen: dict[str, Any], then: Callable[[], object]) -> None:
    """Wait for restorePending on /v1/lags, note what the instance reports, then ``then()``
    (a restore Job's output or verdict appearing on the shared claim)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            lags = get_json(port, "/v1/lags")
        except OSError:
            time.sleep(0.05)
            continue
        if lags.get(STORE, {}).get("0", {}).get("restorePending"):
            seen["lags"] = lags[STORE]["0"]
            seen["layout"] = get_json(port, "/v1/layout")
            break
        time.sleep(0.05)
    then()


def test_a_task_waits_for_a_build_reporting_restore_pending_then_ingests_it(
    app_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """spec.restore on a cluster, by hand: the lost store waits (restorePending on /v1/lags
    and /v1/layout) instead of replaying, and ingests the build once it appears."""
    manifest = app_dir / "streamapp.yaml"
    changelog = TopicPartition(f"wordcount-{STORE}-changelog", 0)
    store_dir = next((app_dir / "state").glob(f"*_0/{STORE}"))
    staged = app_dir / "staged"
    build_offset = build_by_hand(store_dir, changelog, staged)
    before = contents(store_dir, changelog)
    shutil.rmtree(store_dir)  # the volume was lost
    port = free_port()
    document = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    document["spec"]["config"].update(
        {
            "restore.build.dir": str(app_dir / "restore"),
            "restore.wait.lag.above": 10,
            "restore.wait.ms": 60_000,
            "application.server": f"127.0.0.1:{port}",
        }
    )
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    seen: dict[str, Any] = {}

    def on_started(_: object) -> None:
        publish = functools.partial(staged.rename, app_dir / "restore")
        threading.Thread(target=when_pending, args=(port, seen, publish), daemon=True).start()

    log = SqliteLog(app_dir / "log.db")
    try:
        with caplog.at_level(logging.INFO, logger="eddyline_runtime"):
            run_app(
                load_app(manifest),
                log,
                search_path=[manifest.parent],
                until_caught_up=True,
                out=io.StringIO(),
                on_started=on_started,
            )
    finally:
        log.close()
    assert seen["lags"]["offset_lag"] == build_offset + 1
    assert seen["layout"]["stores"][STORE]["0"] == {
        "role": "restorePending",
        "lag": build_offset + 1,
    }
    assert seen["layout"]["ready"] is False
    # The wait itself is proven by what the instance reported above (lags and layout).
    messages = [r.getMessage() for r in caplog.records]
    restored = [m for m in messages if f"{changelog} offsets" in m]
    assert len(restored) == 1 and f"offsets {build_offset + 1}.." in restored[0], restored
    assert contents(store_dir, changelog) == before


def test_a_task_whose_build_job_failed_replays_the_whole_changelog(
    app_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = app_dir / "streamapp.yaml"
    changelog = TopicPartition(f"wordcount-{STORE}-changelog", 0)
    store_dir = next((app_dir / "state").glob(f"*_0/{STORE}"))
    before = contents(store_dir, changelog)
    shutil.rmtree(store_dir)  # the volume was lost
    output, port = app_dir / "restore", free_port()
    document = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    document["spec"]["config"].update(
        {
            "restore.build.dir": str(output),
            "restore.wait.lag.above": 10,
            "restore.wait.ms": 60_000,
            "application.server": f"127.0.0.1:{port}",
        }
    )
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")

    def fail_the_job() -> None:
        verdict = JobResult(
            state=JobState.FAILED,
            application="wordcount",
            store=STORE,
            partitions=(0,),
            driver_exit_code=1,
            message="the Spark driver exited with status 1",
        )
        write_job_result(output, "wordcount-restore-1", verdict)

    started = time.monotonic()
    log = SqliteLog(app_dir / "log.db")
    try:
        with caplog.at_level(logging.INFO, logger="eddyline_runtime"):
            run_app(
                load_app(manifest),
                log,
                search_path=[manifest.parent],
                until_caught_up=True,
                out=io.StringIO(),
                on_started=lambda _: threading.Thread(
                    target=when_pending, args=(port, {}, fail_the_job), daemon=True
                ).start(),
            )
    finally:
        log.close()
    assert time.monotonic() - started < 30  # not the 60 s deadline
    messages = [r.getMessage() for r in caplog.records]
    assert any("the restore Job failed" in m and "replaying" in m for m in messages), messages
    restored = [m for m in messages if f"{changelog} offsets" in m]
    assert len(restored) == 1 and f"{changelog} offsets 0.." in restored[0], restored
    assert contents(store_dir, changelog) == before
