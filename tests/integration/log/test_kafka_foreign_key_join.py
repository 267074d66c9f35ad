"""A foreign-key join (KIP-213) on a real Apache Kafka broker (tests/support/kafka/),
under exactly-once, with tables of different partition counts.

As Kafka's ``KTableKTableForeignKeyJoinDistributedTest`` runs the join across
partitions: orders (3 partitions) name customers (2 partitions) by id, so every
subscription crosses to the customer's partition through the registration topic
and its answer comes back through the response topic to the order's. The inputs
go through every case at once (orders before and after their customer, foreign-key
changes, customer updates fanning out, deletes on both sides), and the output
table must converge to the inner join of the final inputs: responses that lost a
race with a newer order value are dropped by their hash.
"""

from __future__ import annotations

import random
import struct
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from eddyline_runtime.assignor import Assignment, Member, WarmupPolicy, assign
from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.task_release import running_tasks
from eddyline_runtime.engine.topics import resolve_topics
from eddyline_runtime.log import Record
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.membership import StoreRole
from eddyline_runtime.partitions import TaskId, TopicPartition, partition_for_key
from eddyline_runtime.processing import Topology
from eddyline_runtime.query.layout import member_report
from eddyline_runtime.state import KeyRange
from tests.integration.processing.test_foreign_key_join_runtime import LEFT, RIGHT, fk_join
from tests.support.waiting import wait_for

TIMEOUT = 120
ORDERS, CUSTOMERS = 60, 8
PARTITIONS = {LEFT: 3, RIGHT: 2, "output": 3}


@pytest.fixture
def log(kafka_bootstrap: str) -> Iterator[KafkaLog]:
    opened = KafkaLog.open(
        f"kafka://{kafka_bootstrap}", {}, topic_prefix=f"fk-{uuid.uuid4().hex[:8]}."
    )
    for topic, partitions in PARTITIONS.items():
        opened.create_topic(topic, partitions)
    yield opened
    opened.close()


def produce(log: KafkaLog, topic: str, rows: list[tuple[str, str | None]], at: int) -> None:
    """Each row to its key's partition, as Kafka's default partitioner puts it."""
    for index, (key, value) in enumerate(rows):
        data = key.encode()
        partition = partition_for_key(data, PARTITIONS[topic])
        encoded = None if value is None else value.encode()
        log.produce(TopicPartition(topic, partition), [Record(data, encoded, at + index)])


def output_table(log: KafkaLog) -> dict[str, str]:
    """The output topic read as a table: each key's last value, tombstones removing it."""
    table: dict[str, str] = {}
    for partition in range(PARTITIONS["output"]):
        tp = TopicPartition("output", partition)
        offset, end = log.beginning_offset(tp), log.end_offset(tp)
        while offset < end:
            records = log.fetch(tp, offset).records
            if not records:
                break
            for record in records:
                assert record.key is not None
                key = record.key.decode()
                if record.value is None:
                    table.pop(key, None)
                else:
                    table[key] = record.value.decode()
            offset = records[-1].offset + 1
    return table


