# The test-only trust layer: this machine's egress CA, on top of a stand-in base image and
# nowhere else (scripts/base-images builds it; docs/containers.md, "The trust rule").
# Package registries are reached here through a TLS-inspecting egress; pip, apt and Maven
# inside a build verify its certificates only when the image trusts the CA the host trusts.
# Never a step of the project's Dockerfiles, never an image a user pulls, never verification
# switched off: the CA files come in through the build context of this file alone.
ARG BASE
FROM ${BASE}
# The host's local CA directory (what update-ca-certificates installs from on the host).
COPY ca/ /usr/local/share/ca-certificates/
# update-ca-certificates also rebuilds Java's cacerts when ca-certificates-java is installed
# (the Maven stand-in), which is what Maven verifies against.
RUN update-ca-certificates
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
