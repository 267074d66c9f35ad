"""Joins as topology authors see them: ``JoinWindows`` and what each join node does.

Semantics are Kafka Streams' (3.1 and later):

* **KStream-KStream** (``stream.join/left_join/outer_join(other, joiner, windows,
  store_name=...)``): a record of one side meets every record of the other side
  with the same key whose timestamp lies in ``[t - before, t + after]`` (seen from
  the left side; the right side looks the other way). Both sides are buffered in
  window stores (``<store_name>-this-join-store`` and ``-other-join-store``, with
  ``outer-`` inserted for the outer sides as Kafka names them), kept for
  ``before + after + grace``. A result is ``joiner(left, right)`` timestamped with
  the later of the two records. For a left or outer join, a record that found no
  partner waits in a shared store of non-joined records
  (``<store_name>-left-shared-join-store`` / ``-outer-shared-join-store``) and
  comes out as ``joiner(left, None)`` (or ``joiner(None, right)``) only once its
  window has closed (stream time past its timestamp + after/before + grace), and
  only if no partner arrived meanwhile: never a spurious early null join. A record
  already older than its window when it arrives gets its null join at once.
  Records with a null value are dropped (``dropped-records-total``), and so are
  null keys on an inner side; a left/outer side's keyless record is null-joined
  at once (KIP-962).
* **KStream-KTable** (``stream.join/left_join(table, joiner)``): each stream record
  meets the table's current value for its key; the result keeps the stream
  record's timestamp. A left join emits ``joiner(value, None)`` when the table has
  nothing, and also for a null key.
* **KTable-KTable** (``table.join/left_join/outer_join(other, joiner)``): an update
  on either side recomputes the result for its key from the other side's store;
  results are table changes (new and old value), a side's tombstone gives the
  result's tombstone (inner) or ``joiner(left, None)`` (left/outer), timestamped
  with the later of the update and the other side's value.

The processors are in :mod:`~eddyline_runtime.processing.operators.joins`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eddyline_runtime.processing.topology import TopologyError

# A joiner: (left value, right value) -> result (a missing side is None).
ValueJoiner = Callable[[Any, Any], Any]


@dataclass(frozen=True, slots=True)
class JoinWindows:
    """How far apart two records may be to join: the right record's time within
    ``[left - before, left + after]``; ``grace`` accepts records that late."""

    before_ms: int
    after_ms: int
    grace_ms: int

    @classmethod
    def of_time_difference_with_grace(cls, difference_ms: int, grace_ms: int) -> JoinWindows:
        """Kafka's ``ofTimeDifferenceAndGrace``: ``difference_ms`` both ways."""
        windows = cls(difference_ms, difference_ms, grace_ms)
        windows._check()
        return windows

    @classmethod
    def of_time_difference_without_grace(cls, difference_ms: int) -> JoinWindows:
        """Kafka's ``ofTimeDifferenceWithNoGrace``."""
        return cls.of_time_difference_with_grace(difference_ms, 0)

    def before(self, before_ms: int) -> JoinWindows:
        """The same windows looking ``before_ms`` back from a left record (may be negative
        as long as before + after >= 0)."""
        windows = JoinWindows(before_ms, self.after_ms, self.grace_ms)
        windows._check()
        return windows

    def after(self, after_ms: int) -> JoinWindows:
        """The same windows looking ``after_ms`` ahead of a left record."""
        windows = JoinWindows(self.before_ms, after_ms, self.grace_ms)
        windows._check()
        return windows

    @property
    def size_ms(self) -> int:
        return self.before_ms + self.after_ms

    @property
    def retention_ms(self) -> int:
        """How long each side's window store keeps a record: before + after + grace."""
        return self.size_ms + self.grace_ms

    def _check(self) -> None:
        for what, value in (
            ("before", self.before_ms),
            ("after", self.after_ms),
            ("grace", self.grace_ms),
        ):
            if type(value) is not int:
                raise TopologyError(
                    f"JoinWindows: {what} must be a whole number of milliseconds, got {value!r}"
                )
        if self.size_ms < 0:
            raise TopologyError(
                f"JoinWindows: before ({self.before_ms} ms) + after ({self.after_ms} ms) must be "
                ">= 0: no record could join"
            )
        if self.grace_ms < 0:
            raise TopologyError(f"JoinWindows: the grace period must be >= 0, got {self.grace_ms}")
