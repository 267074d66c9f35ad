"""Changelogs read from Kafka by Spark's own Kafka source, for restore builds on a cluster.

:class:`KafkaChangelogSource` is a :class:`ChangelogSource`: the driver fixes
each partition's range through the log port (``beginning_offset``,
``end_offset``, ``partition_epoch`` of a :class:`KafkaLog`), and the executors
read exactly those offsets with ``spark.read.format("kafka")``
(``org.apache.spark:spark-sql-kafka-0-10_2.13`` at the running Spark's
version, passed as ``spark.jars``: :func:`kafka_source_conf`;
``scripts/spark-kafka-jars`` fetches it). Reads are ``read_committed``: an
aborted transaction's records never reach a store.

Two things a changelog has that a plain topic may not, and how they are met:

* Transaction markers take offsets but are never delivered, so a range may end
  on a commit marker (the runtime writes changelogs in transactions). Spark's
  consumer reads the position it reached after a poll and stops there once it
  is at the range's end (SPARK-25005), so nothing waits for a record that does
  not exist.
* Compaction leaves offsets without records. Spark calls a missing offset "data
  loss" and fails the query unless ``failOnDataLoss`` is false; for a changelog
  a gap is expected, and the latest value per key still wins by offset.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import reduce
from pathlib import Path
from typing import Any, Final

import pyspark
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812  (PySpark's own idiom, as in spark_build)

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.spark.changelog_source import ChangelogBounds, read_bounds
from eddyline_runtime.restore.spark.offset_ranges import OffsetRange

SPARK_KAFKA_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"
# Where `eddyline restore build` finds the connector's jars (the restore image sets it);
# the CLI's --spark-kafka-jars wins over it.
JARS_ENV: Final = "EDDYLINE_SPARK_KAFKA_JARS"
# A checkout's root (runtime/src/eddyline_runtime/restore/spark/ is five levels down):
# scripts/spark-kafka-jars fetches into .cache there. An installed package has no such root.
_CHECKOUT: Final = Path(__file__).resolve().parents[5]


def kafka_source_conf(jars: Path | str | Sequence[Path | str]) -> dict[str, str]:
    """Session settings that make ``spark.read.format("kafka")`` available: ``spark.jars``
    naming the connector's jars (a directory of them, or the files). They must be set
    when the session's JVM starts: a running JVM does not load new data sources."""
    if isinstance(jars, (str, Path)):
        directory = Path(jars)
        files = sorted(directory.glob("*.jar")) if directory.is_dir() else [directory]
    else:
        files = [Path(jar) for jar in jars]
    if not any(f.name.startswith("spark-sql-kafka-0-10_2.13") for f in files):
        raise FileNotFoundError(
            f"no {SPARK_KAFKA_ARTIFACT} jar in {jars}; fetch it at PySpark's version with "
            "scripts/spark-kafka-jars (make spark-kafka-jars)"
        )
    return {"spark.jars": ",".join(str(f.resolve()) for f in files)}


class SparkKafkaJarsMissingError(EddylineError):
    """Spark's Kafka source is not where the build was told, or not anywhere it looked."""


def checkout_jars() -> Path | None:
    """``.cache/spark-kafka/<PySpark's version>/jars`` of the checkout this module runs
    from (what ``make spark-kafka-jars`` fills); None when it is not a checkout."""
    if not (_CHECKOUT / "tools" / "spark-kafka" / "pom.xml").is_file():
        return None
    return _CHECKOUT / ".cache" / "spark-kafka" / pyspark.__version__ / "jars"


