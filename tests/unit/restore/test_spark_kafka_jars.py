"""Where ``eddyline restore build`` finds Spark's Kafka source for a kafka:// changelog:
``--spark-kafka-jars``, else ``$EDDYLINE_SPARK_KAFKA_JARS``, else a checkout's cache; and
an error naming the setting and ``make spark-kafka-jars`` when the jars are not there."""

from __future__ import annotations

from pathlib import Path

import pyspark
import pytest

from eddyline_runtime.restore.spark.kafka_source import (
    JARS_ENV,
    SparkKafkaJarsMissingError,
    checkout_jars,
    connector_conf,
    with_connector,
)

ROOT = Path(__file__).resolve().parents[3]
CONNECTOR = f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar"


def jars_dir(directory: Path, *names: str) -> Path:
    directory.mkdir(parents=True)
    for name in names:
        (directory / name).write_bytes(b"")  # only the names matter to the lookup
    return directory


def listed(conf: dict[str, str]) -> list[str]:
    return [Path(jar).name for jar in conf["spark.jars"].split(",")]


def test_the_flag_wins_over_the_environment(tmp_path: Path) -> None:
    flag = jars_dir(tmp_path / "flag", CONNECTOR, "kafka-clients-3.9.2.jar")
    env = jars_dir(tmp_path / "env")  # empty: would fail if it were used
    conf = connector_conf(flag, {JARS_ENV: str(env)})
    assert listed(conf) == ["kafka-clients-3.9.2.jar", CONNECTOR]  # sorted


def test_the_environment_names_the_jars_when_no_flag_does(tmp_path: Path) -> None:
    env = jars_dir(tmp_path / "env", CONNECTOR)
    assert listed(connector_conf(None, {JARS_ENV: str(env)})) == [CONNECTOR]


def test_a_checkout_defaults_to_its_cache() -> None:
    assert checkout_jars() == ROOT / ".cache" / "spark-kafka" / pyspark.__version__ / "jars"


@pytest.mark.parametrize("origin", ["flag", "env"])
def test_missing_jars_name_the_setting_and_the_make_target(tmp_path: Path, origin: str) -> None:
    empty = jars_dir(tmp_path / "empty", "kafka-clients-3.9.2.jar")
    with pytest.raises(SparkKafkaJarsMissingError) as raised:
        if origin == "flag":
            connector_conf(empty, {})
        else:
            connector_conf(None, {JARS_ENV: str(empty)})
    message = str(raised.value)
    assert str(empty) in message and "make spark-kafka-jars" in message
    assert ("--spark-kafka-jars" if origin == "flag" else f"${JARS_ENV}") in message


def test_the_users_jars_are_kept_and_the_connector_added_once(tmp_path: Path) -> None:
    found = jars_dir(tmp_path / "jars", CONNECTOR)
    conf = with_connector({"spark.jars": "/opt/mine.jar", "spark.x": "1"}, found)
    assert conf["spark.x"] == "1"
    assert listed(conf) == ["mine.jar", CONNECTOR]
    # A driver handed these settings by spark-submit does not look for the jars again,
    # so a missing lookup place does not fail it.
    assert with_connector(conf, tmp_path / "nowhere") == conf


def test_a_restore_job_on_kafka_puts_the_jars_on_spark_submits_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spark-submit starts the driver's JVM, so the Job's settings carry the jars; the
    driver's `restore build` then finds them there and looks no further."""
    from eddyline_runtime import cli
    from eddyline_runtime.restore.job_result import JobResult, JobState
    from eddyline_runtime.restore.spark import job_runner

    jars = jars_dir(tmp_path / "jars", CONNECTOR)
    manifest = tmp_path / "streamapp.yaml"
    manifest.write_text(
        "apiVersion: eddyline.dev/v1alpha1\nkind: StreamApp\nmetadata: {name: wc}\n"
        "spec: {topology: 'wordcount:topology', log: {url: 'kafka://k:9092'}}\n"
    )
    seen: dict[str, str] = {}

    def run(*, conf: dict[str, str], **_: object) -> JobResult:
        seen.update(conf)
        return JobResult(
            state=JobState.SUCCEEDED, application="wc", store="counts", partitions=(0,)
        )

    monkeypatch.setattr(job_runner, "run_restore_job", run)
    monkeypatch.setenv(JARS_ENV, str(jars))
    job = ["restore", "job", "--manifest", str(manifest), "--store", "counts"]
    job += ["--partitions", "0", "--output", str(tmp_path / "out"), "--job-name", "j"]
    code = cli.main([*job, "--conf", "spark.executor.cores=2"])
    assert code == 0
    assert seen["spark.executor.cores"] == "2"
    assert listed(seen) == [CONNECTOR]
