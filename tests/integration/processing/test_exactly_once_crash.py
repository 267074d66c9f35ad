"""Word count SIGKILLed at random instants and restarted: exactly-once holds, restores stay small.

The worker (``eos_worker.py``) runs ``examples/wordcount`` over generated
lines on a SQLite log, or on the project's Kafka broker (tests/support/kafka/;
fewer lines and kills there); the parent kills it with SIGKILL at random instants
(during start-up, mid-iteration, mid-commit; see :func:`crash_loop`),
restarts it, and finally lets it run to the end and close cleanly. A run to be
killed never ends on its own, and the parent keeps appending input until its
kill (:class:`InputFeed`): every kill lands in a run still at work, however fast
the machine (a fixed input ran out before a kill more than once). Each run is
a process of its own, forked from a server that imported the worker once
(tests/support/forkserver.py), so a restart costs no import.

The invariant under ``exactly_once_v2`` (the commit protocol in
``stream_thread.py``):

* after every kill, the log's committed input offsets, outputs and
  changelogs belong to the same processed records: the repartition topic
  holds exactly the words of the lines before the committed ``text-lines``
  offsets, each changelog holds each word's count among the repartitioned
  words before the committed offset, and the published counts are the
  changelogs' (:class:`CommittedState`);
* at the end, the log is that of one crash-free run: the repartition topic
  holds each input word exactly once, each word's published counts on
  ``word-counts`` strictly increase (a replayed or duplicated commit would
  repeat a count or go back) and the last one is the word's exact count;
* the stores equal a model: after the final clean close, the union of the
  ``word-counts`` stores is exactly the expected counts, each word in the
  task its key hashes to, each store committed at its changelog's end;
* a restart replays at most one commit: the runtime's restore reports (and
  its ``restore-total`` metric) never replay a changelog record of a commit
  the commit listener saw (it runs after the stores committed), and what
  they replay lies inside the one commit the kill cut between the log
  transaction and the store commits (:func:`check_restores`).

On Kafka, offsets have gaps (each transaction's commit marker takes one,
aborted records keep theirs), so every check counts the records a range
holds, never offset differences.

Under ``at_least_once`` the promise is weaker: nothing is lost (every final
count is at least the exact count); duplicates are allowed.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import sqlite3
import time
import uuid
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from eddyline_runtime.log import Log, Record, SqliteLog
from eddyline_runtime.log.kafka import KafkaLog
from eddyline_runtime.partitions import TaskId, TopicPartition, partition_for_key
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import RocksDBStore
from tests.support.forkserver import ForkedProcess, ForkServer

WORKER = Path(__file__).with_name("eos_worker.py")
APPLICATION_ID = "wordcount"  # eos_worker.APPLICATION_ID
INPUT = "text-lines"
OUTPUT = "word-counts"
STORE = "word-counts"
CHANGELOG = f"{APPLICATION_ID}-{STORE}-changelog"
PARTITIONS = 4
COUNTING_SUBTOPOLOGY = 1  # sub-topology 0 splits lines and repartitions by word
LONGS = serde_for("long")
SLOW_MS = 60  # how late a slow run's worker starts each log transaction or store commit
# A Zipf-like vocabulary: frequent words are in (nearly) every commit of
# their partition, so a changelog range spanning two commits repeats keys.
VOCABULARY = [f"w{i}" for i in range(2_000)]
CUMULATIVE_WEIGHTS = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(VOCABULARY))))


@pytest.fixture
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Log]:
    """The SQLite log, or (parametrized ``"kafka"``) fresh topics on the project's broker."""
    log: Log
    if getattr(request, "param", "sqlite") == "kafka":
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        prefix = f"crash-{uuid.uuid4().hex[:8]}."
        log = KafkaLog.open(f"kafka://{bootstrap}", {}, topic_prefix=prefix)
    else:
        log = SqliteLog(tmp_path / "log.db")
    yield log
    log.close()


def worker_log(log: Log) -> list[str]:
    """The worker's LOG and TOPIC_PREFIX arguments for ``log``."""
    if isinstance(log, KafkaLog):
        return [log.url, log.topic_prefix]
    assert isinstance(log, SqliteLog)
    return [str(log.path), ""]


def line_batches(
    rng: random.Random, start: int, count: int
) -> tuple[list[list[Record]], Counter[str]]:
    """Lines ``start``..``start + count - 1`` of 1..8 words, round-robin over the partitions
    (line ``i`` to partition ``i % PARTITIONS``, timestamp ``i``), and their word counts."""
    batches: list[list[Record]] = [[] for _ in range(PARTITIONS)]
    counts: Counter[str] = Counter()
    for i in range(start, start + count):
        words = rng.choices(VOCABULARY, cum_weights=CUMULATIVE_WEIGHTS, k=rng.randint(1, 8))
        counts.update(words)
        batches[i % PARTITIONS].append(Record(None, " ".join(words).encode(), i))
    return batches, counts


def produce_lines(log: Log, batches: list[list[Record]]) -> None:
    for partition, batch in enumerate(batches):
        if batch:
            log.produce(TopicPartition(INPUT, partition), batch)


def generate_lines(log: Log, lines: int, seed: int) -> Counter[str]:
    """Write ``lines`` keyless lines of 1..8 words round-robin; returns the exact word counts."""
    log.create_topic(INPUT, PARTITIONS)
    batches, expected = line_batches(random.Random(seed), 0, lines)
    produce_lines(log, batches)
    return expected


