"""``until_time_limit`` and bounded buffers on the embedded log: Kafka's table scenarios,
and a bounded buffer that keeps its contract across a restart.

Kafka's ``SuppressScenarioTest`` table scenarios (zero and 2 ms limits, a record and a
byte bound emitting early; see tests/unit/processing/test_bounded_suppress.py) run
through the driver and by an instance with the same outputs, step by step.

The scenario runs twice (tests/support/scenarios.py): through the test driver without
a stop, and by a ``StreamsInstance`` on the embedded log, exactly-once, RocksDB stores,
closed in the middle of its buffering and started again, with its state directory kept
or wiped (then the buffer is restored from its changelog). Both must give the same
outputs, when they came out, and the same buffer: an entry emitted early before the
stop is not emitted again, and what was still buffered comes out when it is due (by
time, or pushed out by the bound), with the buffer time of its first update.

The semantics are Kafka's (``KTableSuppressProcessor`` with a ``TimeLimit`` and an
eager ``maxRecords`` bound); the restart cases are ours, as in Kafka the buffer is in
memory with a changelog.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

import pytest

from eddyline_runtime.processing import BufferConfig, StreamsBuilder, Suppressed, Topology
from tests.support.scenarios import Scenario, run_on_driver, run_on_instance

INPUT = "input"
OUTPUT = "output"
BUFFER = "input-store-suppress-buffer"
CONFIG = {
    "processing.guarantee": "exactly_once_v2",
    "statestore.cache.max.bytes": "0",
    "log.retention.check.interval.ms": str(7 * 86_400_000),
}
_LONG = struct.Struct(">q")


def suppressed_table(buffer_config: BufferConfig) -> Topology:
    builder = StreamsBuilder()
    (
        builder.table(INPUT, "input-store", key_serde="string", value_serde="string")
        .suppress(Suppressed.until_time_limit(10, buffer_config))
        .to_stream()
        .to(OUTPUT, key_serde="string", value_serde="string")
    )
    return builder.build()


def inputs(*records: tuple[str, str, int]) -> list[tuple[str, str, str, int]]:
    return [(INPUT, key, value, timestamp) for key, value, timestamp in records]


def entry(buffer_time: int, key: str, timestamp: int, value: str) -> tuple[bytes, bytes]:
    """A raw buffer entry (processing/operators/suppress.py): buffer time | key ->
    timestamp | present | value."""
    return _LONG.pack(buffer_time) + key.encode(), _LONG.pack(timestamp) + b"\x01" + value.encode()


@pytest.mark.parametrize("wiped", [False, True], ids=["kept", "wiped"])
def test_a_record_bound_restarted_mid_way_emits_early_as_an_uninterrupted_one(
    tmp_path: Path, wiped: bool
) -> None:
    """max_records(2), 10 ms. Before the stop: c takes the buffer over its bound, so a
    (the oldest) comes out early; b is updated and keeps buffer time 1. After it, one
    record a step: d takes the buffer over again and pushes b out (its latest value);
    e at 12 makes c (first buffered at 2) due; f at 14 makes d due."""
    scenario = Scenario(
        "record-bound-after-a-restart",
        lambda: suppressed_table(BufferConfig.max_records(2)),
        steps=[
            inputs(("a", "a1", 0), ("b", "b1", 1), ("c", "c1", 2), ("b", "b2", 3)),
            inputs(("d", "d1", 4)),
            inputs(("e", "e1", 12)),
            inputs(("f", "f1", 14)),
        ],
        outputs=[OUTPUT],
        stores=[BUFFER],
        config=CONFIG,
        restart_after=[0],
        wipe_on_restart=wiped,
    )
    driven = run_on_driver(scenario)
    assert run_on_instance(scenario, tmp_path) == driven
    assert driven.outputs[OUTPUT] == [
        ("a", "a1", 0),
        ("b", "b2", 3),
        ("c", "c1", 2),
        ("d", "d1", 4),
    ]
    assert driven.emitted == [{OUTPUT: 1}, {OUTPUT: 2}, {OUTPUT: 3}, {OUTPUT: 4}]
    assert driven.stores[BUFFER] == [
        entry(12, "e", 12, "e1"),
        entry(14, "f", 14, "f1"),
        (b"\xffstream-time", _LONG.pack(14)),
    ]


@pytest.mark.parametrize("wiped", [False, True], ids=["kept", "wiped"])
def test_a_key_updated_after_a_restart_keeps_the_buffer_time_of_its_first_update(
    tmp_path: Path, wiped: bool
) -> None:
    """Unbounded, 10 ms. b is first buffered at 1 before the stop and updated at 3 after
    it: x at 11 makes a (0) and b (1) due, b with its latest value; y at 13 makes
    nothing else due (x was first buffered at 11)."""
    scenario = Scenario(
        "time-limit-after-a-restart",
        lambda: suppressed_table(BufferConfig.unbounded()),
        steps=[
            inputs(("a", "a1", 0), ("b", "b1", 1)),
            inputs(("b", "b2", 3)),
            inputs(("x", "x1", 11)),
            inputs(("x", "x2", 13)),
        ],
        outputs=[OUTPUT],
        stores=[BUFFER],
        config=CONFIG,
        restart_after=[0],
        wipe_on_restart=wiped,
    )
    driven = run_on_driver(scenario)
    assert run_on_instance(scenario, tmp_path) == driven
    assert driven.outputs[OUTPUT] == [("a", "a1", 0), ("b", "b2", 3)]
    assert driven.emitted == [{OUTPUT: 0}, {OUTPUT: 0}, {OUTPUT: 2}, {OUTPUT: 2}]
    assert driven.stores[BUFFER] == [
        entry(11, "x", 13, "x2"),
        (b"\xffstream-time", _LONG.pack(13)),
    ]


# -- Kafka's table scenarios, through the driver and by an instance -------------------


def value_counts(suppressed: Suppressed) -> Topology:
    """SuppressScenarioTest's table of values counted by ``groupBy((k, v) -> (v, k))``,
    raw and suppressed side by side."""
    builder = StreamsBuilder()
    counts = (
        builder.table(INPUT, "input-store", key_serde="string", value_serde="string")
        .group_by(lambda key, value: (value, key), repartition_name="by-value")
        .count("counts")
    )
    counts.suppress(suppressed).to_stream().to("suppressed", key_serde="string", value_serde="long")
    counts.to_stream().to("raw", key_serde="string", value_serde="long")
    return builder.build()


FIRST_THREE = inputs(("k1", "v1", 0), ("k1", "v2", 1), ("k2", "v1", 2))
RAW_FIRST_THREE = [("v1", 1, 0), ("v1", 0, 1), ("v2", 1, 1), ("v1", 1, 2)]
FOREVER = 2**62  # Kafka's Long.MAX_VALUE wait: nothing is due by time


class Case(NamedTuple):
    suppressed: Suppressed
    steps: list[list[tuple[str, str, str, int]]]
    raw: list[tuple[str, int, int]]
    expected: list[tuple[str, int, int]]
    # How many suppressed results were out after each step.
    emitted: list[int]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            Case(
                Suppressed.until_time_limit(0, BufferConfig.unbounded()),
                [FIRST_THREE, inputs(("x", "x", 3)), inputs(("x", "y", 4))],
                [*RAW_FIRST_THREE, ("x", 1, 3), ("x", 0, 4), ("y", 1, 4)],
                [*RAW_FIRST_THREE, ("x", 1, 3), ("x", 0, 4), ("y", 1, 4)],
                [4, 5, 7],
            ),
            id="shouldImmediatelyEmitEventsWithZeroEmitAfter",
        ),
        pytest.param(
            Case(
                Suppressed.until_time_limit(2, BufferConfig.unbounded()),
                [FIRST_THREE, inputs(("tick", "tick", 3)), inputs(("tick", "tock", 4))],
                [*RAW_FIRST_THREE, ("tick", 1, 3), ("tick", 0, 4), ("tock", 1, 4)],
                [("v1", 1, 2), ("v2", 1, 1)],
                [1, 2, 2],
            ),
            id="shouldSuppressIntermediateEventsWithTimeLimit",
        ),
        pytest.param(
            Case(
                Suppressed.until_time_limit(FOREVER, BufferConfig.max_records(1)),
                [FIRST_THREE, inputs(("x", "x", 3))],
                [*RAW_FIRST_THREE, ("x", 1, 3)],
                [("v1", 0, 1), ("v2", 1, 1), ("v1", 1, 2)],
                [2, 3],
            ),
            id="shouldSuppressIntermediateEventsWithRecordLimit",
        ),
        pytest.param(
            # One 27-byte entry fits, two do not (Kafka: 200 for its ~100-byte entries).
            Case(
                Suppressed.until_time_limit(FOREVER, BufferConfig.max_bytes(40)),
                [FIRST_THREE, inputs(("x", "x", 3))],
                [*RAW_FIRST_THREE, ("x", 1, 3)],
                [("v1", 0, 1), ("v2", 1, 1), ("v1", 1, 2)],
                [2, 3],
            ),
            id="shouldSuppressIntermediateEventsWithBytesLimit",
        ),
    ],
)
def test_kafkas_table_suppress_scenarios_match_on_the_driver_and_an_instance(
    tmp_path: Path, case: Case
) -> None:
    scenario = Scenario(
        "table-suppress",
        lambda: value_counts(case.suppressed),
        steps=case.steps,
        outputs=["raw", "suppressed"],
        stores=["counts"],
        config=CONFIG,
    )
    driven = run_on_driver(scenario)
    assert run_on_instance(scenario, tmp_path) == driven
    assert driven.outputs["raw"] == case.raw
    assert driven.outputs["suppressed"] == case.expected
    assert [step["suppressed"] for step in driven.emitted] == case.emitted
