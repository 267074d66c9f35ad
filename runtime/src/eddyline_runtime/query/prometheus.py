"""Metrics in Prometheus' text exposition format, version 0.0.4 (``GET /metrics``).

Kafka's (group, name, tags) become ``eddyline_<group>_<name>{tag="..."}``
with dashes as underscores, e.g. ``eddyline_stream_thread_metrics_commit_total``.

Types follow Kafka's own split: its ``-total`` metrics are cumulative (a ``CumulativeSum``
or ``CumulativeCount``: they only grow, and start again at zero with the process), so they
are counters, which ``rate()`` and ``increase()`` read across restarts; every other metric
(a windowed rate, an average, a maximum, a lag, a size) is a current value, a gauge. In
the 0.0.4 text format a counter's family carries its ``_total`` suffix (only OpenMetrics
moves it from the family to the sample), so the names Prometheus stores are the ones
exported before counters were typed, and ``promtool check metrics`` finds the suffix on
every counter and on nothing else. Each family's HELP is the description its metric was
registered with (:meth:`~eddyline_runtime.metrics.MetricsRegistry.register`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from eddyline_runtime.metrics import MetricName

_INVALID = re.compile(r"[^a-zA-Z0-9_]")
# Kafka's suffix for a cumulative metric (a counter, see above).
_CUMULATIVE_SUFFIX = "-total"


def metric_family(name: MetricName) -> str:
    return "eddyline_" + _INVALID.sub("_", f"{name.group}_{name.name}")


def metric_type(name: MetricName) -> str:
    """``counter`` for Kafka's cumulative ``-total`` metrics, ``gauge`` for the rest."""
    return "counter" if name.name.endswith(_CUMULATIVE_SUFFIX) else "gauge"


def render_prometheus(
    snapshot: Mapping[MetricName, float], descriptions: Mapping[tuple[str, str], str]
) -> str:
    """``snapshot``'s values, with each family's HELP from ``descriptions`` (by Kafka's
    (group, name), as :meth:`MetricsRegistry.descriptions` gives them)."""
    families: dict[str, tuple[MetricName, list[str]]] = {}
    for name, value in sorted(snapshot.items()):
        labels = ",".join(f'{_INVALID.sub("_", key)}="{_escape(tag)}"' for key, tag in name.tags)
        family = metric_family(name)
        sample = family + (f"{{{labels}}}" if labels else "")
        families.setdefault(family, (name, []))[1].append(f"{sample} {_number(value)}")
    lines: list[str] = []
    for family, (name, samples) in families.items():
        description = descriptions.get((name.group, name.name))
        if description is not None:
            lines.append(f"# HELP {family} {_escape_help(description)}")
        lines.append(f"# TYPE {family} {metric_type(name)}")
        lines.extend(samples)
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    # HELP escapes backslashes and line feeds only (a quote stays as it is).
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
