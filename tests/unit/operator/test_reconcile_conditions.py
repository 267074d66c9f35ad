"""Conditions as a vocabulary: their types are ``ConditionType``, they are built only in
``reconcile/conditions.py``, and the status written is composed there once."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import eddyline_operator
from eddyline_operator.reconcile.conditions import Conditions, compose_status
from eddyline_operator.reconcile.plan import Observed, plan
from eddyline_runtime.spec import (
    AutoscalingStatus,
    Condition,
    ConditionStatus,
    ConditionType,
    Phase,
    StreamAppStatus,
)
from tests.support.k8s_objects import body, pod, three_zones

Obj = dict[str, Any]
NOW = "2026-11-27T10:00:00Z"
PACKAGE = Path(eddyline_operator.__file__).parent
BUILDER = PACKAGE / "reconcile" / "conditions.py"


def test_conditions_are_built_only_in_the_conditions_module() -> None:
    """Nothing else calls ``Condition(...)`` or ``Conditions.make``/``seeded``: a part that
    owns a condition's meaning hands over a Seed instead (issue 37)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == BUILDER:
            continue
        for call in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(call, ast.Call):
                continue
            func = call.func
            if (isinstance(func, ast.Name) and func.id == "Condition") or (
                isinstance(func, ast.Attribute) and func.attr in ("make", "seeded")
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{call.lineno}")
    assert found == []


def test_every_condition_a_cycle_writes_has_a_type_of_the_vocabulary() -> None:
    app = body(replicas=3)
    pods = [pod(i) for i in range(2)]
    cycles = [
        plan(Observed(body=app, pods=pods, nodes=three_zones(), now=NOW)),
        plan(Observed(body=body(replicas=-1), pods=pods, nodes=three_zones(), now=NOW)),
    ]
    paused = body(replicas=3)
    paused["metadata"]["annotations"] = {"eddyline.dev/pause-reconciliation": "true"}
    cycles.append(plan(Observed(body=paused, pods=pods, nodes=three_zones(), now=NOW)))
    types = [c.type for result in cycles for c in result.status.conditions]
    assert types and all(t in set(ConditionType) for t in types)
    assert {ConditionType.READY, ConditionType.DEGRADED, ConditionType.PAUSED} <= set(types)


def _status() -> StreamAppStatus:
    conditions = Conditions([], now=NOW, generation=4)
    ready = conditions.make(ConditionType.READY, True, "AllReplicasReady", "3/3 pods ready")
    degraded = conditions.make(ConditionType.DEGRADED, False, "AsExpected", "")
    return StreamAppStatus(observedGeneration=4, phase=Phase.RUNNING, conditions=[ready, degraded])


def test_the_written_status_carries_the_autoscalers_part_and_nothing_else_changes() -> None:
    scaling = AutoscalingStatus(currentReplicas=3, desiredReplicas=4)
    status, event = compose_status(_status(), autoscaling=scaling, now=NOW)
    assert event is None
    assert status.autoscaling == scaling
    assert status.model_copy(update={"autoscaling": None}) == _status()


def test_refused_children_make_the_written_status_degraded_with_one_warning() -> None:
    refusals = [("NameConflict", "Service wc-query is not this app's"), ("ApplyFailed", "x")]
    status, event = compose_status(
        _status(), autoscaling=None, refusals=refusals, previous=_status().conditions, now=NOW
    )
    degraded = next(c for c in status.conditions if c.type == ConditionType.DEGRADED)
    assert (degraded.status, degraded.reason) == (ConditionStatus.TRUE, "NameConflict")
    assert degraded.message == "Service wc-query is not this app's; x"
    assert degraded.observed_generation == 4
    assert status.phase is Phase.DEGRADED
    assert event is not None and (event.type, event.reason) == ("Warning", "NameConflict")
    # The same refusals again: the condition stands, no second warning.
    again, repeated = compose_status(
        _status(), autoscaling=None, refusals=refusals, previous=status.conditions, now=NOW
    )
    assert repeated is None
    assert again.conditions == status.conditions


def test_a_suspended_app_stays_suspended_when_a_child_is_refused() -> None:
    suspended = _status().model_copy(update={"phase": Phase.SUSPENDED})
    status, _ = compose_status(
        suspended, autoscaling=None, refusals=[("ApplyFailed", "refused")], now=NOW
    )
    assert status.phase is Phase.SUSPENDED
    assert [c.type for c in status.conditions].count(ConditionType.DEGRADED) == 1


def test_a_condition_of_a_type_another_tool_wrote_still_reads() -> None:
    """``Condition.type`` stays a string: status read back may hold foreign types."""
    foreign = Condition.model_validate(
        {"type": "BackupTaken", "status": "True", "reason": "Done", "lastTransitionTime": NOW}
    )
    assert foreign.type == "BackupTaken"
