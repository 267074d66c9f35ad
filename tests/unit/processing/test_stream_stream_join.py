"""Windowed KStream-KStream joins: inner, left and outer, as Kafka Streams runs them.

Worked from Kafka Streams' ``KStreamKStreamJoinTest`` (``testJoin``: duplicates at
one timestamp, both sides), ``KStreamKStreamLeftJoinTest`` and
``KStreamKStreamOuterJoinTest`` (apache/kafka,
streams/src/test/java/org/apache/kafka/streams/kstream/internals/), and from the
operators in the kafka-streams 3.9 sources (``KStreamKStreamJoin``,
``KStreamJoinWindow``): window bounds ``[t - before, t + after]``, results
timestamped with the later record, non-joined records held in the shared store
and emitted only once the window has closed (stream time past t + after + grace),
never before, immediate null joins for records older than their window. The
input sequences and expected outputs below are ours, written from those facts;
Kafka's emit interval is 0 here as in its tests (eddyline has no throttle).
Keyless records on a left/outer side follow KIP-962 (Kafka 3.7+).
"""

from __future__ import annotations

import pytest

from eddyline_runtime.processing import JoinWindows, StreamsBuilder, Topology, TopologyError
from tests.support.stores import StoreFactory
from tests.unit.processing.join_driver import JoinDriver, to_string_joiner

LEFT, RIGHT = "topic1", "topic2"


def join_topology(kind: str, windows: JoinWindows) -> Topology:
    builder = StreamsBuilder()
    left = builder.stream(LEFT, key_serde="string", value_serde="string")
    right = builder.stream(RIGHT, key_serde="string", value_serde="string")
    method = {"inner": left.join, "left": left.left_join, "outer": left.outer_join}[kind]
    joined = method(
        right,
        to_string_joiner,
        windows,
        store_name="joined",
        value_serde="string",
        other_value_serde="string",
    )
    joined.to("output", key_serde="string", value_serde="string")
    return builder.build()


def test_the_topology_names_its_stores_from_the_store_name() -> None:
    windows = JoinWindows.of_time_difference_with_grace(100, 5)
    (sub,) = join_topology("inner", windows).subtopologies()
    assert sub.stores == ("joined-this-join-store", "joined-other-join-store")
    (sub,) = join_topology("left", windows).subtopologies()
    assert set(sub.stores) == {
        "joined-this-join-store",
        "joined-outer-other-join-store",
        "joined-left-shared-join-store",
    }
    (sub,) = join_topology("outer", windows).subtopologies()
    assert set(sub.stores) == {
        "joined-outer-this-join-store",
        "joined-outer-other-join-store",
        "joined-outer-shared-join-store",
    }
    topology = join_topology("outer", windows)
    assert topology.stores["joined-outer-this-join-store"].window_retention_ms == 205


def test_a_stream_stream_join_needs_a_store_name_and_windows() -> None:
    builder = StreamsBuilder()
    left, right = builder.stream(LEFT), builder.stream(RIGHT)
    windows = JoinWindows.of_time_difference_without_grace(10)
    with pytest.raises(TopologyError, match="store_name"):
        left.join(right, to_string_joiner, windows, store_name="")
    with pytest.raises(TopologyError, match="JoinWindows"):
        left.left_join(right, to_string_joiner)  # type: ignore[call-overload]
    with pytest.raises(TopologyError, match=">= 0"):
        JoinWindows.of_time_difference_without_grace(10).before(-11)


