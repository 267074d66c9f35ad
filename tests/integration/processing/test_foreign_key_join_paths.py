"""A foreign-key join's stores (KIP-213) on the state paths a user relies on: a standby
promoted when the active member stops, and KIP-816 relocation when an upgrade adds a
sub-topology before the join's.

Each run feeds test_foreign_key_join_runtime's steps (Kafka's
``KTableKTableForeignKeyJoinIntegrationTest`` inputs) on the embedded log, and its output
topic and stores (both tables, the result and the subscription store, byte for byte)
must equal the test driver's uninterrupted run of the same steps: nothing lost, nothing
repeated, no subscription left behind or forgotten. The join is named (as docs/joins.md
asks of an app that will be upgraded), so its internal topics and subscription store
keep their names when the topology changes before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.task_manager import RestoreReport
from eddyline_runtime.engine.topics import TopicLayout, resolve_topics
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.membership import StoreRole
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing import Topology
from eddyline_runtime.serde import serde_for
from eddyline_runtime.testing import read_store
from tests.integration.processing.test_foreign_key_join_runtime import LEFT, RIGHT, STEPS, fk_join
from tests.support.scenarios import (
    APPLICATION_ID,
    STEP_TIMEOUT_SECONDS,
    Input,
    Output,
    Scenario,
    read_stores,
    read_topic,
    run_on_driver,
    source_node,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NAME = "fk"
SUBSCRIPTIONS = f"{NAME}-subscription-store"
STORES = ("joined", "orders-store", "customers-store", SUBSCRIPTIONS)
MEMBERS = (Member("a"), Member("b"))
# The steps before the standby's member takes over / before the upgrade: every left row
# subscribed, a fan-out and a foreign-key change done; a right tombstone, a left tombstone
# and a null foreign key still to come.
FIRST_STEPS = 5


def topology(kind: str, *, new_first_sub_topology: bool = False) -> Callable[[], Topology]:
    return lambda: fk_join(
        left_join=kind == "left", name=NAME, new_first_sub_topology=new_first_sub_topology
    )


def reference(kind: str, steps: Sequence[Sequence[Input]]) -> tuple[list[Output], Any]:
    """The driver's output and stores after ``steps``, run without a stop."""
    result = run_on_driver(
        Scenario(
            f"fk-{kind}-reference",
            topology(kind),
            steps=steps,
            outputs=["output"],
            stores=STORES,
            config={"statestore.cache.max.bytes": 0},
        )
    )
    return result.outputs["output"], result.stores


def config(state_dir: Path, **settings: Any) -> StreamsConfig:
    return StreamsConfig.from_properties(
        {
            "application.id": APPLICATION_ID,
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            "statestore.cache.max.bytes": 0,
            **settings,
        },
        environ={},
    )


def produce(log: SqliteLog, topology: Topology, step: Sequence[Input]) -> None:
    for topic, key, value, timestamp in step:
        source = source_node(topology, topic)
        record = Record(
            serde_for(source.key_serde).serialize(key),
            serde_for(source.value_serde).serialize(value),
            timestamp,
        )
        log.produce(TopicPartition(topic, 0), [record])


def local_stores(instance: StreamsInstance, role: StoreRole) -> dict[str, list[tuple[Any, Any]]]:
    """Every store's contents in ``instance``'s copies of ``role``, read with its serdes."""
    contents: dict[str, list[tuple[Any, Any]]] = {}
    for name in STORES:
        (local,) = [p for p in instance.local_store_partitions(name) if p.role is role]
        contents[name] = read_store(local.open_reader(None), instance.topology.stores[name])
    return contents


class Pair:
    """Member "a" runs every task; member "b" keeps a standby of each stateful one."""

    def __init__(self, root: Path, kind: str) -> None:
        self.root = root
        self.kind = kind
        self.topology = topology(kind)
        self.log = SqliteLog(root / "log.db")  # the test's own client of the log
        for topic in (LEFT, RIGHT):
            self.log.create_topic(topic, 1)
        self.layout: TopicLayout = resolve_topics(self.topology(), APPLICATION_ID, self.log)
        tasks = frozenset(self.layout.tasks())
        self.stateful = frozenset(self.layout.stateful_tasks())
        # Both sub-topologies hold stores: the left table's and the result, the right
        # table's and the subscriptions.
        assert self.stateful == tasks and len(tasks) == 2
        self.assignment = Assignment(
            active={"a": tasks, "b": frozenset()},
            standby={"a": frozenset(), "b": self.stateful},
            members=MEMBERS,
        )
        self.takeover = Assignment(
            active={"a": frozenset(), "b": tasks},
            standby={"a": frozenset(), "b": frozenset()},
            members=MEMBERS,
        )
        self.logs: list[SqliteLog] = []
        self.restores: list[RestoreReport] = []
        self.a = self.instance("a")
        self.b = self.instance("b")

    def instance(self, member_id: str) -> StreamsInstance:
        log = SqliteLog(self.root / "log.db")
        self.logs.append(log)
        return StreamsInstance(
            self.topology(),
            config(self.root / f"state-{member_id}", **{"num.standby.replicas": 1}),
            log,
            instance_id=member_id,
            member=next(m for m in MEMBERS if m.id == member_id),
            assignment=self.assignment,
            on_restore=[self.restores.append] if member_id == "b" else [],
        )

    def standby_at_changelog_ends(self) -> bool:
        self.a.check()
        self.b.check()
        if not self.a.caught_up():
            return False
        lags = self.b.all_local_store_partition_lags()
        for store in STORES:
            end = self.log.end_offset(TopicPartition(self.layout.changelogs[store], 0))
            lag = lags.get(store, {}).get(0)
            if lag is None or lag.current_offset_position != end:
                return False
        return True

    def close(self) -> None:
        errors: list[BaseException] = []
        for instance in (self.a, self.b):
            try:
                instance.close(30)
            except BaseException as error:  # close the other regardless
                errors.append(error)
        for log in self.logs:
            log.close()
        self.log.close()
        if errors:
            raise errors[0]