def connector_conf(
    jars: Path | str | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """:func:`kafka_source_conf` for the jars a build was given: ``jars`` (the CLI's
    ``--spark-kafka-jars``), else ``$EDDYLINE_SPARK_KAFKA_JARS``, else the checkout's cache.
    Raises :class:`SparkKafkaJarsMissingError` naming where it looked and the way out."""
    environ = os.environ if environ is None else environ
    if jars is not None:
        where, origin = Path(jars), "--spark-kafka-jars"
    elif environ.get(JARS_ENV):
        where, origin = Path(environ[JARS_ENV]), f"${JARS_ENV}"
    else:
        found = checkout_jars()
        if found is None:
            raise SparkKafkaJarsMissingError(
                f"a kafka:// changelog is read with Spark's Kafka source ({SPARK_KAFKA_ARTIFACT} "
                f"{pyspark.__version__}), and no jars for it were given: set {JARS_ENV} or "
                "pass --spark-kafka-jars to a directory holding them (the restore image sets "
                "it; from a checkout, make spark-kafka-jars fetches them)"
            )
        where, origin = (
            found,
            f"the checkout's cache (neither --spark-kafka-jars nor {JARS_ENV} set)",
        )
    try:
        return kafka_source_conf(where)
    except FileNotFoundError:
        raise SparkKafkaJarsMissingError(
            f"no {SPARK_KAFKA_ARTIFACT} jar in {where} ({origin}): run make spark-kafka-jars "
            f"(scripts/spark-kafka-jars) for PySpark {pyspark.__version__}, or point "
            f"{JARS_ENV} / --spark-kafka-jars at a directory holding that version's jars"
        ) from None


def with_connector(conf: Mapping[str, str], jars: Path | str | None = None) -> dict[str, str]:
    """``conf`` (a build's Spark settings) able to read Kafka: the connector's jars
    (:func:`connector_conf`) added to any ``spark.jars`` given. A ``spark.jars`` that names
    the connector already is kept as it is: spark-submit hands the restore Job's settings
    to its driver that way, and the driver must not look for the jars a second time."""
    merged = dict(conf)
    given = [jar for jar in merged.get("spark.jars", "").split(",") if jar]
    if any(Path(jar).name.startswith("spark-sql-kafka-0-10_2.13") for jar in given):
        return merged
    merged["spark.jars"] = ",".join([*given, connector_conf(jars)["spark.jars"]])
    return merged


# Offsets below the last stable offset searched for the last record: a changelog's
# tail is one commit marker per transaction, rarely an aborted transaction or two.
_TAIL_SEARCH = 64


def data_end(log: KafkaLog, tp: TopicPartition, start: int) -> int:
    """The offset after the last committed record: the last stable offset less the
    transaction markers (and aborted records) that end the partition.

    A build's manifest says its store is committed at ``end - 1``; the runtime
    judges it against ``Log.end_offset``, which on Kafka is this same data end
    once a reader has been there. Had the range ended at the last stable offset,
    a manifest at a commit marker would be one past that end and refused."""
    end = log.end_offset(tp)
    position = max(start, end - _TAIL_SEARCH)
    last = -1
    while position < end:
        records = log.fetch(tp, position, _TAIL_SEARCH).records
        if not records:
            break
        last = records[-1].offset
        position = last + 1
    if last >= 0:
        return last + 1
    # Nothing but markers from the start: empty. Else no record in the tail searched.
    return start if end - _TAIL_SEARCH <= start else end


class KafkaChangelogSource:
    """Changelogs on a Kafka cluster, read by Spark's Kafka source (module docstring).

    ``settings`` are the log's client settings (librdkafka names, as in the
    StreamApp's log Secret); those of the ``security.``/``sasl.``/``ssl.`` families
    are handed to Spark's Java client as ``kafka.<name>`` too.
    """

    def __init__(
        self,
        log_url: str,
        settings: Mapping[str, object] | None = None,
        *,
        topic_prefix: str = "",
    ) -> None:
        self.log_url = log_url
        self.settings = dict(settings or {})
        self.topic_prefix = topic_prefix

    def _log(self) -> KafkaLog:
        return KafkaLog.open(self.log_url, self.settings, topic_prefix=self.topic_prefix)

    def bounds(self, topic: str, partitions: Sequence[int]) -> Mapping[int, ChangelogBounds]:
        log = self._log()
        try:
            found = {}
            for partition in partitions:
                tp = TopicPartition(topic, partition)
                found[partition] = read_bounds(log, tp, data_end(log, tp, log.beginning_offset(tp)))
            return found
        finally:
            log.close()

    def load(self, spark: SparkSession, topic: str, ranges: Sequence[OffsetRange]) -> DataFrame:
        log = self._log()
        try:
            bootstrap, real = log.settings.bootstrap, log.real_topic(topic)
        finally:
            log.close()
        # One read per range: Spark's options take one range per Kafka partition, and a
        # build splits a partition into several ranges read in parallel.
        reads = [
            self._read(spark, bootstrap, real, piece) for piece in ranges if piece.end > piece.start
        ]
        if not reads:
            return spark.createDataFrame([], "partition int, offset long, key binary, value binary")
        return reduce(DataFrame.unionAll, reads)

    def _read(
        self, spark: SparkSession, bootstrap: str, real: str, piece: OffsetRange
    ) -> DataFrame:
        reader = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("assign", json.dumps({real: [piece.partition]}))
            .option("startingOffsets", json.dumps({real: {str(piece.partition): piece.start}}))
            .option("endingOffsets", json.dumps({real: {str(piece.partition): piece.end}}))
            .option("kafka.isolation.level", "read_committed")
            .option("failOnDataLoss", "false")
        )
        for key, value in self._client_options().items():
            reader = reader.option(key, value)
        rows: DataFrame = reader.load()
        return rows.where(F.col("key").isNotNull()).select(
            F.col("partition").cast("int").alias("partition"),
            F.col("offset").cast("long").alias("offset"),
            "key",
            "value",
        )

    def _client_options(self) -> dict[str, Any]:
        """Security settings of the log, in the Java client's names (``kafka.`` prefix)."""
        return {
            f"kafka.{key}": str(value)
            for key, value in self.settings.items()
            if key.startswith(("security.", "sasl.", "ssl."))
        }
