"""The real ``promtool`` and Prometheus server, built by ``scripts/build-prometheus`` from
the Go module that ``tools/prometheus`` pins: ``check metrics`` lints an endpoint's text,
``test rules`` runs the chart's alert unit tests, and the server scrapes endpoints given
by address (static targets: scraping through Kubernetes service discovery is still to come).

Never a skip when Go is missing: the script's error says what to install, and ``make test``
builds the binaries first (``make prometheus``).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from tests.support.ports import free_port
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-prometheus"
# A first build compiles Prometheus' dependency tree: minutes on a busy two-core machine.
BUILD_TIMEOUT_SECONDS = 1800
# The server opens its (empty) database and answers /-/ready in a second or two.
READY_TIMEOUT_SECONDS = 60
# It flushes its head block on SIGTERM: small here.
STOP_TIMEOUT_SECONDS = 30


@cache
def prometheus_bin() -> Path:
    """The directory holding ``prometheus`` and ``promtool`` (built the first time)."""
    completed = subprocess.run(
        [str(SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS, check=False
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{SCRIPT.name} failed:\n{completed.stderr}")
    return Path(completed.stdout.strip().splitlines()[-1])


def promtool(
    *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``promtool ARGS`` (never raises on its exit code: the caller asserts on it)."""
    return subprocess.run(
        [str(prometheus_bin() / "promtool"), *args],
        input=stdin, capture_output=True, text=True, cwd=cwd, timeout=120, check=False,
    )  # fmt: skip


@contextlib.contextmanager
def running_prometheus(home: Path, targets: Mapping[str, Sequence[str]]) -> Iterator[str]:
    """The real Prometheus server on a free loopback port, scraping ``targets`` (job name ->
    ``host:port`` addresses, each at ``/metrics``) every second; yields its base URL and
    stops it (SIGTERM, then SIGKILL) when the block ends."""
    home.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(addresses)}]}
            for job, addresses in targets.items()
        ],
    }
    (home / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (home / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [str(prometheus_bin() / "prometheus"), f"--config.file={home / 'prometheus.yml'}",
             f"--storage.tsdb.path={home / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(
                lambda: process.poll() is not None or _ready(url),
                f"Prometheus ready at {url}",
                READY_TIMEOUT_SECONDS,
            )
            if process.poll() is not None:
                raise RuntimeError(
                    f"Prometheus exited with {process.returncode}:\n"
                    + (home / "prometheus.log").read_text()
                )
            yield url
        finally:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def prometheus_api(url: str, path: str, **params: str) -> Any:
    """``GET <url>/api/v1/<path>?params``'s ``data`` (AssertionError when not a success)."""
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}/api/v1/{path}?{query}", timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
