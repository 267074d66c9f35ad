"""Removes from a directory of fetched jars every one PySpark ships already (by artifact
name, any version), keeping what PySpark lacks: the Kafka connector, kafka-clients,
commons-pool2 and the token provider. PySpark's own jars (Hadoop, Scala, slf4j 2, lz4,
snappy) win on the class path anyway, and older copies beside them only invite conflicts.
Run by scripts/spark-kafka-jars and by restore.Dockerfile, with the PySpark they serve.
    usage: python tools/spark-kafka/prune_jars.py JARS_DIR
"""

import pathlib
import re
import sys

import pyspark


def artifact(jar: pathlib.Path) -> str:
    return re.sub(r"-[0-9][^-]*\.jar$", "", jar.name)


own = {artifact(j) for j in (pathlib.Path(pyspark.__file__).parent / "jars").glob("*.jar")}
for jar in pathlib.Path(sys.argv[1]).glob("*.jar"):
    if artifact(jar) in own:
        jar.unlink()
