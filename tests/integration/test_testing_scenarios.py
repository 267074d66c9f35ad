"""Kafka Streams' own test scenarios, through the test driver and through a StreamsInstance.

Each scenario's inputs and expected outputs are facts carried over from Kafka
Streams' tests (apache/kafka; the tests are ours):

* word count: ``WordCountDemoTest.testOneWord`` and ``testCountListOfWords``
  (streams/examples, the demo's topology: ``flatMapValues(split("\\\\W+"))``,
  ``groupBy(value)``, ``count()``);
* tumbling windows with grace, raw and ``suppress(untilWindowCloses)``:
  ``SuppressScenarioTest.shouldSupportFinalResultsForTimeWindows`` and
  ``...WithLargeJump`` (streams/src/test/.../kstream/internals/);
* a stream-table join: ``KStreamKTableJoinTest.shouldClearTableEntryOnNullValueUpdates``
  and ``shouldNotJoinOnTableUpdates`` (the table's records at timestamp 0, as
  its ``pushToTableNonRandom``: a plain table's timestamps do not change the
  result, the stream record's timestamp is the output's);
* hopping windows with ``emit_final()`` (``EmitStrategy.onWindowClose``):
  ``KStreamWindowAggregateTest.shouldEmitWithInterval0`` (size 10, advance 5,
  grace 5; emitted as soon as a window closes);
* session windows, raw and suppressed:
  ``SuppressScenarioTest.shouldSupportFinalResultsForSessionWindows``.

Every scenario runs twice: through :class:`TopologyTestDriver`, whose outputs
must be Kafka's, and by a :class:`StreamsInstance` on the embedded SQLite log,
whose outputs and store contents must be the driver's. Both run without the
record cache (``statestore.cache.max.bytes=0``, Kafka's tests'
``withCachingDisabled()``): with it, the instance's less frequent commits
would deduplicate updates the driver forwards one by one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.processing import (
    SessionWindows,
    StreamsBuilder,
    Suppressed,
    TimeWindows,
    Topology,
    Windowed,
)
from eddyline_runtime.processing.windows import SessionWindow, TimeWindow
from tests.support.scenarios import Scenario, run_on_driver, run_on_instance

NO_CACHE = {"statestore.cache.max.bytes": 0}

# -- word count (WordCountDemoTest) ------------------------------------------------------


def java_split_words(line: str) -> list[str]:
    """Java's ``line.toLowerCase().split("\\\\W+")``: trailing empty strings dropped."""
    words = re.split(r"\W+", line.lower())
    while words and not words[-1]:
        words.pop()
    return words


def word_count() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("streams-plaintext-input", key_serde="string", value_serde="string")
        .flat_map_values(java_split_words)
        .group_by(lambda _key, word: word, key_serde="string", value_serde="string")
        .count("counts-store")
        .to_stream()
        .to("streams-wordcount-output", key_serde="string", value_serde="long")
    )
    return builder.build()


WORD_COUNT = Scenario(
    "word-count",
    word_count,
    steps=[
        [("streams-plaintext-input", None, "Hello", 0)],
        [
            ("streams-plaintext-input", None, line, 0)
            for line in (
                "Apache   Kafka Streams   Example",
                "Using  \t\t Kafka   Streams\tTest Utils",
                "Reading and Writing Kafka Topic",
            )
        ],
    ],
    outputs=["streams-wordcount-output"],
    stores=["counts-store"],
    config=NO_CACHE,
)


# -- tumbling windows, raw and suppressed (SuppressScenarioTest) ---------------------------


def windowed_counts(windows: TimeWindows | SessionWindows) -> Topology:
    builder = StreamsBuilder()
    counts = (
        builder.stream("input", key_serde="string", value_serde="string")
        .group_by(lambda key, _value: key, key_serde="string", value_serde="string")
        .windowed_by(windows)
        .count("counts")
    )
    (
        counts.suppress(Suppressed.until_window_closes())  # type: ignore[attr-defined]
        .to_stream()
        .map(lambda window, count: (str(window), count))
        .to("output-suppressed", key_serde="string", value_serde="long")
    )
    (
        counts.to_stream()
        .map(lambda window, count: (str(window), count))
        .to("output-raw", key_serde="string", value_serde="long")
    )
    return builder.build()


def k1_at(*timestamps: int) -> list[tuple[str, str, str, int]]:
    return [("input", "k1", "v1", t) for t in timestamps]


