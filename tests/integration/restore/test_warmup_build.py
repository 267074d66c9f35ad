"""A warm-up replica on a fresh member is seeded from a Spark build, then replays only the tail.

Issue 25 (KIP-441 with ``spec.restore``): member "a" runs the stateful
word-count tasks and holds a long changelog; member "b" joins on an empty
state directory, runs the stateless tasks, and gets the stateful ones as
warm-ups. With ``restore.build.dir`` and a changelog longer than
``restore.wait.lag.above``, b's warm-ups report ``restorePending`` (as an
active task's missing store does) instead of replaying from offset 0, and
wait for a build without holding up b's active tasks. The build is a real
Spark build (``local[1]``: the build is small; ``eddyline restore job`` runs
the same code); a failed Job sends the warm-ups to replay everything, as it
does an active task.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.assignor import Assignment, Member
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.engine.stream_thread import ThreadState
from eddyline_runtime.engine.task_manager import RestoreReport
from eddyline_runtime.engine.topics import resolve_topics
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.membership import StoreCopy, StoreRole
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.query.layout import member_report
from eddyline_runtime.restore.job_result import JobResult, JobState, write_job_result
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import KeyRange
from tests.support.waiting import wait_for
from tests.support.word_count import APP, INPUT, STORE, produce_lines, streams_config, word_count

PARTITIONS = 2
WORDS = 6_000  # distinct words: about this many changelog records over both partitions
THRESHOLD = 500  # restore.wait.lag.above: each partition's changelog is far longer
MEMBERS = (Member("a"), Member("b"))
LONGS = serde_for("long")


def lines(first: int, count: int) -> list[str]:
    """Lines of 10 distinct words each, ``w<first>`` on."""
    return [" ".join(f"w{first + i * 10 + j}" for j in range(10)) for i in range(count // 10)]


class Group:
    """Members a and b on one log file, each its own state directory and log client."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.builds = root / "restore"
        self.log = SqliteLog(root / "log.db")
        self.log.create_topic(INPUT, PARTITIONS)
        self.layout = resolve_topics(word_count(), APP, self.log)
        self.stateful = frozenset(self.layout.stateful_tasks())
        self.all_tasks = frozenset(self.layout.tasks())
        self.stateless = self.all_tasks - self.stateful
        self.logs: list[SqliteLog] = []
        self.instances: list[StreamsInstance] = []
        self.restores: list[RestoreReport] = []

    def instance(self, member: str, assignment: Assignment, **settings: Any) -> StreamsInstance:
        log = SqliteLog(self.root / "log.db")
        self.logs.append(log)
        instance = StreamsInstance(
            word_count(),
            streams_config(self.root / f"state-{member}", **settings),
            log,
            instance_id=member,
            member=next(m for m in MEMBERS if m.id == member),
            assignment=assignment,
            on_restore=[self.restores.append] if member == "b" else [],
        )
        self.instances.append(instance)
        instance.start()
        return instance

    def close(self) -> None:
        for instance in self.instances:
            instance.close(60)
        for log in self.logs:
            log.close()
        self.log.close()

    def changelog(self, partition: int) -> TopicPartition:
        return TopicPartition(self.layout.changelogs[STORE], partition)

    def changelog_records(self, partition: int, start: int) -> int:
        """Records the changelog partition holds from ``start`` on."""
        tp, count, position = self.changelog(partition), 0, start
        end = self.log.end_offset(tp)
        while position < end:
            fetched = self.log.fetch_columns(tp, position, 10_000)
            if not fetched.offsets:
                break
            count += len(fetched.offsets)
            position = fetched.offsets[-1] + 1
        return count

    def inputs_committed(self, tasks: frozenset[TaskId]) -> bool:
        # Committed offsets first: input committed before the read was written out before.
        inputs = [tp for task in tasks for tp in self.layout.input_partitions(task)]
        committed = self.log.committed_offsets(APP, inputs)
        return all(committed.get(tp, 0) == self.log.end_offset(tp) for tp in inputs)


def contents(instance: StreamsInstance, role: StoreRole) -> dict[str, int]:
    found: dict[str, int] = {}
    for local in instance.local_store_partitions(STORE):
        if local.role is role:
            for key, value in local.open_reader(None).scan(KeyRange()):
                found[key.decode()] = LONGS.deserialize(value)
    return found


def warming_up(group: Group) -> Assignment:
    """a runs the stateful tasks; b the stateless ones, and warms up the stateful ones."""
    return Assignment(
        active={"a": group.stateful, "b": group.stateless},
        standby={"a": frozenset(), "b": frozenset()},
        members=MEMBERS,
        warmup={"a": frozenset(), "b": group.stateful},
    )