def test_inner_join_of_duplicates_at_one_timestamp(store_factory: StoreFactory) -> None:
    """KStreamKStreamJoinTest.testJoin: every record at time 0, keys repeated on both sides."""
    driver = JoinDriver(
        join_topology("inner", JoinWindows.of_time_difference_without_grace(100)), store_factory
    )
    for key in "01":
        driver.pipe(LEFT, key, f"A{key}", 0)
    assert driver.read() == []
    for key in "01":
        driver.pipe(RIGHT, key, f"a{key}", 0)
    assert driver.read() == [("0", "A0+a0", 0), ("1", "A1+a1", 0)]
    for key in "0123":
        driver.pipe(LEFT, key, f"B{key}", 0)
    assert driver.read() == [("0", "B0+a0", 0), ("1", "B1+a1", 0)]
    for key in "0123":
        driver.pipe(RIGHT, key, f"b{key}", 0)
    assert driver.read() == [
        ("0", "A0+b0", 0),
        ("0", "B0+b0", 0),
        ("1", "A1+b1", 0),
        ("1", "B1+b1", 0),
        ("2", "B2+b2", 0),
        ("3", "B3+b3", 0),
    ]
    for key in "0123":
        driver.pipe(LEFT, key, f"C{key}", 0)
    assert driver.read() == [
        ("0", "C0+a0", 0),
        ("0", "C0+b0", 0),
        ("1", "C1+a1", 0),
        ("1", "C1+b1", 0),
        ("2", "C2+b2", 0),
        ("3", "C3+b3", 0),
    ]
    for key in "01":
        driver.pipe(RIGHT, key, f"c{key}", 0)
    assert driver.read() == [
        ("0", "A0+c0", 0),
        ("0", "B0+c0", 0),
        ("0", "C0+c0", 0),
        ("1", "A1+c1", 0),
        ("1", "B1+c1", 0),
        ("1", "C1+c1", 0),
    ]


def test_inner_join_window_bounds_are_inclusive_and_results_take_the_later_time(
    store_factory: StoreFactory,
) -> None:
    """KStreamKStreamJoinTest.testWindowing's facts: a right record joins left records
    within [t - 100, t + 100], both ends included; asymmetric before/after flip sides."""
    windows = JoinWindows.of_time_difference_with_grace(100, 1000)
    driver = JoinDriver(join_topology("inner", windows), store_factory)
    driver.pipe(LEFT, "0", "A0", 1000)
    driver.pipe(RIGHT, "0", "a0", 899)  # 101 before: outside
    driver.pipe(RIGHT, "0", "b0", 900)  # exactly 100 before
    driver.pipe(RIGHT, "0", "c0", 1100)  # exactly 100 after
    driver.pipe(RIGHT, "0", "d0", 1101)  # outside
    assert driver.read() == [("0", "A0+b0", 1000), ("0", "A0+c0", 1100)]
    driver.close()
    # before(0).after(50): a right record must not be older than the left one.
    windows = JoinWindows.of_time_difference_with_grace(0, 1000).after(50)
    driver = JoinDriver(join_topology("inner", windows), store_factory)
    driver.pipe(RIGHT, "1", "r-1", 999)
    driver.pipe(RIGHT, "1", "r0", 1000)
    driver.pipe(RIGHT, "1", "r50", 1050)
    driver.pipe(RIGHT, "1", "r51", 1051)
    driver.pipe(LEFT, "1", "L", 1000)
    assert driver.read() == [("1", "L+r0", 1000), ("1", "L+r50", 1050)]


def test_null_values_and_inner_null_keys_are_dropped_and_counted(
    store_factory: StoreFactory,
) -> None:
    """A null value is dropped on every side; a null key on an inner side. An outer side's
    keyless record is null-joined at once (KIP-962, Kafka 3.7+)."""
    driver = JoinDriver(
        join_topology("left", JoinWindows.of_time_difference_without_grace(10)), store_factory
    )
    driver.pipe(LEFT, None, "A", 0)  # the left side of a left join keeps it
    driver.pipe(RIGHT, None, "a", 0)  # the right side is inner: dropped
    driver.pipe(RIGHT, "0", None, 0)
    driver.pipe(LEFT, "1", None, 0)
    driver.pipe(LEFT, "0", "A0", 0)
    driver.pipe(RIGHT, "0", "a0", 0)
    assert driver.read() == [(None, "A+null", 0), ("0", "A0+a0", 0)]
    assert driver.task.dropped_records == 3


