"""What a backfill refuses, before any history is read."""

from __future__ import annotations

import pytest

from eddyline_runtime.backfill import (
    BackfillError,
    BackfillPlan,
    NotBackfillableError,
    backfill_layout,
)
from eddyline_runtime.partitions import TaskId, TopicPartition
from tests.support.topologies.backfill_topologies import (
    INPUT,
    count_joined_with_a_global_table,
    keyed_count,
    repartitioned_count,
)


def test_a_repartitioned_topology_is_refused_naming_its_stores() -> None:
    with pytest.raises(NotBackfillableError, match=r"value-counts.*not supported yet"):
        backfill_layout(repartitioned_count(), "app", {INPUT: 4})


def test_a_topology_with_a_global_table_is_refused_naming_its_store() -> None:
    topology = count_joined_with_a_global_table()
    assert len(tuple(topology.subtopologies())) == 1  # refused for the global store alone
    with pytest.raises(
        NotBackfillableError, match=r'global stores \("region-names"\).*without the GlobalKTable'
    ):
        backfill_layout(topology, "app", {INPUT: 4, "regions": 1})


def test_a_missing_input_topic_is_refused_naming_it() -> None:
    with pytest.raises(BackfillError, match='input topic "events" is not in the log'):
        backfill_layout(keyed_count(), "app", {"other": 4})


def test_the_layout_has_one_task_per_input_partition_and_the_changelogs() -> None:
    layout = backfill_layout(keyed_count(), "app", {INPUT: 3})
    assert layout.tasks() == [TaskId(0, 0), TaskId(0, 1), TaskId(0, 2)]
    assert layout.changelog_partition("counts", TaskId(0, 2)) == TopicPartition(
        "app-counts-changelog", 2
    )


def test_a_plan_survives_its_trip_to_the_executors() -> None:
    plan = BackfillPlan(
        application="app",
        topology="m:f",
        stores=("counts",),
        log_url="sqlite:////tmp/x.db",
        output="/tmp/out",
        build_id="b",
        end_offsets={"events:0": 10},
        properties={"statestore.cache.max.bytes": 0},
        start_offsets={"events:0": 4},
    )
    assert BackfillPlan.decode(plan.encode()) == plan
