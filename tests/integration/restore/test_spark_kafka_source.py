"""Spark restore builds from Kafka changelogs (Spark's own Kafka source, read_committed).

The changelog lives on the project's broker. Partition 0 is written as the
runtime writes it, in transactions (one of them aborted), so its end offset
is a commit marker; partition 1 is compacted by the broker's log cleaner, so
its range has offsets without records. The build (its own process: Spark's
Kafka source must be on the JVM's class path from its start) neither waits
nor fails on either, and the stores ingested from its SST files equal the
stores a replay through the log port builds, byte for byte, committed offset
included.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource

from eddyline_runtime import cli
from eddyline_runtime.log import Record
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.partitions import TopicPartition, changelog_topic
from eddyline_runtime.restore.ingest.sst_restore import ingest_latest_manifest
from eddyline_runtime.restore.spark.kafka_source import JARS_ENV
from tests.integration.restore.restore_changelogs import (
    changelog_records,
    live_keys,
    replay_store,
    store_contents,
)
from tests.support.kafka.watermarks import high_watermarks
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
APP, STORE = "app", "counts"
TOPIC = f"{APP}-{STORE}-changelog"
PER_PARTITION = 2_000
KEYS = 150
TRANSACTIONAL, COMPACTED = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


@pytest.fixture
def log(kafka_bootstrap: str) -> Iterator[KafkaLog]:
    log = KafkaLog.open(
        f"kafka://{kafka_bootstrap}", {}, topic_prefix=f"spark-{uuid.uuid4().hex[:8]}."
    )
    yield log
    log.close()


def spark_kafka_jars() -> Path:
    done = subprocess.run(
        [str(ROOT / "scripts" / "spark-kafka-jars"), sys.executable],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


def high_watermark(log: KafkaLog, changelog: TopicPartition) -> int:
    """The partition's high watermark: records of open transactions count (read_uncommitted)."""
    with high_watermarks(log.settings.bootstrap) as high:
        return high(log.real_topic(changelog.topic), changelog.partition)


def write_in_transactions(
    log: KafkaLog, changelog: TopicPartition = TRANSACTIONAL, application: str = APP
) -> list[Record]:
    """``changelog`` (partition 0) in transactions of 400 records, the third one aborted;
    returns the committed records. The last offset of the partition is the last commit's
    marker."""
    records = changelog_records(0, PER_PARTITION, KEYS)
    keyed = [r for r in records if r.key is not None]  # a compacted topic takes keys only
    producer = log.transactional_producer(f"{application}-1_0")
    committed: list[Record] = []
    for number, start in enumerate(range(0, len(keyed), 400)):
        batch = keyed[start : start + 400]
        producer.begin()
        before = high_watermark(log, changelog) if number == 2 else 0
        producer.send_batch(changelog, batch)
        if number == 2:
            # librdkafka#4849: an abort whose EndTxn overtakes the transaction's first
            # AddPartitionsToTxn finds no transaction on the coordinator and fails with a
            # fatal INVALID_TXN_STATE, which the adapter reports as a ProducerFencedError
            # (met here under load; the broker logged "state is COMPLETE_COMMIT, but
            # received transaction marker result to send: ABORT" for this producer).
            # A record on the broker proves the partition was added: wait for one.
            wait_for(
                lambda before=before: high_watermark(log, changelog) > before or None,
                "the aborted transaction's first record on the broker",
            )
            producer.abort()
        else:
            last = producer.commit().last_offsets[changelog]
            committed.extend(batch)
    producer.close()
    # The marker after the last record makes the last stable offset last + 2.
    wait_for(lambda: log.end_offset(changelog) == last + 2 or None, "the last commit marker")
    return committed


