"""Foreign-key table-table joins (KIP-213) on the test driver.

The scenarios follow Kafka Streams' ``KTableKTableForeignKeyJoinIntegrationTest``
(apache/kafka, streams/src/test/java/org/apache/kafka/streams/integration/; its
test cases run every scenario for inner and left joins, materialized or not, with
a rejoin and with versioned tables, as here) and ``KTableKTableForeignKeyJoinScenarioTest``
(a foreign-key join joined again on the key), with Kafka's inputs and expected
outputs: ``lhsValue1|rhs1`` names the right key ``rhs1``, the joiner renders
``(left,right)``. The protocol's pieces (stale responses dropped by hash, the
subscription store's layout, the wire format's version guard) are tested on their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from eddyline_runtime.processing import Materialized, StreamsBuilder, TopologyError
from eddyline_runtime.processing.operators.foreign_key_joins import (
    ForeignKeyJoinFormatError,
    Instruction,
    Response,
    Subscription,
    decode_response,
    decode_subscription,
    encode_response,
    encode_subscription,
    subscription_prefix,
    value_hash,
)
from eddyline_runtime.testing import TestInputTopic, TestOutputTopic, TopologyTestDriver

LEFT, RIGHT, OUTPUT, REJOIN = "left_table", "right_table", "output", "rejoin-output"
BASE = 1_000


def _java(value: Any) -> str:
    return "null" if value is None else str(value)


def _joiner(left: Any, right: Any) -> str:
    """Kafka's test joiner, rendering a missing side as Java does."""
    return f"({_java(left)},{_java(right)})"


def _second(value: str) -> str | None:
    return value.split("|")[1]


def build(
    *,
    left_join: bool,
    materialized: bool,
    rejoin: bool = False,
    left_versioned: bool = False,
    right_versioned: bool = False,
    extractor: Callable[[str], str | None] = _second,
) -> StreamsBuilder:
    builder = StreamsBuilder()
    left_store = Materialized.as_versioned("left", 300_000) if left_versioned else "left"
    right_store = Materialized.as_versioned("right", 300_000) if right_versioned else "right"
    left = builder.table(LEFT, left_store, key_serde="string", value_serde="string")
    right = builder.table(RIGHT, right_store, key_serde="string", value_serde="string")
    store = Materialized.as_("store").with_caching_disabled() if materialized else None
    method = left.left_join if left_join else left.join
    joined = method(right, extractor, _joiner, materialized=store, value_serde="string")
    joined.to_stream().to(OUTPUT, key_serde="string", value_serde="string")
    if rejoin:
        again = joined.left_join if left_join else joined.join

        def rejoiner(a: Any, b: Any) -> str:
            return f"rejoin({_java(a)},{_java(b)})"

        rejoined = again(
            left,
            rejoiner,
            store_name="rejoin",
            materialized="store-rejoin" if materialized else None,
            value_serde="string",
        )
        rejoined.to_stream().to(REJOIN, key_serde="string", value_serde="string")
    return builder


CASES = [
    pytest.param((left_join, materialized, rejoin, versioned), id=f"{kind}-{m}-{r}-{v}")
    for left_join, kind in ((False, "inner"), (True, "left"))
    for materialized, m in ((False, "plain"), (True, "materialized"))
    for rejoin, r in ((False, "no-rejoin"), (True, "rejoin"))
    for versioned, v in ((False, "kv"), (True, "versioned"))
]


class Run:
    def __init__(self, driver: TopologyTestDriver, materialized: bool) -> None:
        self.driver = driver
        self.left: TestInputTopic[str, str] = driver.create_input_topic(LEFT)
        self.right: TestInputTopic[str, str] = driver.create_input_topic(RIGHT)
        self.output: TestOutputTopic[str, str] = driver.create_output_topic(OUTPUT)
        self.materialized = materialized

    def out(self) -> dict[str, str | None]:
        return self.output.read_key_values_to_map()

    def store(self) -> dict[str, str] | None:
        """The result store's rows (None when the join is not materialized: nothing to check)."""
        if not self.materialized:
            return None
        return dict(self.driver.get_key_value_store("store").all())

    def check_store(self, expected: dict[str, str]) -> None:
        if self.materialized:
            assert self.store() == expected


