"""A windowed stream-stream left join SIGKILLed mid-run and restarted under exactly-once.

The input (impressions and the clicks on some of them, two co-partitioned topics)
spans less than the join window, so no window closes and the committed output is
the same whatever order the task interleaves the two topics in: every click joined
with its impression, once. A crash that lost the window stores (or the shared
store of non-joined impressions) would lose the joins whose two records were
processed on both sides of a restart; one that repeated committed work would
duplicate results. Before the third run the state directory is deleted, so the
stores are restored from their changelogs. Both sides' window stores and the shared store are task
stores, committed with the output in one transaction.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from tests.support.crash_runs import committed_records, kill_and_restart

WORKER = "tests.integration.processing.join_eos_worker"
IMPRESSIONS, PARTITIONS, KILLS = 6000, 2, 3


def generate(log: SqliteLog) -> Counter[tuple[str, str]]:
    """Impressions 50 ms apart (5 minutes in all, within the 10-minute window), clicks
    on every third (two on every ninth); the expected joins."""
    log.create_topic("impressions", PARTITIONS)
    log.create_topic("clicks", PARTITIONS)
    expected: Counter[tuple[str, str]] = Counter()
    impressions: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
    clicks: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
    for i in range(IMPRESSIONS):
        key, at = f"ad-{i}", 1_000_000 + i * 50
        partition = i % PARTITIONS
        impressions[partition].append(Record(key.encode(), f"imp{i}".encode(), at))
        for n in range(0 if i % 3 else (2 if i % 9 == 0 else 1)):
            clicks[partition].append(Record(key.encode(), f"click{i}.{n}".encode(), at + 25 + n))
            expected[(key, f"imp{i}+click{i}.{n}")] += 1
    for partition in range(PARTITIONS):
        log.produce(TopicPartition("impressions", partition), impressions[partition])
        log.produce(TopicPartition("clicks", partition), clicks[partition])
    return expected


def committed_output(log: SqliteLog) -> Counter[tuple[str, str]]:
    return Counter(
        (record.key.decode(), record.value.decode())  # type: ignore[union-attr]
        for record in committed_records(log, "joined", PARTITIONS)
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_stream_stream_join_survives_sigkills_under_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    log = SqliteLog(path)
    expected = generate(log)
    log.close()
    # After a commit (a batch of up to 1,000 records per task), within the next batch.
    kill_and_restart(WORKER, path, tmp_path, kills=KILLS, seed=24, final_timeout=120)
    log = SqliteLog(path)
    try:
        found = committed_output(log)
    finally:
        log.close()
    assert_exactly_once(found, expected)


def assert_exactly_once(
    found: Counter[tuple[str, str]], expected: Counter[tuple[str, str]]
) -> None:
    """Each expected join result committed exactly once, and nothing else."""
    assert set(expected.values()) == {1}, "the generator makes each join result unique"
    repeated = {result: n for result, n in found.items() if n > 1}
    missing = sorted(expected.keys() - found.keys())
    unexpected = sorted(found.keys() - expected.keys())
    assert not repeated, f"{len(repeated)} join results committed more than once: {repeated}"
    assert not missing, f"{len(missing)} join results never committed: {missing[:10]}"
    assert not unexpected, f"{len(unexpected)} results no join makes: {unexpected[:10]}"


def test_the_exactly_once_check_fails_on_a_repeated_result() -> None:
    expected = Counter({("ad-0", "imp0+click0.0"): 1, ("ad-3", "imp3+click3.0"): 1})
    assert_exactly_once(Counter(expected), expected)
    for wrong in (
        expected + Counter({("ad-0", "imp0+click0.0"): 1}),  # a result repeated
        Counter({("ad-0", "imp0+click0.0"): 1}),  # one missing
        expected + Counter({("ad-1", "imp1+null"): 1}),  # one no join makes
    ):
        with pytest.raises(AssertionError):
            assert_exactly_once(wrong, expected)
