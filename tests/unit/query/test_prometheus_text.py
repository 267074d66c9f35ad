"""The runtime's /metrics text: Kafka's cumulative ``-total`` metrics as counters, the rest as
gauges, each family with the HELP its metric was registered with."""

from __future__ import annotations

import pytest

from eddyline_runtime.metrics import MetricName, MetricsRegistry
from eddyline_runtime.query.prometheus import metric_type, render_prometheus


def test_total_metrics_are_counters_and_the_rest_gauges_each_with_its_help() -> None:
    registry = MetricsRegistry()
    for thread in ("t1", "t2"):
        tags = {"thread-id": thread}
        registry.register(
            MetricName.of("stream-thread-metrics", "commit-total", tags),
            lambda: 3.0,
            description="The total number of commits",
        )
        registry.register(
            MetricName.of("stream-thread-metrics", "commit-rate", tags),
            lambda: 0.5,
            description="Commits per second",
        )
    text = render_prometheus(registry.snapshot(), registry.descriptions())
    assert text.splitlines() == [
        "# HELP eddyline_stream_thread_metrics_commit_rate Commits per second",
        "# TYPE eddyline_stream_thread_metrics_commit_rate gauge",
        'eddyline_stream_thread_metrics_commit_rate{thread_id="t1"} 0.5',
        'eddyline_stream_thread_metrics_commit_rate{thread_id="t2"} 0.5',
        "# HELP eddyline_stream_thread_metrics_commit_total The total number of commits",
        "# TYPE eddyline_stream_thread_metrics_commit_total counter",
        'eddyline_stream_thread_metrics_commit_total{thread_id="t1"} 3.0',
        'eddyline_stream_thread_metrics_commit_total{thread_id="t2"} 3.0',
    ]


def test_the_type_follows_kafkas_cumulative_suffix() -> None:
    assert metric_type(MetricName("stream-task-metrics", "dropped-records-total")) == "counter"
    assert metric_type(MetricName("stream-task-metrics", "dropped-records-rate")) == "gauge"
    # "total" inside a name is not the suffix.
    assert metric_type(MetricName("g", "total-bytes")) == "gauge"


def test_help_escapes_backslashes_and_line_feeds() -> None:
    registry = MetricsRegistry()
    registry.register(MetricName("g", "m"), lambda: 1.0, description='a\\b "c"')
    text = render_prometheus(registry.snapshot(), registry.descriptions())
    assert '# HELP eddyline_g_m a\\\\b "c"' in text.splitlines()


def test_a_metric_needs_one_description_whatever_its_tags() -> None:
    registry = MetricsRegistry()
    with pytest.raises(ValueError, match=r"metric g/m: give it a description"):
        registry.register(MetricName("g", "m"), lambda: 1.0, description="  ")
    registry.register(MetricName.of("g", "m", {"task-id": "0_0"}), lambda: 1.0, description="M")
    with pytest.raises(ValueError, match=r"metric g/m is described twice: 'M' and 'Other'"):
        registry.register(
            MetricName.of("g", "m", {"task-id": "0_1"}), lambda: 1.0, description="Other"
        )
    # The same description again (another task's copy) is fine.
    registry.register(MetricName.of("g", "m", {"task-id": "0_1"}), lambda: 2.0, description="M")
    assert registry.descriptions() == {("g", "m"): "M"}