@pytest.fixture
def run(request: pytest.FixtureRequest) -> Iterator[Run]:
    left_join, materialized, rejoin, versioned = request.param
    builder = build(
        left_join=left_join,
        materialized=materialized,
        rejoin=rejoin,
        left_versioned=versioned,
        right_versioned=versioned,
    )
    with TopologyTestDriver(builder, {"application.id": "fk-join"}) as driver:
        yield Run(driver, materialized)


def _left_join(request: pytest.FixtureRequest) -> bool:
    return bool(request.node.callspec.params["run"][0])


@pytest.mark.parametrize("run", CASES, indirect=True)
def test_join_from_left_then_delete_left_entity(run: Run, request: pytest.FixtureRequest) -> None:
    """Kafka's doJoinFromLeftThenDeleteLeftEntity."""
    run.right.pipe_input("rhs1", "rhsValue1", timestamp=BASE)
    run.right.pipe_input("rhs2", "rhsValue2", timestamp=BASE + 1)
    run.right.pipe_input("rhs3", "rhsValue3", timestamp=BASE + 2)  # never referenced
    assert run.out() == {}
    run.check_store({})
    run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE + 3)
    run.left.pipe_input("lhs2", "lhsValue2|rhs2", timestamp=BASE + 4)
    expected = {"lhs1": "(lhsValue1|rhs1,rhsValue1)", "lhs2": "(lhsValue2|rhs2,rhsValue2)"}
    assert run.out() == expected
    run.check_store(expected)
    # Another reference to an existing foreign key.
    run.left.pipe_input("lhs3", "lhsValue3|rhs1", timestamp=BASE + 5)
    assert run.out() == {"lhs3": "(lhsValue3|rhs1,rhsValue1)"}
    run.check_store({**expected, "lhs3": "(lhsValue3|rhs1,rhsValue1)"})
    # Deleting a left row deletes its result.
    run.left.pipe_input("lhs1", None, timestamp=BASE + 6)
    assert run.out() == {"lhs1": None}
    run.check_store({"lhs2": "(lhsValue2|rhs2,rhsValue2)", "lhs3": "(lhsValue3|rhs1,rhsValue1)"})


@pytest.mark.parametrize("run", CASES, indirect=True)
def test_join_from_right_then_delete_right_entity(run: Run, request: pytest.FixtureRequest) -> None:
    """Kafka's doJoinFromRightThenDeleteRightEntity: a right row fans out to every
    subscriber of its key; its tombstone unsets them all (left join: with null)."""
    left_join = _left_join(request)
    run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE)
    run.left.pipe_input("lhs2", "lhsValue2|rhs2", timestamp=BASE + 1)
    run.left.pipe_input("lhs3", "lhsValue3|rhs1", timestamp=BASE + 2)
    halves = {
        "lhs1": "(lhsValue1|rhs1,null)",
        "lhs2": "(lhsValue2|rhs2,null)",
        "lhs3": "(lhsValue3|rhs1,null)",
    }
    assert run.out() == (halves if left_join else {})
    run.check_store(halves if left_join else {})
    run.right.pipe_input("rhs1", "rhsValue1", timestamp=BASE + 3)
    ones = {"lhs1": "(lhsValue1|rhs1,rhsValue1)", "lhs3": "(lhsValue3|rhs1,rhsValue1)"}
    assert run.out() == ones
    run.check_store({**halves, **ones} if left_join else ones)
    run.right.pipe_input("rhs2", "rhsValue2", timestamp=BASE + 4)
    assert run.out() == {"lhs2": "(lhsValue2|rhs2,rhsValue2)"}
    full = {**ones, "lhs2": "(lhsValue2|rhs2,rhsValue2)"}
    run.check_store(full)
    run.right.pipe_input("rhs3", "rhsValue3", timestamp=BASE + 5)  # no subscriber
    assert run.out() == {}
    run.check_store(full)
    run.right.pipe_input("rhs1", None, timestamp=BASE + 6)
    assert run.out() == {
        "lhs1": "(lhsValue1|rhs1,null)" if left_join else None,
        "lhs3": "(lhsValue3|rhs1,null)" if left_join else None,
    }
    two = {"lhs2": "(lhsValue2|rhs2,rhsValue2)"}
    run.check_store({**two, "lhs1": halves["lhs1"], "lhs3": halves["lhs3"]} if left_join else two)


