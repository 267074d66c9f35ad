"""KTable-KTable joins (inner, left, outer) and KStream-KTable joins (inner, left).

Worked from Kafka Streams' ``KTableKTableInnerJoinTest``, ``KTableKTableLeftJoinTest``,
``KTableKTableOuterJoinTest`` (their ``testJoin`` sequences: keys 0..3, values X/Y,
XX/YY, ..., explicit timestamps, null keys, tombstones on either side) and
``KStreamKTableJoinTest``/``KStreamKTableLeftJoinTest`` (apache/kafka,
streams/src/test/java/org/apache/kafka/streams/kstream/internals/), with the
processors of the kafka-streams 3.9 sources (``KTableKTable{Inner,Left,Right,Outer}Join``,
``KStreamKTableJoinProcessor``): a result is timestamped with the later of the
update and the other side's value; the tests and their expected outputs are ours.
"""

from __future__ import annotations

import json

from eddyline_runtime.processing import StreamsBuilder, Topology
from tests.support.stores import StoreFactory
from tests.unit.processing.join_driver import JoinDriver, to_string_joiner

T1, T2 = "topic1", "topic2"
KEYS = "0123"


def table_join_topology(kind: str) -> Topology:
    builder = StreamsBuilder()
    left = builder.table(T1, "left-table", key_serde="string", value_serde="string")
    right = builder.table(T2, "right-table", key_serde="string", value_serde="string")
    method = {"inner": left.join, "left": left.left_join, "outer": left.outer_join}[kind]
    joined = method(right, to_string_joiner, store_name="joined")
    joined.to_stream().to("output", key_serde="string", value_serde="string")
    return builder.build()


def drive_table_join(driver: JoinDriver) -> list[list[tuple[str | None, str | None, int]]]:
    """The testJoin input sequence; what came out after each step."""
    steps = []
    for i, key in enumerate(KEYS[:2]):
        driver.pipe(T1, key, f"X{key}", 5 + i)
    driver.pipe(T1, None, "SomeVal", 42)  # a null key: dropped
    steps.append(driver.read())
    for i, key in enumerate(KEYS[:2]):
        driver.pipe(T2, key, f"Y{key}", 10 * i)
    driver.pipe(T2, None, "AnotherVal", 73)
    steps.append(driver.read())
    for key in KEYS:
        driver.pipe(T1, key, f"XX{key}", 7)
    steps.append(driver.read())
    for key in KEYS:
        driver.pipe(T2, key, f"YY{key}", int(key) * 5)
    steps.append(driver.read())
    for key in KEYS:
        driver.pipe(T1, key, f"XXX{key}", 6)
    steps.append(driver.read())
    driver.pipe(T2, "0", None, 5)  # right tombstones
    driver.pipe(T2, "1", None, 7)
    steps.append(driver.read())
    for key in KEYS:
        driver.pipe(T1, key, f"XXXX{key}", 13)
    steps.append(driver.read())
    for key, timestamp in zip(KEYS, (0, 42, 5, 20), strict=True):  # left tombstones
        driver.pipe(T1, key, None, timestamp)
    steps.append(driver.read())
    return steps


def test_table_table_inner_join(store_factory: StoreFactory) -> None:
    steps = drive_table_join(JoinDriver(table_join_topology("inner"), store_factory))
    assert steps == [
        [],
        [("0", "X0+Y0", 5), ("1", "X1+Y1", 10)],
        [("0", "XX0+Y0", 7), ("1", "XX1+Y1", 10)],
        [("0", "XX0+YY0", 7), ("1", "XX1+YY1", 7), ("2", "XX2+YY2", 10), ("3", "XX3+YY3", 15)],
        [("0", "XXX0+YY0", 6), ("1", "XXX1+YY1", 6), ("2", "XXX2+YY2", 10), ("3", "XXX3+YY3", 15)],
        [("0", None, 6), ("1", None, 7)],
        [("2", "XXXX2+YY2", 13), ("3", "XXXX3+YY3", 15)],
        [("2", None, 10), ("3", None, 20)],
    ]


