"""The app of ``tests/e2e/test_operator_backfill.py``: revision 1 counts events per key;
revision 2 adds a second count per key (``totals``) that the upgrade backfills from the
input's history. One sub-topology in both (the backfill builds no repartition yet), and
revision 1's nodes first in revision 2, so no generated name moves."""

from __future__ import annotations

from eddyline_runtime.processing import StreamsBuilder

INPUT = "events"
COUNTS = "counts"
TOTALS = "totals"


def topology() -> StreamsBuilder:
    builder = StreamsBuilder()
    builder.stream(INPUT, key_serde="string", value_serde="string").group_by_key().count(COUNTS)
    return builder


def topology_v2() -> StreamsBuilder:
    builder = StreamsBuilder()
    events = builder.stream(INPUT, key_serde="string", value_serde="string")
    events.group_by_key().count(COUNTS)
    events.group_by_key().count(TOTALS)
    return builder
