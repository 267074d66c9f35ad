# The Spark restore-job image (`eddyline restore build`): the eddyline image plus a Java
# runtime, PySpark and pyarrow, and Spark's Kafka source for kafka:// changelogs. The
# eddyline image itself stays without a JVM; pods ingest builds with rocksdict alone.
# Build the eddyline image first (`make image`):
#   docker build -f restore.Dockerfile --build-arg BASE=eddyline:dev -t eddyline-restore:dev .
ARG BASE=eddyline:dev
# PySpark's version, and so the Kafka source's: the connector is compiled against one
# Spark release. It is the `spark` extra's pin in pyproject.toml (tests/unit checks it).
ARG SPARK_VERSION=4.2.0
# The build stage's base: a build argument only so that the project's tests can build on a
# local stand-in where no registry is reachable (scripts/base-images); users build on this.
ARG MAVEN_BASE=maven:3.9-eclipse-temurin-17

# Spark's Kafka source and what it needs, fetched with the pom `make spark-kafka-jars`
# uses (tools/spark-kafka/pom.xml), at the image's PySpark version.
FROM ${MAVEN_BASE} AS spark-kafka
ARG SPARK_VERSION
COPY tools/spark-kafka/pom.xml /build/pom.xml
RUN mvn -q -B -f /build/pom.xml dependency:copy-dependencies -Dspark.version=${SPARK_VERSION} \
    -DincludeScope=runtime -DoutputDirectory=/build/jars

# The image's Spark: a JRE, PySpark at the connector's version, pyarrow. The final image is
# this stage plus the pruned connector jars.
FROM ${BASE} AS spark
ARG SPARK_VERSION
USER root
RUN apt-get update \
    && apt-get install --yes --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir "pyspark==${SPARK_VERSION}" 'pyarrow>=18'

# Keep only the jars PySpark lacks, as scripts/spark-kafka-jars does on a checkout. In a
# stage of its own, so the ~70 MB of jars the pruning drops never become a layer of the image.
FROM spark AS spark-kafka-pruned
COPY --from=spark-kafka /build/jars /opt/eddyline/spark-kafka/jars
COPY tools/spark-kafka/prune_jars.py /opt/eddyline/spark-kafka/prune_jars.py
RUN python /opt/eddyline/spark-kafka/prune_jars.py /opt/eddyline/spark-kafka/jars

FROM spark
COPY --from=spark-kafka-pruned /opt/eddyline/spark-kafka/jars /opt/eddyline/spark-kafka/jars
# Where `eddyline restore build` finds them for kafka:// logs (kafka_source.JARS_ENV).
ENV EDDYLINE_SPARK_KAFKA_JARS=/opt/eddyline/spark-kafka/jars
USER 10001
ENTRYPOINT ["eddyline", "restore"]
