"""A Spark restore build from Kafka changelogs, in its own process: Spark's Kafka source
must be on the JVM's class path from its start (spark.jars), and the tests' other Spark
session started the JVM of the test process without it."""

import sys
from pathlib import Path

from eddyline_runtime.restore.spark.kafka_source import KafkaChangelogSource, kafka_source_conf
from eddyline_runtime.restore.spark.spark_build import build, spark_session

bootstrap, prefix, topic, partitions, output, jars = sys.argv[1:7]
spark = spark_session("local[2]", kafka_source_conf(jars))
try:
    build(
        spark,
        application="app",
        store="counts",
        changelog_topic=topic,
        partitions=[int(p) for p in partitions.split(",")],
        output=Path(output),
        source=KafkaChangelogSource(f"kafka://{bootstrap}", topic_prefix=prefix),
        split_records=700,  # several ranges per partition, read in parallel
    )
finally:
    spark.stop()
