"""The real ``promtool`` and Prometheus server, built by ``scripts/build-prometheus`` from
the Go module that ``tools/prometheus`` pins: ``check metrics`` lints an endpoint's text,
``test rules`` runs the chart's alert unit tests, and the server scrapes endpoints given
by address (static targets) or found through Kubernetes service discovery against an API
server, with the scrape config the Prometheus Operator derives from a rendered PodMonitor
(:func:`pod_monitor_scrape_config`).

Never a skip when Go is missing: the script's error says what to install, and ``make test``
builds the binaries first (``make prometheus``).
"""

from __future__ import annotations

import contextlib
import json
import re
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


def pod_monitor_scrape_config(
    monitor: Mapping[str, Any], *, api_server: str, ca_file: Path, token_file: Path
) -> dict[str, Any]:
    """The scrape config the Prometheus Operator generates for a rendered PodMonitor with one
    endpoint (its ``generatePodMonitorConfig``, the parts the chart's monitor uses): pods found
    through Kubernetes service discovery (``role: pod``) against ``api_server`` with the CA
    and a ServiceAccount's token, kept when their labels match ``selector.matchLabels`` and
    the container port is the endpoint's, labelled ``namespace``/``pod``/``container``/
    ``job``/``endpoint`` as the operator does, then the monitor's own relabelings. The
    scrape interval is Prometheus' global one (a test's second), not the monitor's.

    A monitor using what this does not translate (matchExpressions, several endpoints,
    metricRelabelings) is refused by name rather than scraped differently from a cluster.
    """
    meta, spec = monitor["metadata"], monitor["spec"]
    selector = spec["selector"]
    if set(selector) - {"matchLabels"}:
        raise ValueError(
            f"PodMonitor {meta['name']}: only selector.matchLabels is translated "
            f"(found {sorted(selector)}): extend pod_monitor_scrape_config"
        )
    (endpoint,) = spec["podMetricsEndpoints"]
    unknown = set(endpoint) - {"port", "path", "interval", "relabelings"}
    if unknown:
        raise ValueError(
            f"PodMonitor {meta['name']}: endpoint fields {sorted(unknown)} are not translated: "
            "extend pod_monitor_scrape_config"
        )
    namespaces = spec.get("namespaceSelector", {})
    discovery: dict[str, Any] = {
        "role": "pod",
        "api_server": api_server,
        "tls_config": {"ca_file": str(ca_file)},
        "authorization": {"credentials_file": str(token_file)},
    }
    if not namespaces.get("any", False):
        discovery["namespaces"] = {"names": namespaces.get("matchNames", [meta["namespace"]])}
    relabel: list[dict[str, Any]] = []
    for label, value in sorted(selector.get("matchLabels", {}).items()):
        name = _sanitized(label)
        relabel.append({
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_pod_label_{name}",
                              f"__meta_kubernetes_pod_labelpresent_{name}"],
            "regex": f"({value});true",
        })  # fmt: skip
    port = endpoint["port"]
    job = f"{meta['namespace']}/{meta['name']}"
    relabel += [
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
         "regex": port},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": job},
        {"target_label": "endpoint", "replacement": port},
    ]  # fmt: skip
    for rule in endpoint.get("relabelings", []):
        relabel.append({_snake(key): value for key, value in rule.items()})
    return {
        "job_name": f"podMonitor/{job}/0",
        "metrics_path": endpoint.get("path", "/metrics"),
        "kubernetes_sd_configs": [discovery],
        "relabel_configs": relabel,
    }


def _sanitized(label: str) -> str:
    """A Kubernetes label name as service discovery spells it in a meta label."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _snake(key: str) -> str:
    """A Prometheus Operator relabeling field (``sourceLabels``) as Prometheus' own
    (``source_labels``)."""
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)


@contextlib.contextmanager
def running_prometheus(
    home: Path,
    targets: Mapping[str, Sequence[str]] | None = None,
    *,
    scrape_configs: Sequence[Mapping[str, Any]] = (),
    rule_groups: Sequence[Mapping[str, Any]] = (),
) -> Iterator[str]:
    """The real Prometheus server on a free loopback port, scraping ``targets`` (job name ->
    ``host:port`` addresses, each at ``/metrics``) and ``scrape_configs`` every second and
    evaluating ``rule_groups`` (a PrometheusRule's ``spec.groups``) every second; yields its
    base URL and stops it (SIGTERM, then SIGKILL) when the block ends."""
    home.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(addresses)}]}
            for job, addresses in (targets or {}).items()
        ]
        + [dict(scrape) for scrape in scrape_configs],
    }
    if rule_groups:
        (home / "rules.yml").write_text(json.dumps({"groups": list(rule_groups)}))
        config["rule_files"] = [str(home / "rules.yml")]
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
