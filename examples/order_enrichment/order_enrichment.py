"""Order enrichment: each order joined with its customer by the customer id it names.

``orders`` (key: order id, value ``{"customer_id": ..., "amount": ...}``) and
``customers`` (key: customer id, value ``{"name": ..., "tier": ...}``) are tables.
Orders are keyed by order id, customers by customer id: they are not co-partitioned,
so the join is a foreign-key join (Kafka's KIP-213, docs/joins.md): each order
subscribes to its customer's partition and is answered from there. A left join:
an order whose customer is unknown (or deleted) goes out with ``customer`` None.

``enriched-orders`` receives the joined table's changelog: the order's current
row ``{"order": ..., "customer": ...}`` whenever the order or its customer changes
(a renamed customer re-sends every order of theirs), a tombstone when the order is
deleted. The joined table is kept in the store ``enriched-orders`` (queryable);
the join's internal topics and subscription store are named from
``order-customer``, so they keep their names when the topology changes elsewhere.
"""

from typing import Any

from eddyline_runtime.processing import StreamsBuilder

ORDERS_TOPIC = "orders"
CUSTOMERS_TOPIC = "customers"
OUTPUT_TOPIC = "enriched-orders"


def customer_id(order: dict[str, Any]) -> Any:
    return order.get("customer_id")


def enriched(order: dict[str, Any], customer: dict[str, Any] | None) -> dict[str, Any]:
    return {"order": order, "customer": customer}


def topology() -> StreamsBuilder:
    builder = StreamsBuilder()
    orders = builder.table(ORDERS_TOPIC, "orders", key_serde="string", value_serde="json")
    customers = builder.table(CUSTOMERS_TOPIC, "customers", key_serde="string", value_serde="json")
    (
        orders.left_join(
            customers,
            customer_id,
            enriched,
            name="order-customer",
            materialized="enriched-orders",
        )
        .to_stream()
        .to(OUTPUT_TOPIC, key_serde="string", value_serde="json")
    )
    return builder
