"""Order enrichment: each order joined with its customer, its amount converted to EUR.

``orders`` (key: order id, value ``{"customer_id": ..., "amount": ..., "currency":
...}``) and ``customers`` (key: customer id, value ``{"name": ..., "tier": ...}``)
are tables. Orders are keyed by order id, customers by customer id: they are not
co-partitioned, so the join is a foreign-key join (Kafka's KIP-213, docs/joins.md):
each order subscribes to its customer's partition and is answered from there. A
left join: an order whose customer is unknown (or deleted) goes out with
``customer`` None. The joined table is kept in the store ``enriched-orders``
(queryable); the join's internal topics and subscription store are named from
``order-customer``, so they keep their names when the topology changes elsewhere.

``currency-rates`` (key: currency code, value: the rate to EUR, a JSON number) is a
global table (GlobalKTable): every instance reads it whole into the global store
``currency-rates`` before it processes an order, so it needs no co-partitioning.
Each row of the joined table's changelog is left-joined with it through the
order's currency: ``eur`` is the amount in EUR, None while the currency has no
rate. Kafka joins a stream, not a table, with a global table, so a new rate
applies to the rows joined after it arrives (an order or customer change); it
does not rewrite rows already sent.

``enriched-orders`` receives ``{"order": ..., "customer": ..., "eur": ...}``
whenever an order or its customer changes (a renamed customer re-sends every order
of theirs), and the order's tombstone when it is deleted. A stream-global join
drops a record without a value (Kafka's rule), so tombstones bypass the
conversion and are merged back in; both paths run in the same task, one record at
a time, so an order's rows keep their order.
"""

from typing import Any

from eddyline_runtime.processing import StreamsBuilder

ORDERS_TOPIC = "orders"
CUSTOMERS_TOPIC = "customers"
RATES_TOPIC = "currency-rates"
OUTPUT_TOPIC = "enriched-orders"


def customer_id(order: dict[str, Any]) -> Any:
    return order.get("customer_id")


def enriched(order: dict[str, Any], customer: dict[str, Any] | None) -> dict[str, Any]:
    return {"order": order, "customer": customer}


def currency_of(_order_id: str, row: dict[str, Any]) -> str | None:
    currency = row["order"].get("currency")
    return currency if isinstance(currency, str) else None


def in_eur(row: dict[str, Any], rate: float | None) -> dict[str, Any]:
    eur = None if rate is None else round(row["order"]["amount"] * rate, 2)
    return {**row, "eur": eur}


def is_row(_order_id: str, row: dict[str, Any] | None) -> bool:
    return row is not None


def is_tombstone(_order_id: str, row: dict[str, Any] | None) -> bool:
    return row is None


def topology() -> StreamsBuilder:
    builder = StreamsBuilder()
    orders = builder.table(ORDERS_TOPIC, "orders", key_serde="string", value_serde="json")
    customers = builder.table(CUSTOMERS_TOPIC, "customers", key_serde="string", value_serde="json")
    rates = builder.global_table(
        RATES_TOPIC, "currency-rates", key_serde="string", value_serde="json"
    )
    joined = orders.left_join(
        customers,
        customer_id,
        enriched,
        name="order-customer",
        materialized="enriched-orders",
    ).to_stream()
    converted = joined.filter(is_row).left_join(rates, currency_of, in_eur)
    converted.merge(joined.filter(is_tombstone)).to(
        OUTPUT_TOPIC, key_serde="string", value_serde="json"
    )
    return builder
