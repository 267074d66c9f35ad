"""``eddyline backfill build`` in PySpark (local[2]): the stores it writes equal a replay's.

One Spark task per task partition runs that partition's history through the
engine's task code; the end offsets default to the app's committed positions.
The builds, ingested as a pod ingests a restore build, hold the bytes the
StreamsInstance's stores hold. Spark starts once per module (its JVM costs
seconds of CPU).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from eddyline_runtime.backfill_cli import RUNNING_HISTORY
from eddyline_runtime.cli import main
from eddyline_runtime.log.sqlite_log import SqliteLog
from eddyline_runtime.partitions import TaskId, TopicPartition, changelog_topic
from eddyline_runtime.restore.manifest import read_manifest
from tests.integration.backfill.test_task_history import ingested
from tests.support.backfill import (
    committed_changelog,
    reference_replay,
    store_contents,
    write_history,
)
from tests.support.topologies.backfill_topologies import INPUT, repartitioned_count, windowed_count

pytestmark = pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
    reason="PySpark needs a Java runtime",
)

REFERENCE = "tests.support.topologies.backfill_topologies:windowed_count"
PARTITIONS = 3
RECORDS = 4_500


def test_backfill_build_in_spark_equals_a_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spark's Python workers import the topology by reference, from this checkout.
    root = str(Path(__file__).resolve().parents[3])
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )
    application = "backfill-spark"
    state_dir = tmp_path / "replay-state"
    log = SqliteLog(tmp_path / "log.db")
    try:
        write_history(log, INPUT, PARTITIONS, RECORDS)
        config, _ = reference_replay(windowed_count(), application, log, state_dir)
        url = log.url
    finally:
        log.close()
    output = tmp_path / "builds"
    # As in a terminal: the command draws its progress line (the history's records read
    # of all, from the tasks' reports), then erases it before its summary.
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code = main(
        [
            "backfill",
            "build",
            "--topology",
            REFERENCE,
            "--application",
            application,
            "--store",
            "window-counts",
            "--log-url",
            url,
            "--output",
            str(output),
            "--master",
            "local[2]",
            "--build-id",
            "b1",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert f"{RECORDS:,} records through {PARTITIONS} tasks" in printed
    assert f"{RUNNING_HISTORY}: {RECORDS:,} of {RECORDS:,} records" in printed
    # The tasks' reports are gone with the job.
    assert not (output / application / "b1-progress").exists()
    result = json.loads((output / application / "b1-backfill-result.json").read_text())
    assert sum(task["records"] for task in result["tasks"]) == RECORDS
    for task in result["tasks"]:
        partition = int(task["task"].split("_")[1])
        expected = store_contents(config, state_dir, TaskId(0, partition), "window-counts")
        assert expected
        got = ingested(
            task["manifests"]["window-counts"], config, tmp_path / f"ingested-{partition}"
        )
        assert got == expected
        # The job wrote the store's contents to its changelog, once, and the manifest
        # names its last offset: a restore from the changelog alone finds them.
        changelog = TopicPartition(changelog_topic(application, "window-counts"), partition)
        log = SqliteLog(tmp_path / "log.db", read_only=True)
        try:
            records = committed_changelog(log, changelog)
        finally:
            log.close()
        assert [(key, value) for _, key, value in records] == expected
        manifest = read_manifest(Path(task["manifests"]["window-counts"]))
        assert manifest.offset == records[-1][0]


def test_a_repartitioned_topology_is_refused_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = SqliteLog(tmp_path / "log.db")
    try:
        log.create_topic(INPUT, 2)
        url = log.url
    finally:
        log.close()
    assert repartitioned_count().stores  # the store the error must name
    code = main(
        [
            "backfill",
            "build",
            "--topology",
            "tests.support.topologies.backfill_topologies:repartitioned_count",
            "--application",
            "app",
            "--store",
            "value-counts",
            "--log-url",
            url,
            "--output",
            str(tmp_path / "out"),
        ]
    )
    assert code != 0
    assert "value-counts" in capsys.readouterr().err
