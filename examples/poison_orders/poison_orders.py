"""Poison orders: revenue per customer, with the records that cannot be processed set aside.

``orders`` (key: customer id, value JSON ``{"quantity": 2, "price": 3}``) are
summed per customer into ``revenue`` (JSON numbers, each new total). Two kinds
of bad record show up in real order feeds, and neither stops the app:

- a value that is not JSON fails the source's deserializer: the
  ``deserialization.exception.handler`` (``log-and-continue`` in the manifest)
  skips it;
- an order without a price, or with a negative quantity, makes :func:`amount`
  raise: the ``processing.exception.handler`` skips it.

With ``errors.dead.letter.queue.topic.name: orders-dlq`` each skipped record
goes to ``orders-dlq`` with its original key and value bytes and the
``__streams.errors.*`` headers (exception, message, stack trace, topic,
partition, offset), in the same transaction as the input offset that skips it
(``exactly_once_v2``). The app does not create ``orders-dlq``: create it with
the input topic (see ``streamapp.yaml``). See ``docs/errors.md``.
"""

from typing import Any

from eddyline_runtime.processing import StreamsBuilder

ORDERS_TOPIC = "orders"
OUTPUT_TOPIC = "revenue"
DEAD_LETTER_TOPIC = "orders-dlq"


def amount(order: dict[str, Any]) -> int:
    """What an order is worth; a malformed order raises (and goes to the DLQ)."""
    quantity, price = order["quantity"], order["price"]
    if quantity < 0:
        raise ValueError(f"negative quantity {quantity}")
    return int(quantity * price)


def topology() -> StreamsBuilder:
    builder = StreamsBuilder()
    (
        builder.stream(ORDERS_TOPIC, key_serde="string", value_serde="json")
        .map_values(amount)
        .group_by_key()
        .reduce(lambda total, value: total + value, "revenue-per-customer")
        .to_stream()
        .to(OUTPUT_TOPIC, key_serde="string", value_serde="json")
    )
    return builder