@pytest.mark.parametrize("run", CASES, indirect=True)
def test_deleting_a_non_joining_record_emits_a_tombstone(
    run: Run, request: pytest.FixtureRequest
) -> None:
    """Kafka's shouldEmitTombstoneWhenDeletingNonJoiningRecords (an inner join cannot know
    whether a result went out before, so it unsets it), then deleting again is idempotent."""
    left_join = _left_join(request)
    run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE)
    expected = {"lhs1": "(lhsValue1|rhs1,null)"} if left_join else {}
    assert run.out() == expected
    run.check_store(expected)
    run.left.pipe_input("lhs1", None, timestamp=BASE + 1)
    assert run.out() == {"lhs1": None}
    run.check_store({})
    run.left.pipe_input("lhs1", None, timestamp=BASE + 2)
    assert run.out() == {}
    run.check_store({})


@pytest.mark.parametrize("run", CASES, indirect=True)
def test_deleting_a_record_that_never_existed_emits_nothing(run: Run) -> None:
    """Kafka's shouldNotEmitTombstonesWhenDeletingNonExistingRecords."""
    run.left.pipe_input("lhs1", None, timestamp=BASE)
    assert run.out() == {}
    run.check_store({})


@pytest.mark.parametrize("run", CASES, indirect=True)
def test_a_foreign_key_without_a_match_unsets_the_result(
    run: Run, request: pytest.FixtureRequest
) -> None:
    """Kafka's joinShouldProduceNullsWhenValueHasNonMatchingForeignKey: moving between
    foreign keys with and without a right row."""
    left_join = _left_join(request)
    run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE)
    half = {"lhs1": "(lhsValue1|rhs1,null)"}
    assert run.out() == (half if left_join else {})
    run.check_store(half if left_join else {})
    for step, fk in enumerate(("rhs2", "rhs3"), start=1):
        # An unneeded tombstone for the inner join: it cannot know whether the old
        # key had a match; the left join's row has changed.
        run.left.pipe_input("lhs1", f"lhsValue1|{fk}", timestamp=BASE + step)
        row = f"(lhsValue1|{fk},null)"
        assert run.out() == {"lhs1": row if left_join else None}
        run.check_store({"lhs1": row} if left_join else {})
    # rhs1 is no longer referenced: no change at all.
    run.right.pipe_input("rhs1", "rhsValue1", timestamp=BASE + 3)
    assert run.out() == {}
    run.check_store({"lhs1": "(lhsValue1|rhs3,null)"} if left_join else {})
    run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE + 4)
    assert run.out() == {"lhs1": "(lhsValue1|rhs1,rhsValue1)"}
    run.check_store({"lhs1": "(lhsValue1|rhs1,rhsValue1)"})
    run.left.pipe_input("lhs1", "lhsValue1|rhs2", timestamp=BASE + 5)
    assert run.out() == {"lhs1": "(lhsValue1|rhs2,null)" if left_join else None}
    run.check_store({"lhs1": "(lhsValue1|rhs2,null)"} if left_join else {})


