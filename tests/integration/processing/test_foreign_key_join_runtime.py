"""A foreign-key join (KIP-213) run by a StreamsInstance on the embedded log, restarted.

The steps walk the protocol's cases (Kafka's ``KTableKTableForeignKeyJoinIntegrationTest``
inputs): left rows before and after their right rows, a right row fanning out to two
subscribers, a foreign-key change, a right tombstone, a left tombstone, and a left
join's null foreign key. The instance is stopped between steps (and once its state
directory is wiped, so the subscription store and both tables are restored from
their changelogs); its outputs, per step, and its stores must equal the test
driver's uninterrupted run, and the driver's must be Kafka's.

Each step is processed to the end before the next is produced, so an instance stops
with no subscription or response in flight: that a stop with records in flight
neither loses nor repeats one is the transactions' business, which the crash tests
hold for every internal topic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.processing import StreamsBuilder, Topology
from tests.support.scenarios import Input, Scenario, run_on_driver, run_on_instance

pytestmark = pytest.mark.timeout(300)

LEFT, RIGHT = "orders", "customers"


def _java(value: Any) -> str:
    return "null" if value is None else str(value)


def _joiner(left: Any, right: Any) -> str:
    return f"({_java(left)},{_java(right)})"


def _extractor(value: str) -> str | None:
    fk = value.split("|")[1]
    return None if fk == "none" else fk


def fk_join(
    *, left_join: bool, name: str | None = None, new_first_sub_topology: bool = False
) -> Topology:
    """Orders joined to customers by the customer an order names; ``name`` names the join's
    topics and subscription store, ``new_first_sub_topology`` puts an unrelated one first
    (every ordinal shifts by one: what KIP-816 relocation is for)."""
    builder = StreamsBuilder()
    if new_first_sub_topology:
        builder.stream("other").to("elsewhere")
    left = builder.table(LEFT, "orders-store", key_serde="string", value_serde="string")
    right = builder.table(RIGHT, "customers-store", key_serde="string", value_serde="string")
    method = left.left_join if left_join else left.join
    joined = method(
        right, _extractor, _joiner, name=name, materialized="joined", value_serde="string"
    )
    joined.to_stream().to("output", key_serde="string", value_serde="string")
    return builder.build()


STEPS: list[list[Input]] = [
    [(RIGHT, "rhs1", "rhsValue1", 1), (RIGHT, "rhs2", "rhsValue2", 2)],
    [(LEFT, "lhs1", "lhsValue1|rhs1", 3), (LEFT, "lhs2", "lhsValue2|rhs2", 4)],
    [(LEFT, "lhs3", "lhsValue3|rhs1", 5)],
    [(RIGHT, "rhs1", "rhsValue1b", 6)],  # fans out to lhs1 and lhs3
    [(LEFT, "lhs1", "lhsValue1|rhs2", 7)],  # a foreign-key change
    [(RIGHT, "rhs1", "rhsValue1c", 8)],  # reaches lhs3 only
    [(RIGHT, "rhs2", None, 9)],  # unsets lhs1 and lhs2
    [(LEFT, "lhs3", None, 10), (LEFT, "lhs4", "lhsValue4|none", 11)],
]

# Kafka's results for these inputs (its readKeyValuesToList, in order).
KAFKA_EXPECTED = {
    "inner": [
        ("lhs1", "(lhsValue1|rhs1,rhsValue1)"),
        ("lhs2", "(lhsValue2|rhs2,rhsValue2)"),
        ("lhs3", "(lhsValue3|rhs1,rhsValue1)"),
        ("lhs1", "(lhsValue1|rhs1,rhsValue1b)"),
        ("lhs3", "(lhsValue3|rhs1,rhsValue1b)"),
        ("lhs1", "(lhsValue1|rhs2,rhsValue2)"),
        ("lhs3", "(lhsValue3|rhs1,rhsValue1c)"),
        ("lhs1", None),
        ("lhs2", None),
        ("lhs3", None),
    ],
    "left": [
        ("lhs1", "(lhsValue1|rhs1,rhsValue1)"),
        ("lhs2", "(lhsValue2|rhs2,rhsValue2)"),
        ("lhs3", "(lhsValue3|rhs1,rhsValue1)"),
        ("lhs1", "(lhsValue1|rhs1,rhsValue1b)"),
        ("lhs3", "(lhsValue3|rhs1,rhsValue1b)"),
        ("lhs1", "(lhsValue1|rhs2,rhsValue2)"),
        ("lhs3", "(lhsValue3|rhs1,rhsValue1c)"),
        ("lhs1", "(lhsValue1|rhs2,null)"),
        ("lhs2", "(lhsValue2|rhs2,null)"),
        ("lhs3", None),
        ("lhs4", "(lhsValue4|none,null)"),
    ],
}


def subscription_store(kind: str) -> str:
    """The join's subscription store, by the name Kafka's node counter gives it."""
    (name,) = [
        store
        for store in fk_join(left_join=kind == "left").stores
        if store.startswith("KTABLE-FK-JOIN-SUBSCRIPTION-STATE-STORE-")
    ]
    return name


def scenario(kind: str, *, wipe: bool) -> Scenario:
    return Scenario(
        f"fk-{kind}-join{'-wiped' if wipe else ''}",
        lambda: fk_join(left_join=kind == "left"),
        steps=STEPS,
        outputs=["output"],
        stores=["joined", "orders-store", "customers-store", subscription_store(kind)],
        config={"statestore.cache.max.bytes": 0},
        restart_after=[1, 4, 6],
        wipe_on_restart=wipe,
    )


@pytest.mark.parametrize("kind", ["inner", "left"])
def test_the_driver_gives_what_kafka_gives(kind: str) -> None:
    result = run_on_driver(scenario(kind, wipe=False))
    assert [(key, value) for key, value, _ in result.outputs["output"]] == KAFKA_EXPECTED[kind]


@pytest.mark.slow
@pytest.mark.parametrize("wipe", [False, True], ids=["kept-state", "wiped-state"])
@pytest.mark.parametrize("kind", ["inner", "left"])
def test_a_restarted_instance_gives_what_an_uninterrupted_run_gives(
    kind: str, wipe: bool, tmp_path: Path
) -> None:
    run = scenario(kind, wipe=wipe)
    assert run_on_instance(run, tmp_path) == run_on_driver(run)