def test_left_join_emits_a_non_joined_record_only_once_its_window_has_closed(
    store_factory: StoreFactory,
) -> None:
    """KStreamKStreamLeftJoinTest's spurious-result-fix cases: no early null join."""
    driver = JoinDriver(
        join_topology("left", JoinWindows.of_time_difference_with_grace(100, 10)), store_factory
    )
    driver.pipe(LEFT, "0", "A0", 0)
    driver.pipe(LEFT, "1", "A1", 60)
    assert driver.read() == []  # both windows still open: no spurious null join
    driver.pipe(RIGHT, "0", "a0", 50)  # out of order, joins A0 within its window
    assert driver.read() == [("0", "A0+a0", 50)]
    driver.pipe(LEFT, "2", "A2", 170)  # 60 + 100 + 10 = 170: A1's window not closed yet
    assert driver.read() == []
    driver.pipe(LEFT, "3", "A3", 171)  # now it has, and A0 (joined) never comes out
    assert driver.read() == [("1", "A1+null", 60)]
    driver.pipe(RIGHT, "2", "a2", 200)  # joins A2; A2 is never null-joined
    assert driver.read() == [("2", "A2+a2", 200)]
    driver.pipe(RIGHT, "9", "a9", 400)  # a right record without partner: inner side, nothing
    assert driver.read() == [("3", "A3+null", 171)]
    driver.pipe(LEFT, "4", "A4", 250)  # out of order and its window (until 350) is past
    assert driver.read() == [("4", "A4+null", 250)]


def test_left_join_right_records_join_every_buffered_left_record(
    store_factory: StoreFactory,
) -> None:
    """A right record meets left records in [t - after, t + before] (the right side's view)."""
    windows = JoinWindows.of_time_difference_with_grace(0, 0).after(100)
    driver = JoinDriver(join_topology("left", windows), store_factory)
    driver.pipe(LEFT, "0", "A0", 100)
    driver.pipe(LEFT, "0", "B0", 150)
    driver.pipe(RIGHT, "0", "a0", 180)  # joins A0 (180 - 100 = 80 <= 100) and B0
    assert driver.read() == [("0", "A0+a0", 180), ("0", "B0+a0", 180)]
    driver.pipe(RIGHT, "0", "b0", 99)  # before every left record: after=0 for a right record
    assert driver.read() == []
    driver.pipe(LEFT, "1", "C1", 400)  # closes everything before 300: nothing waits
    assert driver.read() == []
    driver.pipe(LEFT, "1", "D1", 501)  # C1's window (400..500) closed
    assert driver.read() == [("1", "C1+null", 400)]


def test_outer_join_emits_both_sides_non_joined_records_in_time_order(
    store_factory: StoreFactory,
) -> None:
    """KStreamKStreamOuterJoinTest: non-joined records of both sides come out oldest first,
    a right one before a left one at the same time (the shared store's key order)."""
    driver = JoinDriver(
        join_topology("outer", JoinWindows.of_time_difference_without_grace(10)), store_factory
    )
    driver.pipe(LEFT, "0", "A0", 0)
    driver.pipe(RIGHT, "1", "a1", 0)
    driver.pipe(RIGHT, "2", "a2", 5)
    driver.pipe(LEFT, "2", "A2", 7)
    assert driver.read() == [("2", "A2+a2", 7)]
    driver.pipe(LEFT, "3", "A3", 10)
    assert driver.read() == []  # 0 + 10 + 0 >= 10: still open
    driver.pipe(RIGHT, "4", "a4", 11)
    assert driver.read() == [("1", "null+a1", 0), ("0", "A0+null", 0)]
    driver.pipe(RIGHT, "3", "a3", 15)  # joins A3, which is therefore never null-joined
    assert driver.read() == [("3", "A3+a3", 15)]
    driver.pipe(LEFT, "5", "A5", 30)
    assert driver.read() == [("4", "null+a4", 11)]


def test_records_beyond_retention_are_not_buffered_and_find_no_partner(
    store_factory: StoreFactory,
) -> None:
    """A record later than the window store's retention (before + after + grace) is not
    kept: a partner arriving later does not find it."""
    driver = JoinDriver(
        join_topology("inner", JoinWindows.of_time_difference_with_grace(10, 5)), store_factory
    )
    driver.pipe(LEFT, "0", "A0", 100)
    driver.pipe(LEFT, "0", "B0", 70)  # 100 - 25 = 75 is the oldest the store keeps
    driver.pipe(RIGHT, "0", "a0", 78)  # would meet B0 (70) and not A0 (100)
    assert driver.read() == []
    driver.pipe(RIGHT, "0", "b0", 95)
    assert driver.read() == [("0", "A0+b0", 100)]