@pytest.mark.parametrize("run", CASES, indirect=True)
def test_changing_the_foreign_key_unsubscribes_the_old_one(run: Run) -> None:
    """Kafka's shouldUnsubscribeOldForeignKeyIfLeftSideIsUpdated."""
    run.right.pipe_input("rhs1", "rhsValue1", timestamp=BASE)
    run.right.pipe_input("rhs2", "rhsValue2", timestamp=BASE + 1)
    assert run.out() == {}
    run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE + 2)
    assert run.out() == {"lhs1": "(lhsValue1|rhs1,rhsValue1)"}
    run.left.pipe_input("lhs1", "lhsValue1|rhs2", timestamp=BASE + 3)
    assert run.out() == {"lhs1": "(lhsValue1|rhs2,rhsValue2)"}
    run.check_store({"lhs1": "(lhsValue1|rhs2,rhsValue2)"})
    # The old foreign key's update reaches nobody.
    run.right.pipe_input("rhs1", "rhsValue1Delta", timestamp=BASE + 4)
    assert run.out() == {}
    run.check_store({"lhs1": "(lhsValue1|rhs2,rhsValue2)"})


def _subscription_store(driver: TopologyTestDriver) -> str:
    (name,) = [s for s in driver.topology.stores if "SUBSCRIPTION-STATE-STORE" in s]
    return name


def _subscription_key(left_key: str, right_key: str) -> bytes:
    """Kafka's subscriptionStoreKey: the right key's length, the right key, the left key."""
    return subscription_prefix(right_key.encode()) + left_key.encode()


@pytest.mark.parametrize("materialized", [False, True])
def test_a_null_foreign_key_emits_the_left_row_with_null_in_a_left_join(
    materialized: bool,
) -> None:
    """Kafka's shouldEmitRecordOnNullForeignKeyForLeftJoins."""
    builder = build(left_join=True, materialized=materialized, extractor=lambda _value: None)
    with TopologyTestDriver(builder) as driver:
        run = Run(driver, materialized)
        run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE)
        assert run.out() == {"lhs1": "(lhsValue1|rhs1,null)"}
        run.check_store({"lhs1": "(lhsValue1|rhs1,null)"})
        assert driver.dropped_records == 0


def test_a_null_foreign_key_drops_the_update_in_an_inner_join() -> None:
    """Kafka's defaultJoinInstructions: no subscription, logged and counted as dropped."""
    builder = build(left_join=False, materialized=True, extractor=lambda _value: None)
    with TopologyTestDriver(builder) as driver:
        run = Run(driver, True)
        run.right.pipe_input("rhs1", "rhsValue1", timestamp=BASE)
        run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE + 1)
        assert run.out() == {}
        run.check_store({})
        assert driver.dropped_records == 1
        assert driver.get_key_value_store(_subscription_store(driver)).all() == []


def _none_or_second(value: str) -> str | None:
    fk = _second(value)
    return None if fk == "none" else fk


def test_an_inner_join_follows_a_foreign_key_from_and_to_none() -> None:
    """KAFKA-16407 (apache/kafka#19303, its SubscriptionSendProcessorSupplierTest cases):
    an update whose old foreign key was None subscribes; one whose new key is None is
    dropped and unsets the old result; an update keeping a key without a match says
    nothing (the old value did not join either)."""
    builder = build(left_join=False, materialized=True, extractor=_none_or_second)
    with TopologyTestDriver(builder) as driver:
        run = Run(driver, True)
        run.right.pipe_input("rhs1", "rhsValue1", timestamp=BASE)
        run.left.pipe_input("lhs1", "lhsValue1|none", timestamp=BASE + 1)
        assert run.out() == {}
        assert driver.dropped_records == 1
        run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE + 2)
        assert run.out() == {"lhs1": "(lhsValue1|rhs1,rhsValue1)"}
        run.left.pipe_input("lhs1", "lhsValue1b|none", timestamp=BASE + 3)
        assert run.output.read_key_values_to_list() == [("lhs1", None)]
        assert driver.dropped_records == 2
        run.check_store({})
        run.left.pipe_input("lhs2", "lhsValue2|rhs9", timestamp=BASE + 4)
        run.left.pipe_input("lhs2", "lhsValue2b|rhs9", timestamp=BASE + 5)
        assert run.output.read_key_values_to_list() == []


