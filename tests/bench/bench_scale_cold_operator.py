"""The operator with warm-ups off: ``make bench-scale``'s cold-move run beside the warm one.

Issue 25 asks for the scaling steps "with warm-ups disabled beside it". The runtime refuses
``max.warmup.replicas: 0`` (Kafka Streams' lower bound is 1: a task moves only to a warm
member, so at least one warm-up must run) and the operator always assigns with the app's
warm-up policy, so no setting turns them off. This entry point runs the very same operator
(``eddyline-operator``) with its warm-up policy replaced by none: the assignor then publishes
its balanced target at once, and each stateful task that moves restores its store on the new
pod before it processes again (the operator as it was before KIP-441). Only the benchmark
starts it (``tests/bench/bench_scale.py``, ``ColdOperator``); it is no product mode.
"""

from __future__ import annotations

import sys
from typing import Any

from eddyline_operator import __main__ as entry
from eddyline_operator.reconcile import plan


def _no_warmups(*_args: Any, **_kwargs: Any) -> None:
    return None  # assign(..., warmups=None): the balanced target, tasks move cold


if not callable(getattr(plan, "warmup_policy", None)):
    # Replacing a name plan.py no longer calls would leave warm-ups on and the "cold" figures
    # warm: refuse instead.
    raise SystemExit(
        "eddyline_operator.reconcile.plan no longer calls warmup_policy: update "
        "tests/bench/bench_scale_cold_operator.py to turn warm-ups off where plan.py now does"
    )
plan.warmup_policy = _no_warmups  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(entry.main())
