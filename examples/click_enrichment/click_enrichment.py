"""Click enrichment: join a stream of clicks with a table of user profiles.

``clicks`` (key: user id, value ``{"page": ...}``) meets ``user-profiles``
(key: user id, value ``{"region": ...}``), whose latest value per user the
task keeps in the ``user-profiles`` store. Each click of a user with a
profile goes to ``enriched-clicks`` under the same key as
``{"page": ..., "region": ...}``; it is an inner join, so clicks of users
without a profile are dropped.

Both inputs are keyed by user id and must be co-partitioned (the same number
of partitions): a user's clicks and profile then land in the same task, which
reads the profile from its own store.
"""

from typing import Any

from eddyline_runtime.processing import StreamsBuilder

CLICKS_TOPIC = "clicks"
PROFILES_TOPIC = "user-profiles"
OUTPUT_TOPIC = "enriched-clicks"
PROFILES_STORE = "user-profiles"


def enrich(click: dict[str, Any], profile: dict[str, Any]) -> dict[str, Any]:
    return {**click, "region": profile.get("region")}


def topology() -> StreamsBuilder:
    builder = StreamsBuilder()
    profiles = builder.table(PROFILES_TOPIC, PROFILES_STORE, key_serde="string", value_serde="json")
    (
        builder.stream(CLICKS_TOPIC, key_serde="string", value_serde="json")
        .join(profiles, enrich)
        .to(OUTPUT_TOPIC, key_serde="string", value_serde="json")
    )
    return builder
