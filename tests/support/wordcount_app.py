"""``examples/wordcount`` as it ships, on the real control plane with its log on a broker.

What ``tests/e2e/test_operator_node_loss.py`` and ``tests/e2e/test_operator_scale_in.py``
share: the example's manifest applied under another name with its log on the session's
broker, waited for until Ready, and the counts its query Service (or chosen pods) must answer.
How each module writes its input (batches on demand, a steady thread) stays in the module.
Unlike :mod:`tests.support.kafka.streamapp` (a manifest of its own with a client-settings
Secret), the manifest here is the example file itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from eddyline_runtime.query.client import QueryRouter
from tests.support.cluster_word_count import create_input_topic, first_mismatch
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.operator import Operator
from tests.support.kafka.streamapp import query_service_when_ready

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
# A bound for a broken run on a loaded 2-core machine, not an expectation.
COUNT_TIMEOUT = 120


@contextmanager
def word_count_on(operator: Operator, app: str, log_url: str) -> Iterator[str]:
    """The example applied as ``app`` with its log at ``log_url`` (its input topic created
    first), until 3 pods are ready and Ready=True; yields the query Service's address and
    deletes the app afterwards, so that nothing of it keeps running (and using the 2 cores)
    for the modules after this one."""
    create_input_topic(log_url)
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["metadata"]["name"] = app
    document["spec"]["log"] = {"url": log_url}
    operator.wait_watching()
    operator.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(document))
    try:
        yield query_service_when_ready(operator, app)
    finally:
        operator.kubectl("delete", "sapp", app, "--wait=false")


class ExpectedCounts:
    """The words produced so far (acknowledged by the log: each must be counted) and the
    check that the app answers each word's count exactly."""

    def __init__(self, app: str, log_url: str, query_service: str) -> None:
        self.app = app
        self.log_url = log_url
        # Where queries start: the query Service, or chosen pods' addresses.
        self.query_addresses = [query_service]
        self.expected: Counter[str] = Counter()
        self.last_mismatch = ""

    def exact(self) -> bool:
        mismatch = first_mismatch(QueryRouter(self.query_addresses, timeout=2), self.expected)
        if mismatch is not None:
            self.last_mismatch = mismatch
        return mismatch is None

    def wait_exact(self, operator: Operator, what: str) -> None:
        """Until every count is exact; fails with the operator's view and the last answer."""
        try:
            wait_until(self.exact, what, COUNT_TIMEOUT)
        except TimeoutError as error:
            print(operator.describe_failure(self.app))
            raise AssertionError(f"{error}; last answer {self.last_mismatch}") from None