def compacted_partition(log: KafkaLog) -> list[Record]:
    """Partition 1 written in three segments, the first two compacted by the broker."""
    admin = AdminClient({"bootstrap.servers": log.settings.bootstrap})
    settings = {"segment.ms": "300", "min.cleanable.dirty.ratio": "0.01"}
    resource = ConfigResource(
        "topic",
        log.real_topic(TOPIC),
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in settings.items()
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result()
    records = [r for r in changelog_records(1, PER_PARTITION, KEYS) if r.key is not None]
    for part in (records[:1000], records[1000:-1], records[-1:]):
        time.sleep(0.5)  # past segment.ms: the next append rolls a new segment
        # The broker rolls by record time (this batch's newest timestamp against the
        # segment's first one), so each part carries the time it is written at.
        now = time.time_ns() // 1_000_000
        log.produce(COMPACTED, [Record(r.key, r.value, now) for r in part])

    def compacted() -> bool:
        fetched, position = 0, log.beginning_offset(COMPACTED)
        end = log.end_offset(COMPACTED)
        while position < end:
            batch = log.fetch(COMPACTED, position).records
            if not batch:
                break
            fetched += len(batch)
            position = batch[-1].offset + 1
        return fetched < len(records)

    wait_for(compacted, "the broker's cleaner compacting partition 1", 60)
    return records


@pytest.mark.timeout(600)  # a broker, a Spark JVM and the cleaner on 2 busy cores
def test_stores_built_from_kafka_changelogs_equal_replayed_stores(
    log: KafkaLog, tmp_path: Path
) -> None:
    jars = spark_kafka_jars()
    log.create_topic(TOPIC, 2, compacted=True)
    committed = write_in_transactions(log)
    written = compacted_partition(log)

    started = time.monotonic()
    with (tmp_path / "driver.log").open("w") as driver_output:
        done = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).with_name("spark_kafka_driver.py")),
                log.settings.bootstrap,
                log.topic_prefix,
                TOPIC,
                "0,1",
                str(tmp_path / "out"),
                str(jars),
            ],
            stdout=subprocess.DEVNULL,
            stderr=driver_output,
            check=False,
            timeout=400,
            cwd=ROOT,
        )
    driver_log = (tmp_path / "driver.log").read_text()
    print(f"build took {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, driver_log[-4000:]
    # Neither the marker nor the gaps made Spark wait for its poll timeout (120 s).
    assert time.monotonic() - started < 110

    for changelog, records in ((TRANSACTIONAL, committed), (COMPACTED, written)):
        attempt = ingest_latest_manifest(
            tmp_path / "out",
            application=APP,
            store=STORE,
            changelog=changelog,
            directory=tmp_path / f"sst-{changelog.partition}" / STORE,
            log_start=log.beginning_offset(changelog),
            log_end=log.end_offset(changelog),
        )
        assert attempt.refusals == ()
        assert attempt.result is not None
        replay_dir = tmp_path / f"replay-{changelog.partition}" / STORE
        replay_store(STORE, replay_dir, log, changelog)
        from_files = store_contents(
            STORE, tmp_path / f"sst-{changelog.partition}" / STORE, changelog
        )
        assert from_files == store_contents(STORE, replay_dir, changelog)
        # The aborted transaction's records are in neither.
        assert dict(from_files[0]) == live_keys(records)


def streamapp(directory: Path, application: str, log_url: str) -> Path:
    manifest = directory / "streamapp.yaml"
    document = {
        "apiVersion": "eddyline.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": {"name": application},
        "spec": {
            "topology": "wordcount:topology",
            "log": {"url": log_url},
            "config": {"state.dir": str(directory / "state")},
        },
    }
    manifest.write_text(yaml.safe_dump(document), encoding="utf-8")
    return manifest


@pytest.mark.timeout(600)
def test_restore_build_of_a_kafka_changelog_reads_it_with_sparks_kafka_source(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`eddyline restore build` on a kafka:// app: Spark's reader, its jars from
    $EDDYLINE_SPARK_KAFKA_JARS (as in the restore image); without them, an error that says
    how to get them before any JVM starts."""
    jars = spark_kafka_jars()
    application = f"kspark-{uuid.uuid4().hex[:8]}"
    changelog = TopicPartition(changelog_topic(application, STORE), 0)
    url = f"kafka://{kafka_bootstrap}"
    manifest = streamapp(tmp_path, application, url)
    output = tmp_path / "out"
    build = ["restore", "build", "--manifest", str(manifest), "--store", STORE]
    build += ["--output", str(output), "--master", "local[2]", "--split-records", "700"]
    log = KafkaLog.open(url, {})
    try:
        log.create_topic(changelog.topic, 1, compacted=True)
        committed = write_in_transactions(log, changelog, application)

        monkeypatch.setenv(JARS_ENV, str(tmp_path))  # no connector there
        err = io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        assert cli.main(build) == 1
        assert JARS_ENV in err.getvalue() and "make spark-kafka-jars" in err.getvalue()
        monkeypatch.undo()

        # Its own process: Spark's Kafka source must be on the JVM's class path from its
        # start, and other tests may have started this process's JVM without it.
        started = time.monotonic()
        done = subprocess.run(
            [str(Path(sys.executable).with_name("eddyline")), *build],
            env={**os.environ, JARS_ENV: str(jars)},
            capture_output=True,
            text=True,
            check=False,
            timeout=400,
            cwd=tmp_path,
        )
        print(f"restore build took {time.monotonic() - started:.1f} s")
        assert done.returncode == 0, done.stderr[-4000:]
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert summary["source"] == "KafkaChangelogSource"
        # The aborted transaction's records were not read.
        assert summary["records_read"] == len(committed)

        directory = tmp_path / "sst" / STORE
        attempt = ingest_latest_manifest(
            output,
            application=application,
            store=STORE,
            changelog=changelog,
            directory=directory,
            log_start=log.beginning_offset(changelog),
            log_end=log.end_offset(changelog),
        )
        assert attempt.refusals == ()
        assert attempt.result is not None
        replay_dir = tmp_path / "replay" / STORE
        replay_store(STORE, replay_dir, log, changelog)
        from_files = store_contents(STORE, directory, changelog)
        assert from_files == store_contents(STORE, replay_dir, changelog)
        assert dict(from_files[0]) == live_keys(committed)
    finally:
        log.close()
