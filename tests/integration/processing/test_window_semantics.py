"""Kafka Streams' window and suppress semantics, each run twice as scenarios
(tests/support/scenarios.py): through the ``TopologyTestDriver``, and as a user runs
them, by a ``StreamsInstance`` on the embedded log, exactly-once, RocksDB stores. Both
must give the same outputs (and when they came out), store contents, dropped-record
counts and log lines, and those are Kafka's.

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
  split by a restart, with and without the state wiped. The driver cannot close and
  reopen a kept state directory (its ``state.dir`` is a temporary one it removes on
  close), so it runs the same records without the restart: the restart must not show.

The tests are ours. The record cache is off, as in Kafka's tests that read every
update (``withCachingDisabled``).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.processing import (
    SessionWindows,
    StreamsBuilder,
    Suppressed,
    TimeWindows,
    Topology,
    WindowedKTable,
)
from eddyline_runtime.processing.windows import SessionWindow, TimeWindow, Windowed
from tests.support.scenarios import Scenario, ScenarioResult, run_on_driver, run_on_instance

INPUT = "topic"
OUTPUT = "output"
WINDOWED = "eddyline_runtime.processing.operators.windowed"

_LONG = struct.Struct(">q")

CONFIG = {
    "processing.guarantee": "exactly_once_v2",
    "statestore.cache.max.bytes": "0",
    # Kafka's timestamps are milliseconds after the epoch, far older than any
    # changelog retention: the embedded log must not apply it during a test.
    "log.retention.check.interval.ms": str(7 * 86_400_000),
}


def inputs(*records: tuple[str | None, str, int]) -> list[tuple[str, str | None, str, int]]:
    return [(INPUT, key, value, timestamp) for key, value, timestamp in records]


def run_both(
    scenario: Scenario, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> tuple[ScenarioResult, list[str]]:
    """The scenario's result and the aggregation's log lines, the same through the
    driver and by the instance (or the test fails)."""
    caplog.set_level(logging.WARNING, logger=WINDOWED)
    driven = run_on_driver(scenario)
    driver_lines = [r.getMessage() for r in caplog.records if r.name == WINDOWED]
    caplog.clear()
    assert run_on_instance(scenario, tmp_path) == driven
    assert [r.getMessage() for r in caplog.records if r.name == WINDOWED] == driver_lines
    return driven, driver_lines


def printed(key: Any, value: Any) -> tuple[str, str | None]:
    return str(key), None if value is None else str(value)


# -- time windows: the aggregation's own observed stream time -------------------------


def hopping_strings(windows: TimeWindows) -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream(INPUT, key_serde="string", value_serde="string")
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
        .to(OUTPUT, key_serde="string", value_serde="string")
    )
    return builder.build()


def test_a_dropped_null_key_record_closes_no_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A null-key record is dropped before it reaches the aggregation's clock: its
    timestamp (100) closes neither window of A, and A's later records are on time."""
    scenario = Scenario(
        "null-key-closes-no-window",
        lambda: hopping_strings(TimeWindows.of_size_with_grace(10, 0).advance_by(5)),
        steps=[inputs(("A", "1", 0), (None, "x", 100), ("A", "2", 5), ("A", "3", 9))],
        outputs=[OUTPUT],
        stores=["topic1-Canonicalized"],
        config=CONFIG,
    )
    result, lines = run_both(scenario, tmp_path, caplog)
    assert result.outputs[OUTPUT] == [
        ("[A@0/10]", "0+1", 0),
        ("[A@0/10]", "0+1+2", 5),
        ("[A@5/15]", "0+2", 5),
        ("[A@0/10]", "0+1+2+3", 9),
        ("[A@5/15]", "0+2+3", 9),
    ]
    assert result.stores["topic1-Canonicalized"] == [
        (Windowed("A", TimeWindow(0, 10)), "0+1+2+3"),
        (Windowed("A", TimeWindow(5, 15)), "0+2+3"),
    ]
    assert result.dropped == [1]  # the null-key record, once
    assert lines == [
        "Skipping record due to null key. value=[x] topic=[topic] partition=[0] offset=[1]"
    ]


