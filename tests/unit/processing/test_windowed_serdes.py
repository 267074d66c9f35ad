"""``WindowedSerdes``: a windowed table's ``to_stream()`` written with Kafka's windowed-key
bytes and read back (Kafka's ``WindowedSerdesTest`` and ``TimeWindowedSerdeTest``
shapes, apache/kafka streams/src/test/java/org/apache/kafka/streams/kstream/). The
bytes are checked against Kafka Streams' own serializers in
tests/integration/processing/test_windowed_serdes_kafka.py."""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.errors import ConfigError
from eddyline_runtime.processing import (
    SessionWindow,
    SessionWindows,
    StreamsBuilder,
    TimeWindow,
    TimeWindows,
    Windowed,
    WindowedSerdes,
)
from eddyline_runtime.serde import serde_for
from tests.support.stores import StoreFactory
from tests.unit.processing.join_driver import JoinDriver

DAY = 86_400_000


def _long(value: int) -> bytes:
    return value.to_bytes(8, "big", signed=True)


def test_a_time_windowed_count_goes_to_a_topic_with_kafkas_key_bytes(
    store_factory: StoreFactory,
) -> None:
    builder = StreamsBuilder()
    keys = WindowedSerdes.time_windowed_serde_from("string", 10)
    assert keys == "time-windowed(string,10)"
    builder.stream("input", key_serde="string", value_serde="string").group_by_key().windowed_by(
        TimeWindows.of_size_with_grace(10, DAY)
    ).count("counts").to_stream().to("output", key_serde=keys, value_serde="long")
    driver = JoinDriver(builder.build(), store_factory)
    for key, timestamp in (("A", 1), ("A", 4), ("B", 12)):
        driver.pipe("input", key, "v", timestamp)
    out = [(o.key, o.value, o.timestamp) for o in driver.task.drain_outputs()]
    assert out == [
        (b"A" + _long(0), _long(1), 1),
        (b"A" + _long(0), _long(2), 4),
        (b"B" + _long(10), _long(1), 12),
    ]
    serde = serde_for(keys)
    assert serde.deserialize(out[2][0]) == Windowed("B", TimeWindow(10, 20))


def test_a_session_windowed_count_goes_to_a_topic_with_end_then_start(
    store_factory: StoreFactory,
) -> None:
    builder = StreamsBuilder()
    keys = WindowedSerdes.session_windowed_serde_from("string")
    builder.stream("input", key_serde="string", value_serde="string").group_by_key().windowed_by(
        SessionWindows.of_inactivity_gap_with_grace(5, DAY)
    ).count("sessions").to_stream().to("output", key_serde=keys, value_serde="long")
    driver = JoinDriver(builder.build(), store_factory)
    driver.pipe("input", "A", "v", 10)
    driver.pipe("input", "A", "v", 12)
    out = [(o.key, o.value) for o in driver.task.drain_outputs()]
    # The second record merges the session: its [10,10] is removed, [10,12] written.
    assert out == [
        (b"A" + _long(10) + _long(10), _long(1)),
        (b"A" + _long(10) + _long(10), None),
        (b"A" + _long(12) + _long(10), _long(2)),
    ]
    assert serde_for(keys).deserialize(out[2][0]) == Windowed("A", SessionWindow(10, 12))


def test_windowed_keys_are_read_back_by_a_source(store_factory: StoreFactory) -> None:
    """What one application wrote, another reads with the same serde name."""
    builder = StreamsBuilder()
    seen: list[Any] = []
    builder.stream(
        "windowed", key_serde=WindowedSerdes.time_windowed_serde_from("string", 60_000)
    ).peek(lambda key, _v: seen.append(key))
    driver = JoinDriver(builder.build(), store_factory)
    driver.task.process("windowed", b"k" + _long(120_000), b"1", 5, partition=0, offset=0)
    assert seen == [Windowed("k", TimeWindow(120_000, 180_000))]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("time-windowed(string)", r"time-windowed\(<key serde>,<window size in ms, > 0>\)"),
        ("time-windowed(string,0)", "time_windowed_serde_from"),
        ("time-windowed(nope,10)", "'bytes', 'string'"),
        ("session-windowed(nope)", "'bytes', 'string'"),
        ("hopping(string)", "'time-windowed', 'session-windowed'"),
    ],
)
def test_a_bad_windowed_serde_name_says_what_would_do(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        serde_for(name, key="key_serde")


def test_the_name_is_checked_where_the_author_writes_it() -> None:
    with pytest.raises(ConfigError, match="window size"):
        WindowedSerdes.time_windowed_serde_from("string", -5)
    with pytest.raises(ConfigError, match="'bytes', 'string'"):
        WindowedSerdes.session_windowed_serde_from("strnig")