def test_table_table_left_join(store_factory: StoreFactory) -> None:
    steps = drive_table_join(JoinDriver(table_join_topology("left"), store_factory))
    assert steps == [
        [("0", "X0+null", 5), ("1", "X1+null", 6)],
        [("0", "X0+Y0", 5), ("1", "X1+Y1", 10)],
        [("0", "XX0+Y0", 7), ("1", "XX1+Y1", 10), ("2", "XX2+null", 7), ("3", "XX3+null", 7)],
        [("0", "XX0+YY0", 7), ("1", "XX1+YY1", 7), ("2", "XX2+YY2", 10), ("3", "XX3+YY3", 15)],
        [("0", "XXX0+YY0", 6), ("1", "XXX1+YY1", 6), ("2", "XXX2+YY2", 10), ("3", "XXX3+YY3", 15)],
        [("0", "XXX0+null", 6), ("1", "XXX1+null", 7)],
        [
            ("0", "XXXX0+null", 13),
            ("1", "XXXX1+null", 13),
            ("2", "XXXX2+YY2", 13),
            ("3", "XXXX3+YY3", 15),
        ],
        [("0", None, 0), ("1", None, 42), ("2", None, 10), ("3", None, 20)],
    ]


def test_table_table_outer_join(store_factory: StoreFactory) -> None:
    steps = drive_table_join(JoinDriver(table_join_topology("outer"), store_factory))
    assert steps == [
        [("0", "X0+null", 5), ("1", "X1+null", 6)],
        [("0", "X0+Y0", 5), ("1", "X1+Y1", 10)],
        [("0", "XX0+Y0", 7), ("1", "XX1+Y1", 10), ("2", "XX2+null", 7), ("3", "XX3+null", 7)],
        [("0", "XX0+YY0", 7), ("1", "XX1+YY1", 7), ("2", "XX2+YY2", 10), ("3", "XX3+YY3", 15)],
        [("0", "XXX0+YY0", 6), ("1", "XXX1+YY1", 6), ("2", "XXX2+YY2", 10), ("3", "XXX3+YY3", 15)],
        [("0", "XXX0+null", 6), ("1", "XXX1+null", 7)],
        [
            ("0", "XXXX0+null", 13),
            ("1", "XXXX1+null", 13),
            ("2", "XXXX2+YY2", 13),
            ("3", "XXXX3+YY3", 15),
        ],
        # Left tombstones: keys 0 and 1 leave both tables; 2 and 3 keep their right rows.
        [("0", None, 0), ("1", None, 42), ("2", "null+YY2", 10), ("3", "null+YY3", 20)],
    ]


def test_a_right_tombstone_for_a_key_never_seen_gives_nothing(store_factory: StoreFactory) -> None:
    """KTableKTableOuterJoin: no value on either side, before or after: no result."""
    driver = JoinDriver(table_join_topology("outer"), store_factory)
    driver.pipe(T2, "9", None, 3)
    driver.pipe(T1, "9", None, 4)
    assert driver.read() == []
    assert driver.task.dropped_records == 0


def stream_table_topology(left: bool) -> Topology:
    builder = StreamsBuilder()
    stream = builder.stream(T1, key_serde="string", value_serde="string")
    table = builder.table(T2, "table", key_serde="string", value_serde="string")
    joined = (stream.left_join if left else stream.join)(table, to_string_joiner)
    joined.to("output", key_serde="string", value_serde="string")
    return builder.build()


def drive_stream_table(driver: JoinDriver) -> list[list[tuple[str | None, str | None, int]]]:
    """KStreamKTableJoinTest's sequence: stream records at times 0..3, table updates between."""
    steps = []

    def stream(count: int, prefix: str) -> None:
        for i, key in enumerate(KEYS[:count]):
            driver.pipe(T1, key, f"{prefix}{key}", i)

    def table(count: int, prefix: str) -> None:
        for i, key in enumerate(KEYS[:count]):
            driver.pipe(T2, key, None if prefix is None else f"{prefix}{key}", i)

    stream(2, "X")
    steps.append(driver.read())
    table(2, "Y")
    steps.append(driver.read())
    stream(4, "X")
    steps.append(driver.read())
    table(4, "YY")
    stream(4, "X")
    steps.append(driver.read())
    table(4, "YYY")
    for key in KEYS[:2]:
        driver.pipe(T2, key, None, 9)  # deletes
    steps.append(driver.read())
    stream(4, "XX")
    driver.pipe(T1, None, "no key", 10)
    driver.pipe(T1, "3", None, 11)
    steps.append(driver.read())
    return steps


def test_stream_table_inner_join(store_factory: StoreFactory) -> None:
    driver = JoinDriver(stream_table_topology(left=False), store_factory)
    assert drive_stream_table(driver) == [
        [],
        [],
        [("0", "X0+Y0", 0), ("1", "X1+Y1", 1)],
        [("0", "X0+YY0", 0), ("1", "X1+YY1", 1), ("2", "X2+YY2", 2), ("3", "X3+YY3", 3)],
        [],
        [("2", "XX2+YYY2", 2), ("3", "XX3+YYY3", 3)],
    ]
    assert driver.task.dropped_records == 2  # the null key and the null value