def test_a_window_closed_before_a_restart_stays_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """eddyline's one difference from Kafka here (docs/windows.md): the aggregation's
    clock starts again where it was at the last commit (the newest record in its store),
    where Kafka's starts empty and would fold A@3 into a fresh [A@0/10] "0+3". Null-key
    records, before and after the restart, never move it. The driver runs the same
    records without the restart, and must give the same."""
    scenario = Scenario(
        "closed-window-stays-closed",
        lambda: hopping_strings(TimeWindows.of_size_with_grace(10, 5)),
        steps=[
            inputs(("A", "1", 0), ("A", "2", 20), (None, "x", 1_000)),
            # Observed stream time 20 before and after: [0, 10) closed at 15, [10, 20) is open.
            inputs((None, "y", 2_000), ("A", "3", 3), ("A", "4", 12), ("A", "5", 21)),
        ],
        outputs=[OUTPUT],
        config=CONFIG,
        restart_after=[0],
    )
    result, lines = run_both(scenario, tmp_path, caplog)
    assert result.outputs[OUTPUT] == [
        ("[A@0/10]", "0+1", 0),
        ("[A@20/30]", "0+2", 20),
        ("[A@10/20]", "0+4", 12),
        ("[A@20/30]", "0+2+5", 21),
    ]
    assert result.emitted == [{OUTPUT: 2}, {OUTPUT: 4}]
    assert result.dropped == [1, 2]  # a null-key record; the other one and A@3
    assert (
        "Skipping record for expired window. key=[A] topic=[topic] partition=[0] offset=[4] "
        "timestamp=[3] window=[0,10) expiration=[15] streamTime=[20]"
    ) in lines


# -- session windows: closed at end + gap + grace ------------------------------------


def session_counts(windows: SessionWindows) -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream(INPUT, key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(windows)
        .count("sessions")
        .to_stream()
        .map(printed)
        .to(OUTPUT, key_serde="string", value_serde="string")
    )
    return builder.build()


def test_late_session_records_with_nonzero_grace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """shouldLogAndMeterWhenSkippingLateRecordWithNonzeroGrace: gap 10, grace 1. At
    stream time 11 a session ending at 0 still closes at 0 + 10 + 1: OnTime2 is on time
    (and its store, retention 11, keeps it: the segment of 0 is live). At 12 it is not."""
    scenario = Scenario(
        "late-sessions-nonzero-grace",
        lambda: session_counts(SessionWindows.of_inactivity_gap_with_grace(10, 1)),
        steps=[
            inputs(
                ("dummy", "dummy", 0),
                ("OnTime1", "1", 0),
                ("dummy", "dummy", 11),
                ("OnTime2", "1", 0),
                ("dummy", "dummy", 12),
                ("Late1", "1", 0),
            )
        ],
        outputs=[OUTPUT],
        stores=["sessions"],
        config=CONFIG,
    )
    result, lines = run_both(scenario, tmp_path, caplog)
    assert result.outputs[OUTPUT] == [
        ("[dummy@0/0]", "1", 0),
        ("[OnTime1@0/0]", "1", 0),
        # dummy@0 ended before 11 - gap: a new session (and the store reads no further
        # back than 11 - retention + 1 = 1 anyway).
        ("[dummy@11/11]", "1", 11),
        ("[OnTime2@0/0]", "1", 0),
        ("[dummy@11/11]", None, 11),
        ("[dummy@11/12]", "2", 12),
    ]
    assert result.stores["sessions"] == STORES_NONZERO_GRACE
    assert result.dropped == [1]
    assert (
        "Skipping record for expired window. key=[Late1] topic=[topic] partition=[0] "
        "offset=[5] timestamp=[0] window=[0,0] expiration=[1] streamTime=[12]"
    ) in lines


def test_late_session_records_with_zero_grace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """shouldLogAndMeterWhenSkippingLateRecordWithZeroGrace: gap 10, no grace; a record
    one gap behind stream time (b@0 at 10) is on time, one past it (Late1@0 at 11) is not.

    b@10 then does not merge with [b@0/0], though it is within a gap: the store's reads
    start at observed - retention + 1 = 10 - 10 + 1, as Kafka's do."""
    scenario = Scenario(
        "late-sessions-zero-grace",
        lambda: session_counts(SessionWindows.of_inactivity_gap_with_grace(10, 0)),
        steps=[
            inputs(
                ("dummy", "dummy", 0),
                ("OnTime1", "1", 0),
                ("a", "1", 10),
                ("b", "1", 0),
                ("b", "1", 10),
                ("dummy", "dummy", 11),
                ("Late1", "1", 0),
            )
        ],
        outputs=[OUTPUT],
        stores=["sessions"],
        config=CONFIG,
    )
    result, lines = run_both(scenario, tmp_path, caplog)
    assert result.outputs[OUTPUT] == [
        ("[dummy@0/0]", "1", 0),
        ("[OnTime1@0/0]", "1", 0),
        ("[a@10/10]", "1", 10),
        ("[b@0/0]", "1", 0),
        ("[b@10/10]", "1", 10),
        ("[dummy@11/11]", "1", 11),
    ]
    assert result.stores["sessions"] == STORES_ZERO_GRACE
    assert result.dropped == [1]
    assert (
        "Skipping record for expired window. key=[Late1] topic=[topic] partition=[0] "
        "offset=[6] timestamp=[0] window=[0,0] expiration=[1] streamTime=[11]"
    ) in lines


