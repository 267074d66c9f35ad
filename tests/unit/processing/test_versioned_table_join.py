"""Stream-table joins against a versioned table (KIP-914), through the test driver.

The behaviour follows KIP-914 and the versioned-table cases of Kafka Streams'
``KStreamKTableJoinTest`` / ``VersionedKeyValueStoreIntegrationTest`` (the code is ours):
a stream record joins the table's value *as of the record's timestamp*, so a late stream
record meets the table as it was then; an out-of-order table update changes the past
(later late stream records see it) but is not forwarded as a table change; a stream
record older than the table's history retention finds no version (an inner join drops
it, a left join joins it with None). KIP-923's stream-side grace period is not in: each
stream record is joined when it arrives.
"""

from __future__ import annotations

from typing import Any

import pytest

from eddyline_runtime.processing import Materialized, StreamsBuilder, Topology
from eddyline_runtime.processing.topology import TopologyError
from eddyline_runtime.testing import TestDriverError, TopologyTestDriver

ORDERS, PRICES, OUTPUT, CHANGES = "orders", "prices", "priced", "price-changes"
HISTORY = 1_000


def topology(*, left: bool = False, history_ms: int = HISTORY) -> Topology:
    builder = StreamsBuilder()
    orders = builder.stream(ORDERS, key_serde="string", value_serde="string")
    prices = builder.table(
        PRICES,
        Materialized.as_versioned("prices-store", history_ms),
        key_serde="string",
        value_serde="string",
    )
    join = orders.left_join if left else orders.join
    join(prices, lambda order, price: f"{order}@{price}").to(
        OUTPUT, key_serde="string", value_serde="string"
    )
    prices.to_stream().to(CHANGES, key_serde="string", value_serde="string")
    return builder.build()


class Harness:
    def __init__(self, driver: TopologyTestDriver) -> None:
        self.driver = driver
        self.orders = driver.create_input_topic(ORDERS)
        self.prices = driver.create_input_topic(PRICES)
        self.output = driver.create_output_topic(OUTPUT)
        self.changes = driver.create_output_topic(CHANGES)

    def joined(self) -> list[tuple[Any, Any, int]]:
        return [(r.key, r.value, r.timestamp) for r in self.output.read_records_to_list()]


@pytest.fixture
def inner() -> Any:
    with TopologyTestDriver(topology()) as driver:
        yield Harness(driver)


def test_a_late_stream_record_joins_the_table_as_of_its_time(inner: Harness) -> None:
    inner.prices.pipe_input("apple", "1.00", timestamp=100)
    inner.prices.pipe_input("apple", "1.20", timestamp=200)
    inner.orders.pipe_input("apple", "o1", timestamp=250)
    inner.orders.pipe_input("apple", "o0", timestamp=150)  # late: the 1.00 price held then
    inner.orders.pipe_input("apple", "o-early", timestamp=50)  # before any price: no join
    assert inner.joined() == [("apple", "o1@1.20", 250), ("apple", "o0@1.00", 150)]


def test_an_out_of_order_table_update_changes_the_past_not_the_present(
    inner: Harness,
) -> None:
    inner.prices.pipe_input("apple", "1.00", timestamp=100)
    inner.prices.pipe_input("apple", "1.50", timestamp=300)
    inner.prices.pipe_input("apple", "1.20", timestamp=200)  # out of order
    # Only updates that are the key's latest version reach the table's stream (KIP-914).
    assert inner.changes.read_key_values_to_list() == [("apple", "1.00"), ("apple", "1.50")]
    inner.orders.pipe_input("apple", "now", timestamp=310)
    inner.orders.pipe_input("apple", "then", timestamp=250)
    assert inner.joined() == [("apple", "now@1.50", 310), ("apple", "then@1.20", 250)]
    store = inner.driver.get_versioned_store("prices-store")
    assert store.get("apple") == "1.50"
    assert store.get("apple", 250) == "1.20"
    assert store.versions("apple") == [("1.50", 300, None), ("1.20", 200, 300), ("1.00", 100, 200)]


def test_a_tombstone_version_ends_the_match_at_its_time(inner: Harness) -> None:
    inner.prices.pipe_input("apple", "1.00", timestamp=100)
    inner.prices.pipe_input("apple", None, timestamp=200)
    inner.orders.pipe_input("apple", "after", timestamp=210)
    inner.orders.pipe_input("apple", "before", timestamp=150)
    assert inner.joined() == [("apple", "before@1.00", 150)]


def test_stream_records_older_than_the_history_retention_find_no_version() -> None:
    for left in (False, True):
        with TopologyTestDriver(topology(left=left)) as driver:
            h = Harness(driver)
            h.prices.pipe_input("apple", "1.00", timestamp=100)
            h.prices.pipe_input("apple", "2.00", timestamp=100 + HISTORY + 500)
            h.orders.pipe_input("apple", "old", timestamp=150)  # 150 < observed - 1000
            expected = [("apple", "old@None", 150)] if left else []
            assert h.joined() == expected
            # A table update older than the retention is dropped: not kept, not forwarded.
            h.prices.pipe_input("apple", "ancient", timestamp=120)
            assert h.changes.read_key_values_to_list() == [("apple", "1.00"), ("apple", "2.00")]
            assert driver.get_versioned_store("prices-store").get("apple", 600) == "1.00"


def test_a_versioned_store_is_read_with_its_own_accessor(inner: Harness) -> None:
    with pytest.raises(TestDriverError, match="is a versioned store, not a key-value store"):
        inner.driver.get_key_value_store("prices-store")


def test_as_versioned_is_refused_where_only_latest_values_are_kept() -> None:
    builder = StreamsBuilder()
    words = builder.stream("words", key_serde="string", value_serde="string")
    with pytest.raises(TopologyError, match=r"as_versioned is supported for builder\.table only"):
        words.group_by_key().count(Materialized.as_versioned("counts", HISTORY))
    with pytest.raises(TopologyError, match="a versioned store has no record cache"):
        Materialized.as_versioned("p", HISTORY).with_caching_enabled()
    with pytest.raises(TopologyError, match='"p": history retention -1'):
        Materialized.as_versioned("p", -1)
    with pytest.raises(TopologyError, match=r"as_versioned is supported for builder\.table only"):
        builder.global_table("rates", Materialized.as_versioned("rates", HISTORY))
