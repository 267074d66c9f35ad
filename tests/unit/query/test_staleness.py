"""A copy's staleness by role (query/staleness.py), and the bound's parameter."""

from __future__ import annotations

import pytest

from eddyline_runtime.engine.queryable import LocalStorePartition
from eddyline_runtime.errors import InvalidArgumentError
from eddyline_runtime.membership import StoreRole
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.query.staleness import CopyFreshness, copy_freshness, parse_max_staleness
from eddyline_runtime.restore.replay.lag import LagInfo

NOW = 1_000_000


def copy(
    role: StoreRole, *, running: bool, caught_up_at: int | None, committed_at: int | None
) -> LocalStorePartition:
    def no_reader(_: object) -> object:
        raise AssertionError("staleness never reads the store")

    return LocalStorePartition(
        store="counts",
        partition=0,
        task=TaskId(1, 0),
        role=role,
        running=running,
        lag=LagInfo(5, 9, caught_up_at),
        open_reader=no_reader,  # type: ignore[arg-type]
        committed_at_ms=committed_at,
    )


def test_the_fresh_active_copy_is_the_committed_state_now() -> None:
    active = copy(StoreRole.ACTIVE, running=True, caught_up_at=NOW - 500, committed_at=NOW - 500)
    freshness = copy_freshness(active, fresh=True, now_ms=NOW)
    assert (freshness.as_of_ms, freshness.staleness_ms) == (NOW, 0)


def test_a_copy_whose_task_moved_away_is_as_stale_as_its_last_commit() -> None:
    moving = copy(StoreRole.ACTIVE, running=True, caught_up_at=None, committed_at=NOW - 700)
    freshness = copy_freshness(moving, fresh=False, now_ms=NOW)
    assert freshness.staleness_ms == 700
    assert freshness.within(700) and not freshness.within(699)


def test_a_standby_is_as_stale_as_its_last_catch_up() -> None:
    standby = copy(StoreRole.STANDBY, running=False, caught_up_at=NOW - 40, committed_at=None)
    assert copy_freshness(standby, fresh=False, now_ms=NOW).staleness_ms == 40


def test_a_copy_that_never_caught_up_is_never_within_a_bound() -> None:
    restoring = copy(StoreRole.ACTIVE, running=False, caught_up_at=None, committed_at=None)
    freshness = copy_freshness(restoring, fresh=False, now_ms=NOW)
    assert freshness == CopyFreshness(NOW, None)
    assert freshness.staleness_ms is None and not freshness.within(10**12)


@pytest.mark.parametrize("text", ["-1", "1.5", "soon", ""])
def test_a_bound_that_is_not_whole_milliseconds_is_refused_naming_the_form(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="whole number of milliseconds"):
        parse_max_staleness(text)
    assert parse_max_staleness("0") == 0