class InputTemplates:
    """Each (lines, seed)'s input generated once per module, copied into each SQLite log
    that asks: generating 1.2M lines took ~6 s of each test, a copy takes a fraction of a
    second. Other logs get theirs generated."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.made: dict[tuple[int, int], tuple[Path, Counter[str]]] = {}

    def write(self, log: Log, lines: int, seed: int) -> Counter[str]:
        """Write the lines into ``log``, which holds no topic yet; returns the exact word counts."""
        if not isinstance(log, SqliteLog):
            return generate_lines(log, lines, seed)
        if (lines, seed) not in self.made:
            path = self.directory / f"lines-{lines}-{seed}.db"
            template = SqliteLog(path)
            try:
                self.made[lines, seed] = (path, generate_lines(template, lines, seed))
            finally:
                template.close()
        path, expected = self.made[lines, seed]
        assert not log.topics(), f"{log.path} already holds topics: the copy would replace them"
        log.close()  # it reconnects on its next use, and sees the copy
        with closing(sqlite3.connect(path)) as source, closing(sqlite3.connect(log.path)) as copy:
            source.backup(copy)
        return Counter(expected)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> InputTemplates:
    return InputTemplates(tmp_path_factory.mktemp("crash-input"))


# What the feed keeps ahead of the committed words: the share of the first input that the
# kill schedule leaves after its last target (see crash_loop), so the final run has as much
# to do as before the feed. Its size does not assume a speed: the parent tops it up every
# LOOK_SECONDS, and a worker would need to count it all between two looks to idle.
AHEAD_SHARE = 0.2
FEED_CHUNK = 5_000  # lines appended at once (~22,000 words)
LOOK_SECONDS = 0.05  # how often the feed looks (the parent polls faster while it waits)


class InputFeed:
    """The input: the lines in the log at the start, and more appended until each kill.

    A run that is to be killed never ends on its own (the worker's ``killed``
    mode), so it cannot finish the input before its kill however fast the
    machine; the feed makes sure it also has input left to work on when the
    kill comes (mid-iteration, mid-transaction, not idle). Whenever the parent
    waits or pauses before a kill it calls :meth:`keep_ahead`, which appends
    lines while the words not committed yet by the counting sub-topology are
    fewer than ``AHEAD_SHARE`` of the first input's. Words, not lines: with two
    threads the splitting thread runs far ahead of the counting one, and the
    kill schedule aims at counted words. The margin is fixed, not scaled by
    the commits seen: a commit takes more when more input waits, so a margin
    following it grew without end. The lines it appends come from their own
    seeded generator (the same lines whatever the chunks); the final run gets
    none and ends when it has caught up.
    """

    def __init__(self, log: Log, expected: Counter[str], seed: int) -> None:
        self.log = log
        self.expected = expected  # the word counts of every line written so far
        self.lines = sum(log.end_offset(TopicPartition(INPUT, p)) for p in range(PARTITIONS))
        self.words = expected.total()
        self.initial_lines, self.initial_words = self.lines, self.words
        self.ahead_words = int(AHEAD_SHARE * self.initial_words)
        self._rng = random.Random(f"{seed}-fed")
        self._looked = -LOOK_SECONDS

    def keep_ahead(self, committed_words: Callable[[], int]) -> None:
        """Look at the committed words (at most every ``LOOK_SECONDS``) and append lines
        while fewer than ``ahead_words`` are left to count."""
        now = time.monotonic()
        if now - self._looked < LOOK_SECONDS:
            return
        self._looked = now
        committed = committed_words()
        while self.words - committed < self.ahead_words:
            self.append(FEED_CHUNK)

    def append(self, lines: int) -> None:
        batches, counts = line_batches(self._rng, self.lines, lines)
        produce_lines(self.log, batches)
        self.lines += lines
        self.words += counts.total()
        self.expected.update(counts)


# -- the worker ---------------------------------------------------------------------


@dataclass
class Run:
    """One start of the worker, and what it reported before it ended."""

    index: int
    mode: str  # "random", "slow log" or "slow store": see crash_loop
    changelog_ends: dict[int, int]  # per changelog partition, when the run started
    killed: bool = False
    kill_note: str = ""
    target_words: int | None = None  # the committed words its kill waited for, if any
    progress: tuple[int, int] = (0, 0)  # committed_progress() after the run
    # The lines, and their words, in the log when it ended (the feed's, at the kill).
    input_lines: int = 0
    input_words: int = 0
    work_left: bool = False  # the log held records its committed offsets had not passed
    events: list[dict[str, Any]] = field(default_factory=list)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["event"] == kind]

    def restores(self) -> dict[int, dict[str, Any]]:
        return {partition_of(event["changelog"]): event for event in self.of("restore")}


def partition_of(tp_key: str) -> int:
    topic, _, partition = tp_key.rpartition(":")
    assert topic == CHANGELOG, tp_key
    return int(partition)


def read_events(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a worker's events file (each line is one write())."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text.split("\n")[:-1]]


def changelog_ends(log: Log) -> dict[int, int]:
    if CHANGELOG not in log.topics():
        return dict.fromkeys(range(PARTITIONS), 0)
    return {p: log.end_offset(TopicPartition(CHANGELOG, p)) for p in range(PARTITIONS)}


def worker_server(tmp_path: Path, log: Log, commit_mode: str | None = None) -> ForkServer:
    """The process that forks each run's worker, ``eos_worker.py`` imported once.

    A fresh ``python eos_worker.py`` per run spent ~0.3 s importing the runtime,
    a quarter of the worker's CPU over a test; each fork is still a process of
    its own, SIGKILLed at the instant the loop picks.
    """
    # The environment overrides StreamsConfig (EDDYLINE_*): keep the parent's out of it.
    env = {key: value for key, value in os.environ.items() if not key.startswith("EDDYLINE_")}
    if commit_mode is not None:
        env["EDDYLINE_COMMIT_MODE"] = commit_mode
    preload = ["eddyline_runtime.log.kafka"] if isinstance(log, KafkaLog) else []
    return ForkServer(WORKER, preload=preload, env=env, stderr=tmp_path / "forkserver.stderr")


def start_worker(
    server: ForkServer,
    tmp_path: Path,
    log: Log,
    run: Run,
    *,
    guarantee: str,
    commit_interval_ms: int,
    threads: int,
    final: bool,
) -> ForkedProcess:
    stderr = tmp_path / "worker.stderr"
    with stderr.open("ab") as errors:
        errors.write(f"--- run {run.index}\n".encode())
    where, prefix = worker_log(log)
    return server.start(
        [
            where,
            str(tmp_path / "state"),
            str(events_path(tmp_path, run.index)),
            guarantee,
            str(commit_interval_ms),
            str(threads),
            str(SLOW_MS if run.mode == "slow log" else 0),
            str(SLOW_MS if run.mode == "slow store" else 0),
            "caught-up" if final else "killed",
            prefix,
        ],
        stderr=stderr,
    )


def events_path(tmp_path: Path, run: int) -> Path:
    return tmp_path / f"events-{run:02d}.jsonl"


def store_commits(tmp_path: Path, run: int) -> int:
    """How many store commits the run's worker started (only "slow store" runs say)."""
    path = events_path(tmp_path, run)
    return path.read_bytes().count(b'"event": "store_commit"') if path.exists() else 0


