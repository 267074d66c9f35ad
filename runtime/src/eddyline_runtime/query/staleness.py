"""Queries bounded by time: how stale a store copy's answer is, and the bound a caller sets.

KIP-535 bounds a stale read by records (``acceptable_lag``), KIP-796 by position
(query/position.py); users think in time: "no answer older than five seconds". This
module says what a copy's staleness is and whether it is within a caller's
``max_staleness_ms``.

The invariant (docs/queries.md says it for users): an answer with ``as_of_ms`` =
*t* includes every write its task committed at or before *t*, and
``staleness_ms`` = the answer's time - *t* (both on the answering pod's wall
clock, so no clock skew between pods enters). How each copy knows its *t*:

* the running active copy of a task this member's assignment gives it: it *is*
  the task's committed state, so *t* is the answer's time and staleness 0
  (its READ_COMMITTED data trails its own processing by up to one
  ``commit.interval.ms``: ``committed_at_ms`` says when it last committed);
* a copy that still runs but whose task a new assignment moved away: its last
  commit (the new owner commits only after fencing it);
* a standby, or a copy that restores: the last changelog end it was seen to have
  applied everything up to (``LagInfo.caught_up_at_ms``, the time taken before
  the end was read); until it first catches up after opening, the time its store
  was last known complete if it was closed cleanly (state/as_of_marker.py), else
  unknown (None).

A copy whose staleness is unknown is never within a bound: it cannot show that
it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.queryable import LocalStorePartition
from eddyline_runtime.errors import EddylineError, InvalidArgumentError
from eddyline_runtime.membership import StoreRole

# The query parameter the bound travels in.
MAX_STALENESS_PARAMETER = "max_staleness_ms"


@dataclass(frozen=True)
class CopyFreshness:
    """How current one copy's committed data is at ``answered_at_ms``."""

    answered_at_ms: int
    as_of_ms: int | None  # the copy includes every write committed by then; None: unknown

    @property
    def staleness_ms(self) -> int | None:
        if self.as_of_ms is None:
            return None
        return max(self.answered_at_ms - self.as_of_ms, 0)

    def within(self, max_staleness_ms: int) -> bool:
        staleness = self.staleness_ms
        return staleness is not None and staleness <= max_staleness_ms


def is_fresh(instance: StreamsInstance, local: LocalStorePartition) -> bool:
    """The running active copy of a task this instance's assignment gives it.

    Between a new assignment and the stream thread closing a task that moved
    away, the copy still runs here but the new owner may already process: its
    answers are stale from then on.
    """
    if not local.current:
        return False
    assignment = instance.assignment
    if assignment is None or local.task not in assignment.tasks:
        return True  # no assignment to compare with: the thread's own view stands
    return assignment.active_owner(local.task) == instance.member.id


def copy_freshness(local: LocalStorePartition, *, fresh: bool, now_ms: int) -> CopyFreshness:
    """A copy's freshness by the rules of the module docstring; ``fresh``: the running
    active copy of a task this member's assignment gives it (the server's judgement)."""
    if fresh:
        return CopyFreshness(now_ms, now_ms)
    if local.role is StoreRole.ACTIVE and local.running:
        return CopyFreshness(now_ms, local.committed_at_ms)
    return CopyFreshness(now_ms, local.lag.caught_up_at_ms)


def parse_max_staleness(text: str) -> int:
    """``max_staleness_ms`` as a whole number of milliseconds >= 0; an error naming the
    form otherwise."""
    if not text.isdigit():
        raise InvalidArgumentError(
            f"{MAX_STALENESS_PARAMETER}={text!r} is not a whole number of milliseconds >= 0 "
            f"(e.g. {MAX_STALENESS_PARAMETER}=5000 for answers at most five seconds stale)"
        )
    return int(text)


class StalenessBoundError(EddylineError):
    """No copy of the store could show that it is within the staleness bound.

    ``least_staleness_ms`` is the least staleness a copy reported (None: no copy
    knew its own, e.g. every one is restoring); ``attempts`` says what each copy
    asked did, as :class:`~eddyline_runtime.query.client.QueryFailedError`'s do.
    """

    def __init__(
        self,
        store: str,
        key: str,
        max_staleness_ms: int,
        least_staleness_ms: int | None,
        attempts: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.key = key
        self.max_staleness_ms = max_staleness_ms
        self.least_staleness_ms = least_staleness_ms
        self.attempts = list(attempts)
        seen = (
            "no copy knows its staleness yet (each is restoring or replaying a backlog)"
            if least_staleness_ms is None
            else f"the freshest copy is {least_staleness_ms} ms stale"
        )
        super().__init__(
            f'no copy of store "{store}" can answer key "{key}" within '
            f"{MAX_STALENESS_PARAMETER}={max_staleness_ms}: {seen}"
            + "".join(f"; {attempt}" for attempt in attempts)
            + "; retry later, raise the bound, or allow stale answers without one"
        )
