"""``eddyline backfill build``'s arguments and plan: bad input named, with the way out."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.backfill import BackfillError, BackfillPlan, spark_job
from eddyline_runtime.backfill.spark_job import fix_plan
from eddyline_runtime.backfill_cli import BackfillCommandError, parse_end_offset, parse_timestamp
from eddyline_runtime.cli import main
from eddyline_runtime.log.sqlite_log import SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.spark_requirements import java_missing, spark_missing
from eddyline_runtime.spec import BackfillState, BackfillVerdict
from tests.support.topologies.backfill_topologies import INPUT, keyed_count


def test_an_end_offset_is_topic_partition_equals_offset() -> None:
    assert parse_end_offset("app.events:3=1500") == (TopicPartition("app.events", 3), 1500)


@pytest.mark.parametrize("text", ["events=3", "events:x=1", "events:1=", ":1=2", "events:1=-5"])
def test_a_malformed_end_offset_is_refused_with_the_form_to_use(text: str) -> None:
    with pytest.raises(BackfillCommandError, match=r"TOPIC:PARTITION=OFFSET"):
        parse_end_offset(text)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2026-11-01T00:00:00Z", 1_793_491_200_000),
        ("2026-11-01T01:00:00.123+01:00", 1_793_491_200_123),
        ("1970-01-01T00:00:00.001+00:00", 1),
    ],
)
def test_a_from_timestamp_is_rfc_3339_with_a_zone_in_milliseconds(text: str, ms: int) -> None:
    assert parse_timestamp(text) == ms


@pytest.mark.parametrize("text", ["2026-11-01T00:00:00", "yesterday", "1761955200000"])
def test_a_from_timestamp_without_a_zone_is_refused_by_the_command_naming_the_form(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["backfill", "build", "--topology", "m:f", "--application", "app"]
    args += ["--store", "counts", "--log-url", "sqlite:///x.db", "--output", "out"]
    with pytest.raises(SystemExit) as ended:
        main([*args, "--from-timestamp", text])
    assert ended.value.code == 2
    error = capsys.readouterr().err
    assert "--from-timestamp" in error and "2026-11-01T00:00:00Z" in error


def _log_with_input(tmp_path: Path) -> str:
    log = SqliteLog(tmp_path / "log.db")
    try:
        log.create_topic(INPUT, 2)
        return log.url
    finally:
        log.close()


@pytest.mark.parametrize(
    ("stores", "end_offsets", "error"),
    [
        # A store the topology lacks: refused, naming the ones it has.
        (["nope"], None, r"no store 'nope'.*its stores: counts"),
        # No committed positions and none given: the plan asks for end offsets.
        (["counts"], None, r'group "app" has no committed position.*--end-offset'),
        # Given end offsets must cover every input partition.
        (["counts"], {TopicPartition(INPUT, 0): 0}, r"no end offset for .*give one per input"),
    ],
    ids=["unknown-store", "no-committed-positions", "end-offsets-missing-a-partition"],
)
def test_a_plan_that_cannot_be_fixed_is_refused_with_the_way_out(
    tmp_path: Path,
    stores: list[str],
    end_offsets: dict[TopicPartition, int] | None,
    error: str,
) -> None:
    with pytest.raises(BackfillError, match=error):
        fix_plan(
            keyed_count(),
            application="app",
            reference="m:f",
            stores=stores,
            log_url=_log_with_input(tmp_path),
            output=tmp_path / "out",
            build_id="b",
            end_offsets=end_offsets,
        )


def test_without_java_backfill_build_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one message of both Spark commands (restore/spark_requirements.py), naming
    the command that needs it; said before any JVM starts."""
    url = _log_with_input(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-java-here"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert java_missing()
    args = [
        "backfill",
        "build",
        "--topology",
        "tests.support.topologies.backfill_topologies:keyed_count",
    ]
    args += ["--application", "app", "--store", "counts", "--log-url", url]
    args += ["--output", str(tmp_path / "out"), "--end-offset", f"{INPUT}:0=0"]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: backfill build needs PySpark and a Java 17+ runtime")
    assert error.strip() == f"error: {spark_missing('backfill build')}"
    assert spark_missing("restore build").startswith("restore build needs PySpark")


@pytest.mark.parametrize("supersede", [False, True])
def test_a_plan_holds_the_given_end_offsets_and_whether_it_supersedes(
    tmp_path: Path, supersede: bool
) -> None:
    """Both survive the encoding every Spark task gets the plan in."""
    plan = fix_plan(
        keyed_count(),
        application="app",
        reference="m:f",
        stores=["counts"],
        log_url=_log_with_input(tmp_path),
        output=tmp_path / "out",
        build_id="b",
        end_offsets={TopicPartition(INPUT, 0): 0, TopicPartition(INPUT, 1): 0},
        supersede=supersede,
    )
    assert plan.end_offsets == {f"{INPUT}:0": 0, f"{INPUT}:1": 0}
    decoded = BackfillPlan.decode(plan.encode())
    assert (decoded.end_offsets, decoded.supersede) == (plan.end_offsets, supersede)


@pytest.mark.skipif(bool(java_missing()), reason="needs Java (make setup says how)")
def test_the_job_says_why_it_failed_in_its_verdict(tmp_path: Path) -> None:
    """``eddyline backfill job`` (the operator's backfill Job): a store the new revision
    lacks ends in a Failed verdict naming it, in the result file the operator reads (the
    termination message), and exit 1; before any Spark session starts."""
    url = _log_with_input(tmp_path)
    manifest = tmp_path / "streamapp.yaml"
    manifest.write_text(
        "apiVersion: eddyline.dev/v1alpha1\nkind: StreamApp\nmetadata: {name: app}\n"
        f"spec: {{topology: 'm:f', log: {{url: '{url}'}}}}\n",
        encoding="utf-8",
    )
    result = tmp_path / "verdict.json"
    code = main(
        [
            "backfill",
            "job",
            "--manifest",
            str(manifest),
            "--topology",
            "tests.support.topologies.backfill_topologies:keyed_count",
            "--store",
            "nope",
            "--output",
            str(tmp_path / "builds"),
            "--build-id",
            "b1",
            "--result-file",
            str(result),
        ]
    )
    assert code == 1
    verdict = BackfillVerdict.from_text(result.read_text(encoding="utf-8"))
    assert verdict is not None and verdict.state is BackfillState.FAILED
    assert "no store 'nope'" in verdict.message and verdict.build_id == "b1"


@pytest.mark.skipif(bool(java_missing()), reason="needs Java (make setup says how)")
@pytest.mark.parametrize(
    ("command", "supersede"),
    [(["build"], False), (["build", "--supersede"], True), (["job"], True)],
    ids=["build", "build-supersede", "operator-job"],
)
def test_only_the_operators_job_and_an_explicit_flag_supersede_a_changelogs_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str], supersede: bool
) -> None:
    """By hand, a changelog's other state is replaced only on ``--supersede``: the command
    cannot know whether a running revision has the store. The operator's Job always may:
    the operator starts no backfill of a store the running revision has."""
    asked: dict[str, object] = {}

    def fix_plan_seen(*args: object, **kwargs: object) -> BackfillPlan:
        asked.update(kwargs)
        raise BackfillError("stopped before Spark starts")

    monkeypatch.setattr(spark_job, "fix_plan", fix_plan_seen)
    url = _log_with_input(tmp_path)
    topology = "tests.support.topologies.backfill_topologies:keyed_count"
    common = ["--topology", topology, "--store", "counts", "--output", str(tmp_path / "out")]
    if command[0] == "build":
        rest = ["--application", "app", "--log-url", url, "--end-offset", f"{INPUT}:0=0"]
    else:
        manifest = tmp_path / "streamapp.yaml"
        manifest.write_text(
            "apiVersion: eddyline.dev/v1alpha1\nkind: StreamApp\nmetadata: {name: app}\n"
            f"spec: {{topology: 'm:f', log: {{url: '{url}'}}}}\n",
            encoding="utf-8",
        )
        rest = ["--manifest", str(manifest), "--build-id", "b1"]
    assert main(["backfill", *command, *common, *rest]) != 0
    assert asked["supersede"] is supersede