def test_a_left_join_answers_a_foreign_key_change_and_a_delete_once() -> None:
    """Kafka's leftJoinInstructions since apache/kafka#20605: the old key is unsubscribed
    without an answer, so a key change and a delete each give one result."""
    builder = build(left_join=True, materialized=False)
    with TopologyTestDriver(builder) as driver:
        run = Run(driver, False)
        run.right.pipe_input("rhs2", "rhsValue2", timestamp=BASE)
        run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE + 1)
        run.left.pipe_input("lhs1", "lhsValue1|rhs2", timestamp=BASE + 2)
        run.left.pipe_input("lhs1", None, timestamp=BASE + 3)
        assert run.output.read_key_values_to_list() == [
            ("lhs1", "(lhsValue1|rhs1,null)"),
            ("lhs1", "(lhsValue1|rhs2,rhsValue2)"),
            ("lhs1", None),
        ]


def test_a_foreign_key_turning_null_unsubscribes_and_emits_in_a_left_join() -> None:
    """Kafka's shouldEmitRecordWhenOldAndNewFkDiffer: the old subscription is removed
    from the store, the row goes out with null."""

    def extractor(value: str) -> str | None:
        fk = _second(value)
        return None if fk == "returnNull" else fk

    builder = build(left_join=True, materialized=True, extractor=extractor)
    with TopologyTestDriver(builder) as driver:
        run = Run(driver, True)
        subscriptions = driver.get_key_value_store(_subscription_store(driver))
        key = _subscription_key("lhs1", "rhs1")
        run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE)
        assert run.out() == {"lhs1": "(lhsValue1|rhs1,null)"}
        assert subscriptions.get(key) is not None
        run.left.pipe_input("lhs1", "lhsValue1|returnNull", timestamp=BASE)
        assert run.out() == {"lhs1": "(lhsValue1|returnNull,null)"}
        assert subscriptions.get(key) is None


@pytest.mark.parametrize("left_join", [False, True])
def test_a_rejoin_sees_the_joined_rows(left_join: bool) -> None:
    """Kafka's rejoin variant and KTableKTableForeignKeyJoinScenarioTest: the foreign-key
    join's result joined on the key with the left table again."""
    builder = build(left_join=left_join, materialized=True, rejoin=True)
    with TopologyTestDriver(builder) as driver:
        run = Run(driver, True)
        rejoined: TestOutputTopic[str, str] = driver.create_output_topic(REJOIN)
        run.right.pipe_input("rhs1", "rhsValue1", timestamp=BASE)
        run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE + 1)
        assert rejoined.read_key_values_to_map() == {
            "lhs1": "rejoin((lhsValue1|rhs1,rhsValue1),lhsValue1|rhs1)"
        }
        run.left.pipe_input("lhs1", None, timestamp=BASE + 2)
        assert rejoined.read_key_values_to_map() == {"lhs1": None}


def test_results_take_the_later_timestamp_of_the_two_rows() -> None:
    """Kafka's SubscriptionJoinProcessorSupplier: a subscription answered from a versioned
    right table is stamped with the later of the two rows' timestamps; a right update
    fanning out keeps its own."""
    builder = build(left_join=False, materialized=False, right_versioned=True)
    with TopologyTestDriver(builder) as driver:
        run = Run(driver, False)
        run.right.pipe_input("rhs1", "rhsValue1", timestamp=BASE + 10)
        run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE)
        run.right.pipe_input("rhs1", "rhsValue2", timestamp=BASE + 20)
        records = run.output.read_records_to_list()
        assert [(r.value, r.timestamp) for r in records] == [
            ("(lhsValue1|rhs1,rhsValue1)", BASE + 10),
            ("(lhsValue1|rhs1,rhsValue2)", BASE + 20),
        ]


