# Stands in for maven:3.9-eclipse-temurin-17, which no registry here serves: Debian bookworm's
# OpenJDK 17 and Maven (3.8) on the debootstrapped bookworm root file system. Test-only: the
# build stage of restore.Dockerfile runs `mvn dependency:copy-dependencies` in it.
ARG ROOTFS
FROM ${ROOTFS}
RUN export DEBIAN_FRONTEND=noninteractive \
    && apt-get update \
    && apt-get install --yes --no-install-recommends openjdk-17-jdk-headless maven \
    && rm -rf /var/lib/apt/lists/*
CMD ["mvn", "--version"]