def test_foreign_key_join_converges_across_partitions_on_a_real_broker(
    tmp_path: Path, log: KafkaLog
) -> None:
    config = StreamsConfig.from_properties(
        {
            "application.id": f"fk-join-{uuid.uuid4().hex[:6]}",
            "state.dir": str(tmp_path / "state"),
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": 50,
        }
    )
    orders: dict[str, str | None] = {}
    customers: dict[str, str | None] = {}

    def order_rows(rows: Sequence[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
        orders.update(rows)
        return list(rows)

    def customer_rows(rows: Sequence[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
        customers.update(rows)
        return list(rows)

    instance = StreamsInstance(fk_join(left_join=False), config, log)
    instance.start()
    try:
        # Half the customers first, then every order, then the other half.
        produce(log, RIGHT, customer_rows([(f"c{i}", f"name{i}") for i in range(0, 8, 2)]), 0)
        order_list = [(f"o{i}", f"order{i}|c{i % CUSTOMERS}") for i in range(ORDERS)]
        produce(log, LEFT, order_rows(order_list), 100)
        produce(log, RIGHT, customer_rows([(f"c{i}", f"name{i}") for i in range(1, 8, 2)]), 200)
        # Moves to another customer, in a burst racing the answers to the first values.
        moves = [(f"o{i}", f"order{i}b|c{(i + 3) % CUSTOMERS}") for i in range(0, ORDERS, 2)]
        produce(log, LEFT, order_rows(moves), 300)
        produce(log, RIGHT, customer_rows([("c1", "name1-renamed"), ("c2", None)]), 400)
        produce(log, LEFT, order_rows([(f"o{i}", None) for i in range(0, ORDERS, 5)]), 500)
        produce(log, RIGHT, customer_rows([("c2", "name2-back"), ("c5", None)]), 600)

        expected = {}
        for key, value in orders.items():
            if value is None:
                continue
            customer = customers.get(value.split("|")[1])
            if customer is not None:
                expected[key] = f"({value},{customer})"
        deadline = time.monotonic() + TIMEOUT
        found = output_table(log)
        while found != expected and time.monotonic() < deadline:
            time.sleep(0.2)
            found = output_table(log)
        assert found == expected
        assert instance.layout is not None
        internal = {
            topic: instance.layout.topic_partitions[instance.layout.physical[topic]]
            for topic in instance.topology.internal_topics
        }
        # Co-partitioned with their readers: subscriptions with customers, answers with orders.
        assert sorted(internal.values()) == [2, 3]
    finally:
        instance.close(TIMEOUT)


# The scale-out/scale-in test's inputs: bursts in which customers change (some deleted,
# some back) and then every order moves to another customer, orders deleted only in the
# last burst: Kafka's protocol converges for these whatever the interleaving of the
# tasks (docs/joins.md's two races need an update keeping its customer while that one
# is deleted, or a delete then a re-insert without a match).
SCALE_ORDERS, SCALE_CUSTOMERS = 200, 20
# Between two bursts: several commits (50 ms apart), so every task move happens with
# input in flight and some of it processed.
BURST_PAUSE_S = 0.3


class _Bursts:
    """The inputs, produced by a thread in bursts until :meth:`finish` (which asks for the
    last burst, with the deletes); the final tables kept for the check."""

    def __init__(self, url: str, prefix: str) -> None:
        self._log = KafkaLog.open(url, {}, topic_prefix=prefix)
        self.orders: dict[str, str | None] = {}
        self.customers: dict[str, str | None] = {}
        self.done = 0  # bursts produced
        self._last = threading.Event()
        self._thread = threading.Thread(target=self._produce, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        if self._last.is_set():
            return  # finished already (the test's cleanup calls it again)
        self._last.set()
        if self._thread.is_alive():
            self._thread.join(TIMEOUT)
        self._log.close()
        assert not self._thread.is_alive(), "the input thread did not finish"

    def _produce(self) -> None:
        rng = random.Random(816)
        names = {f"o{i}": rng.randrange(SCALE_CUSTOMERS) for i in range(SCALE_ORDERS)}
        at = 0
        while True:
            last = self._last.is_set()
            rows: list[tuple[str, str | None]] = [
                (f"c{i}", f"name{i}.{self.done}")
                for i in range(SCALE_CUSTOMERS)
                if rng.random() < 0.8
            ]
            rows += [(f"c{i}", None) for i in range(SCALE_CUSTOMERS) if rng.random() < 0.1]
            produce(self._log, RIGHT, rows, at)
            self.customers.update(rows)
            at += 10_000
            rows = []
            for key, current in list(names.items()):
                names[key] = (current + rng.randrange(1, SCALE_CUSTOMERS)) % SCALE_CUSTOMERS
                rows.append((key, f"{key}.{self.done}|c{names[key]}"))
            if last:
                rows += [(key, None) for key in names if rng.random() < 0.05]
            produce(self._log, LEFT, rows, at)
            self.orders.update(rows)
            at += 10_000
            self.done += 1
            if last:
                return
            time.sleep(BURST_PAUSE_S)

    def expected(self) -> dict[str, str]:
        """The inner join of the final tables."""
        joined = {}
        for key, value in self.orders.items():
            if value is not None:
                customer = self.customers.get(value.split("|")[1])
                if customer is not None:
                    joined[key] = f"({value},{customer})"
        return joined


SCALE_APP = "fk-scale"
SCALE_SUBSCRIPTIONS = "fk-subscription-store"


def scale_topology() -> Topology:
    return fk_join(left_join=False, name="fk")


class _Members:
    """Instances of the app, each on its own state directory and KafkaLog client. A task's
    previous owner is asked in process which tasks it still runs, as a pod's
    ``/v1/layout`` is asked (task_release.probe_layout); one that exited answers nothing
    (unreachable)."""

    def __init__(self, root: Path, log: KafkaLog) -> None:
        self._root = root
        self._log = log
        self.running: dict[str, StreamsInstance] = {}
        self.started: list[StreamsInstance] = []

    def probe(self, address: str, timeout: float) -> frozenset[TaskId] | None:
        instance = self.running.get(address)
        return None if instance is None else running_tasks(member_report(instance))

    def start(self, who: Member, assignment: Assignment) -> StreamsInstance:
        config = StreamsConfig.from_properties(
            {
                "application.id": SCALE_APP,
                "state.dir": str(self._root / f"state-{who.id}"),
                "processing.guarantee": "exactly_once_v2",
                "commit.interval.ms": 50,
                "num.standby.replicas": 1,
            }
        )
        own = KafkaLog.open(self._log.url, {}, topic_prefix=self._log.topic_prefix)
        instance = StreamsInstance(
            scale_topology(), config, own, instance_id=who.id, member=who,
            assignment=assignment, release_probe=self.probe,
        )  # fmt: skip
        assert who.address is not None
        self.running[who.address] = instance
        self.started.append(instance)
        instance.start()
        return instance

    def exited(self, instance: StreamsInstance) -> None:
        assert instance.member.address is not None
        self.running.pop(instance.member.address)
        instance.close(TIMEOUT)

    def close(self) -> None:
        for instance in self.started:
            instance.close(TIMEOUT)
            instance.log.close()


def runs(instance: StreamsInstance, tasks: frozenset[TaskId]) -> bool:
    instance.check()  # raises if a stream thread failed
    return running_tasks(member_report(instance)) == tasks


def warmup(*instances: StreamsInstance) -> WarmupPolicy:
    """What the assignor weighs before moving a task: each member's copies and their lags
    (the most over a task's stores), from its layout report as the operator reads it."""
    lags: dict[str, dict[TaskId, int]] = {}
    for instance in instances:
        report = member_report(instance)
        mine = lags.setdefault(report.member, {})
        for store, copies in report.stores.items():
            for partition, copy in copies.items():
                task = TaskId(report.store_owners[store], partition)
                mine[task] = max(mine.get(task, 0), copy.lag)
    return WarmupPolicy(lags)


def held_subscriptions(instance: StreamsInstance) -> list[tuple[str, str]]:
    """(foreign key, order) of every subscription in the instance's active copies, read
    from the store's key layout ``len(fk) | fk | left key``."""
    held: list[tuple[str, str]] = []
    for local in instance.local_store_partitions(SCALE_SUBSCRIPTIONS):
        assert local.role is StoreRole.ACTIVE
        for key, _ in local.open_reader(None).scan(KeyRange()):
            (length,) = struct.unpack_from(">I", key)
            held.append((key[4 : 4 + length].decode(), key[4 + length :].decode()))
    return sorted(held)


def test_foreign_key_join_converges_while_tasks_move_between_two_members(
    tmp_path: Path, log: KafkaLog
) -> None:
    """Member "a" runs alone; "b" joins (scale-out: tasks move to it by the cooperative
    hand-over), then leaves (scale-in: they move back), all while orders and customers
    change. The output table converges to the join of the final inputs, and the
    subscription stores (all on "a" in the end) hold exactly one subscription per live
    order, under its current customer: none lost in a move, none left behind."""
    layout = resolve_topics(scale_topology(), SCALE_APP, log)
    tasks, stateful = frozenset(layout.tasks()), frozenset(layout.stateful_tasks())
    a, b = Member("a", address="member-a"), Member("b", address="member-b")
    alone = assign(tasks, [a], 1, stateful=stateful)
    members = _Members(tmp_path, log)
    bursts = _Bursts(log.url, log.topic_prefix)
    try:
        first = members.start(a, alone)
        bursts.start()
        wait_for(lambda: bursts.done >= 1, "the first burst is in", TIMEOUT)

        # Scale-out as the operator does it: "b" joins with copies to warm first (it has
        # none), and once they caught up tasks move to it, each held as a standby by "b"
        # until "a" released it (the cooperative hand-over).
        joining = assign(tasks, [a, b], 1, previous=alone, stateful=stateful, warmups=warmup(first))
        assert not joining.active["b"]
        second = members.start(b, joining)
        first.apply_assignment(joining)
        wait_for(lambda: warmup(second).lags["b"].keys() == stateful, "b warmed its copies")
        together = assign(
            tasks, [a, b], 1, previous=joining, stateful=stateful, warmups=warmup(first, second)
        )
        moved = together.active["b"]
        assert moved & stateful  # stateful tasks change hands
        second.apply_assignment(together)
        first.apply_assignment(together)
        wait_for(lambda: runs(second, moved), "b runs the tasks moved to it", TIMEOUT)
        assert {o.task: o.how for o in second.release.outcomes} == dict.fromkeys(moved, "released")
        more = bursts.done + 2  # input for "b" to process while it holds them
        wait_for(lambda: bursts.done >= more and second.processed, "b processed", TIMEOUT)

        back = assign(tasks, [a, b], 1, previous=together, stateful=stateful, leaving=["b"])
        assert back.active["a"] == tasks
        second.leaving = True
        second.apply_assignment(back)
        first.apply_assignment(back)
        wait_for(second.handed_over, "b handed its tasks over", TIMEOUT)
        # "b" answers until "a" took the tasks (had it exited first, "a" would have found
        # it unreachable: as correct, but then "released" is not what this checks).
        wait_for(lambda: runs(first, tasks), "a runs every task again", TIMEOUT)
        members.exited(second)
        assert {o.task: o.how for o in first.release.outcomes} == dict.fromkeys(moved, "released")
        bursts.finish()  # the input went on through both moves

        expected = bursts.expected()
        wait_for(lambda: output_table(log) == expected, "the output is the join", TIMEOUT)
        first.wait_until_caught_up(TIMEOUT)
        assert output_table(log) == expected
        live = [(v.split("|")[1], k) for k, v in bursts.orders.items() if v is not None]
        assert held_subscriptions(first) == sorted(live)
    finally:
        bursts.finish()
        members.close()
