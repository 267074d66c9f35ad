"""Page views per region per minute, final results only.

``page-views`` (key: user id, value ``{"region": ..., "page": ...}``) is
re-keyed by region (through the ``page-views-by-region`` repartition topic),
cut into 1-minute tumbling windows aligned to the epoch that accept records
up to 10 seconds late, and counted in the window store
``page-views-per-region-minute``. With ``emit_final()`` each window's count
goes out once, when the stream time passes its end + grace, to
``page-views-per-minute`` (key ``"<region>@<window start>"``, value
``{"region", "start", "end", "views"}``); views later than the grace are
dropped and counted in the task metric ``dropped-records-total``.
"""

from typing import Any

from eddyline_runtime.processing import StreamsBuilder, TimeWindows, Windowed

INPUT_TOPIC = "page-views"
OUTPUT_TOPIC = "page-views-per-minute"
STORE = "page-views-per-region-minute"
MINUTE_MS = 60_000
GRACE_MS = 10_000


def region_of(_user: str, view: dict[str, Any]) -> str:
    return str(view.get("region", "unknown"))


def result(window: Windowed[str], views: int) -> tuple[str, dict[str, Any]]:
    start, end = window.window.start, window.window.end
    return f"{window.key}@{start}", {
        "region": window.key,
        "start": start,
        "end": end,
        "views": views,
    }


def topology() -> StreamsBuilder:
    builder = StreamsBuilder()
    (
        builder.stream(INPUT_TOPIC, key_serde="string", value_serde="json")
        .group_by(region_of, repartition_name="page-views-by-region")
        .windowed_by(TimeWindows.of_size_with_grace(MINUTE_MS, GRACE_MS))
        .emit_final()
        .count(STORE)
        .to_stream()
        .map(result)
        .to(OUTPUT_TOPIC, key_serde="string", value_serde="json")
    )
    return builder


# Revision 2 of the topology: a bot filter goes in before the windowed aggregation. It drops
# views marked ``{"bot": true}`` and runs behind a repartition topic of its own
# (``page-views-checked``), so it is a new sub-topology ahead of the aggregation's: the
# aggregation moves from sub-topology 1 to 2, and with it its task directories. Deploy it by
# changing ``spec.topology`` to ``{ref: "page_views:topology_v2", revision: "2"}``; the
# stores keep their given names (``page-views-per-region-minute`` and its final-results
# buffer), so the pods relocate them to the new ordinal (KIP-816) instead of restoring them
# from their changelogs, and the counts of windows still open go on from where they were.
CHECKED_NAME = "page-views-checked"


def not_a_bot(_user: str, view: dict[str, Any]) -> bool:
    return not view.get("bot", False)


def topology_v2() -> StreamsBuilder:
    builder = StreamsBuilder()
    (
        builder.stream(INPUT_TOPIC, key_serde="string", value_serde="json")
        .filter(not_a_bot)
        .repartition(CHECKED_NAME)
        # Revision 1's repartition topic by the same name: views still in it at the
        # upgrade are counted by revision 2.
        .group_by(region_of, repartition_name="page-views-by-region")
        .windowed_by(TimeWindows.of_size_with_grace(MINUTE_MS, GRACE_MS))
        .emit_final()
        .count(STORE)
        .to_stream()
        .map(result)
        .to(OUTPUT_TOPIC, key_serde="string", value_serde="json")
    )
    return builder
