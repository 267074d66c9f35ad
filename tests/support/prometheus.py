"""The real ``promtool`` (and Prometheus server), built by ``scripts/build-prometheus`` from
the Go module that ``tools/prometheus`` pins: ``check metrics`` lints an endpoint's text,
``test rules`` runs the chart's alert unit tests.

Never a skip when Go is missing: the script's error says what to install, and ``make test``
builds the binaries first (``make prometheus``).
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-prometheus"
# A first build compiles Prometheus' dependency tree: minutes on a busy two-core machine.
BUILD_TIMEOUT_SECONDS = 1800


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
