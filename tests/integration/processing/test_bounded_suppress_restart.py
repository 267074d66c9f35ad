"""A bounded ``until_time_limit`` suppression keeps its contract across a restart.

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