def metric(instance: StreamsInstance, name: str, task: TaskId) -> float:
    values = {
        key: value
        for key, value in instance.metrics.snapshot().items()
        if key.name == name and dict(key.tags).get("task-id") == str(task)
    }
    assert len(values) == 1, values
    return next(iter(values.values()))


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    """a alone runs every task over WORDS distinct words, then stops: a long changelog."""
    built = Group(tmp_path)
    try:
        produce_lines(built.log, lines(0, WORDS), PARTITIONS)
        alone = Assignment(
            active={"a": frozenset(built.layout.tasks()), "b": frozenset()},
            standby={"a": frozenset(), "b": frozenset()},
            members=MEMBERS,
        )
        a = built.instance("a", alone)
        wait_for(
            lambda: a.check() is not None and built.inputs_committed(built.all_tasks),
            "a counted every word",
            timeout=300,
        )
        yield built
    finally:
        built.close()


def start_b_warming_up(group: Group) -> StreamsInstance:
    """a hands b the stateless tasks and b joins with warm-ups; b's warm-ups wait for a build."""
    assignment = warming_up(group)
    group.instances[0].apply_assignment(assignment)
    return group.instance(
        "b",
        assignment,
        **{
            "restore.build.dir": str(group.builds),
            "restore.wait.lag.above": THRESHOLD,
            "restore.wait.ms": 600_000,
        },
    )


def assert_pending_without_blocking(group: Group, b: StreamsInstance) -> dict[int, int]:
    """b reports both warm-ups restorePending and runs its active tasks meanwhile; returns
    each partition's changelog length as reported."""
    wait_for(lambda: len(b.restore_pending()) == PARTITIONS, "b's warm-ups wait for a build")
    report = member_report(b)
    pending = {p: group.changelog_records(p, 0) for p in range(PARTITIONS)}
    assert all(records > THRESHOLD for records in pending.values()), pending
    assert report.stores[STORE] == {
        p: StoreCopy(StoreRole.RESTORE_PENDING, records) for p, records in pending.items()
    }
    # A copy waiting for a build holds nothing: the assignor sees no lag for it yet.
    assert not set(report.task_lags()) & group.stateful
    # b's active (stateless) tasks process new input while its warm-ups wait.
    produce_lines(group.log, lines(WORDS, 1_000), PARTITIONS)
    wait_for(
        lambda: b.check() is not None and group.inputs_committed(group.stateless),
        "b's active tasks processed the new lines while its warm-ups waited",
        timeout=120,
    )
    assert len(b.restore_pending()) == PARTITIONS
    assert b.ready()  # its active tasks run: a warm-up never holds up readiness
    return pending


def caught_up(group: Group, a: StreamsInstance, b: StreamsInstance) -> bool:
    a.check()
    b.check()
    if not group.inputs_committed(group.all_tasks) or b.restore_pending():
        return False
    lags = member_report(b).task_lags()
    if not all(lags.get(task) == 0 for task in group.stateful):
        return False
    # A lag is against the end its copy last read: 0 before the copy has seen the tail
    # written since. Caught up means at the changelog's end as the log has it now.
    standbys = {t: s for thread in b.threads for t, s in thread.standbys.items()}
    return all(
        task in standbys
        and standbys[task].lag(STORE).current_offset_position
        >= group.log.end_offset(group.changelog(task.partition))
        for task in group.stateful
    )


@pytest.mark.slow
@pytest.mark.timeout(600)  # a Spark JVM on 2 busy cores: 235 s at load 37
def test_a_warm_up_is_seeded_from_a_spark_build_and_replays_only_the_tail(group: Group) -> None:
    from eddyline_runtime.restore.spark.spark_build import build, spark_session

    a = group.instances[0]
    b = start_b_warming_up(group)
    before = assert_pending_without_blocking(group, b)
    # The Job the operator launches for b's pending partitions: a real Spark build.
    started = time.monotonic()
    # One core and one file per partition: the build is small, the JVM is most of its cost.
    spark = spark_session("local[1]")
    try:
        result = build(
            spark,
            application=APP,
            store=STORE,
            changelog_topic=group.layout.changelogs[STORE],
            partitions=list(range(PARTITIONS)),
            output=group.builds,
            log_url=group.log.url,
            files_per_build=1,
        )
    finally:
        spark.stop()
    print(f"Spark build (session included) took {time.monotonic() - started:.1f} s")
    offsets = {p: manifest.offset for p, manifest in result.read().items()}
    # More counting after the build: the tail b replays.
    produce_lines(group.log, lines(WORDS + 1_000, 1_000), PARTITIONS)
    wait_for(lambda: caught_up(group, a, b), "b's warm-ups caught up", timeout=300)
    standbys = {t: s for thread in b.threads for t, s in thread.standbys.items()}
    assert set(standbys) == group.stateful
    seeded_total = replayed_total = 0
    for task, standby in standbys.items():
        partition = task.partition
        tail = group.changelog_records(partition, offsets[partition] + 1)
        seeded = group.changelog_records(partition, 0) - tail
        # Exactly the records after the build were replayed; the rest came as SST files.
        assert standby.replayed == tail, (task, offsets, tail)
        assert 0 < tail < seeded
        assert metric(b, "restore-ingested-offset", task) == offsets[partition]
        assert metric(b, "restore-ingested-keys", task) > 0
        seeded_total += seeded
        replayed_total += tail
    assert seeded_total > sum(before.values()) / 2
    print(f"warm-up seeded {seeded_total} changelog records, replayed {replayed_total}")
    assert contents(b, StoreRole.STANDBY) == contents(a, StoreRole.ACTIVE)
    assert len(contents(a, StoreRole.ACTIVE)) == WORDS + 2_000
    # Caught up, the task moves (the assignor's next generation): b restores nothing.
    moved = Assignment(
        active={"a": frozenset(), "b": frozenset(group.layout.tasks())},
        standby={"a": frozenset(), "b": frozenset()},
        members=MEMBERS,
    )
    a.apply_assignment(moved)
    b.apply_assignment(moved)
    wait_for(lambda: b.check() is not None and b.ready(), "b runs every task")
    assert sorted((r.task, r.result.records) for r in group.restores) == [
        (task, 0) for task in sorted(group.stateful)
    ]


