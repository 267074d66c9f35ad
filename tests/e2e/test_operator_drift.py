"""Children changed by hand are put back, now that the drift check reads them from kopf's
watches (issue 38: ``eddyline_operator/child_cache.py``) instead of a GET per child.

On the real control plane, with the chart's RBAC and the operator's label-filtered watches:
a child deleted by hand is created again, one whose spec was edited is applied back, and one
whose managed-by label was taken off (it leaves the label-filtered watch as a DELETED event)
gets its label back. Each is noticed by the drift check at the app's own phase of
``REAPPLY_SECONDS`` (30 s); the bounds below are for a loaded 2-core machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eddyline_operator.reconcile import names
from tests.support.control_plane.client import wait_until
from tests.support.control_plane.operator import Operator
from tests.support.control_plane.operator_fixture import operator_fixture

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
APP = "drifted"
NAMESPACE = "operator-drift"
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
# A drift check per REAPPLY_SECONDS (30 s) plus a loaded machine: a bound, not an expectation.
TIMEOUT = 120

Obj = dict[str, Any]


operator = operator_fixture(NAMESPACE, directory="operator-drift")


def waited(operator: Operator, condition: Any, what: str) -> None:
    try:
        wait_until(condition, what, TIMEOUT)
    except TimeoutError:
        print(operator.describe_failure(APP))
        raise


@pytest.fixture
def app(operator: Operator) -> Iterator[str]:
    """The word count, suspended (no pods: only its children matter here)."""
    document: Obj = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document["metadata"]["name"] = APP
    document["spec"]["suspend"] = True
    operator.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(document))
    waited(
        operator,
        lambda: all(
            operator.get(group, plural, name) is not None
            for group, plural, name in (
                ("", "services", f"{APP}-query"),
                ("", "services", f"{APP}-headless"),
                ("policy", "poddisruptionbudgets", APP),
                ("apps", "statefulsets", APP),
            )
        ),
        "the app's children",
    )
    yield APP
    operator.kubectl("delete", "sapp", APP, "--wait=true", timeout=TIMEOUT)


def test_children_deleted_edited_or_unlabelled_by_hand_are_put_back(
    operator: Operator, app: str
) -> None:
    query = operator.get("", "services", f"{app}-query")
    assert query is not None
    uid = query["metadata"]["uid"]
    operator.kubectl("delete", "service", f"{app}-query")
    operator.kubectl(
        "patch", "pdb", app, "--type=merge", "-p", json.dumps({"spec": {"maxUnavailable": 3}})
    )
    operator.kubectl("label", "service", f"{app}-headless", f"{names.LABEL_MANAGED_BY}-")

    def put_back() -> bool:
        query = operator.get("", "services", f"{app}-query")
        pdb = operator.get("policy", "poddisruptionbudgets", app)
        headless = operator.get("", "services", f"{app}-headless")
        return (
            query is not None
            and query["metadata"]["uid"] != uid
            and pdb is not None
            and pdb["spec"].get("maxUnavailable") == 1
            and headless is not None
            and (headless["metadata"].get("labels") or {}).get(names.LABEL_MANAGED_BY)
            == names.OPERATOR
        )

    waited(operator, put_back, "the deleted Service, the edited PDB and the label back")
    # And again, now that the cache holds what the operator put back: a second edit of the
    # same child is seen as well.
    operator.kubectl(
        "patch", "pdb", app, "--type=merge", "-p", json.dumps({"spec": {"maxUnavailable": 2}})
    )
    waited(
        operator,
        lambda: (
            (pdb := operator.get("policy", "poddisruptionbudgets", app)) is not None
            and pdb["spec"].get("maxUnavailable") == 1
        ),
        "the PDB edited a second time back",
    )
