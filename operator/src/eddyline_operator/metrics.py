"""The operator's own metrics, in Prometheus' text exposition format (``GET /metrics``).

What an operator of the operator watches (issue 25's ops conventions, as Strimzi's operators
export theirs): reconcile cycles per app and outcome, how long a cycle takes, when each app's
last cycle succeeded, how many apps this replica manages and how many of them are paused
(``eddyline.dev/pause-reconciliation``), the autoscaler's scaling decisions, and per app the
topology upgrades rolled back and the Spark restore Jobs that failed (the chart's
EddylineUpgradeRolledBack alert reads the first).

Why not ``prometheus_client``: it is not a dependency of the project, and eight families
with a fixed set of labels are a few dozen lines; the runtime's exporter
(``eddyline_runtime.query.prometheus``) writes its own text the same way.

Why a server of its own (``http.server`` on a daemon thread) and not kopf's: kopf's liveness
endpoint serves ``/healthz`` only, and a scrape must be answered even while kopf's event
loop is busy. :func:`serve` starts it; ``eddyline-operator`` calls it when
``EDDYLINE_OPERATOR_METRICS`` names an address (the chart sets
``http://$(POD_IP):<metrics.port>/metrics``).

The registry is one per process (:data:`METRICS`), as the series it holds are the
process's: the reconcile daemon records cycles into it and the autoscaler calls
:func:`record_scaling_decision`; a test builds an :class:`OperatorMetrics` of its own.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# The environment variable naming the address to serve on (unset: no endpoint).
METRICS_ENV = "EDDYLINE_OPERATOR_METRICS"

PREFIX = "eddyline_operator_"
CYCLES = PREFIX + "reconcile_cycles_total"
CYCLE_SECONDS = PREFIX + "reconcile_cycle_duration_seconds"
APPS = PREFIX + "apps"
APPS_PAUSED = PREFIX + "apps_paused"
SCALING_DECISIONS = PREFIX + "scaling_decisions_total"
LAST_SUCCESS = PREFIX + "last_successful_reconcile_timestamp_seconds"
UPGRADE_ROLLBACKS = PREFIX + "upgrade_rollbacks_total"
RESTORE_JOBS_FAILED = PREFIX + "restore_jobs_failed_total"

# A cycle's outcomes: it planned and acted; the app is paused (nothing changed); it
# raised (retried at the next beat); the StreamApp is gone or being deleted.
OK, PAUSED, FAILED, GONE = "ok", "paused", "failed", "gone"
OUTCOMES = (OK, PAUSED, FAILED, GONE)

# Cycle durations: a settled app's cycle takes milliseconds (a few GETs), one that asks
# slow pods for their reports or applies children takes seconds.
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_TYPES = {
    CYCLES: ("counter", "Reconcile cycles the daemon ran, per app and outcome"),
    CYCLE_SECONDS: ("histogram", "How long a reconcile cycle took, per app"),
    APPS: ("gauge", "StreamApps this operator replica manages (a running daemon), per namespace"),
    APPS_PAUSED: (
        "gauge",
        "StreamApps whose last cycle found eddyline.dev/pause-reconciliation set, per namespace",
    ),
    SCALING_DECISIONS: ("counter", "Scaling decisions of the autoscaler, per app and direction"),
    # An app whose cycles keep failing (or hang) ages here: the chart's
    # EddylineOperatorNotReconciling alert reads it.
    LAST_SUCCESS: (
        "gauge",
        "When the app's last reconcile cycle succeeded (ok or paused), in seconds since the "
        "epoch; its daemon's start until the first, per app with a running daemon",
    ),
    UPGRADE_ROLLBACKS: (
        "counter",
        "Full-cluster topology upgrades whose new revision failed and that the operator "
        "rolled back (counted when the rollback starts), per app",
    ),
    RESTORE_JOBS_FAILED: (
        "counter",
        "Spark restore Jobs the operator saw fail (their pods replay the changelog instead), "
        "per app",
    ),
}

# The per-app counters that start at 0 with the app's daemon: Prometheus' increase() does not
# see a series' first sample as an increase, so a counter that first appears at 1 (the
# first rollback) would never make EddylineUpgradeRolledBack fire.
_PER_APP_COUNTERS = (UPGRADE_ROLLBACKS, RESTORE_JOBS_FAILED)

Labels = tuple[tuple[str, str], ...]


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        # Each bucket counts the values at or below its bound (cumulated when rendered).
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.buckets):  # above the last bound: only in +Inf (the count)
            self.counts[index] += 1
        self.total += value
        self.count += 1


class OperatorMetrics:
    """The operator's series, thread-safe (cycles run on worker threads)."""

    def __init__(
        self,
        buckets: tuple[float, ...] = CYCLE_BUCKETS,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"histogram buckets must be distinct and ascending, got {buckets}")
        self._buckets = buckets
        self._lock = threading.Lock()
        self._cycles: Counter[Labels] = Counter()
        self._durations: dict[Labels, _Histogram] = {}
        self._decisions: Counter[Labels] = Counter()
        # UPGRADE_ROLLBACKS and RESTORE_JOBS_FAILED: family -> (namespace, app) -> count.
        self._per_app: dict[str, Counter[tuple[str, str]]] = {
            name: Counter() for name in _PER_APP_COUNTERS
        }
        # The apps with a running daemon: (namespace, name) -> paused at its last cycle.
        self._apps: dict[tuple[str, str], bool] = {}
        # The apps with a running daemon: (namespace, name) -> wall-clock time of their
        # last successful cycle (of the daemon's start before the first).
        self._succeeded: dict[tuple[str, str], float] = {}
        self._clock = clock

    def app_started(self, namespace: str, app: str) -> None:
        with self._lock:
            self._apps.setdefault((namespace, app), False)
            self._succeeded.setdefault((namespace, app), self._clock())
            for counts in self._per_app.values():
                counts[(namespace, app)] += 0  # the series exists from now on, at 0

    def app_stopped(self, namespace: str, app: str) -> None:
        """The app's daemon ended (deleted, or another replica took over): it leaves the
        gauges; its counters stay, as counters must not go down."""
        with self._lock:
            self._apps.pop((namespace, app), None)
            self._succeeded.pop((namespace, app), None)

    def record_cycle(self, namespace: str, app: str, outcome: str, seconds: float) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"cycle outcome {outcome!r}: expected one of {', '.join(OUTCOMES)}")
        labels = (("namespace", namespace), ("app", app))
        with self._lock:
            self._cycles[(*labels, ("outcome", outcome))] += 1
            self._durations.setdefault(labels, _Histogram(self._buckets)).observe(seconds)
            key = (namespace, app)
            if key in self._apps and outcome in (OK, PAUSED):
                # A failed cycle tells nothing about the annotation: keep what was known.
                self._apps[key] = outcome == PAUSED
                self._succeeded[key] = self._clock()

    def record_scaling_decision(self, namespace: str, app: str, direction: str) -> None:
        if not direction:
            raise ValueError("a scaling decision needs a direction, such as 'up' or 'down'")
        with self._lock:
            self._decisions[(("namespace", namespace), ("app", app), ("direction", direction))] += 1

    def record_upgrade_rollback(self, namespace: str, app: str) -> None:
        """An upgrade's new revision failed and the operator started rolling it back."""
        with self._lock:
            self._per_app[UPGRADE_ROLLBACKS][(namespace, app)] += 1

    def record_restore_job_failed(self, namespace: str, app: str, count: int = 1) -> None:
        """``count`` restore Jobs of the app were seen failed (each once)."""
        if count < 0:
            raise ValueError(f"a count of failed restore Jobs cannot be negative, got {count}")
        with self._lock:
            self._per_app[RESTORE_JOBS_FAILED][(namespace, app)] += count

    def render(self) -> str:
        """Every family in Prometheus' text format (families without samples keep their
        ``# TYPE`` line, so a scrape shows what exists before anything happened)."""
        with self._lock:
            cycles = dict(self._cycles)
            durations = {k: (list(h.counts), h.total, h.count) for k, h in self._durations.items()}
            decisions = dict(self._decisions)
            apps = dict(self._apps)
            succeeded = dict(self._succeeded)
            per_app = {name: dict(counts) for name, counts in self._per_app.items()}
        managed: Counter[str] = Counter(namespace for namespace, _ in apps)
        paused: Counter[str] = Counter(ns for (ns, _), is_paused in apps.items() if is_paused)
        samples: dict[str, list[str]] = {name: [] for name in _TYPES}
        samples[CYCLES] = [
            _sample(CYCLES, labels, value) for labels, value in sorted(cycles.items())
        ]
        for labels, (counts, total, count) in sorted(durations.items()):
            cumulative = 0
            for bound, in_bucket in zip(self._buckets, counts, strict=True):
                cumulative += in_bucket
                le = (("le", _number(bound)),)
                samples[CYCLE_SECONDS].append(
                    _sample(f"{CYCLE_SECONDS}_bucket", labels + le, cumulative)
                )
            samples[CYCLE_SECONDS].append(
                _sample(f"{CYCLE_SECONDS}_bucket", (*labels, ("le", "+Inf")), count)
            )
            samples[CYCLE_SECONDS].append(_sample(f"{CYCLE_SECONDS}_sum", labels, total))
            samples[CYCLE_SECONDS].append(_sample(f"{CYCLE_SECONDS}_count", labels, count))
        for namespace in sorted(managed):
            ns = (("namespace", namespace),)
            samples[APPS].append(_sample(APPS, ns, managed[namespace]))
            samples[APPS_PAUSED].append(_sample(APPS_PAUSED, ns, paused[namespace]))
        samples[LAST_SUCCESS] = [
            _sample(LAST_SUCCESS, (("namespace", namespace), ("app", app)), at)
            for (namespace, app), at in sorted(succeeded.items())
        ]
        samples[SCALING_DECISIONS] = [
            _sample(SCALING_DECISIONS, labels, value) for labels, value in sorted(decisions.items())
        ]
        for name, by_app in per_app.items():
            samples[name] = [
                _sample(name, (("namespace", namespace), ("app", app)), value)
                for (namespace, app), value in sorted(by_app.items())
            ]
        lines: list[str] = []
        for name, (kind, help_text) in _TYPES.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples[name]]
        return "\n".join(lines) + "\n"


