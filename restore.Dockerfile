# The Spark restore-job image (`eddyline restore build`): the eddyline image plus a Java
# runtime, PySpark and pyarrow. The eddyline image itself stays without a JVM; pods
# ingest builds with rocksdict alone. Build the eddyline image first (`make image`):
#   docker build -f restore.Dockerfile --build-arg BASE=eddyline:dev -t eddyline-restore:dev .
ARG BASE=eddyline:dev
FROM ${BASE}
USER root
# The pins are the `spark` extra's in pyproject.toml.
RUN apt-get update \
    && apt-get install --yes --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir 'pyspark==4.2.0' 'pyarrow>=18'
USER 10001
ENTRYPOINT ["eddyline", "restore"]
