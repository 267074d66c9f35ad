"""Customer accounts: two changelog tables joined on their key.

``customers`` (key: customer id, value ``{"name": ...}``) and ``accounts`` (key:
customer id, value ``{"balance": ...}``) are tables: the latest value per key, a
null value deleting the key. Their left join goes to ``customer-accounts`` as a
table's changelog: on every update of either side, the customer's current row
``{"name": ..., "balance": ...}`` (``balance`` None while the customer has no
account), and a tombstone when the customer is deleted. Each side keeps its
table in a store named from ``customer-accounts`` (``-left-store``,
``-right-store``), so the join survives restarts and relocations.

Both topics are keyed by customer id and must be co-partitioned.
"""

from typing import Any

from eddyline_runtime.processing import StreamsBuilder

CUSTOMERS_TOPIC = "customers"
ACCOUNTS_TOPIC = "accounts"
OUTPUT_TOPIC = "customer-accounts"


def row(customer: dict[str, Any], account: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "name": customer.get("name"),
        "balance": None if account is None else account["balance"],
    }


def topology() -> StreamsBuilder:
    builder = StreamsBuilder()
    customers = builder.table(CUSTOMERS_TOPIC, "customers", key_serde="string", value_serde="json")
    accounts = builder.table(ACCOUNTS_TOPIC, "accounts", key_serde="string", value_serde="json")
    (
        customers.left_join(accounts, row, store_name="customer-accounts")
        .to_stream()
        .to(OUTPUT_TOPIC, key_serde="string", value_serde="json")
    )
    return builder
