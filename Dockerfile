# eddyline runtime image: what each StreamApp pod runs. Users build FROM it and
# add their topology package. Multi-stage: wheels are built with the compiler
# toolchain, the runtime stage carries only the installed packages, non-root.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runtime ./runtime
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin eddyline \
    && mkdir -p /var/lib/eddyline && chown eddyline /var/lib/eddyline
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
# state.dir lives on the pod's volume; the runtime never writes elsewhere.
ENV EDDYLINE_STATE_DIR=/var/lib/eddyline
VOLUME ["/var/lib/eddyline"]
ENTRYPOINT ["eddyline"]
