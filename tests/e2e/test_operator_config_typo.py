"""Issue 23, item 11: a ``spec.config`` typo is refused by name, never pruned silently.

With typed properties only, the real API server pruned an unknown ``spec.config`` key for a
client that sends no strict field validation (``kubectl apply --validate=false``, most
client libraries): the app ran without the setting and nobody was told. ``spec.config`` now
keeps unknown keys (``x-kubernetes-preserve-unknown-fields``), so the typo reaches the
operator, which refuses the app (Degraded, InvalidSpec) naming the key and the known ones,
and applies nothing. Checked on the real API server of the control plane.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.control_plane.client import wait_until
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
APP = "typo"
NAMESPACE = "operator-config-typo"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
# A bound for a broken run on a loaded 2-core machine, not an expectation.
TIMEOUT = 120

Obj = dict[str, Any]


operator = operator_fixture(NAMESPACE, directory="operator-typo")


def test_a_config_typo_sent_without_strict_validation_is_kept_and_refused_by_name(
    operator: Operator,
) -> None:
    document: Obj = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["metadata"]["name"] = APP
    document["spec"]["config"] = {"processing.guarantee": "exactly_once_v2"}
    document["spec"]["config"]["num.standby.replica"] = 1  # the typo: replicas
    # No strict field validation: the server would have pruned the key without a word.
    operator.kubectl("apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump(document))

    stored = operator.app(APP)
    assert stored["spec"]["config"]["num.standby.replica"] == 1, "the server pruned the typo"

    def refused() -> bool:
        degraded = operator.condition(APP, "Degraded")
        return degraded is not None and degraded.get("reason") == "InvalidSpec"

    try:
        wait_until(refused, "the app Degraded with reason InvalidSpec", TIMEOUT)
    except TimeoutError:
        print(operator.describe_failure(APP))
        raise
    degraded = operator.condition(APP, "Degraded")
    assert degraded is not None
    message = degraded["message"]
    assert 'spec.config."num.standby.replica"' in message
    assert 'did you mean "num.standby.replicas"?' in message
    assert "'processing.guarantee'" in message and "'max.task.idle.ms'" in message
    assert operator.app(APP)["status"]["phase"] == "Degraded"
    # Nothing was applied for a spec the operator refused.
    assert operator.get("apps", "statefulsets", APP) is None
    assert operator.pods(APP) == {}