def test_left_join_upper_window_bound(store_factory: StoreFactory) -> None:
    """KStreamKStreamLeftJoinTest.testWindowing/testUpperWindowBound's input, with
    ``ofTimeDifferenceWithNoGrace(100)``: the records Kafka's deprecated ``JoinWindows.of``
    null-joined at once are held until stream time passes their time + 100."""
    driver = JoinDriver(
        join_topology("left", JoinWindows.of_time_difference_without_grace(100)), store_factory
    )
    for key in "01":
        driver.pipe(LEFT, key, f"A{key}", 0)
    assert driver.read() == []  # Kafka 3.1+: no A0+null, A1+null yet
    for key in "0123":
        driver.pipe(RIGHT, key, f"a{key}", 0)
    assert driver.read() == [("0", "A0+a0", 0), ("1", "A1+a1", 0)]
    for i, key in enumerate("0123"):
        driver.pipe(RIGHT, key, f"b{key}", 1000 + i)
    assert driver.read() == []
    for key in "0123":
        driver.pipe(LEFT, key, f"B{key}", 1100)
    assert driver.read() == [(k, f"B{k}+b{k}", 1100) for k in "0123"]
    for key in "0123":
        driver.pipe(LEFT, key, f"C{key}", 1101)
    assert driver.read() == [(k, f"C{k}+b{k}", 1101) for k in "123"]  # C0 waits
    for key in "0123":
        driver.pipe(LEFT, key, f"D{key}", 1102)
    assert driver.read() == [(k, f"D{k}+b{k}", 1102) for k in "23"]
    for key in "0123":
        driver.pipe(LEFT, key, f"E{key}", 1103)
    assert driver.read() == [("3", "E3+b3", 1103)]
    for key in "0123":
        driver.pipe(LEFT, key, f"F{key}", 1104)
    assert driver.read() == []
    driver.pipe(RIGHT, "9", "z", 1201)  # C0's window ends at 1201: still open
    assert driver.read() == []
    driver.pipe(RIGHT, "9", "z", 1202)
    assert driver.read() == [("0", "C0+null", 1101)]
    driver.pipe(RIGHT, "9", "z", 1205)  # every window closed, oldest first, then by key
    assert driver.read() == [
        ("0", "D0+null", 1102),
        ("1", "D1+null", 1102),
        ("0", "E0+null", 1103),
        ("1", "E1+null", 1103),
        ("2", "E2+null", 1103),
        ("0", "F0+null", 1104),
        ("1", "F1+null", 1104),
        ("2", "F2+null", 1104),
        ("3", "F3+null", 1104),
    ]


def test_a_rekeyed_stream_must_be_repartitioned_before_a_join() -> None:
    """Kafka Streams repartitions a key-changed stream before a join by itself, under a
    generated topic name; eddyline asks for the named repartition instead."""
    builder = StreamsBuilder()
    left = builder.stream(LEFT, key_serde="string", value_serde="string")
    right = builder.stream(RIGHT, key_serde="string", value_serde="string")
    windows = JoinWindows.of_time_difference_without_grace(10)
    rekeyed = left.select_key(lambda _k, v: v).filter(lambda _k, _v: True)
    with pytest.raises(TopologyError, match="repartition"):
        rekeyed.join(right, to_string_joiner, windows, store_name="joined")
    with pytest.raises(TopologyError, match="repartition"):
        right.left_join(left.map(lambda k, v: (v, k)), to_string_joiner, windows, store_name="j")
    table = builder.table("topic3", "table", key_serde="string", value_serde="string")
    with pytest.raises(TopologyError, match="repartition"):
        left.flat_map(lambda k, v: [(v, k)]).join(table, to_string_joiner)
    # Value-only steps keep the partitioning; a named repartition restores it.
    left.map_values(str.upper).join(right, to_string_joiner, windows, store_name="ok")
    rekeyed.repartition("by-value").join(table, to_string_joiner)