def test_stream_table_left_join(store_factory: StoreFactory) -> None:
    driver = JoinDriver(stream_table_topology(left=True), store_factory)
    assert drive_stream_table(driver) == [
        [("0", "X0+null", 0), ("1", "X1+null", 1)],
        [],
        [("0", "X0+Y0", 0), ("1", "X1+Y1", 1), ("2", "X2+null", 2), ("3", "X3+null", 3)],
        [("0", "X0+YY0", 0), ("1", "X1+YY1", 1), ("2", "X2+YY2", 2), ("3", "X3+YY3", 3)],
        [],
        [
            ("0", "XX0+null", 0),
            ("1", "XX1+null", 1),
            ("2", "XX2+YYY2", 2),
            ("3", "XX3+YYY3", 3),
            (None, "no key+null", 10),  # a left join keeps a record without a key
        ],
    ]
    assert driver.task.dropped_records == 1  # the null value


def test_table_table_inner_join_sends_old_values_when_a_node_below_needs_them(
    store_factory: StoreFactory,
) -> None:
    """KTableKTableInnerJoinTest.testSendingOldValues: with old values asked for (here by
    a group_by below, which passes each change on as [new, old]), every result carries
    the result it replaces."""
    builder = StreamsBuilder()
    left = builder.table(T1, "left-table", key_serde="string", value_serde="string")
    right = builder.table(T2, "right-table", key_serde="string", value_serde="string")
    joined = left.join(right, to_string_joiner, store_name="joined")
    joined.group_by(lambda k, v: (k, v), repartition_name="changes").count("counts")
    driver = JoinDriver(builder.build(), store_factory)  # the join's sub-topology
    changes: list[list[tuple[str | None, list[str | None], int]]] = []
    original_read = driver.read

    def read(topic: str = "output") -> list[tuple[str | None, str | None, int]]:
        """Each step's changes, as the repartition topic got them."""
        found = original_read("changes-repartition")
        changes.append([(k, json.loads(v or "null"), ts) for k, v, ts in found])
        return []

    driver.read = read  # type: ignore[method-assign]
    drive_table_join(driver)
    assert changes == [
        [],
        [("0", ["X0+Y0", None], 5), ("1", ["X1+Y1", None], 10)],
        [("0", ["XX0+Y0", "X0+Y0"], 7), ("1", ["XX1+Y1", "X1+Y1"], 10)],
        [
            ("0", ["XX0+YY0", "XX0+Y0"], 7),
            ("1", ["XX1+YY1", "XX1+Y1"], 7),
            ("2", ["XX2+YY2", None], 10),
            ("3", ["XX3+YY3", None], 15),
        ],
        [
            ("0", ["XXX0+YY0", "XX0+YY0"], 6),
            ("1", ["XXX1+YY1", "XX1+YY1"], 6),
            ("2", ["XXX2+YY2", "XX2+YY2"], 10),
            ("3", ["XXX3+YY3", "XX3+YY3"], 15),
        ],
        [("0", [None, "XXX0+YY0"], 6), ("1", [None, "XXX1+YY1"], 7)],
        [("2", ["XXXX2+YY2", "XXX2+YY2"], 13), ("3", ["XXXX3+YY3", "XXX3+YY3"], 15)],
        [("2", [None, "XXXX2+YY2"], 10), ("3", [None, "XXXX3+YY3"], 20)],
    ]


def test_mapped_tables_and_a_join_result_join_again(store_factory: StoreFactory) -> None:
    """A table's values keep the serde they are produced with through map_values and a
    join (JSON by default), so the stores of a further join can hold them."""
    builder = StreamsBuilder()
    users = builder.table("users", "users", key_serde="string", value_serde="string")
    plans = builder.table("plans", "plans", key_serde="string", value_serde="string")
    limits = builder.table("limits", "limits", key_serde="string", value_serde="long")
    profile = users.map_values(lambda name: {"name": name}).join(
        plans, lambda user, plan: {**user, "plan": plan}, store_name="user-plans"
    )
    profile.left_join(
        limits, lambda p, limit: {**p, "limit": limit}, store_name="with-limits"
    ).to_stream().to("output", key_serde="string", value_serde="json")
    driver = JoinDriver(builder.build(), store_factory)
    driver.pipe("users", "u", "ann", 1)
    driver.pipe("plans", "u", "pro", 2)
    driver.task.process("limits", b"u", (10).to_bytes(8, "big"), 3, partition=0, offset=99)
    assert [(k, json.loads(v or "null"), ts) for k, v, ts in driver.read()] == [
        ("u", {"name": "ann", "plan": "pro", "limit": None}, 2),
        ("u", {"name": "ann", "plan": "pro", "limit": 10}, 3),
    ]