# -- final results restored after the state is wiped ---------------------------------


def suppressed_counts() -> Topology:
    builder = StreamsBuilder()
    counts = (
        builder.stream(INPUT, key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(TimeWindows.of_size_with_grace(2, 1))
        .count("counts")
    )
    assert isinstance(counts, WindowedKTable)
    (
        counts.suppress(Suppressed.until_window_closes())
        .to_stream()
        .map(printed)
        .to(OUTPUT, key_serde="string", value_serde="string")
    )
    return builder.build()


def emit_final_counts() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream(INPUT, key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(TimeWindows.of_size_with_grace(2, 1))
        .emit_final()
        .count("counts")
        .to_stream()
        .map(printed)
        .to(OUTPUT, key_serde="string", value_serde="string")
    )
    return builder.build()


def buffered(key: str, window: TimeWindow, timestamp: int, count: int) -> tuple[bytes, bytes]:
    """A suppress / emit-final buffer entry, raw (processing/operators/suppress.py):
    window end | key | window start -> record timestamp | count."""
    return (
        _LONG.pack(window.end) + key.encode() + _LONG.pack(window.start),
        _LONG.pack(timestamp) + _LONG.pack(count),
    )


@pytest.mark.parametrize(
    ("topology", "buffer"),
    [(suppressed_counts, "counts-suppress-buffer"), (emit_final_counts, "counts-final-buffer")],
)
@pytest.mark.parametrize("wiped", [False, True], ids=["kept", "wiped"])
def test_final_results_restored_after_a_wipe_come_out_when_due(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    topology: Callable[[], Topology],
    buffer: str,
    wiped: bool,
) -> None:
    """shouldSupportFinalResultsForTimeWindows (size 2, grace 1), stopped after its
    fifth record. The suppress buffer then holds [k1@0/2] = 4 and [k1@2/4] = 1 with its
    clock at 2 (emit_final: the window store holds them, its newest record at 2); k1@5
    makes both due. Restored from the changelog after the state directory was deleted,
    they must come out at k1@5 all the same (and k1@0 is beyond grace). The driver runs
    the same records without the stop."""
    scenario = Scenario(
        "final-results-after-a-restart",
        topology,
        steps=[
            inputs(*[("k1", "v1", t) for t in (0, 1, 2, 1, 0)]),
            inputs(("k1", "v1", 5), ("k1", "v1", 0)),
        ],
        outputs=[OUTPUT],
        stores=["counts", buffer],
        config=CONFIG,
        restart_after=[0],
        wipe_on_restart=wiped,
    )
    result, _ = run_both(scenario, tmp_path, caplog)
    assert result.outputs[OUTPUT] == [("[k1@0/2]", "4", 1), ("[k1@2/4]", "1", 2)]
    assert result.emitted == [{OUTPUT: 0}, {OUTPUT: 2}]  # nothing before the restart
    assert result.dropped == [0, 1]
    assert result.stores["counts"] == STORES_FINAL
    if topology is emit_final_counts:
        # emit_final finds closed windows in the aggregation's own store (KIP-825): its
        # final buffer stays empty, the wiped one included (restored empty).
        assert result.stores[buffer] == []
        return
    # [k1@4/6] is not due before 6 + 1; the buffer's clock is at 5.
    assert result.stores[buffer] == [
        buffered("k1", TimeWindow(4, 6), 5, 1),
        (b"\xffstream-time", _LONG.pack(5)),
    ]


# What the stores hold at the end. Kafka's tests check outputs only; these follow from
# them and from Kafka's store rules (retention: size + grace for windows, gap + grace
# for sessions). A window store reads only windows starting after its observed time
# (the newest window start written) - retention: after 5 - 10 for the null-key
# scenario's, after 4 - 3 for the final results'.
STORES_FINAL = [(Windowed("k1", TimeWindow(2, 4)), 1), (Windowed("k1", TimeWindow(4, 6)), 1)]
# A session store reads only sessions ending at or after its observed time (the newest
# session end written) - retention + 1: 12 - 11 + 1 = 2 with grace 1, 11 - 10 + 1 = 2
# without.
STORES_NONZERO_GRACE = [(Windowed("dummy", SessionWindow(11, 12)), 2)]
STORES_ZERO_GRACE = [
    (Windowed("a", SessionWindow(10, 10)), 1),
    (Windowed("b", SessionWindow(10, 10)), 1),
    (Windowed("dummy", SessionWindow(11, 11)), 1),
]
