"""The pure parts of ``make bench-scale`` (tests/bench/bench_scale.py): what its figures mean."""

from __future__ import annotations

import math
from pathlib import Path

from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from tests.bench.bench_scale import (
    LAST_COMMIT,
    RESTORE_TOTAL,
    CommitGaps,
    RestoreTally,
    balanced,
    parse_metrics,
    targets_met,
    uncommitted_records,
)


def test_metrics_are_parsed_by_family_with_their_labels() -> None:
    text = "\n".join(
        [
            f"# TYPE {LAST_COMMIT} gauge",
            f'{LAST_COMMIT}{{task_id="1_0",thread_id="t-1"}} 1700000000123.0',
            f'{LAST_COMMIT}{{task_id="1_1",thread_id="t-1"}} NaN',
            f'{RESTORE_TOTAL}{{store="word-counts",task_id="1_0",thread_id="t-1"}} 42.0',
            'eddyline_other{task_id="1_0"} 7.0',
        ]
    )
    samples = parse_metrics(text, [LAST_COMMIT])
    assert [(s[1]["task_id"], s[2]) for s in samples[:1]] == [("1_0", 1700000000123.0)]
    assert len(samples) == 2 and math.isnan(samples[1][2])
    (restore,) = parse_metrics(text, [RESTORE_TOTAL])
    assert restore[1] == {"store": "word-counts", "task_id": "1_0", "thread_id": "t-1"}


def test_the_longest_gap_spans_a_move_from_the_old_owner_to_the_new_one() -> None:
    gaps = CommitGaps()
    gaps.observe(10.0, {"1_0": 9.9, "0_0": 9.95})
    gaps.observe(10.25, {"1_0": 10.2, "0_0": 10.2})
    # The old owner closed the task (its metric is gone); the new one has not committed.
    gaps.observe(10.5, {"0_0": 10.45})
    gaps.observe(11.5, {"0_0": 11.45, "1_0": math.nan})
    gaps.observe(11.75, {"0_0": 11.7, "1_0": 11.7})
    assert math.isclose(gaps.longest, 11.5 - 10.2)
    assert gaps.worst_task == "1_0"
    # A commit seen late (an older value from a slow pod) never shortens what was seen.
    gaps.observe(12.0, {"1_0": 11.0, "0_0": 11.95})
    assert math.isclose(gaps.longest, 11.5 - 10.2)


def test_only_restores_the_step_caused_are_counted() -> None:
    before = {("p0", "1_0", "s"): 100.0, ("p1", "1_1", "s"): 5.0}
    tally = RestoreTally(before)
    tally.observe({("p0", "1_0", "s"): 100.0, ("p1", "1_1", "s"): 5.0})
    assert tally.records == 0
    # 1_1 moved to p2 (restored 30), and came back to p1 restoring 7.
    tally.observe({("p0", "1_0", "s"): 100.0, ("p2", "1_1", "s"): 30.0})
    tally.observe({("p0", "1_0", "s"): 100.0, ("p1", "1_1", "s"): 7.0})
    assert tally.records == 37


def _membership(active: dict[str, list[str]], warmup: dict[str, list[str]] | None = None) -> dict:  # type: ignore[type-arg]
    assignment = {
        "members": [{"id": m} for m in active],
        "active": active,
        "standby": {m: [] for m in active},
    }
    if warmup:
        assignment["warmup"] = warmup
    return {"generation": 3, "assignment": assignment}


def test_balance_needs_every_member_its_share_and_no_warm_up() -> None:
    stateful = [f"1_{p}" for p in range(6)]
    even = {"a": ["0_0", "1_0", "1_1"], "b": ["1_2", "1_3"], "c": ["1_4", "1_5"]}
    assert balanced(_membership(even), ["a", "b", "c"], stateful)
    assert not balanced(_membership(even, {"d": ["1_0"]}), ["a", "b", "c"], stateful)
    assert not balanced(_membership(even), ["a", "b", "c", "d"], stateful)
    uneven = {"a": ["1_0", "1_1", "1_2"], "b": ["1_3", "1_4", "1_5"], "c": ["0_0"]}
    assert not balanced(_membership(uneven), ["a", "b", "c"], stateful)


def test_targets_hold_only_with_no_restore_short_gaps_and_every_key_answered() -> None:
    summary = {
        f"{prefix}{step}_{key}": value
        for prefix in ("", "cold_")
        for step in ("scale_out", "scale_in", "evict")
        for key, value in (
            ("critical_path_restored", 0.0),
            ("commit_gap_s", 0.8),
            ("keys_unanswered", 0.0),
            ("to_balance_s", 30.0),
        )
    }
    summary["cold_scale_out_critical_path_restored"] = 50_000.0  # the cold run may restore
    summary["cold_scale_out_commit_gap_s"] = 20.0
    assert targets_met(summary)
    assert not targets_met({**summary, "evict_commit_gap_s": 2.0})
    assert not targets_met({**summary, "scale_in_critical_path_restored": 1.0})
    assert not targets_met({**summary, "cold_evict_keys_unanswered": 10.0})


def test_the_lag_is_what_the_group_has_not_committed_on_input_and_repartition_topics(
    tmp_path: Path,
) -> None:
    log = SqliteLog(tmp_path / "log.db")
    try:
        log.create_topic("text-lines", 2)
        log.create_topic("wordcount-counts-repartition", 1)
        log.create_topic("word-counts", 1)  # output: not the app's input
        for tp, count in (
            (TopicPartition("text-lines", 0), 10),
            (TopicPartition("text-lines", 1), 4),
            (TopicPartition("wordcount-counts-repartition", 0), 7),
            (TopicPartition("word-counts", 0), 100),
        ):
            log.produce(tp, [Record(None, b"x", 0) for _ in range(count)])
        assert uncommitted_records(log, "wordcount") == 21
        log.commit_offsets(
            "wordcount",
            {
                TopicPartition("text-lines", 0): 8,
                TopicPartition("wordcount-counts-repartition", 0): 7,
            },
        )
        assert uncommitted_records(log, "wordcount") == 2 + 4
    finally:
        log.close()
