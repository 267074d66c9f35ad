"""Kafka Streams' window and suppress semantics, run as a user runs them: a
``StreamsInstance`` on the embedded log, exactly-once, RocksDB stores.

The inputs, timestamps and expected outputs are Kafka Streams' facts (apache/kafka,
streams/src/test/java/org/apache/kafka/streams/kstream/internals/):

* ``KStreamWindowAggregateTest.shouldLogAndMeterWhenSkippingNullKey``'s windows
  (size 10, advance 5, no grace) and ``MockAggregator.toStringInstance("+")``;
  what a null-key record may not do follows from ``KStreamWindowAggregate``,
  which drops it before it updates the processor's ``observedStreamTime``;
* ``KStreamSessionWindowAggregateProcessorTest.shouldLogAndMeterWhenSkippingLateRecordWith
  ZeroGrace`` and ``...WithNonzeroGrace`` (gap 10; grace 0 and 1), where a session
  closes at end + gap + grace, and the session store's reads start at
  ``observed - retention + 1`` (``AbstractRocksDBSegmentedBytesStore``);
* ``SuppressScenarioTest.shouldSupportFinalResultsForTimeWindows`` (size 2, grace 1),
  split by a restart, with and without the state wiped.

The tests are ours. The record cache is off, as in Kafka's tests that read every
update (``withCachingDisabled``).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import (
    SessionWindows,
    StreamsBuilder,
    Suppressed,
    TimeWindows,
    Topology,
    WindowedKTable,
)

INPUT = TopicPartition("topic", 0)
OUTPUT = TopicPartition("output", 0)
WINDOWED = "eddyline_runtime.processing.operators.windowed"

Output = tuple[str, str | None, int]


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteLog]:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic(INPUT.topic, 1)
    yield log
    log.close()


def settings(tmp_path: Path) -> StreamsConfig:
    return StreamsConfig.from_properties(
        {
            "application.id": "app",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": "exactly_once_v2",
            "statestore.cache.max.bytes": "0",
            # Kafka's timestamps are milliseconds after the epoch, far older than any
            # changelog retention: the embedded log must not apply it during a test.
            "log.retention.check.interval.ms": str(7 * 86_400_000),
        }
    )


def run(
    topology: Topology,
    log: SqliteLog,
    config: StreamsConfig,
    records: list[tuple[str | None, str, int]],
) -> StreamsInstance:
    """Produce ``records``, run an instance until it has committed them, close it."""
    log.produce(
        INPUT,
        [
            Record(None if key is None else key.encode(), value.encode(), timestamp)
            for key, value, timestamp in records
        ],
    )
    instance = StreamsInstance(topology, config, log)
    instance.start()
    try:
        instance.wait_until_caught_up(60)
    finally:
        instance.close()
    return instance


def outputs(log: SqliteLog) -> list[Output]:
    """Every committed output record, as (key, value, timestamp)."""
    if OUTPUT.topic not in log.topics():
        return []
    return [
        (
            record.key.decode() if record.key is not None else "",
            None if record.value is None else record.value.decode(),
            record.timestamp,
        )
        for record in log.fetch(OUTPUT, 0, 100_000).records
    ]


def dropped(instance: StreamsInstance) -> float:
    return sum(
        value
        for name, value in instance.final_metrics.items()
        if (name.group, name.name) == ("stream-task-metrics", "dropped-records-total")
    )


def printed(key: Any, value: Any) -> tuple[str, str | None]:
    return str(key), None if value is None else str(value)


# -- time windows: the aggregation's own observed stream time -------------------------


def hopping_strings(windows: TimeWindows) -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream(INPUT.topic, key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(windows)
        .aggregate(
            lambda: "0",
            lambda _key, value, aggregate: f"{aggregate}+{value}",
            "topic1-Canonicalized",
            value_serde="string",
        )
        .to_stream()
        .map(printed)
        .to(OUTPUT.topic, key_serde="string", value_serde="string")
    )
    return builder.build()


def test_a_dropped_null_key_record_closes_no_window(
    log: SqliteLog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A null-key record is dropped before it reaches the aggregation's clock: its
    timestamp (100) closes neither window of A, and A's later records are on time."""
    caplog.set_level(logging.WARNING, logger=WINDOWED)
    topology = hopping_strings(TimeWindows.of_size_with_grace(10, 0).advance_by(5))
    records: list[tuple[str | None, str, int]] = [
        ("A", "1", 0),
        (None, "x", 100),
        ("A", "2", 5),
        ("A", "3", 9),
    ]
    instance = run(topology, log, settings(tmp_path), records)
    assert outputs(log) == [
        ("[A@0/10]", "0+1", 0),
        ("[A@0/10]", "0+1+2", 5),
        ("[A@5/15]", "0+2", 5),
        ("[A@0/10]", "0+1+2+3", 9),
        ("[A@5/15]", "0+2+3", 9),
    ]
    assert dropped(instance) == 1  # the null-key record, once
    assert [r.getMessage() for r in caplog.records if r.name == WINDOWED] == [
        "Skipping record due to null key. value=[x] topic=[topic] partition=[0] offset=[1]"
    ]


