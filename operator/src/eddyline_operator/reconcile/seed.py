"""What a part of the cycle says about one condition, before it is a condition.

The parts that own a condition's meaning (``upgrade.py``: Upgrading and its Degraded,
``restore_job.py``: Restoring, ``scale_in.py``: ScalingIn) return a :class:`Seed`;
:mod:`.conditions` alone turns seeds into ``Condition`` objects (transition times,
observed generation), so a condition is built in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from eddyline_runtime.spec import ConditionType


@dataclass(frozen=True)
class Seed:
    type: ConditionType
    status: bool
    reason: str
    message: str
