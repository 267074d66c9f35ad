"""Ad clicks: impressions left-joined with the clicks on them within 10 minutes.

``impressions`` (key: impression id, value ``{"campaign": ...}``) and ``clicks``
(key: the impression id clicked, value ``{"page": ...}``) are joined when a click
comes at most 10 minutes before or after its impression (``JoinWindows``, grace 1
minute). Each clicked impression goes to ``ad-results`` as ``{"campaign": ...,
"clicked": true}`` when its click arrives; an impression never clicked comes out
as ``{"campaign": ..., "clicked": false}`` once its window has closed (stream time
past the impression + 10 minutes + 1 minute of grace), never earlier. A click
without an impression gives nothing (a left join keeps the impressions).

Both topics are keyed by impression id and must be co-partitioned. The two sides
are buffered in the window stores ``ad-clicks-this-join-store`` and
``ad-clicks-outer-other-join-store``, the impressions waiting for their window to
close in ``ad-clicks-left-shared-join-store``.
"""

from typing import Any

from eddyline_runtime.processing import JoinWindows, StreamsBuilder

IMPRESSIONS_TOPIC = "impressions"
CLICKS_TOPIC = "clicks"
OUTPUT_TOPIC = "ad-results"
MINUTE = 60_000


def result(impression: dict[str, Any], click: dict[str, Any] | None) -> dict[str, Any]:
    return {"campaign": impression.get("campaign"), "clicked": click is not None}


def topology() -> StreamsBuilder:
    builder = StreamsBuilder()
    impressions = builder.stream(IMPRESSIONS_TOPIC, key_serde="string", value_serde="json")
    clicks = builder.stream(CLICKS_TOPIC, key_serde="string", value_serde="json")
    impressions.left_join(
        clicks,
        result,
        JoinWindows.of_time_difference_with_grace(10 * MINUTE, MINUTE),
        store_name="ad-clicks",
    ).to(OUTPUT_TOPIC, key_serde="string", value_serde="json")
    return builder
