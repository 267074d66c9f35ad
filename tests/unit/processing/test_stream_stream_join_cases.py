"""Kafka Streams' own left and outer stream-stream join cases, input for input.

Worked from ``KStreamKStreamLeftJoinTest`` and ``KStreamKStreamOuterJoinTest``
(apache/kafka, streams/src/test/java/org/apache/kafka/streams/kstream/internals/):
each case below pipes the records of the Kafka test of the same name (keys and
values as strings, ``MockValueJoiner.TOSTRING_JOINER``) and expects what that test
expects after each step, with the spurious-result fix on (``ofTimeDifference*``)
and the emit interval at 0 as Kafka's tests set it. The code is ours.
"""

from __future__ import annotations

import pytest

from eddyline_runtime.processing import JoinWindows
from tests.support.stores import StoreFactory
from tests.unit.processing.join_driver import JoinDriver
from tests.unit.processing.test_stream_stream_join import LEFT, RIGHT, join_topology

Record = tuple[str, str, str, int]  # topic, key, value, timestamp
Output = tuple[str, str, int]
Step = tuple[list[Record], list[Output]]


def L(key: object, value: str, timestamp: int) -> Record:  # noqa: N802 - reads as Kafka's topic1
    return (LEFT, str(key), value, timestamp)


def R(key: object, value: object, timestamp: int) -> Record:  # noqa: N802
    return (RIGHT, str(key), str(value), timestamp)


def out(key: object, value: str, timestamp: int) -> Output:
    return (str(key), value, timestamp)


NO_GRACE_100 = JoinWindows.of_time_difference_without_grace(100)
GRACE_100_10 = JoinWindows.of_time_difference_with_grace(100, 10)
GRACE_100_0 = JoinWindows.of_time_difference_with_grace(100, 0)