@pytest.fixture(params=["inner", "left"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    group = Pair(tmp_path, request.param)
    try:
        group.a.start()
        group.b.start()
        yield group
    finally:
        group.close()


def test_a_promoted_standby_carries_the_join_on_as_an_uninterrupted_run(pair: Pair) -> None:
    kind = pair.kind
    for step in STEPS[:FIRST_STEPS]:
        produce(pair.log, pair.topology(), step)
        pair.a.wait_until_caught_up(STEP_TIMEOUT_SECONDS)
    wait_for(pair.standby_at_changelog_ends, "b's standbys replayed every changelog")
    _, stores_so_far = reference(kind, STEPS[:FIRST_STEPS])
    assert stores_so_far[SUBSCRIPTIONS]  # subscriptions to hand over
    # The standby copies hold what the active ones hold, and that is the driver's state.
    assert local_stores(pair.b, StoreRole.STANDBY) == local_stores(pair.a, StoreRole.ACTIVE)
    assert local_stores(pair.b, StoreRole.STANDBY) == stores_so_far

    # The next step goes in and "a" stops at once, with its subscriptions and answers
    # possibly still in flight on the internal topics: "b" takes every task over.
    produce(pair.log, pair.topology(), STEPS[FIRST_STEPS])
    pair.a.close(30)
    pair.b.apply_assignment(pair.takeover)
    wait_for(lambda: pair.b.check() is not None and pair.b.ready(), "b runs every task")
    assert {r.result.store for r in pair.restores} == set(STORES)
    for step in STEPS[FIRST_STEPS + 1 :]:
        produce(pair.log, pair.topology(), step)
        pair.b.wait_until_caught_up(STEP_TIMEOUT_SECONDS)
    pair.b.close(30)

    outputs, stores = reference(kind, STEPS)
    assert read_topic(pair.log, pair.topology(), "output") == outputs
    assert read_stores(pair.topology(), STORES, pair.root / "state-b") == stores


@pytest.mark.parametrize("kind", ["inner", "left"])
def test_an_upgrade_adding_a_sub_topology_relocates_the_join_stores_without_a_restore(
    kind: str, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    log = SqliteLog(tmp_path / "log.db")
    restored: list[RestoreReport] = []

    def run(new: Topology, steps: Sequence[Sequence[Input]]) -> None:
        instance = StreamsInstance(new, config(state_dir), log, on_restore=[restored.append])
        instance.start()
        try:
            for step in steps:
                produce(log, new, step)
                instance.wait_until_caught_up(STEP_TIMEOUT_SECONDS)
        finally:
            instance.close(30)

    try:
        for topic in (LEFT, RIGHT, "other"):
            log.create_topic(topic, 1)
        old, upgraded = topology(kind)(), topology(kind, new_first_sub_topology=True)()
        owners = {s: sub.id for sub in old.subtopologies() for s in sub.stores}
        assert owners[SUBSCRIPTIONS] == 1
        run(old, STEPS[:FIRST_STEPS])
        assert {p.name for p in state_dir.iterdir()} == {"0_0", "1_0"}
        restored.clear()  # the first run's (empty) restores

        run(upgraded, STEPS[FIRST_STEPS:])
        # Every ordinal shifted by one: the stores were moved to 1_0 and 2_0, not rebuilt.
        assert sorted((str(r.task), r.result.store, r.result.records) for r in restored) == [
            ("1_0", "joined", 0),
            ("1_0", "orders-store", 0),
            ("2_0", "customers-store", 0),
            ("2_0", SUBSCRIPTIONS, 0),
        ]
        assert {p.name for p in state_dir.iterdir()} == {"1_0", "2_0"}
        outputs, stores = reference(kind, STEPS)
        assert read_topic(log, upgraded, "output") == outputs
    finally:
        log.close()
    assert read_stores(upgraded, STORES, state_dir) == stores
