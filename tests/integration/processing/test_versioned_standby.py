"""A versioned table's standby copy (KIP-535 standbys of a KIP-889 store).

Member "a" runs the task that materializes a versioned table; member "b" keeps its
standby, replaying the changelog the engine writes. The standby holds the same
versions: every as-of query of it, through the in-process reader queries use
(``engine.queryable.versioned_reader``), answers what the active copy answers, and it
reports itself caught up.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.queryable import versioned_reader
from eddyline_runtime.engine.topics import resolve_topics
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.membership import StoreRole
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Materialized, StreamsBuilder, Topology
from tests.support.waiting import wait_for
from tests.support.word_count import APP, streams_config

STORE, HISTORY = "prices", 5_000
MEMBERS = (Member("a"), Member("b"))
# Updates in and out of order, tombstones, and some older than the history retention.
UPDATES = [(f"item{i % 7}", None if i % 11 == 0 else f"p{i}", 100 * i - (900 if i % 4 else 0))
           for i in range(10, 200)]  # fmt: skip


def topology() -> Topology:
    builder = StreamsBuilder()
    builder.table(
        "prices", Materialized.as_versioned(STORE, HISTORY), key_serde="string",
        value_serde="string",
    )  # fmt: skip
    return builder.build()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[StreamsInstance, StreamsInstance]]:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("prices", 1)
    layout = resolve_topics(topology(), APP, log)
    assignment = Assignment(
        active={"a": frozenset(layout.tasks()), "b": frozenset()},
        standby={"a": frozenset(), "b": frozenset(layout.stateful_tasks())},
        members=MEMBERS,
    )
    logs: list[SqliteLog] = []
    instances: list[StreamsInstance] = []
    for member in MEMBERS:
        member_log = SqliteLog(tmp_path / "log.db")
        logs.append(member_log)
        instances.append(
            StreamsInstance(
                topology(),
                streams_config(tmp_path / f"state-{member.id}"),
                member_log,
                instance_id=member.id,
                member=member,
                assignment=assignment,
            )
        )
    try:
        for instance in instances:
            instance.start()
        log.produce(
            TopicPartition("prices", 0),
            [Record(k.encode(), None if v is None else v.encode(), t) for k, v, t in UPDATES],
        )
        changelog = TopicPartition(layout.changelogs[STORE], 0)

        def standby_caught_up() -> bool:
            instances[0].check()
            end = log.end_offset(changelog)
            lag = instances[1].all_local_store_partition_lags().get(STORE, {}).get(0)
            return (
                instances[0].caught_up()
                and end > 0
                and lag is not None
                and lag.current_offset_position == end
            )

        wait_for(standby_caught_up, "the standby replayed the whole changelog")
        yield instances[0], instances[1]
    finally:
        for instance in instances:
            instance.close(30)
        for member_log in logs:
            member_log.close()
        log.close()


def _answers(instance: StreamsInstance, role: StoreRole) -> list[object]:
    (local,) = [p for p in instance.local_store_partitions(STORE) if p.role is role]
    reader = versioned_reader(instance.topology, local, None)
    assert reader is not None
    answers: list[object] = [reader.observed_stream_time]
    for item in {k for k, _, _ in UPDATES}:
        key = item.encode()
        answers.append(reader.get(key))
        answers.append(reader.versions(key))
        answers.extend(reader.get(key, t) for t in range(0, 21_000, 250))
    return answers


def test_a_standby_answers_every_as_of_query_as_the_active_copy(
    pair: tuple[StreamsInstance, StreamsInstance],
) -> None:
    active, standby = pair
    expected = _answers(active, StoreRole.ACTIVE)
    assert expected[0] == max(t for _, _, t in UPDATES)
    assert any(answer is not None for answer in expected[1:])
    assert _answers(standby, StoreRole.STANDBY) == expected
