# The Spark restore-job image (`eddyline restore build`): the eddyline image plus a Java
# runtime, PySpark and pyarrow, and Spark's Kafka source for kafka:// changelogs. The
# eddyline image itself stays without a JVM; pods ingest builds with rocksdict alone.
# Build the eddyline image first (`make image`):
#   docker build -f restore.Dockerfile --build-arg BASE=eddyline:dev -t eddyline-restore:dev .
ARG BASE=eddyline:dev
# PySpark's version, and so the Kafka source's: the connector is compiled against one
# Spark release. It is the `spark` extra's pin in pyproject.toml (tests/unit checks it).
ARG SPARK_VERSION=4.2.0

# Spark's Kafka source and what it needs, fetched with the pom `make spark-kafka-jars`
# uses (tools/spark-kafka/pom.xml), at the image's PySpark version.
FROM maven:3.9-eclipse-temurin-17 AS spark-kafka
ARG SPARK_VERSION
COPY tools/spark-kafka/pom.xml /build/pom.xml
RUN mvn -q -B -f /build/pom.xml dependency:copy-dependencies -Dspark.version=${SPARK_VERSION} \
    -DincludeScope=runtime -DoutputDirectory=/build/jars

FROM ${BASE}
ARG SPARK_VERSION
USER root
RUN apt-get update \
    && apt-get install --yes --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir "pyspark==${SPARK_VERSION}" 'pyarrow>=18'
COPY --from=spark-kafka /build/jars /opt/eddyline/spark-kafka/jars
COPY tools/spark-kafka/prune_jars.py /opt/eddyline/spark-kafka/prune_jars.py
# Keep only the jars PySpark lacks, as scripts/spark-kafka-jars does on a checkout.
RUN python /opt/eddyline/spark-kafka/prune_jars.py /opt/eddyline/spark-kafka/jars
# Where `eddyline restore build` finds them for kafka:// logs (kafka_source.JARS_ENV).
ENV EDDYLINE_SPARK_KAFKA_JARS=/opt/eddyline/spark-kafka/jars
USER 10001
ENTRYPOINT ["eddyline", "restore"]