def test_a_window_closed_before_a_restart_stays_closed(
    log: SqliteLog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """eddyline's one difference from Kafka here (docs/windows.md): the aggregation's
    clock starts again where it was at the last commit (the newest record in its store),
    where Kafka's starts empty and would fold A@3 into a fresh [A@0/10] "0+3". Null-key
    records, before and after the restart, never move it."""
    caplog.set_level(logging.WARNING, logger=WINDOWED)
    topology = hopping_strings(TimeWindows.of_size_with_grace(10, 5))
    config = settings(tmp_path)
    first = run(topology, log, config, [("A", "1", 0), ("A", "2", 20), (None, "x", 1_000)])
    assert outputs(log) == [("[A@0/10]", "0+1", 0), ("[A@20/30]", "0+2", 20)]
    assert dropped(first) == 1
    caplog.clear()
    # Observed stream time 20 before and after: [0, 10) closed at 15, [10, 20) is open.
    second = run(
        topology, log, config, [(None, "y", 2_000), ("A", "3", 3), ("A", "4", 12), ("A", "5", 21)]
    )
    assert outputs(log)[2:] == [("[A@10/20]", "0+4", 12), ("[A@20/30]", "0+2+5", 21)]
    assert dropped(second) == 2  # the null-key record and A@3
    assert (
        "Skipping record for expired window. key=[A] topic=[topic] partition=[0] offset=[4] "
        "timestamp=[3] window=[0,10) expiration=[15] streamTime=[20]"
    ) in [r.getMessage() for r in caplog.records]


# -- session windows: closed at end + gap + grace ------------------------------------


def session_counts(windows: SessionWindows) -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream(INPUT.topic, key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(windows)
        .count("sessions")
        .to_stream()
        .map(printed)
        .to(OUTPUT.topic, key_serde="string", value_serde="string")
    )
    return builder.build()


def test_late_session_records_with_nonzero_grace(
    log: SqliteLog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """shouldLogAndMeterWhenSkippingLateRecordWithNonzeroGrace: gap 10, grace 1. At
    stream time 11 a session ending at 0 still closes at 0 + 10 + 1: OnTime2 is on time
    (and its store, retention 11, keeps it: the segment of 0 is live). At 12 it is not."""
    caplog.set_level(logging.WARNING, logger=WINDOWED)
    records: list[tuple[str | None, str, int]] = [
        ("dummy", "dummy", 0),
        ("OnTime1", "1", 0),
        ("dummy", "dummy", 11),
        ("OnTime2", "1", 0),
        ("dummy", "dummy", 12),
        ("Late1", "1", 0),
    ]
    topology = session_counts(SessionWindows.of_inactivity_gap_with_grace(10, 1))
    instance = run(topology, log, settings(tmp_path), records)
    assert outputs(log) == [
        ("[dummy@0/0]", "1", 0),
        ("[OnTime1@0/0]", "1", 0),
        # dummy@0 ended before 11 - gap: a new session (and the store reads no further
        # back than 11 - retention + 1 = 1 anyway).
        ("[dummy@11/11]", "1", 11),
        ("[OnTime2@0/0]", "1", 0),
        ("[dummy@11/11]", None, 11),
        ("[dummy@11/12]", "2", 12),
    ]
    assert dropped(instance) == 1
    assert (
        "Skipping record for expired window. key=[Late1] topic=[topic] partition=[0] "
        "offset=[5] timestamp=[0] window=[0,0] expiration=[1] streamTime=[12]"
    ) in [r.getMessage() for r in caplog.records]


def test_late_session_records_with_zero_grace(
    log: SqliteLog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """shouldLogAndMeterWhenSkippingLateRecordWithZeroGrace: gap 10, no grace; a record
    one gap behind stream time (b@0 at 10) is on time, one past it (Late1@0 at 11) is not.

    b@10 then does not merge with [b@0/0], though it is within a gap: the store's reads
    start at observed - retention + 1 = 10 - 10 + 1, as Kafka's do."""
    caplog.set_level(logging.WARNING, logger=WINDOWED)
    records: list[tuple[str | None, str, int]] = [
        ("dummy", "dummy", 0),
        ("OnTime1", "1", 0),
        ("a", "1", 10),
        ("b", "1", 0),
        ("b", "1", 10),
        ("dummy", "dummy", 11),
        ("Late1", "1", 0),
    ]
    topology = session_counts(SessionWindows.of_inactivity_gap_with_grace(10, 0))
    instance = run(topology, log, settings(tmp_path), records)
    assert outputs(log) == [
        ("[dummy@0/0]", "1", 0),
        ("[OnTime1@0/0]", "1", 0),
        ("[a@10/10]", "1", 10),
        ("[b@0/0]", "1", 0),
        ("[b@10/10]", "1", 10),
        ("[dummy@11/11]", "1", 11),
    ]
    assert dropped(instance) == 1
    assert (
        "Skipping record for expired window. key=[Late1] topic=[topic] partition=[0] "
        "offset=[6] timestamp=[0] window=[0,0] expiration=[1] streamTime=[11]"
    ) in [r.getMessage() for r in caplog.records]


# -- final results restored after the state is wiped ---------------------------------


def suppressed_counts() -> Topology:
    builder = StreamsBuilder()
    counts = (
        builder.stream(INPUT.topic, key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(TimeWindows.of_size_with_grace(2, 1))
        .count("counts")
    )
    assert isinstance(counts, WindowedKTable)
    (
        counts.suppress(Suppressed.until_window_closes())
        .to_stream()
        .map(printed)
        .to(OUTPUT.topic, key_serde="string", value_serde="string")
    )
    return builder.build()


def emit_final_counts() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream(INPUT.topic, key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(TimeWindows.of_size_with_grace(2, 1))
        .emit_final()
        .count("counts")
        .to_stream()
        .map(printed)
        .to(OUTPUT.topic, key_serde="string", value_serde="string")
    )
    return builder.build()


@pytest.mark.parametrize("topology", [suppressed_counts, emit_final_counts])
@pytest.mark.parametrize("wiped", [False, True], ids=["kept", "wiped"])
def test_final_results_restored_after_a_wipe_come_out_when_due(
    log: SqliteLog, tmp_path: Path, topology: Callable[[], Topology], wiped: bool
) -> None:
    """shouldSupportFinalResultsForTimeWindows (size 2, grace 1), stopped after its
    fifth record. The buffer then holds [k1@0/2] = 4 and [k1@2/4] = 1 with its clock at
    2; k1@5 makes both due. Restored from the changelog after the state directory was
    deleted, the buffer must emit them at k1@5 all the same (and k1@0 is beyond grace)."""
    config = settings(tmp_path)
    first = [("k1", "v1", t) for t in (0, 1, 2, 1, 0)]
    run(topology(), log, config, first)  # type: ignore[arg-type]
    assert outputs(log) == []
    if wiped:
        shutil.rmtree(tmp_path / "state")
    second = run(topology(), log, config, [("k1", "v1", 5), ("k1", "v1", 0)])
    assert outputs(log) == [("[k1@0/2]", "4", 1), ("[k1@2/4]", "1", 2)]
    assert dropped(second) == 1
