"""Metrics in Prometheus' text exposition format (``GET /metrics``).

Kafka's (group, name, tags) become ``eddyline_<group>_<name>{tag="..."}``
with dashes as underscores, e.g. ``eddyline_stream_thread_metrics_commit_total``.
Every metric is exported as a gauge: the registry holds current values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from eddyline_runtime.metrics import MetricName

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def metric_family(name: MetricName) -> str:
    return "eddyline_" + _INVALID.sub("_", f"{name.group}_{name.name}")


def render_prometheus(snapshot: Mapping[MetricName, float]) -> str:
    families: dict[str, list[str]] = {}
    for name, value in sorted(snapshot.items()):
        labels = ",".join(f'{_INVALID.sub("_", key)}="{_escape(tag)}"' for key, tag in name.tags)
        sample = metric_family(name) + (f"{{{labels}}}" if labels else "")
        families.setdefault(metric_family(name), []).append(f"{sample} {_number(value)}")
    lines: list[str] = []
    for family, samples in families.items():
        lines.append(f"# TYPE {family} gauge")
        lines.extend(samples)
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
