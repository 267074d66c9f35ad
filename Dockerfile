# eddyline: one image for the operator (`eddyline-operator`) and for StreamApp pods
# (`eddyline run ...`); the operator's Deployment and the StatefulSets it writes name the
# command. Users build FROM it and add their topology package to the Python path.
# Multi-stage: eddyline and its dependencies are installed into a virtual environment in the
# build stage, and the final stage copies only that environment (no wheels, no pip cache) and
# runs as a non-root user. `make image` builds it (docs/containers.md).
#
# The base is a build argument only so that the project's tests can build on a local stand-in
# where no registry is reachable (scripts/base-images); what users build and pull is on
# python:3.11-slim.
ARG PYTHON_BASE=python:3.11-slim

FROM ${PYTHON_BASE} AS build
RUN python -m venv /opt/eddyline/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runtime ./runtime
COPY operator ./operator
# kubernetes.aio, the Kubernetes client's asyncio copy of itself (68 MB of the 126 MB the
# client installs), is never imported: the operator uses kubernetes.client and .config only
# (tests/unit/test_dockerfile.py checks that).
RUN /opt/eddyline/venv/bin/pip install --no-cache-dir '.[operator]' \
    && rm -rf /opt/eddyline/venv/lib/python3.11/site-packages/kubernetes/aio

FROM ${PYTHON_BASE}
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin eddyline \
    && mkdir -p /var/lib/eddyline && chown eddyline /var/lib/eddyline
COPY --from=build /opt/eddyline/venv /opt/eddyline/venv
ENV PATH=/opt/eddyline/venv/bin:$PATH
USER 10001
# state.dir lives on the pod's volume; the runtime never writes elsewhere (and /tmp).
ENV EDDYLINE_STATE_DIR=/var/lib/eddyline/state
VOLUME ["/var/lib/eddyline"]
CMD ["eddyline", "--help"]