def worker_failure(tmp_path: Path) -> str:
    return (tmp_path / "worker.stderr").read_text()[-3_000:]


def ended_early(tmp_path: Path, run: int, worker: ForkedProcess) -> str:
    """Why a run to be killed is not alive: in the ``killed`` mode only a failure ends it."""
    return f"run {run} failed (returncode {worker.returncode}):\n{worker_failure(tmp_path)}"


def crash_loop(
    tmp_path: Path,
    log: Log,
    feed: InputFeed,
    *,
    kills: int,
    seed: int,
    guarantee: str,
    commit_interval_ms: int,
    threads: int,
    after_run: Callable[[Run], None] = lambda run: None,
    commit_mode: str | None = None,
) -> list[Run]:
    """Start, kill, restart ``kills`` times; then one run to the end. Returns every run.

    Most kills wait until the log shows a commit's changelog records (its
    step 2) once the committed words passed this kill's share of the
    log's first input (so the kills spread over the whole processing), then
    pause at random; the others kill at a random instant after the start
    (start-up, restoration, the first records). The worker of a killed run
    never ends on its own, and ``feed`` keeps input ahead of it while the
    parent waits and pauses, so every kill lands in a run still at work,
    whatever the machine's speed. A commit's steps 2 and 3 are short, so
    random instants rarely hit them; in some runs the worker stretches one:

    * "slow store": each store commit (step 3) starts SLOW_MS late, and the
      worker says when a delay starts: a kill aimed at that event lands
      before that store committed, whatever the machine's load;
    * "slow log": each log transaction (step 2) applies SLOW_MS late; a pause
      across the next iteration often lands in it.
    """
    rng = random.Random(seed)
    runs: list[Run] = []

    def committed_words() -> int:
        return committed_progress(log)[1]

    def keep_fed() -> None:
        feed.keep_ahead(committed_words)

    with worker_server(tmp_path, log, commit_mode) as server:
        for index in range(kills + 1):
            final = index == kills
            mode = "random" if final else rng.choice(("random", "random", "slow log", "slow store"))
            run = Run(index, mode, changelog_ends(log))
            runs.append(run)
            worker = start_worker(
                server,
                tmp_path,
                log,
                run,
                guarantee=guarantee,
                commit_interval_ms=commit_interval_ms,
                threads=threads,
                final=final,
            )
            try:
                if final:
                    returncode = worker.wait(timeout=150)
                    assert returncode == 0, f"the last run failed:\n{worker_failure(tmp_path)}"
                else:
                    into_store_commit = False
                    if rng.random() < 0.15:
                        pause = rng.uniform(0.0, 1.2)
                        run.kill_note = f"{mode}, {pause:.2f} s after the start"
                    else:
                        pause = {
                            "random": rng.uniform(0.0, 0.3),
                            # Well inside the store's SLOW_MS delay, which its event starts.
                            "slow store": rng.uniform(0.0, SLOW_MS / 2_000),
                            "slow log": rng.uniform(0.1, 0.5),
                        }[mode]
                        # Aim past this kill's share of the work, at a commit.
                        run.target_words = int(0.8 * (index + 1) / kills * feed.initial_words)
                        wait_for_commit(tmp_path, log, worker, run, keep_fed=keep_fed)
                        into_store_commit = mode == "slow store"
                        where = "into a store commit" if into_store_commit else "after a commit"
                        run.kill_note = f"{mode}, {pause:.2f} s {where}"
                    if into_store_commit:
                        # Nothing may delay this kill past the store's delay; the feed
                        # keeps a fifth of the input ahead, far more than the pause needs.
                        time.sleep(pause)
                    else:
                        deadline = time.monotonic() + pause
                        while (left := deadline - time.monotonic()) > 0:
                            keep_fed()
                            time.sleep(min(left, LOOK_SECONDS))
                    assert worker.poll() is None, ended_early(tmp_path, index, worker)
                    worker.send_signal(signal.SIGKILL)
                    assert worker.wait(timeout=30) == -signal.SIGKILL
                    run.killed = True
            finally:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
            run.input_lines, run.input_words = feed.lines, feed.words
            run.events = read_events(events_path(tmp_path, index))
            settle(log, exactly_once=guarantee == "exactly_once_v2")
            run.progress = committed_progress(log)
            run.work_left = work_left(log)
            after_run(run)
    return runs


