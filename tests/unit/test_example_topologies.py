"""The examples' topologies, through the test driver: what each one computes, record by record.

``tests/e2e/test_examples.py`` runs every example from its manifest, as
``eddyline run`` does; these tests load the same ``module:function`` and pipe
records through :class:`~eddyline_runtime.testing.TopologyTestDriver`, so each
case says what goes in and what comes out, in milliseconds, without a log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.processing import SessionWindow, TimeWindow, Windowed
from eddyline_runtime.processing.loader import load_topology
from eddyline_runtime.testing import TestRecord, TopologyTestDriver

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MINUTE = 60_000


def example_driver(example: str, **config: Any) -> TopologyTestDriver:
    """The example's ``topology`` function, in a driver (``config``: settings over the
    defaults, with ``_`` for ``.``)."""
    topology = load_topology(f"{example}:topology", [EXAMPLES / example])
    settings = {key.replace("_", "."): value for key, value in config.items()}
    return TopologyTestDriver(topology, {"application.id": example, **settings})


@pytest.fixture
def page_views() -> Iterator[TopologyTestDriver]:
    with example_driver("page_views") as driver:
        yield driver


def test_page_views_count_each_region_and_minute_once_when_it_closes(
    page_views: TopologyTestDriver,
) -> None:
    views = page_views.create_input_topic("page-views")
    finals = page_views.create_output_topic("page-views-per-minute")

    views.pipe_input("alice", {"region": "eu", "page": "/a"}, 1_000)
    views.pipe_input("bob", {"region": "us", "page": "/b"}, 2_000)
    views.pipe_input("carol", {"region": "eu", "page": "/c"}, 59_999)  # end exclusive
    views.pipe_input("dave", {"region": "eu", "page": "/d"}, MINUTE)  # minute 1
    views.pipe_input("frank", {"region": "eu", "page": "/f"}, 55_000)  # late, within grace
    assert finals.is_empty()  # minute 0 closes at 70 s of stream time

    views.pipe_input("gina", {"region": "eu", "page": "/g"}, MINUTE + 10_000)
    assert finals.read_records_to_list() == [
        TestRecord("eu@0", {"region": "eu", "start": 0, "end": MINUTE, "views": 3}, 59_999),
        TestRecord("us@0", {"region": "us", "start": 0, "end": MINUTE, "views": 1}, 2_000),
    ]

    views.pipe_input("hank", {"region": "us", "page": "/h"}, 20_000)  # beyond grace
    assert page_views.dropped_records == 1
    assert finals.is_empty()
    # The window store holds the counts; the closed minute stays until its retention ends.
    assert page_views.get_window_store("page-views-per-region-minute").all() == [
        (Windowed("eu", TimeWindow(0, MINUTE)), 3),
        (Windowed("us", TimeWindow(0, MINUTE)), 1),
        (Windowed("eu", TimeWindow(MINUTE, 2 * MINUTE)), 2),
    ]


def test_user_sessions_merge_when_a_late_click_bridges_two() -> None:
    with example_driver("user_sessions") as driver:
        clicks = driver.create_input_topic("clicks")
        sessions = driver.create_output_topic("user-sessions")
        for user, minute in [("alice", 0), ("alice", 10), ("bob", 5), ("alice", 42)]:
            clicks.pipe_input(user, {"page": "/"}, minute * MINUTE)
        sessions.read_records_to_list()

        clicks.pipe_input("alice", {"page": "/"}, 25 * MINUTE)  # late, within grace

        # Both sessions it bridges are removed, then the merged one is written.
        assert sessions.read_key_values_to_list() == [
            ("alice@0", None),
            ("alice@2520000", None),
            ("alice@0", {"user": "alice", "start": 0, "end": 42 * MINUTE, "clicks": 4}),
        ]
        assert driver.get_session_store("user-sessions").fetch("alice") == [
            (Windowed("alice", SessionWindow(0, 42 * MINUTE)), 4)
        ]


def test_ad_clicks_emit_an_unclicked_impression_only_once_its_window_closed() -> None:
    with example_driver("ad_clicks") as driver:
        impressions = driver.create_input_topic("impressions")
        clicks = driver.create_input_topic("clicks")
        results = driver.create_output_topic("ad-results")

        impressions.pipe_input("imp-1", {"campaign": "a"}, 0)
        clicks.pipe_input("imp-1", {"page": "/a"}, MINUTE // 2)
        assert results.read_key_values_to_list() == [("imp-1", {"campaign": "a", "clicked": True})]

        impressions.pipe_input("imp-2", {"campaign": "b"}, MINUTE)
        clicks.pipe_input("imp-9", {"page": "/x"}, 100_000)  # no such impression: nothing
        assert results.is_empty()

        # imp-2's window (1 + 10 minutes, + 1 of grace) closes once stream time is past 12
        # minutes (Kafka's outer join: emitted when its time + after + grace < stream time).
        impressions.pipe_input("imp-3", {"campaign": "a"}, 12 * MINUTE)
        assert results.is_empty()
        impressions.pipe_input("imp-4", {"campaign": "a"}, 12 * MINUTE + 1)
        assert results.read_records_to_list() == [
            TestRecord("imp-2", {"campaign": "b", "clicked": False}, MINUTE)
        ]


def test_customer_accounts_join_two_tables_into_a_table() -> None:
    with example_driver("customer_accounts") as driver:
        customers = driver.create_input_topic("customers")
        accounts = driver.create_input_topic("accounts")
        rows = driver.create_output_topic("customer-accounts")

        customers.pipe_input("c1", {"name": "Ann"}, 1_000)
        accounts.pipe_input("c1", {"balance": 10}, 1_500)
        accounts.pipe_input("c2", {"balance": 5}, 1_600)  # no customer yet: no row
        customers.pipe_input("c2", {"name": "Bo"}, 2_000)
        customers.pipe_input("c1", None, 3_000)  # Ann leaves: the row's tombstone

        assert rows.read_records_to_list() == [
            TestRecord("c1", {"name": "Ann", "balance": None}, 1_000),
            TestRecord("c1", {"name": "Ann", "balance": 10}, 1_500),
            TestRecord("c2", {"name": "Bo", "balance": 5}, 2_000),
            TestRecord("c1", None, 3_000),
        ]
        assert driver.get_key_value_store("customers").all() == [("c2", {"name": "Bo"})]


def test_order_enrichment_joins_each_order_with_its_customer_and_converts_it_to_eur() -> None:
    with example_driver("order_enrichment") as driver:
        rates = driver.create_input_topic("currency-rates")
        orders = driver.create_input_topic("orders")
        customers = driver.create_input_topic("customers")
        rows = driver.create_output_topic("enriched-orders")
        ann, bo = {"name": "Ann", "tier": "gold"}, {"name": "Bo", "tier": "basic"}
        o1 = {"customer_id": "c1", "amount": 30, "currency": "USD"}
        o2 = {"customer_id": "c2", "amount": 5, "currency": "CHF"}

        rates.pipe_input("USD", 0.9, 500)
        customers.pipe_input("c1", ann, 1_000)
        orders.pipe_input("o1", o1, 2_000)
        orders.pipe_input("o2", o2, 3_000)  # no customer c2 yet, no CHF rate yet: both None
        customers.pipe_input("c2", bo, 4_000)  # answers o2
        rates.pipe_input("CHF", 1.1, 4_500)  # sends nothing: the rows joined from now on use it
        gold = {**bo, "tier": "gold"}
        customers.pipe_input("c2", gold, 5_000)  # re-sends every order of c2, now in EUR
        moved = {**o1, "customer_id": "c2"}
        orders.pipe_input("o1", moved, 6_000)  # o1 now names c2
        customers.pipe_input("c1", None, 7_000)  # nobody names c1 any more: nothing
        orders.pipe_input("o2", None, 8_000)  # the order's tombstone gets past the conversion
        orders.pipe_input("o3", {"customer_id": "c2", "amount": 1}, 9_000)  # no currency

        assert [(r.key, r.value) for r in rows.read_records_to_list()] == [
            ("o1", {"order": o1, "customer": ann, "eur": 27.0}),
            ("o2", {"order": o2, "customer": None, "eur": None}),
            ("o2", {"order": o2, "customer": bo, "eur": None}),
            ("o2", {"order": o2, "customer": gold, "eur": 5.5}),
            ("o1", {"order": moved, "customer": gold, "eur": 27.0}),
            ("o2", None),
            ("o3", {"order": {"customer_id": "c2", "amount": 1}, "customer": gold, "eur": None}),
        ]
        # The joined table is stored before the conversion (a rate is not part of it).
        assert driver.get_key_value_store("enriched-orders").all() == [
            ("o1", {"order": moved, "customer": gold}),
            ("o3", {"order": {"customer_id": "c2", "amount": 1}, "customer": gold}),
        ]
        assert driver.get_key_value_store("currency-rates").all() == [("CHF", 1.1), ("USD", 0.9)]


def test_currency_conversion_enriches_orders_from_the_global_table() -> None:
    with example_driver("currency_conversion") as driver:
        rates = driver.create_input_topic("currency-rates")
        orders = driver.create_input_topic("orders")
        converted = driver.create_output_topic("orders-in-eur")

        rates.pipe_input("USD", 0.92, 0)
        orders.pipe_input("o1", {"currency": "USD", "amount": 100}, 1_000)
        orders.pipe_input("o2", {"currency": "CHF", "amount": 50}, 2_000)  # no rate yet
        orders.pipe_input("o3", {"amount": 5}, 2_500)  # no currency: the mapper gives None
        rates.pipe_input("CHF", 1.05, 3_000)
        orders.pipe_input("o4", {"currency": "CHF", "amount": 10}, 4_000)

        assert converted.read_records_to_list() == [
            TestRecord("o1", {"currency": "USD", "amount": 100, "eur": 92.0}, 1_000),
            TestRecord("o2", {"currency": "CHF", "amount": 50, "eur": None}, 2_000),
            TestRecord("o3", {"amount": 5, "eur": None}, 2_500),
            TestRecord("o4", {"currency": "CHF", "amount": 10, "eur": 10.5}, 4_000),
        ]
        assert driver.get_key_value_store("currency-rates").all() == [("CHF", 1.05), ("USD", 0.92)]


def test_custom_processor_forwards_an_id_again_once_its_retention_passed() -> None:
    day = 24 * 60 * MINUTE  # the example's RETENTION_MS
    with example_driver("custom_processor") as driver:
        events = driver.create_input_topic("events")
        unique = driver.create_output_topic("unique-events")
        seen = driver.get_key_value_store("seen-event-ids")

        events.pipe_input("e1", {"n": 1}, 10, headers=(("source", b"app"),))
        events.pipe_input("e1", {"n": 1, "retry": True}, 20)
        assert unique.read_records_to_list() == [
            TestRecord("e1", {"n": 1}, 10, (("source", b"app"),))
        ]

        events.pipe_input("e2", {"n": 2}, day + 1_000)  # the hourly purge forgets e1
        assert seen.get(b"e1") is None  # the store has no serdes: bytes
        events.pipe_input("e1", {"n": 1, "again": True}, day + 2_000)
        assert unique.read_key_values_to_list() == [
            ("e2", {"n": 2}),
            ("e1", {"n": 1, "again": True}),
        ]


def test_poison_orders_sum_the_good_orders_and_set_the_bad_ones_aside() -> None:
    config = {
        "deserialization_exception_handler": "log-and-continue",
        "processing_exception_handler": "log-and-continue",
    }
    with example_driver("poison_orders", **config) as driver:
        raw = driver.create_input_topic("orders", value_serde="bytes")
        raw.pipe_input("ann", b'{"quantity": 2, "price": 3}')
        raw.pipe_input("ann", b"{not json")
        raw.pipe_input("bo", b'{"quantity": 1}')
        raw.pipe_input("ann", b'{"quantity": 1, "price": 4}')
        revenue = driver.create_output_topic("revenue").read_key_values_to_map()
        assert revenue == {"ann": 10}
        assert driver.dropped_records == 2