TIME_WINDOWS = Scenario(
    "time-windows",
    lambda: windowed_counts(TimeWindows.of_size_with_grace(2, 1)),
    # The last record is out of the grace period: dropped.
    steps=[k1_at(0, 1, 2, 1, 0, 5, 0)],
    outputs=["output-raw", "output-suppressed"],
    stores=["counts"],
    config=NO_CACHE,
)
TIME_WINDOWS_LARGE_JUMP = Scenario(
    "time-windows-large-jump",
    lambda: windowed_counts(TimeWindows.of_size_with_grace(2, 2)),
    # The record at 0 after 4 is dropped: 4 advanced stream time and closed [0, 2).
    steps=[k1_at(0, 1, 2, 0, 3, 0, 4, 0, 30)],
    outputs=["output-raw", "output-suppressed"],
    stores=["counts"],
    config=NO_CACHE,
)

# -- hopping windows with emit_final (KStreamWindowAggregateTest) -----------------------------


def emit_final_strings() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("topic1", key_serde="string", value_serde="string")
        .group_by_key()
        .windowed_by(TimeWindows.of_size_with_grace(10, 5).advance_by(5))
        .emit_final()
        .aggregate(
            lambda: "0",
            lambda _key, value, aggregate: f"{aggregate}+{value}",
            "topic1-Canonized",
            value_serde="string",
        )
        .to_stream()
        .map(lambda window, value: (str(window), value))
        .to("output", key_serde="string", value_serde="string")
    )
    return builder.build()


EMIT_FINAL = Scenario(
    "emit-final-hopping-windows",
    emit_final_strings,
    # A window closes once stream time reaches its end + grace: D@20 closes [0, 10) and
    # [5, 15); [10, 20) stays open.
    steps=[
        [
            ("topic1", "A", "1", 0),
            ("topic1", "A", "1", 5),
            ("topic1", "B", "2", 10),
            ("topic1", "C", "3", 15),
            ("topic1", "D", "4", 20),
        ]
    ],
    outputs=["output"],
    stores=["topic1-Canonized"],
    config=NO_CACHE,
)

# -- sessions, raw and suppressed (SuppressScenarioTest) -----------------------------------

SESSION_WINDOWS = Scenario(
    "session-windows",
    lambda: windowed_counts(SessionWindows.of_inactivity_gap_with_grace(5, 0)),
    steps=[
        [
            ("input", "k1", "v1", 0),
            ("input", "k1", "v1", 5),
            # Disordered, but the session is not closed until end + gap + grace.
            ("input", "k1", "v1", 1),
            # Any key advances stream time.
            ("input", "k2", "v1", 11),
            # Late for the first session, now closed: dropped from every output.
            ("input", "k1", "v1", 5),
            # Pushes stream time on to flush the others through.
            ("input", "k1", "v1", 30),
        ]
    ],
    outputs=["output-raw", "output-suppressed"],
    stores=["counts"],
    config=NO_CACHE,
)

# -- stream-table join (KStreamKTableJoinTest) -----------------------------------------------


def stream_table_join() -> Topology:
    builder = StreamsBuilder()
    table = builder.table("tableTopic", "table-store", key_serde="int", value_serde="string")
    (
        builder.stream("streamTopic", key_serde="int", value_serde="string")
        .join(table, lambda left, right: f"{left}+{right}")
        .to("output", key_serde="int", value_serde="string")
    )
    return builder.build()


def push_to_stream(count: int, prefix: str) -> list[tuple[str, int, str, int]]:
    return [("streamTopic", i, f"{prefix}{i}", i) for i in range(count)]


def push_to_table(count: int, prefix: str) -> list[tuple[str, int, str | None, int]]:
    return [("tableTopic", i, f"{prefix}{i}", 0) for i in range(count)]


NULLS_TO_TABLE = [("tableTopic", i, None, 0) for i in range(2)]

STREAM_TABLE_CLEARED = Scenario(
    "stream-table-join-cleared-by-null",
    stream_table_join,
    steps=[push_to_table(4, "Y"), push_to_stream(4, "X"), NULLS_TO_TABLE, push_to_stream(4, "XX")],
    outputs=["output"],
    stores=["table-store"],
    config=NO_CACHE,
)
STREAM_TABLE_UPDATES = Scenario(
    "stream-table-join-on-table-updates",
    stream_table_join,
    steps=[
        push_to_stream(2, "X"),
        push_to_table(2, "Y"),
        push_to_stream(4, "X"),
        push_to_table(4, "YY"),
        push_to_stream(4, "X"),
        push_to_table(4, "YYY"),
    ],
    outputs=["output"],
    stores=["table-store"],
    config=NO_CACHE,
)

# -- what Kafka's tests expect -------------------------------------------------------------

