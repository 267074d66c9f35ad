"""``eddyline backfill build``'s arguments and plan: bad input named, with the way out."""

from __future__ import annotations

from pathlib import Path

import pytest

from eddyline_runtime.backfill import BackfillError
from eddyline_runtime.backfill.spark_job import fix_plan
from eddyline_runtime.backfill_cli import BackfillCommandError, parse_end_offset
from eddyline_runtime.log.sqlite_log import SqliteLog
from eddyline_runtime.partitions import TopicPartition
from tests.support.topologies.backfill_topologies import INPUT, keyed_count


def test_an_end_offset_is_topic_partition_equals_offset() -> None:
    assert parse_end_offset("app.events:3=1500") == (TopicPartition("app.events", 3), 1500)


@pytest.mark.parametrize("text", ["events=3", "events:x=1", "events:1=", ":1=2", "events:1=-5"])
def test_a_malformed_end_offset_is_refused_with_the_form_to_use(text: str) -> None:
    with pytest.raises(BackfillCommandError, match=r"TOPIC:PARTITION=OFFSET"):
        parse_end_offset(text)


def _log_with_input(tmp_path: Path) -> str:
    log = SqliteLog(tmp_path / "log.db")
    try:
        log.create_topic(INPUT, 2)
        return log.url
    finally:
        log.close()


def test_a_store_the_topology_lacks_is_refused_naming_the_ones_it_has(tmp_path: Path) -> None:
    with pytest.raises(BackfillError, match=r"no store 'nope'.*its stores: counts"):
        fix_plan(
            keyed_count(),
            application="app",
            reference="m:f",
            stores=["nope"],
            log_url=_log_with_input(tmp_path),
            output=tmp_path / "out",
            build_id="b",
        )


def test_without_committed_positions_the_plan_asks_for_end_offsets(tmp_path: Path) -> None:
    with pytest.raises(BackfillError, match=r'group "app" has no committed position.*--end-offset'):
        fix_plan(
            keyed_count(),
            application="app",
            reference="m:f",
            stores=["counts"],
            log_url=_log_with_input(tmp_path),
            output=tmp_path / "out",
            build_id="b",
        )


def test_given_end_offsets_must_cover_every_input_partition(tmp_path: Path) -> None:
    with pytest.raises(BackfillError, match=r"no end offset for .*give one per input partition"):
        fix_plan(
            keyed_count(),
            application="app",
            reference="m:f",
            stores=["counts"],
            log_url=_log_with_input(tmp_path),
            output=tmp_path / "out",
            build_id="b",
            end_offsets={TopicPartition(INPUT, 0): 0},
        )


def test_a_plan_holds_the_given_end_offsets(tmp_path: Path) -> None:
    plan = fix_plan(
        keyed_count(),
        application="app",
        reference="m:f",
        stores=["counts"],
        log_url=_log_with_input(tmp_path),
        output=tmp_path / "out",
        build_id="b",
        end_offsets={TopicPartition(INPUT, 0): 0, TopicPartition(INPUT, 1): 0},
    )
    assert plan.end_offsets == {f"{INPUT}:0": 0, f"{INPUT}:1": 0}