def family_names() -> Iterator[str]:
    """Every metric name a scrape can hold (a histogram's ``_bucket``, ``_sum`` and
    ``_count``), for whoever must query only what exists (the chart's dashboard test)."""
    for name, (kind, _) in _TYPES.items():
        if kind == "histogram":
            yield from (f"{name}_bucket", f"{name}_sum", f"{name}_count")
        else:
            yield name


# The process's registry: what /metrics serves.
METRICS = OperatorMetrics()


def record_scaling_decision(namespace: str, app: str, direction: str) -> None:
    """Count one scaling decision of the autoscaler (``direction``: ``up`` or ``down``)."""
    METRICS.record_scaling_decision(namespace, app, direction)


def _sample(name: str, labels: Labels, value: float) -> str:
    if not labels:
        return f"{name} {_number(value)}"
    rendered = ",".join(f'{key}="{_escape(text)}"' for key, text in labels)
    return f"{name}{{{rendered}}} {_number(value)}"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class MetricsServer:
    """``GET <path>`` answers the registry's text; anything else 404. Daemon threads: the
    operator's exit never waits for a scrape."""

    def __init__(self, address: str, metrics: OperatorMetrics = METRICS) -> None:
        host, port, path = parse_address(address)
        registry = metrics

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != path:
                    self.send_error(404, f"metrics are served at {path}")
                    return
                body = registry.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a scrape every few seconds would drown the operator's log

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as error:
            raise OSError(
                f"{METRICS_ENV}={address}: cannot listen on {host}:{port} ({error}); choose "
                "another port (the chart's metrics.port) or unset it to serve no metrics"
            ) from error
        self._server.daemon_threads = True
        bound_host, bound_port = self._server.server_address[:2]
        self.url = f"http://{_host(str(bound_host))}:{bound_port}{path}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="eddyline-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve(address: str, metrics: OperatorMetrics = METRICS) -> MetricsServer:
    """Serve ``metrics`` at ``address`` (``http://host:port/path``; port 0: any free one)."""
    return MetricsServer(address, metrics)


def parse_address(address: str) -> tuple[str, int, str]:
    """``http://host:port/path`` as (host, port, path); ValueError says what is wrong."""
    parts = urlsplit(address.strip())
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ValueError(
            f"{METRICS_ENV}={address!r}: expected http://<host>:<port>/<path>, such as "
            "http://0.0.0.0:9090/metrics"
        )
    return parts.hostname, port, parts.path or "/metrics"


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