KAFKA_EXPECTED: dict[str, dict[str, Any]] = {
    "word-count": {
        "streams-wordcount-output": {
            "hello": 1,
            "apache": 1,
            "kafka": 3,
            "streams": 2,
            "example": 1,
            "using": 1,
            "test": 1,
            "utils": 1,
            "reading": 1,
            "and": 1,
            "writing": 1,
            "topic": 1,
        }
    },
    "time-windows": {
        "output-raw": [
            ("[k1@0/2]", 1, 0),
            ("[k1@0/2]", 2, 1),
            ("[k1@2/4]", 1, 2),
            ("[k1@0/2]", 3, 1),
            ("[k1@0/2]", 4, 1),
            ("[k1@4/6]", 1, 5),
        ],
        "output-suppressed": [("[k1@0/2]", 4, 1), ("[k1@2/4]", 1, 2)],
    },
    "time-windows-large-jump": {
        "output-raw": [
            ("[k1@0/2]", 1, 0),
            ("[k1@0/2]", 2, 1),
            ("[k1@2/4]", 1, 2),
            ("[k1@0/2]", 3, 1),
            ("[k1@2/4]", 2, 3),
            ("[k1@0/2]", 4, 1),
            ("[k1@4/6]", 1, 4),
            ("[k1@30/32]", 1, 30),
        ],
        "output-suppressed": [("[k1@0/2]", 4, 1), ("[k1@2/4]", 2, 3), ("[k1@4/6]", 1, 4)],
    },
    "session-windows": {
        "output-raw": [
            ("[k1@0/0]", 1, 0),
            ("[k1@0/0]", None, 0),
            ("[k1@0/5]", 2, 5),
            ("[k1@0/5]", None, 5),
            ("[k1@0/5]", 3, 5),
            ("[k2@11/11]", 1, 11),
            ("[k1@30/30]", 1, 30),
        ],
        "output-suppressed": [("[k1@0/5]", 3, 5), ("[k2@11/11]", 1, 11)],
    },
    "emit-final-hopping-windows": {
        "output": [("[A@0/10]", "0+1+1", 5), ("[A@5/15]", "0+1", 5), ("[B@5/15]", "0+2", 10)]
    },
    "stream-table-join-cleared-by-null": {
        "output": [
            (0, "X0+Y0", 0),
            (1, "X1+Y1", 1),
            (2, "X2+Y2", 2),
            (3, "X3+Y3", 3),
            (2, "XX2+Y2", 2),
            (3, "XX3+Y3", 3),
        ]
    },
    "stream-table-join-on-table-updates": {
        "output": [
            (0, "X0+Y0", 0),
            (1, "X1+Y1", 1),
            (0, "X0+YY0", 0),
            (1, "X1+YY1", 1),
            (2, "X2+YY2", 2),
            (3, "X3+YY3", 3),
        ]
    },
}

# What the stores hold at the end. Kafka's tests check outputs only; these follow from
# them and from Kafka's store rules: a window store reads only windows starting after its
# observed time (the newest window start written, 4) - retention (size + grace, 3).
EXPECTED_STORES: dict[str, dict[str, list[tuple[Any, Any]]]] = {
    "time-windows": {
        "counts": [(Windowed("k1", TimeWindow(2, 4)), 1), (Windowed("k1", TimeWindow(4, 6)), 1)]
    },
    # A session store's: sessions ending after the newest end (30) - retention (gap + grace, 5).
    "session-windows": {"counts": [(Windowed("k1", SessionWindow(30, 30)), 1)]},
    "stream-table-join-cleared-by-null": {"table-store": [(2, "Y2"), (3, "Y3")]},
    "stream-table-join-on-table-updates": {
        "table-store": [(0, "YYY0"), (1, "YYY1"), (2, "YYY2"), (3, "YYY3")]
    },
}

SCENARIOS = [
    WORD_COUNT,
    TIME_WINDOWS,
    TIME_WINDOWS_LARGE_JUMP,
    EMIT_FINAL,
    SESSION_WINDOWS,
    STREAM_TABLE_CLEARED,
    STREAM_TABLE_UPDATES,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_the_driver_gives_what_kafka_streams_tests_expect(scenario: Scenario) -> None:
    result = run_on_driver(scenario)
    for topic, expected in KAFKA_EXPECTED[scenario.name].items():
        if isinstance(expected, dict):  # Kafka's readKeyValuesToMap: each key's last value
            assert {key: value for key, value, _ in result.outputs[topic]} == expected
        else:
            assert result.outputs[topic] == expected, topic
    for store, entries in EXPECTED_STORES.get(scenario.name, {}).items():
        assert result.stores[store] == entries, store


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_a_streams_instance_on_the_embedded_log_gives_what_the_driver_gives(
    scenario: Scenario, tmp_path: Path
) -> None:
    assert run_on_instance(scenario, tmp_path) == run_on_driver(scenario)
