"""The pure parts of ``make bench-queries`` (tests/bench/bench_queries.py): how an answer is
judged against the changelog, and what the per-operation figures and the verdict mean."""

from __future__ import annotations

import dataclasses

from tests.bench.bench_queries import (
    Answer,
    summarize,
    targets_met,
    window_name,
    wrong_answers,
)


def _answer(key: str, value: int | None, offset: int | None) -> Answer:
    return Answer(
        started=1.0, latency_ms=5.0, key=key, found=value is not None, value=value,
        partition=0, changelog_offset=offset, role="active",
    )  # fmt: skip


# One changelog partition: (offset, word, count); offset 3 is a transaction marker's gap.
CHANGELOG = [(0, "a", 1), (1, "b", 1), (2, "a", 2), (4, "a", 3), (5, "b", None)]


def test_an_answer_is_right_when_it_equals_the_count_as_of_its_changelog_offset() -> None:
    right = [
        _answer("a", None, -1),  # before any record: not found
        _answer("a", 1, 0),
        _answer("a", 2, 2),
        _answer("a", 2, 3),  # the marker's offset: still the record at 2
        _answer("a", 3, 5),
        _answer("b", 1, 4),
        _answer("b", None, 5),  # a tombstone: not found
    ]
    assert wrong_answers(right, CHANGELOG) == []


def test_a_stale_or_future_value_or_a_missing_offset_is_wrong_and_says_why() -> None:
    stale = _answer("a", 1, 2)  # the copy includes offset 2, so its count is 2
    ahead = _answer("a", 3, 2)
    missing = _answer("b", None, 1)
    unplaced = _answer("a", 3, None)
    wrong = dict(wrong_answers([stale, ahead, missing, unplaced], CHANGELOG))
    assert set(wrong) == {stale, ahead, missing, unplaced}
    assert wrong[stale] == (
        "a: 1 from a active copy at changelog offset 2, the changelog says 2"
    )  # fmt: skip
    assert "no changelog_offset" in wrong[unplaced]


def test_failed_queries_are_counted_as_failed_not_judged_and_in_the_p99() -> None:
    answered = [_answer("a", 3, 5) for _ in range(98)]
    timed_out = Answer(started=1.0, latency_ms=2000.0, key="a", error="TimeoutError: timed out")
    slow = Answer(started=1.0, latency_ms=150.0, key="a", found=True, value=3, partition=0,
                  changelog_offset=5, staleness_ms=900)  # fmt: skip
    answers = [*answered, slow, timed_out]
    assert wrong_answers(answers, CHANGELOG) == []
    figures = summarize("upgrade", answers, wrong=0, duration_s=4.0)
    assert figures == {
        "upgrade_queries": 100.0,
        "upgrade_failed": 1.0,
        "upgrade_wrong": 0.0,
        "upgrade_p99_ms": 150.0,  # nearest rank: the 99th of 100
        "upgrade_max_staleness_ms": 900.0,
        "upgrade_duration_s": 4.0,
        "upgrade_qps": 25.0,
    }
    assert summarize("evict", [], wrong=0, duration_s=1.0)["evict_p99_ms"] == -1.0


def test_targets_need_answers_and_no_failure_wrong_answer_or_slow_p99() -> None:
    good = summarize("evict", [_answer("a", 3, 5)], wrong=0, duration_s=1.0)
    assert targets_met(good, ["evict"])
    assert not targets_met({**good, "evict_failed": 1.0}, ["evict"])
    assert not targets_met({**good, "evict_wrong": 1.0}, ["evict"])
    assert not targets_met({**good, "evict_p99_ms": 100.0}, ["evict"])
    assert not targets_met(summarize("evict", [], wrong=0, duration_s=1.0), ["evict"])


def test_the_recreate_upgrade_is_a_baseline_beside_the_targets() -> None:
    good = summarize("evict", [_answer("a", 3, 5)], wrong=0, duration_s=1.0)
    failed = _answer("b", 3, 5)
    baseline = summarize(
        "upgrade_recreate",
        [dataclasses.replace(failed, error="connection refused")],
        wrong=0,
        duration_s=1.0,
    )
    assert baseline["upgrade_recreate_failed"] == 1.0
    assert targets_met({**good, **baseline}, ["evict", "upgrade_recreate"])
    # A later round's window is held to the same rule as the first's.
    later = {k.replace("upgrade_recreate", window_name("upgrade_recreate", 2)): v
             for k, v in baseline.items()}  # fmt: skip
    assert targets_met({**good, **later}, ["evict", "upgrade_recreate_r2"])
    evict_r3 = {k.replace("evict", window_name("evict", 3)): v for k, v in good.items()}
    assert not targets_met({**evict_r3, "evict_r3_failed": 1.0}, ["evict_r3"])