CASES: dict[str, tuple[str, JoinWindows, list[Step]]] = {
    "left testLeftJoinDuplicates": (
        "left",
        GRACE_100_10,
        [
            (
                [L(0, "A0", 0), L(0, "A0-0", 0), R(1, "a0", 111), R(2, "dummy", 500)],
                [out(0, "A0+null", 0), out(0, "A0-0+null", 0)],
            ),
            (
                [L(2, "A2", 1000), L(2, "A2-0", 1000), R(2, "a2", 1001)],
                [out(2, "A2+a2", 1001), out(2, "A2-0+a2", 1001)],
            ),
            ([R(3, "a3", 315)], []),
        ],
    ),
    "left testLeftExpiredNonJoinedRecordsAreEmittedByTheLeftProcessor": (
        "left",
        GRACE_100_0,
        [
            ([L(0, "A0", 1), L(1, "A1", 2), L(0, "A0-0", 3)], []),
            ([R(1, "a1", 3)], [out(1, "A1+a1", 3)]),
            ([L(2, "dummy", 401)], [out(0, "A0+null", 1), out(0, "A0-0+null", 3)]),
            ([R(2, "dummy", 401)], [out(2, "dummy+dummy", 401)]),
        ],
    ),
    "left testLeftExpiredNonJoinedRecordsAreEmittedByTheRightProcessor": (
        "left",
        GRACE_100_0,
        [
            ([L(0, "A0", 1), L(1, "A1", 2), L(0, "A0-0", 3)], []),
            ([R(1, "a1", 3)], [out(1, "A1+a1", 3)]),
            ([R(2, "dummy", 401)], [out(0, "A0+null", 1), out(0, "A0-0+null", 3)]),
            ([L(2, "dummy", 402)], [out(2, "dummy+dummy", 402)]),
        ],
    ),
    # Kafka pipes A0/A1 into topic2 and a1 into topic1 here: the right side's
    # records of a left join are never emitted alone, by either processor.
    "left testRightNonJoinedRecordsAreNeverEmittedByTheLeftProcessor": (
        "left",
        GRACE_100_0,
        [
            ([R(0, "A0", 1), R(1, "A1", 2), R(0, "A0-0", 3)], []),
            ([L(1, "a1", 3)], [out(1, "a1+A1", 3)]),
            ([L(2, "dummy", 401)], []),
            ([R(2, "dummy", 402)], [out(2, "dummy+dummy", 402)]),
        ],
    ),
    "left testRightNonJoinedRecordsAreNeverEmittedByTheRightProcessor": (
        "left",
        NO_GRACE_100,
        [
            ([R(0, "A0", 1), R(1, "A1", 2), R(0, "A0-0", 3)], []),
            ([L(1, "a1", 3)], [out(1, "a1+A1", 3)]),
            ([R(2, "dummy", 401)], []),
            ([L(2, "dummy", 402)], [out(2, "dummy+dummy", 402)]),
        ],
    ),
    "left testLeftJoinedRecordsWithZeroAfterAreEmitted": (
        "left",
        NO_GRACE_100.after(0),
        [
            (
                [L(k, f"A{k}", 1000 + k) for k in range(4)],
                [out(0, "A0+null", 1000), out(1, "A1+null", 1001), out(2, "A2+null", 1002)],
            ),
            (
                [R(k, f"a{k}", 999) for k in range(4)],
                [out(k, f"A{k}+a{k}", 1000 + k) for k in range(4)],
            ),
            (
                [R(k, f"b{k}", 1000) for k in range(4)],
                [out(k, f"A{k}+b{k}", 1000 + k) for k in range(4)],
            ),
            (
                [R(k, f"c{k}", 1001) for k in range(4)],
                [out(k, f"A{k}+c{k}", 1000 + k) for k in (1, 2, 3)],
            ),
            (
                [R(k, f"d{k}", 1002) for k in range(4)],
                [out(k, f"A{k}+d{k}", 1000 + k) for k in (2, 3)],
            ),
            ([R(k, f"e{k}", 1003) for k in range(4)], [out(3, "A3+e3", 1003)]),
            ([R(k, f"f{k}", 1100) for k in range(4)], []),
        ],
    ),
    "left testOrdering": (
        "left",
        NO_GRACE_100,
        [
            ([L(0, "A0", 0), L(1, "A1", 100)], []),
            ([R(1, "a1", 110)], [out(0, "A0+null", 0), out(1, "A1+a1", 110)]),
        ],
    ),
    "left testGracePeriod": (
        "left",
        GRACE_100_10,
        [
            ([L(0, "A0", 0), L(1, "A1", 0)], []),
            ([R(k, f"a{k}", 101) for k in range(4)], []),
            ([R(0, "dummy", 1201)], [out(0, "A0+null", 0), out(1, "A1+null", 0)]),
        ],
    ),
    "outer testOuterJoinDuplicates": (
        "outer",
        GRACE_100_10,
        [
            (
                [
                    L(0, "A0", 0),
                    L(0, "A0-0", 0),
                    R(1, 11, 0),
                    R(1, 12, 0),
                    R(1, 10, 111),
                    R(3, 100, 211),  # bumps stream time: the outer results come out
                ],
                [
                    out(1, "null+11", 0),
                    out(1, "null+12", 0),
                    out(0, "A0+null", 0),
                    out(0, "A0-0+null", 0),
                ],
            ),
            (
                [L(2, "A2", 200), L(2, "A2-0", 200), R(2, 13, 201), R(2, 14, 201)],
                [
                    out(2, "A2+13", 201),
                    out(2, "A2-0+13", 201),
                    out(2, "A2+14", 201),
                    out(2, "A2-0+14", 201),
                ],
            ),
            ([R(3, 100, 1500)], [out(1, "null+10", 111), out(3, "null+100", 211)]),
        ],
    ),
    "outer testLeftExpiredNonJoinedRecordsAreEmittedByTheLeftProcessor": (
        "outer",
        NO_GRACE_100,
        [
            ([L(0, "A0", 1), L(1, "A1", 2), L(0, "A0-0", 3)], []),
            ([R(1, 11, 3)], [out(1, "A1+11", 3)]),
            ([L(2, "dummy", 401)], [out(0, "A0+null", 1), out(0, "A0-0+null", 3)]),
            ([R(2, 100, 401)], [out(2, "dummy+100", 401)]),
        ],
    ),
    "outer testLeftExpiredNonJoinedRecordsAreEmittedByTheRightProcessor": (
        "outer",
        GRACE_100_0,
        [
            ([L(0, "A0", 1), L(1, "A1", 2), L(0, "A0-0", 3)], []),
            ([R(1, 11, 3)], [out(1, "A1+11", 3)]),
            ([R(2, 100, 401)], [out(0, "A0+null", 1), out(0, "A0-0+null", 3)]),
            ([L(2, "dummy", 402)], [out(2, "dummy+100", 402)]),
        ],
    ),
    "outer testRightExpiredNonJoinedRecordsAreEmittedByTheLeftProcessor": (
        "outer",
        NO_GRACE_100,
        [
            ([R(0, 10, 1), R(1, 11, 2), R(0, 12, 3)], []),
            ([L(1, "A1", 3)], [out(1, "A1+11", 3)]),
            ([L(2, "dummy", 401)], [out(0, "null+10", 1), out(0, "null+12", 3)]),
            ([R(2, 100, 402)], [out(2, "dummy+100", 402)]),
        ],
    ),
    "outer testRightExpiredNonJoinedRecordsAreEmittedByTheRightProcessor": (
        "outer",
        GRACE_100_0,
        [
            ([R(0, 10, 1), R(1, 11, 2), R(0, 12, 3)], []),
            ([L(1, "A1", 3)], [out(1, "A1+11", 3)]),
            ([R(2, 100, 401)], [out(0, "null+10", 1), out(0, "null+12", 3)]),
            ([L(2, "dummy", 402)], [out(2, "dummy+100", 402)]),
        ],
    ),
    "outer testOrdering": (
        "outer",
        NO_GRACE_100,
        [
            ([L(0, "A0", 0), L(1, "A1", 100)], []),
            ([R(1, 11, 110)], [out(0, "A0+null", 0), out(1, "A1+11", 110)]),
        ],
    ),
    "outer testGracePeriod": (
        "outer",
        GRACE_100_10,
        [
            ([L(0, "A0", 0), R(1, 11, 0)], []),
            ([L(1, "A1", 101), R(0, 10, 101)], []),
            ([R(0, 100, 112)], [out(1, "null+11", 0), out(0, "A0+null", 0)]),
        ],
    ),
    "outer testEmitAllNonJoinedResultsForAsymmetricWindow": (
        "outer",
        JoinWindows.of_time_difference_without_grace(5).after(20),
        [
            ([L(0, "A0", 29)], []),
            ([L(1, "A1", 30)], []),
            ([R(2, 12, 31)], []),
            ([R(3, 13, 36)], []),
            ([R(4, 14, 37)], [out(2, "null+12", 31)]),
            (
                [R(5, 15, 50)],
                [out(0, "A0+null", 29), out(3, "null+13", 36), out(4, "null+14", 37)],
            ),
        ],
    ),
    "outer testShouldNotEmitLeftJoinResultForAsymmetricBeforeWindow": (
        "outer",
        NO_GRACE_100.before(0),
        [
            ([L(0, "A0", 0), L(1, "A1", 1)], []),
            ([R(0, 10, 100)], [out(0, "A0+10", 100)]),
            ([R(1, 11, 102)], [out(1, "A1+null", 1)]),
            ([R(2, 12, 103)], [out(1, "null+11", 102)]),
            ([L(2, "A2", 103)], [out(2, "A2+12", 103)]),
        ],
    ),
    "outer testShouldNotEmitLeftJoinResultForAsymmetricAfterWindow": (
        "outer",
        NO_GRACE_100.after(0),
        [
            ([L(0, "A0", 0), L(1, "A1", 1)], [out(0, "A0+null", 0)]),
            ([R(1, 11, 1)], [out(1, "A1+11", 1)]),
            ([R(2, 12, 101)], []),
            ([R(3, 13, 101)], []),
            ([L(2, "A2", 201)], [out(2, "A2+12", 201)]),
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_kafka_case(case: str, store_factory: StoreFactory) -> None:
    kind, windows, steps = CASES[case]
    driver = JoinDriver(join_topology(kind, windows), store_factory)
    for number, (records, expected) in enumerate(steps):
        for topic, key, value, timestamp in records:
            driver.pipe(topic, key, value, timestamp)
        assert driver.read() == expected, f"step {number}"