def test_a_warm_up_whose_build_failed_replays_the_whole_changelog(group: Group) -> None:
    a = group.instances[0]
    b = start_b_warming_up(group)
    assert_pending_without_blocking(group, b)
    fail_the_build(group, 1)
    wait_for(lambda: caught_up(group, a, b), "b's warm-ups caught up by replay", timeout=300)
    standbys = {t: s for thread in b.threads for t, s in thread.standbys.items()}
    assert {t: s.replayed for t, s in standbys.items()} == {
        task: group.changelog_records(task.partition, 0) for task in group.stateful
    }
    for task in group.stateful:
        assert metric(b, "restore-ingested-offset", task) == -1
    assert contents(b, StoreRole.STANDBY) == contents(a, StoreRole.ACTIVE)


def test_without_build_dir_a_warm_up_replays_at_once(group: Group) -> None:
    """restore.build.dir unset (spec.restore.when Never): nothing waits, as before."""
    a = group.instances[0]
    assignment = warming_up(group)
    a.apply_assignment(assignment)
    b = group.instance("b", assignment)
    assert b.restore_pending() == []
    wait_for(lambda: caught_up(group, a, b), "b's warm-ups caught up by replay", timeout=300)
    standbys = {t: s for thread in b.threads for t, s in thread.standbys.items()}
    assert {t: s.replayed for t, s in standbys.items()} == {
        task: group.changelog_records(task.partition, 0) for task in group.stateful
    }
    with pytest.raises(AssertionError):
        metric(b, "restore-ingested-offset", next(iter(group.stateful)))


def fail_the_build(group: Group, attempt: int) -> None:
    write_job_result(
        group.builds,
        f"{APP}-restore-{attempt}",
        JobResult(
            state=JobState.FAILED,
            application=APP,
            store=STORE,
            partitions=tuple(range(PARTITIONS)),
            driver_exit_code=1,
            message="the Spark driver exited with status 1",
        ),
    )


def test_a_warm_up_made_active_while_it_waits_waits_as_an_active_task(group: Group) -> None:
    """a is lost while b's warm-ups wait: b takes the tasks over, and their stores wait as an
    active task's do (b not ready), then replay everything when the build fails."""
    a = group.instances[0]
    b = start_b_warming_up(group)
    assert_pending_without_blocking(group, b)
    wait_for(
        lambda: a.check() is not None and group.inputs_committed(group.all_tasks),
        "a counted what b's active tasks forwarded",
        timeout=120,
    )
    expected = contents(a, StoreRole.ACTIVE)
    a.close(60)
    everything = Assignment(
        active={"a": frozenset(), "b": group.all_tasks},
        standby={"a": frozenset(), "b": frozenset()},
        members=MEMBERS,
    )
    b.apply_assignment(everything)
    wait_for(
        lambda: (
            any(t.state is ThreadState.RESTORING for t in b.threads)
            and len(b.restore_pending()) > 0
        ),
        "b's tasks wait for the build as active tasks",
    )
    assert not b.ready()
    fail_the_build(group, 2)
    wait_for(lambda: b.check() is not None and b.ready(), "b runs every task", timeout=300)
    assert b.restore_pending() == []
    assert sorted((r.task, r.result.records) for r in group.restores) == [
        (task, group.changelog_records(task.partition, 0)) for task in sorted(group.stateful)
    ]
    assert contents(b, StoreRole.ACTIVE) == expected
