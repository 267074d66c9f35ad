# eddyline: one image for the operator (`eddyline-operator`) and for StreamApp pods
# (`eddyline run ...`); the operator's Deployment and the StatefulSets it writes name the
# command. Users build FROM it and add their topology package to the Python path.
# Multi-stage: wheels are built with the compiler toolchain, the final stage carries only
# the installed packages and runs as a non-root user. `make image` builds it.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runtime ./runtime
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[operator]'

FROM python:3.11-slim
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin eddyline \
    && mkdir -p /var/lib/eddyline && chown eddyline /var/lib/eddyline
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
# state.dir lives on the pod's volume; the runtime never writes elsewhere (and /tmp).
ENV EDDYLINE_STATE_DIR=/var/lib/eddyline/state
VOLUME ["/var/lib/eddyline"]
CMD ["eddyline", "--help"]
