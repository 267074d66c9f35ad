"""The real Prometheus (3.16, built from its Go module) scrapes a running instance's
``/metrics`` and the operator's, and stores what they say about each family: counters for
Kafka's ``-total`` metrics, gauges for the rest, with their HELP. Static targets by address;
scraping through Kubernetes service discovery is left to the control-plane tests to come.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eddyline_operator import metrics as operator_metrics
from eddyline_operator.metrics import OperatorMetrics
from eddyline_runtime.log import SqliteLog
from tests.support.prometheus import prometheus_api, running_prometheus
from tests.support.query_cluster import started_cluster
from tests.support.waiting import wait_for

LINES = ["apple banana cherry", "banana cherry", "cherry date"] * 4
# Scrapes come every second; a few rounds are enough on a busy machine.
SCRAPED_TIMEOUT_SECONDS = 90


def test_prometheus_scrapes_the_runtime_and_the_operator_with_types_and_help(
    tmp_path: Path,
) -> None:
    group = started_cluster(tmp_path / "group", LINES, SqliteLog)
    registry = OperatorMetrics()
    registry.app_started("apps", "wc")
    registry.record_cycle("apps", "wc", operator_metrics.OK, 0.02)
    operator = operator_metrics.serve("http://127.0.0.1:0/metrics", registry)
    try:
        targets = {
            "streamapp": [node.address for node in group.nodes],
            "operator": [operator.url.removeprefix("http://").removesuffix("/metrics")],
        }
        with running_prometheus(tmp_path / "prometheus", targets) as url:

            def all_up() -> bool:
                up = prometheus_api(url, "query", query="up")["result"]
                return len(up) == 4 and all(sample["value"][1] == "1" for sample in up)

            wait_for(all_up, "every target scraped and up", SCRAPED_TIMEOUT_SECONDS)

            def metadata(metric: str) -> dict[str, Any]:
                found = prometheus_api(url, "metadata", metric=metric)
                (entry,) = found[metric]
                return dict(entry)

            commits = metadata("eddyline_stream_thread_metrics_commit_total")
            assert commits["type"] == "counter"
            assert commits["help"] == "The total number of commits"
            assert metadata("eddyline_stream_thread_metrics_commit_rate")["type"] == "gauge"
            assert metadata(operator_metrics.CYCLES)["type"] == "counter"
            assert metadata(operator_metrics.LAST_SUCCESS)["type"] == "gauge"
            # The values arrive too: every instance committed the input it processed.
            committed = prometheus_api(
                url,
                "query",
                query="sum by (instance) (eddyline_stream_thread_metrics_commit_total)",
            )["result"]
            assert len(committed) == 3 and all(float(s["value"][1]) >= 1 for s in committed)
    finally:
        operator.close()
        group.close()