def test_a_stale_response_is_dropped_by_its_hash() -> None:
    """A response answering a left value the row no longer has is dropped and counted,
    as Kafka's ResponseJoinProcessorSupplier drops it: written here by hand to the
    response topic, as a slow right side would deliver it after the left row moved on."""
    builder = build(left_join=True, materialized=True, extractor=_second)
    with TopologyTestDriver(builder, {"application.id": "fk"}) as driver:
        run = Run(driver, True)
        run.right.pipe_input("rhs1", "rhsValue1", timestamp=BASE)
        run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE + 1)
        assert run.out() == {"lhs1": "(lhsValue1|rhs1,rhsValue1)"}
        (response_topic,) = [t for t in driver.topology.internal_topics if "RESPONSE" in t]
        stale = value_hash(b"lhsValue0|rhs1")
        driver._pipe(
            response_topic,
            b"lhs1",
            encode_response(Response(stale, b"rhsValueOld", 0)),
            BASE + 2,
            (),
        )
        assert run.out() == {}
        assert driver.dropped_records == 1
        run.check_store({"lhs1": "(lhsValue1|rhs1,rhsValue1)"})


def test_describe_names_the_internal_topics_and_store_as_kafka_does() -> None:
    """Kafka's generated names (KTableImpl.doJoinOnForeignKey), in its numbering order;
    the result store's name is numbered even when nothing is materialized."""
    builder = build(left_join=False, materialized=False)
    text = builder.build().describe()
    for name in (
        "KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION-0000000004-topic",
        "KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION-0000000005",
        "KTABLE-SINK-0000000006",
        "KTABLE-SOURCE-0000000007",
        "KTABLE-FK-JOIN-SUBSCRIPTION-STATE-STORE-0000000008",
        "KTABLE-FK-JOIN-SUBSCRIPTION-PROCESSOR-0000000009",
        "KTABLE-FK-JOIN-SUBSCRIPTION-PROCESSOR-0000000010",
        "KTABLE-FK-JOIN-SUBSCRIPTION-PROCESSOR-0000000011",
        "KTABLE-FK-JOIN-SUBSCRIPTION-RESPONSE-0000000012-topic",
        "KTABLE-SINK-0000000013",
        "KTABLE-SOURCE-0000000014",
        "KTABLE-FK-JOIN-SUBSCRIPTION-RESPONSE-RESOLVER-PROCESSOR-0000000015",
        "KTABLE-FK-JOIN-OUTPUT-0000000016",
        "KTABLE-TOSTREAM-0000000018",
    ):
        assert name in text, name


def test_a_named_join_names_its_topics_and_store_from_the_name() -> None:
    """Kafka's TableJoined.withName: ``<name>-subscription-registration-topic`` and so on."""
    builder = StreamsBuilder()
    left = builder.table(LEFT, "left", key_serde="string", value_serde="string")
    right = builder.table(RIGHT, "right", key_serde="string", value_serde="string")
    left.join(right, _second, _joiner, name="orders").to_stream().to(OUTPUT)
    topology = builder.build()
    assert topology.internal_topics == [
        "orders-subscription-registration-topic",
        "orders-subscription-response-topic",
    ]
    assert "orders-subscription-store" in topology.stores
    for node in (
        "orders-subscription-registration-processor",
        "orders-subscription-registration-sink",
        "orders-subscription-registration-source",
        "orders-subscription-receive",
        "orders-subscription-join-foreign",
        "orders-foreign-join-subscription",
        "orders-subscription-response-sink",
        "orders-subscription-response-source",
        "orders-subscription-response-resolver",
        "orders-result",
    ):
        assert node in topology.nodes, node
    # A name burns the generated indexes too: the next node is numbered as without it.
    assert "KTABLE-TOSTREAM-0000000018" in topology.nodes


