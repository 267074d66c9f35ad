"""Currency conversion: a stream of orders enriched from a global table of rates.

``currency-rates`` (key: currency code, value: the rate to EUR, a JSON number) is read
whole by every instance into the global store ``currency-rates`` (a GlobalKTable):
it needs no co-partitioning with the orders, and every instance loads it before it
processes an order. ``orders`` (key: order id, value ``{"currency": ..., "amount":
...}``) are left-joined with it through a key mapper, the order's currency: each
order goes to ``orders-in-eur`` with its amount in EUR (``eur`` None when the
currency has no rate yet). A new rate applies to the orders processed after it
reaches the global store; it does not rewrite past results.
"""

from typing import Any

from eddyline_runtime.processing import StreamsBuilder

ORDERS_TOPIC = "orders"
RATES_TOPIC = "currency-rates"
OUTPUT_TOPIC = "orders-in-eur"


def currency_of(_order_id: str, order: dict[str, Any]) -> str | None:
    currency = order.get("currency")
    return currency if isinstance(currency, str) else None


def in_eur(order: dict[str, Any], rate: float | None) -> dict[str, Any]:
    eur = None if rate is None else round(order["amount"] * rate, 2)
    return {**order, "eur": eur}


def topology() -> StreamsBuilder:
    builder = StreamsBuilder()
    orders = builder.stream(ORDERS_TOPIC, key_serde="string", value_serde="json")
    rates = builder.global_table(
        RATES_TOPIC, "currency-rates", key_serde="string", value_serde="json"
    )
    orders.left_join(rates, currency_of, in_eur).to(
        OUTPUT_TOPIC, key_serde="string", value_serde="json"
    )
    return builder