def wait_for_commit(
    tmp_path: Path,
    log: Log,
    worker: ForkedProcess,
    run: Run,
    *,
    keep_fed: Callable[[], None],
) -> None:
    """Wait until the committed words reach ``run.target_words``, then for a commit.

    In a "slow store" run, for a store commit to start its delay (step 3,
    announced by the worker); otherwise for a log transaction (its changelog
    records appear, step 2). The input is kept fed all along.
    """
    deadline = time.monotonic() + 60
    target = run.target_words
    assert target is not None

    def wait(until: Callable[[], bool], what: str, poll_seconds: float) -> None:
        while not until():
            assert worker.poll() is None, ended_early(tmp_path, run.index, worker)
            assert time.monotonic() < deadline, f"run {run.index}: no {what}"
            keep_fed()
            time.sleep(poll_seconds)

    wait(lambda: committed_progress(log)[1] >= target, "progress", 0.01)
    if run.mode == "slow store":
        started = store_commits(tmp_path, run.index)
        wait(lambda: store_commits(tmp_path, run.index) > started, "store commit", 0.002)
    else:
        ends = changelog_ends(log)
        wait(lambda: changelog_ends(log) != ends, "commit", 0.01)


def check_kills(runs: list[Run]) -> None:
    """Every kill landed while its run was at work, and the aimed ones past their share.

    At work: after its kill, a line or a repartitioned word lay past the committed
    offsets (:func:`work_left`).
    """
    killed = [run for run in runs if run.killed]
    idle = [
        f"run {r.index} ({r.kill_note}): {r.progress} lines, words committed"
        for r in killed
        if not r.work_left
    ]
    assert not idle, f"killed with all input committed (the feed did not keep ahead): {idle}"
    short = [
        f"run {r.index}: {r.progress[1]} words committed, aimed past {r.target_words}"
        for r in killed
        if r.target_words is not None and r.progress[1] < r.target_words
    ]
    assert not short, f"kills before their share of the work: {short}"
    last = runs[-1]
    assert not last.killed and last.progress[0] == last.input_lines, "the last run finished"


# -- reading the results ------------------------------------------------------------


def fetch_range(log: Log, tp: TopicPartition, start: int, end: int) -> list[Record]:
    records: list[Record] = []
    while start < end:
        fetched = [r for r in log.fetch(tp, start, 50_000).records if r.offset < end]
        if not fetched:  # only transaction markers (or aborted records) left before end
            break
        records.extend(fetched)
        start = fetched[-1].offset + 1
    return records


def read_topic(log: Log, topic: str, partition: int) -> list[Record]:
    tp = TopicPartition(topic, partition)
    return fetch_range(log, tp, log.beginning_offset(tp), log.end_offset(tp))


@dataclass
class Columns:
    """A range's records as columns: what :func:`fetch_range` reads, without a Record per
    row (the repartition topic holds millions; building a tuple for each made the
    parent's checks a third of a run)."""

    offsets: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)


def fetch_columns_range(log: Log, tp: TopicPartition, start: int, end: int) -> Columns:
    """The records at offsets start..end-1, as :func:`fetch_range` reads them."""
    columns = Columns()
    while start < end:
        fetched = log.fetch_columns(tp, start, 50_000)
        n = bisect_left(fetched.offsets, end)  # offsets increase within a partition
        if not n:  # only transaction markers (or aborted records) left before end
            break
        columns.offsets.extend(fetched.offsets[:n])
        columns.keys.extend(fetched.keys[:n])
        columns.values.extend(fetched.values[:n])
        start = fetched.offsets[n - 1] + 1
    return columns


def read_topic_columns(log: Log, topic: str, partition: int) -> Columns:
    tp = TopicPartition(topic, partition)
    return fetch_columns_range(log, tp, log.beginning_offset(tp), log.end_offset(tp))


def decoded(keys: list[bytes | None]) -> list[str]:
    """Each key as text; every record here has one."""
    texts = [key.decode() for key in keys if key is not None]
    assert len(texts) == len(keys), "a record without a key"
    return texts