def test_a_key_join_given_a_foreign_key_extractor_form_is_refused_clearly() -> None:
    builder = StreamsBuilder()
    left = builder.table(LEFT, "left")
    right = builder.table(RIGHT, "right")
    with pytest.raises(TopologyError, match="foreign_key_extractor, joiner"):
        left.join(right, _joiner, name="x")  # type: ignore[call-overload]
    with pytest.raises(TopologyError, match="non-empty"):
        left.join(right, _second, _joiner, name="")


def test_an_unmaterialized_table_is_refused_with_the_way_out() -> None:
    builder = StreamsBuilder()
    left = builder.table(LEFT, "left").filter(lambda _k, _v: True)
    right = builder.table(RIGHT, "right")
    with pytest.raises(TopologyError, match='materialized="<store>"'):
        left.join(right, _second, _joiner)


def test_the_wire_formats_round_trip_and_refuse_a_newer_version() -> None:
    hashed = value_hash(b"v")
    for subscription in (
        Subscription(hashed, Instruction.PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE, b"k", 3),
        Subscription(None, Instruction.DELETE_KEY_AND_PROPAGATE, b"", 0),
    ):
        assert decode_subscription(encode_subscription(subscription)) == subscription
    for response in (Response(hashed, b"", 1), Response(None, None, 2), Response(hashed, b"x", 0)):
        assert decode_response(encode_response(response)) == response
    newer = bytes((5,)) + encode_subscription(Subscription(None, Instruction(0), b"k", 0))[1:]
    with pytest.raises(ForeignKeyJoinFormatError, match="finish the rolling upgrade"):
        decode_subscription(newer)


@pytest.mark.parametrize("versioned", [False, True], ids=["kv", "versioned"])
@pytest.mark.parametrize("left_join", [False, True], ids=["inner", "left"])
def test_out_of_order_left_records_are_ignored_iff_the_left_table_is_versioned(
    left_join: bool, versioned: bool
) -> None:
    """Kafka's shouldIgnoreOutOfOrderRecordsIffVersioned (its left-hand side part, KIP-914)."""
    builder = build(left_join=left_join, materialized=True, left_versioned=versioned)
    with TopologyTestDriver(builder) as driver:
        run = Run(driver, True)
        run.right.pipe_input("rhs1", "rhsValue1", timestamp=BASE + 4)
        assert run.out() == {}
        run.left.pipe_input("lhs1", "lhsValue1|rhs1", timestamp=BASE + 3)
        run.left.pipe_input("lhs2", "lhsValue2|rhs1", timestamp=BASE + 5)
        both = {"lhs1": "(lhsValue1|rhs1,rhsValue1)", "lhs2": "(lhsValue2|rhs1,rhsValue1)"}
        assert run.out() == both
        run.check_store(both)
        run.left.pipe_input("lhs2", None, timestamp=BASE + 6)
        assert run.out() == {"lhs2": None}
        run.check_store({"lhs1": both["lhs1"]})
        run.left.pipe_input("lhs1", "lhsValue1_ooo|rhs1", timestamp=BASE + 2)
        run.left.pipe_input("lhs2", "lhsValue2_ooo|rhs1", timestamp=BASE + 2)
        ooo = {"lhs1": "(lhsValue1_ooo|rhs1,rhsValue1)", "lhs2": "(lhsValue2_ooo|rhs1,rhsValue1)"}
        assert run.out() == ({} if versioned else ooo)
        run.check_store({"lhs1": both["lhs1"]} if versioned else ooo)
        run.left.pipe_input("lhs1", None, timestamp=BASE + 2)
        assert run.out() == ({} if versioned else {"lhs1": None})
        run.check_store({"lhs1": both["lhs1"]} if versioned else {"lhs2": ooo["lhs2"]})
        run.left.pipe_input("lhs1", "lhsValue1_new|rhs1", timestamp=BASE + 8)
        run.left.pipe_input("lhs2", "lhsValue2_new|rhs1", timestamp=BASE + 8)
        new = {"lhs1": "(lhsValue1_new|rhs1,rhsValue1)", "lhs2": "(lhsValue2_new|rhs1,rhsValue1)"}
        assert run.out() == new
        run.check_store(new)
