"""Cooperative hand-over on a real Apache Kafka broker (engine/task_release.py): the end a
moved task's copy is compared with is read only once no earlier owner can commit any more.

Issue 38: the scale-in e2e saw a copy judged caught up in the very round the old owner's
release was seen (55 ms), and its promotion then replayed 12 changelog records: the old
owner's word (its ``/v1/layout``) had come before commits that were still to land. Here that
interleaving is forced through two seams instead of waiting for it: the new owner's release
probe says the old owner runs nothing while it still does (an early release), and the new
owner's promotion is slowed (its producers start half a second late, as an InitProducerId on
a loaded broker does). The old owner keeps committing meanwhile; a copy promoted on an end
read before it was fenced replays those commits.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.task_manager import RestoreReport
from eddyline_runtime.engine.topics import resolve_topics
from eddyline_runtime.log import Record
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.log.port import StartedProducers
from eddyline_runtime.membership import StoreRole
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import KeyRange
from tests.support.waiting import wait_for
from tests.support.word_count import APP, INPUT, STORE, streams_config, word_count

PARTITIONS = 2
LONGS = serde_for("long")
LINES = ["a b a", "b a c", "d e f g"]
# Input a few times a second, as the e2e's steady producer writes it: the old owner commits
# after each batch, and between two commits its changelogs hold nothing undecided.
INPUT_PAUSE_S = 0.15
# How much later the new owner's promotion starts its producers: long enough for the old
# owner (committing every 100 ms while input arrives) to commit several times meanwhile.
PROMOTION_DELAY_S = 0.5
# When the old owner learns of the move after the new owner did: after the slowed promotion
# would have fenced it, well before a fenced task of its own would be taken back (1 s).
OLD_OWNER_TOLD_AFTER_S = 0.3


class _SlowPromotionLog(KafkaLog):
    """A real KafkaLog whose stream threads start their tasks' producers late."""

    def transactional_producers(self, transactional_ids: Sequence[str]) -> StartedProducers:
        if transactional_ids:  # a promotion, not an assignment that only keeps copies
            time.sleep(PROMOTION_DELAY_S)
        return super().transactional_producers(transactional_ids)


def _early_release(address: str, timeout: float) -> frozenset[TaskId]:
    """The old owner's layout as an early release shows it: it runs nothing (it still does)."""
    return frozenset()


class _Pair:
    """Member "a" runs every task while input keeps arriving; "b" keeps standbys."""

    def __init__(self, root: Path, bootstrap: str) -> None:
        self.url = f"kafka://{bootstrap}"
        self.prefix = f"release-{uuid.uuid4().hex[:8]}."
        self.admin = KafkaLog.open(self.url, {}, topic_prefix=self.prefix)
        self.admin.create_topic(INPUT, PARTITIONS)
        layout = resolve_topics(word_count(), APP, self.admin)
        self.tasks = frozenset(layout.tasks())
        self.stateful = frozenset(layout.stateful_tasks())
        members = (Member("a", address="127.0.0.1:1"), Member("b", address="127.0.0.1:2"))
        self.before = Assignment(
            active={"a": self.tasks, "b": frozenset()},
            standby={"a": frozenset(), "b": self.stateful},
            members=members,
        )
        self.after = Assignment(
            active={"a": self.tasks - self.stateful, "b": self.stateful},
            standby={"a": frozenset(), "b": frozenset()},
            members=members,
        )
        self.restores: list[RestoreReport] = []
        self.produced: Counter[str] = Counter()
        self._stop = threading.Event()
        self._producer: threading.Thread | None = None
        self.logs: list[KafkaLog] = []
        self.a = self._instance(members[0], KafkaLog, root)
        self.b = self._instance(members[1], _SlowPromotionLog, root)

    def _instance(self, member: Member, kind: type[KafkaLog], root: Path) -> StreamsInstance:
        log = kind.open(self.url, {}, topic_prefix=self.prefix)
        self.logs.append(log)
        instance = StreamsInstance(
            word_count(),
            streams_config(root / f"state-{member.id}", **{"commit.interval.ms": 100}),
            log,
            instance_id=member.id,
            member=member,
            assignment=self.before,
            on_restore=[self.restores.append] if member.id == "b" else [],
            release_probe=_early_release,
        )
        instance.start()
        return instance

    def start_input(self) -> None:
        self._producer = threading.Thread(target=self._produce, daemon=True)
        self._producer.start()

    def stop_input(self) -> None:
        self._stop.set()
        if self._producer is not None:
            self._producer.join(60)

    def _produce(self) -> None:
        log = KafkaLog.open(self.url, {}, topic_prefix=self.prefix)
        try:
            while not self._stop.wait(INPUT_PAUSE_S):
                for partition, line in enumerate(LINES):
                    log.produce(
                        TopicPartition(INPUT, partition % PARTITIONS),
                        [Record(None, line.encode(), 1)],
                    )
                    self.produced.update(line.split())
        finally:
            log.close()

    def counts(self, instance: StreamsInstance) -> Counter[str]:
        found: Counter[str] = Counter()
        for local in instance.local_store_partitions(STORE):
            if local.role is StoreRole.ACTIVE:
                for key, value in local.open_reader(None).scan(KeyRange()):
                    found[key.decode()] = LONGS.deserialize(value)
        return found

    def standbys_replayed(self) -> bool:
        self.b.check()
        lags = self.b.all_local_store_partition_lags().get(STORE, {})
        return len(lags) == PARTITIONS and all(
            lag.current_offset_position > 0 for lag in lags.values()
        )

    def close(self) -> None:
        self.stop_input()
        errors: list[BaseException] = []
        for instance in (self.a, self.b):
            try:
                instance.close(30)
            except BaseException as error:  # close the other regardless
                errors.append(error)
        for log in [*self.logs, self.admin]:
            log.close()
        if errors:
            raise errors[0]


@pytest.fixture
def pair(tmp_path: Path, kafka_bootstrap: str) -> Iterator[_Pair]:
    pair = _Pair(tmp_path, kafka_bootstrap)
    try:
        yield pair
    finally:
        pair.close()


def test_a_copy_is_compared_with_an_end_read_after_the_old_owner_was_fenced(pair: _Pair) -> None:
    pair.start_input()
    wait_for(lambda: pair.a.ready() and pair.standbys_replayed(), "a counts and b replays")
    restores_before = len(pair.restores)
    pair.b.apply_assignment(pair.after)  # the early release: b may go on at once
    time.sleep(OLD_OWNER_TOLD_AFTER_S)  # "a" still runs the tasks, committing
    pair.a.apply_assignment(pair.after)
    wait_for(lambda: pair.b.check() is not None and pair.b.ready(), "b runs the moved tasks")
    pair.stop_input()
    wait_for(
        lambda: pair.a.caught_up() and pair.b.caught_up() and pair.counts(pair.b) == pair.produced,
        "b counted every line",
    )
    promoted = pair.restores[restores_before:]
    assert {r.task for r in promoted} == pair.stateful
    # Whatever "a" committed before it was fenced was read by the copies as standbys; what it
    # processed after is redone by "b" (exactly-once): nothing is left for the promotion.
    # Before the fence came first: 8 and 6, 8 and 6, 4 and 3 records replayed in 3 of 3 runs.
    assert {str(r.task): r.result.records for r in promoted} == dict.fromkeys(
        (str(t) for t in pair.stateful), 0
    )
    assert {o.task: o.how for o in pair.b.release.outcomes} == dict.fromkeys(
        pair.stateful, "released"
    )
