"""statestore.uncommitted.max.bytes: each thread's share, and pre-emptive commits."""

from __future__ import annotations

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.errors import InvalidUncommittedBytesLimitError
from eddyline_runtime.state import (
    CommitReason,
    InMemoryStore,
    TopicPartition,
    UncommittedBytesBudget,
    uncommitted_bytes,
)
from tests.support.stores import StoreFactory


def budget_of(max_bytes: int, num_stream_threads: int = 1) -> UncommittedBytesBudget:
    settings = {
        "statestore.uncommitted.max.bytes": max_bytes,
        "num.stream.threads": num_stream_threads,
    }
    return UncommittedBytesBudget(StreamsConfig.from_properties(settings, environ={}))


def test_each_thread_gets_an_equal_share() -> None:
    assert budget_of(64 * 1024 * 1024, 4).share == 16 * 1024 * 1024
    assert budget_of(-1, 4).share is None


def test_a_limit_below_minus_one_never_reaches_a_budget() -> None:
    with pytest.raises(InvalidUncommittedBytesLimitError) as error:
        budget_of(-2)
    assert '"statestore.uncommitted.max.bytes"' in str(error.value)
    assert "-1 (no limit) or a number of bytes >= 0" in str(error.value)


def test_no_limit_never_asks_for_a_commit() -> None:
    budget = budget_of(-1)
    assert all(budget.after_iteration(n * 10**9) is None for n in range(5))


def test_crossing_the_share_requests_a_commit() -> None:
    budget = budget_of(1000)
    assert budget.after_iteration(100) is None
    assert budget.after_iteration(1500) is CommitReason.LIMIT_EXCEEDED


def test_steady_growth_commits_before_the_share_is_crossed(store_factory: StoreFactory) -> None:
    """A thread loop over two real stores never holds more than its share."""
    stores = [store_factory("a"), store_factory("b")]
    budget = budget_of(2 * 50_000, num_stream_threads=2)
    offsets = dict.fromkeys(range(2), -1)
    peak, commits = 0, 0
    for iteration in range(400):
        for index, store in enumerate(stores):
            for record in range(20):
                store.put(b"%d-%d" % (iteration, record), b"v" * 100)
                offsets[index] += 1
        held = uncommitted_bytes(stores)
        peak = max(peak, held)
        reason = budget.after_iteration(held)
        if reason is not None:
            assert reason is CommitReason.PREDICTED_TO_EXCEED
            for index, store in enumerate(stores):
                store.commit({TopicPartition(f"{store.name}-changelog", 0): offsets[index]})
            budget.committed()
            commits += 1
    assert peak <= budget.share  # type: ignore[operator]
    per_iteration = 2 * 20 * (len(b"100-10") + 100)
    assert commits >= 400 * per_iteration // 50_000 - 1


def test_in_memory_stores_never_force_commits() -> None:
    store = InMemoryStore("m")
    store.put(b"k", b"v" * 1000)
    budget = budget_of(10)
    assert budget.after_iteration(uncommitted_bytes([store])) is None