def counts_per_key(records: list[Record]) -> dict[str, list[int]]:
    """Every count a topic holds per word, in offset order."""
    counts: dict[str, list[int]] = {}
    for record in records:
        assert record.key is not None and record.value is not None
        counts.setdefault(record.key.decode(), []).append(LONGS.deserialize(record.value))
    return counts


def published_counts(log: Log) -> dict[str, list[int]]:
    published: dict[str, list[int]] = {}
    for partition in range(PARTITIONS):
        for word, counts in counts_per_key(read_topic(log, OUTPUT, partition)).items():
            assert partition_for_key(word.encode(), PARTITIONS) == partition, word
            assert word not in published, f"{word} published to two partitions"
            published[word] = counts
    return published


def read_stores(state_dir: Path) -> dict[int, tuple[dict[str, int], int | None]]:
    """Per counting task: its store's contents and committed changelog offset."""
    stores = {}
    for partition in range(PARTITIONS):
        directory = state_dir / f"{COUNTING_SUBTOPOLOGY}_{partition}" / STORE
        with RocksDBStore(STORE, directory) as store:
            contents = {key.decode(): LONGS.deserialize(value) for key, value in store.all()}
            offset = store.committed_offset(TopicPartition(CHANGELOG, partition))
        stores[partition] = (contents, offset)
    return stores


def strictly_increasing(values: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


def where_not_increasing(values: list[int]) -> str:
    i = next(i for i in range(1, len(values)) if values[i] <= values[i - 1])
    return f"published ..., {', '.join(map(str, values[max(i - 2, 0) : i + 2]))}, ..."


def committed_progress(log: Log) -> tuple[int, int]:
    """How far the committed input offsets are: lines, and repartitioned words (on Kafka,
    words and the transaction markers among them)."""
    topics = log.topics()
    done = []
    for topic in (INPUT, *(name for name in topics if name.endswith("-repartition"))):
        tps = [TopicPartition(topic, p) for p in range(topics[topic].partitions)]
        done.append(sum(log.committed_offsets(APPLICATION_ID, tps).values()))
    return done[0], sum(done[1:])


def work_left(log: Log) -> bool:
    """Whether a record of the input or repartition topic lies past its committed offset.

    A record, not an offset: on Kafka a committed offset can stop short of the end at
    commit markers or aborted records, which a fetch never returns.
    """
    topics = log.topics()
    for topic in (INPUT, *(name for name in topics if name.endswith("-repartition"))):
        tps = [TopicPartition(topic, p) for p in range(topics[topic].partitions)]
        committed = log.committed_offsets(APPLICATION_ID, tps)
        for tp in tps:
            offset = committed.get(tp, log.beginning_offset(tp))  # absent: never committed
            if any(r.offset < log.end_offset(tp) for r in log.fetch(tp, offset, 1).records):
                return True
    return False


def settle(log: Log, *, exactly_once: bool) -> None:
    """On Kafka, decide the dead worker's transactions and wait until their markers landed.

    Each task has its own transaction, and ``commit.mode=concurrent`` commits a
    thread's tasks at once: a kill between two tasks' commits leaves some
    transactions open, and a partition may hold another task's committed
    records after the first record of one of them. A read_committed reader
    (the checks read to the last stable offset) sees none of those until the
    open transaction is decided, which the next owner of its task does when
    it starts it (its ``init_transactions`` aborts it), or the transaction
    timeout after a minute. So, as the next run would, open and close a
    producer for each task's transactional id first.

    The transaction coordinator writes a commit's markers after it answered the
    commit, so right after a kill a finished commit's records may be visible and
    its input offsets not yet (or the other way round). Settled: the end offsets
    and committed offsets did not change for three polls in a row. The embedded
    log's commits are visible when they return.
    """
    if not isinstance(log, KafkaLog):
        return
    if exactly_once:
        tasks = [TaskId(s, p) for s in range(COUNTING_SUBTOPOLOGY + 1) for p in range(PARTITIONS)]
        started = log.transactional_producers([f"{APPLICATION_ID}-{task}" for task in tasks])
        started.close()

    def snapshot() -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        tps = [
            TopicPartition(topic, p)
            for topic, spec in log.topics().items()
            for p in range(spec.partitions)
        ]
        inputs = [tp for tp in tps if tp.topic == INPUT or tp.topic.endswith("-repartition")]
        return {tp: log.end_offset(tp) for tp in tps}, log.committed_offsets(APPLICATION_ID, inputs)

    previous, unchanged = snapshot(), 0
    deadline = time.monotonic() + 10
    while unchanged < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        current = snapshot()
        unchanged = unchanged + 1 if current == previous else 0
        previous = current


class CommittedState:
    """The log's committed state, folded incrementally, to check after every kill.

    Under exactly-once every record in the log is committed, and the
    committed input offsets belong to the same processed records as the
    outputs and changelogs. So, whenever the worker is dead:

    * the repartition topic holds exactly the words of the lines before the
      committed ``text-lines`` offsets;
    * each changelog's latest value per word is the word's count among the
      repartition records before the committed repartition offset;
    * the latest published count of each word is its changelog's.

    Under at-least-once (``exactly=False``) input offsets are committed after
    what their records produced, which may also be there twice: the first
    two hold with "at least" for "exactly".
    """

    def __init__(self, log: Log, *, exactly: bool) -> None:
        self.log = log
        self.exactly = exactly
        self.committed: dict[TopicPartition, int] = {}
        self.line_words: Counter[str] = Counter()  # in lines before the committed offsets
        self.repartitioned: Counter[str] = Counter()  # in the whole repartition topic
        # Per repartition partition, its records' offsets and words, in offset order.
        self.repartition_offsets: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        self.repartition_keys: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
        self.counted: dict[int, Counter[str]] = {p: Counter() for p in range(PARTITIONS)}
        self.changelogs: dict[int, dict[str, int]] = {p: {} for p in range(PARTITIONS)}
        self.published: dict[str, int] = {}
        self.read_to: dict[TopicPartition, int] = {}

    def check(self, run: Run) -> None:
        """Check the log as ``run`` left it (settled: :func:`crash_loop` waits for that)."""
        topics = self.log.topics()
        repartition = [name for name in topics if name.endswith("-repartition")]
        if not repartition or CHANGELOG not in topics or OUTPUT not in topics:
            return  # the first run died before it created its topics: nothing to check
        self._read(repartition[0])
        when = f"after run {run.index} ({run.kill_note or 'last'})"
        more = (self.repartitioned - self.line_words).total() if self.exactly else 0
        fewer = (self.line_words - self.repartitioned).total()
        assert not more and not fewer, (
            f"{when}: the repartition topic does not hold the words of the committed lines: "
            f"{more} more, {fewer} fewer"
        )
        for p in range(PARTITIONS):
            changelog, counted = self.changelogs[p], self.counted[p]
            wrong = [
                (word, changelog.get(word, 0), n)
                for word, n in counted.items()
                if changelog.get(word, 0) < n or (self.exactly and changelog.get(word, 0) > n)
            ]
            if self.exactly:
                wrong += [(word, n, 0) for word, n in changelog.items() if word not in counted]
            assert not wrong, (
                f"{when}: {CHANGELOG}-{p} does not hold the counts of the repartitioned words "
                f"before the committed offset (word, changelog, repartitioned): {wrong[:5]}"
            )
        if self.exactly:
            union = {word: n for p in range(PARTITIONS) for word, n in self.changelogs[p].items()}
            assert self.published == union, f"{when}: published counts differ from the changelogs"

    def _read(self, repartition: str) -> None:
        for p in range(PARTITIONS):
            new = self._new(TopicPartition(repartition, p))
            words = decoded(new.keys)
            self.repartition_offsets[p].extend(new.offsets)
            self.repartition_keys[p].extend(words)
            self.repartitioned.update(words)
            for topic, latest in ((CHANGELOG, self.changelogs[p]), (OUTPUT, self.published)):
                new = self._new(TopicPartition(topic, p))
                for word, value in zip(decoded(new.keys), new.values, strict=True):
                    assert value is not None
                    latest[word] = LONGS.deserialize(value)
        inputs = [TopicPartition(INPUT, p) for p in range(PARTITIONS)]
        repartitions = [TopicPartition(repartition, p) for p in range(PARTITIONS)]
        committed = self.log.committed_offsets(APPLICATION_ID, inputs + repartitions)
        for tp, offset in committed.items():
            before = self.committed.get(tp, 0)
            assert offset >= before, f"{tp}: the committed offset went back to {offset}"
            if tp.topic == INPUT:
                values = fetch_columns_range(self.log, tp, before, offset).values
                lines = [value for value in values if value is not None]
                assert len(lines) == len(values), f"{tp}: a line without a value"
                # Split as one text: the same words as line by line, a space being whitespace.
                self.line_words.update(b" ".join(lines).decode().split())
            else:
                offsets = self.repartition_offsets[tp.partition]
                self.counted[tp.partition].update(
                    self.repartition_keys[tp.partition][
                        bisect_left(offsets, before) : bisect_left(offsets, offset)
                    ]
                )
            self.committed[tp] = offset

    def _new(self, tp: TopicPartition) -> Columns:
        """The records of ``tp`` not read yet."""
        start, end = self.read_to.get(tp, 0), self.log.end_offset(tp)
        self.read_to[tp] = end
        return fetch_columns_range(self.log, tp, start, end)


# -- the restore bound --------------------------------------------------------------


class ChangelogRecords:
    """Every changelog partition's records, found by offset: on Kafka, commit markers
    and aborted records take offsets but are never read, so ranges are counted."""

    def __init__(self, log: Log) -> None:
        self.records = {p: read_topic(log, CHANGELOG, p) for p in range(PARTITIONS)}
        self.offsets = {p: [r.offset for r in self.records[p]] for p in range(PARTITIONS)}

    def between(self, p: int, start: int, end: int) -> list[Record]:
        """The records at offsets start..end-1."""
        offsets = self.offsets[p]
        return self.records[p][bisect_left(offsets, start) : bisect_left(offsets, end)]

    def same_end(self, p: int, a: int, b: int) -> bool:
        """Two end offsets with no record between them (only markers, on Kafka)."""
        return not self.between(p, min(a, b), max(a, b))


def check_restores(log: Log, runs: list[Run]) -> list[dict[int, int]]:
    """Check every restart's restores against the commits before it; returns records restored.

    A commit the listener saw had its stores committed, so no later restore
    may replay its changelog records. Only a thread's last commit can be
    missing from a run's events (the listener runs after the stores commit,
    before the next commit starts), and a changelog partition has one writer,
    its task: the changelog records a run wrote to a partition after its last
    reported commit are one commit (one transaction of that task), and they
    are all a restart may replay. Restores of 0 records are the common case: the window between the
    log transaction and the store commits is short (the worker widens it in
    some runs).
    """
    changelogs = ChangelogRecords(log)
    between, same_end = changelogs.between, changelogs.same_end
    final_ends = changelog_ends(log)
    reported_last = dict.fromkeys(range(PARTITIONS), -1)  # last offset a reported commit wrote
    # The changelog range of the latest commit no listener reported, per partition.
    unreported: dict[int, tuple[int, int]] = dict.fromkeys(range(PARTITIONS), (0, 0))
    commit_sizes: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    restored_per_run: list[dict[int, int]] = []

    def one_commit(p: int, start: int, end: int, what: str) -> None:
        records = between(p, start, end)
        keys = [record.key for record in records]
        first = records[0].offset if records else start
        # One transaction's records to one partition follow on without gaps.
        assert [r.offset for r in records] == list(range(first, first + len(records)))
        assert len(set(keys)) == len(keys), f"{what}: a key twice, so more than one commit"
        if records:
            commit_sizes[p].append(len(records))

    for i, run in enumerate(runs):
        restores = run.restores()
        if run.of("running") or run.of("commit"):  # every task was created
            assert set(restores) == set(range(PARTITIONS)), f"run {i}: restores {restores}"
        restored: dict[int, int] = {}
        for p, event in restores.items():
            first, end, records = event["first_offset"], event["end_offset"], event["records"]
            where = f"run {i} ({run.kill_note or 'last'}), {CHANGELOG}-{p}"
            assert same_end(p, end, run.changelog_ends[p]), f"{where}: restored to {end}"
            assert first > reported_last[p], (
                f"{where}: restored from {first}, but a reported commit already stored "
                f"offset {reported_last[p]}: the store lost a commit or was wiped"
            )
            assert records == len(between(p, first, end)), (
                f"{where}: {records} records from {first}..{end}"
            )
            if records:
                start, stop = unreported[p]
                assert start <= first and same_end(p, end, stop), (
                    f"{where}: restored {first}..{end}, outside the one unreported commit "
                    f"{start}..{stop}"
                )
            restored[p] = records
        restored_per_run.append(restored)
        for running in run.of("running"):
            assert running["restore_total"] == {
                f"{event['task']}/{STORE}": float(event["records"]) for event in restores.values()
            }, f"run {i}: the restore-total metrics disagree with the restore reports"

        # This run's reported commits must tile the changelog from where it started.
        next_ends = runs[i + 1].changelog_ends if i + 1 < len(runs) else final_ends
        position = dict(run.changelog_ends)
        for commit in run.of("commit"):
            for key, last in commit["changelog_last_offsets"].items():
                p = partition_of(key)
                count = commit["changelog_records"][key]
                written = between(p, position[p], last + 1)
                assert len(written) == count and written[-1].offset == last, (
                    f"run {i}: a commit wrote {count} records to {CHANGELOG}-{p} ending at "
                    f"{last}, but {len(written)} records lie from {position[p]} to there"
                )
                one_commit(p, position[p], last + 1, f"run {i}, commit ending at {last}")
                reported_last[p] = last
                position[p] = last + 1
        for p in range(PARTITIONS):
            assert position[p] <= next_ends[p] or same_end(p, position[p], next_ends[p])
            if between(p, run.changelog_ends[p], next_ends[p]):  # the run wrote to it
                unreported[p] = (position[p], next_ends[p])
                one_commit(p, position[p], next_ends[p], f"run {i}, its unreported commit")
            if not run.killed:
                assert same_end(p, position[p], next_ends[p]), "a clean close reports every commit"

    for i, restored in enumerate(restored_per_run):
        for p, records in restored.items():
            # The bound, literally: no more than one commit's worth.
            assert records <= max(commit_sizes[p], default=0), (i, p, records)
    return restored_per_run


# -- the tests ----------------------------------------------------------------------

LINES = 600_000
# On Kafka a run is slower (a broker round trip per fetch and commit, on 2 shared cores).
KAFKA_LINES, KAFKA_KILLS = 150_000, 12


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("log", "threads", "commit_mode"),
    [("sqlite", 1, None), ("sqlite", 2, None), ("kafka", 1, None), ("kafka", 1, "pipelined")],
    ids=["1-thread", "2-threads", "kafka-1-thread", "kafka-1-thread-pipelined"],
    indirect=["log"],
)
def test_exactly_once_survives_sigkills(
    tmp_path: Path, log: Log, inputs: InputTemplates, threads: int, commit_mode: str | None
) -> None:
    """SIGKILL the word count 24 times (12 on Kafka); the committed results are those
    of a clean run.

    With 2 stream threads, each thread commits its own tasks in its own
    transaction, and one thread's repartition records are the other's input. Under
    ``commit.mode=pipelined`` a task's transaction is open with outputs in it for most
    of each interval, so most kills land in one.
    """
    on_kafka = isinstance(log, KafkaLog)
    expected = inputs.write(log, KAFKA_LINES if on_kafka else LINES, seed=2026)
    feed = InputFeed(log, expected, seed=2026)  # it adds the words of the lines it feeds
    kills = KAFKA_KILLS if on_kafka else 24
    started = time.monotonic()
    committed = CommittedState(log, exactly=True)
    runs = crash_loop(
        tmp_path,
        log,
        feed,
        kills=kills,
        seed=424242 + threads,
        guarantee="exactly_once_v2",
        commit_interval_ms=100,
        threads=threads,
        after_run=committed.check,
        commit_mode=commit_mode,
    )
    elapsed = time.monotonic() - started
    assert sum(run.killed for run in runs) == kills
    # The kills landed throughout the processing (past their shares), none after it.
    check_kills(runs)
    killed = [run for run in runs if run.killed]

    # The log: every word repartitioned exactly once, counts published without
    # a repeat or a step back, and the last published count is exact.
    repartition = [name for name in log.topics() if name.endswith("-repartition")]
    assert len(repartition) == 1
    keys: Counter[bytes | None] = Counter()
    for p in range(PARTITIONS):
        keys.update(read_topic_columns(log, repartition[0], p).keys)
    words = Counter({key.decode(): n for key, n in keys.items() if key is not None})
    assert words == expected, (
        f"the repartition topic doubled {(words - expected).total()} words and lost "
        f"{(expected - words).total()}"
    )
    published = published_counts(log)
    not_increasing = {w: c for w, c in published.items() if not strictly_increasing(c)}
    assert not not_increasing, (
        f"{len(not_increasing)} words had a count published twice or going back, e.g. "
        + ", ".join(f"{w} {where_not_increasing(c)}" for w, c in list(not_increasing.items())[:3])
    )
    assert {word: counts[-1] for word, counts in published.items()} == dict(expected)
    for p in range(PARTITIONS):
        for word, counts in counts_per_key(read_topic(log, CHANGELOG, p)).items():
            assert partition_for_key(word.encode(), PARTITIONS) == p
            assert strictly_increasing(counts), f"{p}: {word} {where_not_increasing(counts)}"
            assert counts[-1] == expected[word]

    # The stores equal the model.
    last_records = {p: read_topic(log, CHANGELOG, p)[-1].offset for p in range(PARTITIONS)}
    stores = read_stores(tmp_path / "state")
    union: dict[str, int] = {}
    for p, (contents, offset) in stores.items():
        assert offset == last_records[p], (
            f"store {p} committed {offset}, the changelog's last record is {last_records[p]}"
        )
        assert all(partition_for_key(w.encode(), PARTITIONS) == p for w in contents)
        union.update(contents)
    assert union == dict(expected)

    # Restores: never a reported commit again, never more than the one cut commit.
    restored = check_restores(log, runs)
    restarts_restoring = [i for i, r in enumerate(restored) if any(r.values())]
    report = {
        "seconds": round(elapsed, 1),
        "lines": {"first": feed.initial_lines, "fed": feed.lines - feed.initial_lines},
        "kills": [
            f"{r.kill_note}: {r.progress[1] / r.input_words:.0%} of {r.input_words} words"
            for r in killed
        ],
        "restored": [sum(r.values()) for r in restored],
        "restarts restoring": restarts_restoring,
        "commits": [len(run.of("commit")) for run in runs],
    }
    print(json.dumps(report))
    # A "slow store" run's aimed kill lands inside a store commit's delay, before
    # that store committed: the next restart that gets as far as restoring
    # restores the tails of the stores not committed yet.
    aimed = [r.index for r in killed if r.mode == "slow store" and "commit" in r.kill_note]
    restarts = [next(j for j in range(i + 1, len(runs)) if runs[j].restores()) for i in aimed]
    # (One may miss: a kill delayed past the last store's delay by a loaded machine.)
    missed = set(restarts) - set(restarts_restoring)
    assert aimed and len(missed) <= min(1, len(aimed) - 1), report


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_at_least_once_loses_nothing_under_sigkills(
    tmp_path: Path, log: Log, inputs: InputTemplates
) -> None:
    """SIGKILL the word count 12 times under at-least-once: counts may double, never drop."""
    # The exactly-once tests' input (copied, not generated again); its own kill instants.
    expected = inputs.write(log, LINES, seed=2026)
    feed = InputFeed(log, expected, seed=2026)  # it adds the words of the lines it feeds
    committed = CommittedState(log, exactly=False)
    runs = crash_loop(
        tmp_path,
        log,
        feed,
        kills=12,
        seed=737373,
        guarantee="at_least_once",
        commit_interval_ms=200,
        threads=1,
        after_run=committed.check,
    )
    assert sum(run.killed for run in runs) == 12
    check_kills(runs)
    latest = {word: counts[-1] for word, counts in published_counts(log).items()}
    lost = {w: (latest.get(w), n) for w, n in expected.items() if latest.get(w, 0) < n}
    assert not lost, (
        f"{len(lost)} words counted less than the input holds (last published, exact), e.g. "
        f"{dict(list(lost.items())[:5])}"
    )
    assert set(latest) == set(expected)
    assert sum(latest.values()) >= sum(expected.values())
    stores = read_stores(tmp_path / "state")
    union = {word: count for contents, _ in stores.values() for word, count in contents.items()}
    # After a clean close each store holds what was last published for its words.
    assert union == latest
