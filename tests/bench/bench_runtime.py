"""Runtime benchmark: word count (beside bytewax), restart after SIGKILL, restore rate.

Run it with ``make bench-runtime`` (the project's ``.venv``, and bytewax's
own ``.venv-bytewax``, which the Makefile creates). It is a script, not a
test: it measures and reports, and never fails on a number. Every case runs
on a fresh embedded log (SQLite) and fresh state directories under the
system's temporary directory.

**Throughput.** The word-count example (``examples/wordcount``: split lines,
re-key by word through a repartition topic, count, publish every new count)
over ``LINES`` generated lines (the demo's generator: 4-12 words each, 32
words, Zipf-like) in ``INPUT_PARTITIONS`` partitions, one stream thread.
Timed: from ``instance.start()`` until ``instance.caught_up()`` (every input
read, nothing buffered, everything committed), polled every 10 ms; the cases
run interleaved ``THROUGHPUT_RUNS`` times and the median is reported:

* ``eos``: ``exactly_once_v2``, ``commit.interval.ms`` = ``COMMIT_INTERVAL_MS``
  (Kafka's exactly-once default);
* ``alos``: ``at_least_once`` with the same ``commit.interval.ms``. One
  interval for both, so the difference is the commit protocol itself (one log
  transaction holding outputs, changelogs and offsets vs plain appends with
  offsets last, outputs appended as they are produced), not how often it runs;
* ``alos_default``: ``at_least_once`` with its own default interval (30 s):
  it commits when the input runs out (or the uncommitted-bytes budget is
  reached), which is what an application left at the defaults gets;
* ``eos_nocache``: ``eos`` with ``statestore.cache.max.bytes`` = 0, so every
  count is written and published;
* ``bytewax_recovery``: the same word count on bytewax 0.21.1 (Rust
  dataflow, Python functions) with its SQLite recovery on and a 100 ms epoch
  (snapshot) interval, run by ``bench_bytewax_wordcount.py`` in a subprocess
  of ``.venv-bytewax`` (``make bench-runtime`` creates it) on the same lines,
  written to a file; its last count per word is checked like ours. Skipped,
  with a note, when ``.venv-bytewax`` is missing.

Reported: input lines/s (the ``*_records_per_s`` of the JSON line), records
processed/s (``instance.processed``: the lines plus the words read back from
the repartition topic), words/s and CPU seconds per million words (CPU time
of this process, every thread, from ``instance.start()`` to caught up; of the
bytewax process from its dataflow's start to its end), and eddyline's ratios
to bytewax. The final counts are checked against the generated text under
every case.

**Restart to first record after a SIGKILL.** A count store
(``stream("keys").group_by_key().count("counts")``, one partition, so one
task and one store) whose changelog holds 100,000 and 1,000,000 records, one
per distinct key. The changelog is produced into the log and restored into the
store once with ``restore()``, as a real store gets there. The input cycles
over ``HOT_KEYS`` of those keys. A worker process
(``bench_runtime_worker.py``) runs the app under ``exactly_once_v2`` with
``READ_COMMITTED`` stores and is SIGKILLed mid-run: after its first commit,
plus a random 0-100 ms (the commit interval), so the kill lands anywhere in the
commit cycle. It is then restarted, ``RESTARTS`` times each, alternately:

* ``rc``: as is. The transactional store reopens at its committed offset and
  restores only the changelog tail after it (at most one commit's records);
* ``wipe``: after deleting the task's state directory, which is what a
  non-transactional store must do after an unclean shutdown under EOS (its
  data may hold uncommitted writes): restore the whole changelog.

Each restarted worker is itself SIGKILLed the same way, so every measured
restart follows a kill. Timed, with ``time.monotonic()`` (one clock for all
processes on Linux): from ``instance.start()`` to the first record reaching
the topology (a ``peek`` stamps it), which excludes the interpreter start-up
and imports; and from spawning the process, which includes them. The median
of the ``RESTARTS`` restarts is reported. The changelog grows by what the
killed runs committed (at most ``HOT_KEYS`` records per commit); the sizes at
restart are printed. At the end the store is checked: every hot key's count
equals 1 + its occurrences before the committed input offset, across all the
kills (exactly once).

**Restore rate.** Records per second of the ``wipe`` restores of the
1,000,000-record changelog (``RestoreResult``, median), and of the initial
restore into an empty store in this process.

The last line printed is one JSON object for tools; the targets are printed
for information only.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.metadata
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.demo.wordcount_demo import generate_lines
from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing.loader import load_topology
from eddyline_runtime.restore.replay import RestoreResult, restore
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import RocksDBStore, RocksDBStoreOptions
from tests.bench.bench_runtime_worker import KEYS_TOPIC, STORE, config

ROOT: Final = Path(__file__).resolve().parents[2]
WORDCOUNT: Final = ROOT / "examples" / "wordcount"
WORKER: Final = Path(__file__).with_name("bench_runtime_worker.py")

LINES: Final = 100_000
INPUT_PARTITIONS: Final = 4
THROUGHPUT_RUNS: Final = 3
COMMIT_INTERVAL_MS: Final = 100
# case -> (processing.guarantee, commit.interval.ms; None: the guarantee's default)
THROUGHPUT_CASES: Final[dict[str, tuple[str, int | None]]] = {
    "eos": ("exactly_once_v2", COMMIT_INTERVAL_MS),
    "eos_nocache": ("exactly_once_v2", COMMIT_INTERVAL_MS),
    "alos": ("at_least_once", COMMIT_INTERVAL_MS),
    "alos_default": ("at_least_once", None),
    "bytewax_recovery": ("bytewax recovery", COMMIT_INTERVAL_MS),
}
# Cases that run with the record cache off.
NO_CACHE_CASES: Final = frozenset({"eos_nocache"})
BYTEWAX_PYTHON: Final = ROOT / ".venv-bytewax" / "bin" / "python"
BYTEWAX_SCRIPT: Final = Path(__file__).with_name("bench_bytewax_wordcount.py")

CHANGELOG_SIZES: Final = {"100k": 100_000, "1m": 1_000_000}
RESTART_KINDS: Final = ("rc", "wipe")
HOT_KEYS: Final = 1_000
RESTARTS: Final = 3
PRODUCE_BATCH: Final = 100_000
# Keep at least this much unread input ahead of every worker run.
INPUT_AHEAD: Final = 400_000
INPUT_TOP_UP: Final = 500_000
SEED: Final = 42

LONG: Final = serde_for("long")

# name -> (comparison, threshold); information only, never enforced.
TARGETS: Final[dict[str, tuple[str, float]]] = {
    "eos_cpu_s_per_m_words": ("<=", 5.0),
    "eos_nocache_cpu_s_per_m_words": ("<=", 8.0),
    "eos_vs_bytewax_recovery_words_per_s": (">=", 0.6),
    "restart_first_record_s_100k_rc": ("<", 1.0),
    "restart_first_record_s_1m_rc": ("<", 1.0),
    "restore_records_per_s": (">=", 500_000),
}

# What the correctness checks found; printed before the results, never fatal.
PROBLEMS: list[str] = []


def problem(message: str) -> None:
    if message not in PROBLEMS:
        PROBLEMS.append(message)


@contextmanager
def fresh_directory(case: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"eddyline-bench-runtime-{case}-") as directory:
        yield Path(directory)


# -- throughput ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThroughputRun:
    seconds: float
    processed: int  # records processed by all tasks: lines + words
    commits: int
    cpu_seconds: float = 0.0


def bytewax_run(case: str, lines_file: Path, expected: Counter[str]) -> ThroughputRun:
    """The word count on bytewax, in its own environment (see the module docstring)."""
    with fresh_directory(case) as directory:
        done = subprocess.run(
            [str(BYTEWAX_PYTHON), str(BYTEWAX_SCRIPT), str(lines_file), "recovery", directory],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"bytewax word count failed:\n{done.stderr[-3_000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    check_word_counts(case, result["counts"], expected)
    words = sum(expected.values())
    return ThroughputRun(result["seconds"], words, 0, result["cpu_seconds"])


def wordcount_run(case: str, texts: list[str], expected: Counter[str]) -> ThroughputRun:
    guarantee, interval = THROUGHPUT_CASES[case]
    with fresh_directory(case) as directory:
        log = SqliteLog(directory / "log.db")
        try:
            log.create_topic("text-lines", INPUT_PARTITIONS)
            for partition in range(INPUT_PARTITIONS):
                log.produce(
                    TopicPartition("text-lines", partition),
                    [
                        Record(None, text.encode(), offset)
                        for offset, text in enumerate(texts[partition::INPUT_PARTITIONS])
                    ],
                )
            properties: dict[str, Any] = {
                "application.id": "bench-wordcount",
                "state.dir": str(directory / "state"),
                "processing.guarantee": guarantee,
            }
            if interval is not None:
                properties["commit.interval.ms"] = interval
            if case in NO_CACHE_CASES:
                properties["statestore.cache.max.bytes"] = 0
            topology = load_topology("wordcount:topology", [WORDCOUNT])
            instance = StreamsInstance(topology, StreamsConfig.from_properties(properties), log)
            gc.collect()
            cpu_started, started = time.process_time(), time.perf_counter()
            instance.start()
            try:
                instance.wait_until_caught_up(600, poll_seconds=0.01)
                seconds = time.perf_counter() - started
                cpu_seconds = time.process_time() - cpu_started
                processed = instance.processed
            finally:
                instance.close()
            commits = sum(
                value
                for name, value in instance.final_metrics.items()
                if name.group == "stream-thread-metrics" and name.name == "commit-total"
            )
            check_word_counts(case, latest_counts(log, "word-counts"), expected)
        finally:
            log.close()
    return ThroughputRun(seconds, processed, int(commits), cpu_seconds)


def latest_counts(log: SqliteLog, topic: str) -> dict[str, int]:
    latest: dict[str, int] = {}
    for partition in range(log.topics()[topic].partitions):
        tp = TopicPartition(topic, partition)
        position = log.beginning_offset(tp)
        while True:
            fetched = log.fetch(tp, position, 10_000)
            if not fetched.records:
                break
            for record in fetched.records:
                if record.key is not None and record.value is not None:
                    latest[record.key.decode()] = LONG.deserialize(record.value)
            position = fetched.records[-1].offset + 1
    return latest


def check_word_counts(case: str, counts: dict[str, int], expected: Counter[str]) -> None:
    wrong = sorted(w for w in expected.keys() | counts.keys() if counts.get(w) != expected[w])
    if wrong:
        word = wrong[0]
        problem(
            f"word count ({case}): {len(wrong)} words counted wrong, e.g. {word!r}: "
            f"{counts.get(word)} instead of {expected[word]}"
        )


# -- restart after SIGKILL -----------------------------------------------------------------


def state_key(index: int) -> bytes:
    return b"key-%09d" % index


@dataclass
class KeysInput:
    """The shared input topic: record j carries ``hot[j % HOT_KEYS]``, keys every store has."""

    log: SqliteLog
    hot: list[bytes]
    produced: int = 0

    @classmethod
    def create(cls, log: SqliteLog) -> KeysInput:
        # Spread over the first 100k keys, which both changelogs hold.
        step = min(CHANGELOG_SIZES.values()) // HOT_KEYS
        hot = [state_key(i * step) for i in range(HOT_KEYS)]
        random.Random(SEED).shuffle(hot)
        log.create_topic(KEYS_TOPIC, 1)
        return cls(log, hot)

    @property
    def partition(self) -> TopicPartition:
        return TopicPartition(KEYS_TOPIC, 0)

    def committed(self, application_id: str) -> int:
        found = self.log.committed_offsets(application_id, [self.partition])
        return found.get(self.partition, 0)

    def ensure_ahead_of(self, application_id: str) -> None:
        while self.produced - self.committed(application_id) < INPUT_AHEAD:
            for start in range(self.produced, self.produced + INPUT_TOP_UP, PRODUCE_BATCH):
                self.log.produce(
                    self.partition,
                    [
                        Record(self.hot[j % HOT_KEYS], b"", j)
                        for j in range(start, start + PRODUCE_BATCH)
                    ],
                )
            self.produced += INPUT_TOP_UP

    def expected_count(self, hot_index: int, committed: int) -> int:
        """1 (the key's changelog record) + its occurrences before offset ``committed``."""
        return 1 + committed // HOT_KEYS + (hot_index < committed % HOT_KEYS)


@dataclass(frozen=True, slots=True)
class Restart:
    kind: str  # "crash" (the first run, not measured), "rc" or "wipe"
    from_instance_start: float
    from_spawn: float
    restored: int  # changelog records restored
    restore_seconds: float
    changelog_records: int  # the changelog's size at restart

    @property
    def restore_rate(self) -> float:
        return self.restored / self.restore_seconds if self.restore_seconds > 0 else 0.0


def run_worker(
    kind: str, log_path: Path, state_dir: Path, application_id: str, rng: random.Random
) -> Restart:
    """Start a worker, wait for its first record and its first commit, then SIGKILL it."""
    spawned = time.monotonic()
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), str(log_path), str(state_dir), application_id],
        stdout=subprocess.PIPE,
        text=True,
    )
    first: dict[str, Any] | None = None
    try:
        assert worker.stdout is not None
        for line in worker.stdout:
            event = json.loads(line)
            if event["event"] == "first":
                first = event
            elif first is not None:  # its first commit: kill it somewhere in the next cycle
                time.sleep(rng.uniform(0, COMMIT_INTERVAL_MS / 1000))
                break
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
    if first is None:
        raise RuntimeError(f"worker {application_id} ({kind}) ended before processing a record")
    restores = first["restores"]
    return Restart(
        kind=kind,
        from_instance_start=first["first_record"] - first["instance_started"],
        from_spawn=first["first_record"] - spawned,
        restored=sum(r["records"] for r in restores),
        restore_seconds=sum(r["seconds"] for r in restores),
        changelog_records=max((r["end_offset"] for r in restores), default=0),
    )


@dataclass(frozen=True, slots=True)
class RestartCase:
    label: str
    size: int
    application_id: str
    state_dir: Path
    changelog: TopicPartition
    initial_restore: RestoreResult | None = None
    restarts: tuple[Restart, ...] = ()

    def of(self, kind: str) -> list[Restart]:
        return [r for r in self.restarts if r.kind == kind]

    def median(self, kind: str, field: str) -> float:
        return statistics.median(getattr(r, field) for r in self.of(kind))


def prepare(case: RestartCase, log: SqliteLog) -> RestoreResult:
    """Produce the changelog and restore it into the store once, as a real store gets there."""
    log.create_topic(case.changelog.topic, 1, compacted=True)
    one = LONG.serialize(1)
    for start in range(0, case.size, PRODUCE_BATCH):
        end = min(start + PRODUCE_BATCH, case.size)
        log.produce(case.changelog, [Record(state_key(i), one, 0) for i in range(start, end)])
    options = RocksDBStoreOptions.from_config(config(case.state_dir, case.application_id))
    with RocksDBStore(STORE, case.state_dir / "0_0" / STORE, options) as store:
        return restore(store, log, case.changelog)


def restart_case(
    label: str, size: int, log: SqliteLog, keys: KeysInput, directory: Path
) -> RestartCase:
    application_id = f"bench-restart-{label}"
    case = RestartCase(
        label,
        size,
        application_id,
        directory / f"state-{label}",
        TopicPartition(f"{application_id}-{STORE}-changelog", 0),
    )
    initial = prepare(case, log)
    log_path = Path(log.path)
    rng = random.Random(f"{SEED}-{label}")
    keys.ensure_ahead_of(application_id)
    restarts = [run_worker("crash", log_path, case.state_dir, application_id, rng)]
    for _ in range(RESTARTS):
        for kind in RESTART_KINDS:
            keys.ensure_ahead_of(application_id)
            if kind == "wipe":
                shutil.rmtree(case.state_dir / "0_0")
            restarts.append(run_worker(kind, log_path, case.state_dir, application_id, rng))
    case = dataclasses.replace(case, initial_restore=initial, restarts=tuple(restarts))
    check_counts(case, log, keys)
    return case


def check_counts(case: RestartCase, log: SqliteLog, keys: KeysInput) -> None:
    """After the last kill, every count is what exactly-once processing gives."""
    committed = keys.committed(case.application_id)
    with RocksDBStore(STORE, case.state_dir / "0_0" / STORE) as store:
        restore(store, log, case.changelog)  # the last killed commit's tail, if any
        for index, key in enumerate(keys.hot):
            found = store.get(key)
            count = None if found is None else LONG.deserialize(found)
            expected = keys.expected_count(index, committed)
            if count != expected:
                problem(f"restart {case.label}: {key!r} counts {count}, expected {expected}")
                break
        hot = set(keys.hot)
        for index in range(1, case.size, case.size // 997):
            key = state_key(index)
            found = store.get(key)
            if key not in hot and (found is None or LONG.deserialize(found) != 1):
                problem(f"restart {case.label}: {key!r} reads {found!r}, expected a count of 1")
                break


# -- reporting ---------------------------------------------------------------------------


def machine() -> str:
    cpus = len(os.sched_getaffinity(0))
    return (
        f"machine: nproc={cpus}, {platform.machine()}, Linux {platform.release()}; "
        f"python {platform.python_version()} ({platform.python_implementation()}); "
        f"rocksdict {importlib.metadata.version('rocksdict')}, "
        f"eddyline {importlib.metadata.version('eddyline')} at {source_revision()}; "
        f"temp dir {tempfile.gettempdir()}"
    )


def source_revision() -> str:
    """The checkout measured: its commit, and whether it had local changes."""
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "an unknown revision"
    return described.stdout.strip()


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def met(name: str, value: float) -> str:
    comparison, threshold = TARGETS[name]
    ok = {"<": value < threshold, "<=": value <= threshold, ">=": value >= threshold}[comparison]
    return f"{comparison} {threshold:,g}  {'met' if ok else 'NOT met'}"


def measure_throughput() -> dict[str, float]:
    print(
        f"throughput: word count over {LINES:,} lines in {INPUT_PARTITIONS} partitions, one "
        f"stream thread; median of {THROUGHPUT_RUNS} interleaved runs",
        flush=True,
    )
    texts = generate_lines(LINES)
    expected = Counter(word for text in texts for word in text.lower().split())
    words = sum(expected.values())
    cases = dict(THROUGHPUT_CASES)
    if not BYTEWAX_PYTHON.exists():
        print(f"(no {BYTEWAX_PYTHON}: bytewax skipped; `make bench-runtime` creates it)")
        del cases["bytewax_recovery"]
    runs: dict[str, list[ThroughputRun]] = {case: [] for case in cases}
    with fresh_directory("lines") as directory:
        lines_file = directory / "lines.txt"
        lines_file.write_text("".join(f"{text}\n" for text in texts))
        for _ in range(THROUGHPUT_RUNS):
            for case in cases:
                if case.startswith("bytewax"):
                    runs[case].append(bytewax_run(case, lines_file, expected))
                else:
                    runs[case].append(wordcount_run(case, texts, expected))
    print()
    print(
        f"{'case':<18}{'guarantee':<18}{'commit ms':>10}{'lines/s':>10}{'records/s':>11}"
        f"{'words/s':>10}{'CPU s/M words':>15}{'commits':>9}   runs (s)"
    )
    result: dict[str, float] = {}
    for case, (guarantee, interval) in cases.items():
        done = runs[case]
        median_seconds = statistics.median(r.seconds for r in done)
        lines_per_second = round(LINES / median_seconds)
        records_per_second = round(statistics.median(r.processed / r.seconds for r in done))
        words_per_second = round(words / median_seconds)
        cpu_per_m_words = round(statistics.median(r.cpu_seconds for r in done) / words * 1e6, 2)
        commits = round(statistics.median(r.commits for r in done))
        shown_interval = f"{interval}" if interval is not None else "default"
        spread = " / ".join(f"{r.seconds:.2f}" for r in done)
        shown_records = "-" if case.startswith("bytewax") else f"{records_per_second:,}"
        print(
            f"{case:<18}{guarantee:<18}{shown_interval:>10}{lines_per_second:>10,}"
            f"{shown_records:>11}{words_per_second:>10,}{cpu_per_m_words:>15.2f}{commits:>9}"
            f"   {spread}"
        )
        result[f"{case}_records_per_s"] = lines_per_second
        if not case.startswith("bytewax"):
            result[f"{case}_internal_records_per_s"] = records_per_second
        result[f"{case}_words_per_s"] = words_per_second
        result[f"{case}_cpu_s_per_m_words"] = cpu_per_m_words
    processed = runs["eos"][0].processed
    print(f"(records: {processed:,} per run = {LINES:,} lines + {processed - LINES:,} words)")
    if "bytewax_recovery" in cases:
        speed = result["eos_words_per_s"] / result["bytewax_recovery_words_per_s"]
        cpu = result["eos_cpu_s_per_m_words"] / result["bytewax_recovery_cpu_s_per_m_words"]
        cpu_nocache = (
            result["eos_nocache_cpu_s_per_m_words"] / result["bytewax_recovery_cpu_s_per_m_words"]
        )
        print(
            f"eddyline eos / bytewax with recovery: words/s {speed:.2f}x, CPU per word "
            f"{cpu:.2f}x (cache off: {cpu_nocache:.2f}x)"
        )
        result["eos_vs_bytewax_recovery_words_per_s"] = round(speed, 2)
        result["eos_vs_bytewax_recovery_cpu_per_word"] = round(cpu, 2)
        result["eos_nocache_vs_bytewax_recovery_cpu_per_word"] = round(cpu_nocache, 2)
    return result


def measure_restarts() -> dict[str, RestartCase]:
    sizes = " and ".join(f"{size:,}" for size in CHANGELOG_SIZES.values())
    print(
        f"\nrestart: count store, changelogs of {sizes} records, input over {HOT_KEYS:,} hot "
        f"keys; exactly_once_v2, READ_COMMITTED; SIGKILL after the first commit + "
        f"0-{COMMIT_INTERVAL_MS} ms; median of {RESTARTS} restarts",
        flush=True,
    )
    cases: dict[str, RestartCase] = {}
    with fresh_directory("restart") as directory:
        log = SqliteLog(directory / "log.db")
        try:
            keys = KeysInput.create(log)
            for label, size in CHANGELOG_SIZES.items():
                cases[label] = restart_case(label, size, log, keys, directory)
        finally:
            log.close()
    print()
    print(
        f"{'changelog':<11}{'restart':<9}{'from start (s)':>15}{'from spawn (s)':>15}"
        f"{'restored':>11}{'restore/s':>11}   per run: from start (s), changelog at restart"
    )
    for case in cases.values():
        for kind in RESTART_KINDS:
            restarts = case.of(kind)
            runs = ", ".join(
                f"{r.from_instance_start:.3f} ({r.changelog_records:,})" for r in restarts
            )
            restored = round(case.median(kind, "restored"))
            rate = f"{case.median(kind, 'restore_rate'):,.0f}" if restored else "-"
            print(
                f"{case.size:<11,}{kind:<9}{case.median(kind, 'from_instance_start'):>15.3f}"
                f"{case.median(kind, 'from_spawn'):>15.3f}{restored:>11,}{rate:>11}   {runs}"
            )
        initial = case.initial_restore
        assert initial is not None
        print(
            f"{case.size:<11,}{'setup':<9}{'':>15}{'':>15}{initial.records:>11,}"
            f"{initial.records_per_second:>11,.0f}   the initial restore into an empty store, "
            "in this process"
        )
    tails = [r.restored for case in cases.values() for r in case.of("rc")]
    print(f"(rc restarts restored changelog tails of {', '.join(map(str, tails))} records)")
    return cases


def restart_figures(cases: dict[str, RestartCase]) -> dict[str, float]:
    result: dict[str, float] = {}
    for field, prefix in (
        ("from_instance_start", "restart_first_record_s"),
        ("from_spawn", "restart_process_first_record_s"),
    ):
        for label, case in cases.items():
            for kind in RESTART_KINDS:
                result[f"{prefix}_{label}_{kind}"] = round(case.median(kind, field), 3)
    largest = cases[max(cases, key=lambda label: cases[label].size)]
    result["restore_records_per_s"] = round(largest.median("wipe", "restore_rate"))
    initial = largest.initial_restore
    assert initial is not None
    result["initial_restore_records_per_s"] = round(initial.records_per_second)
    return result


def main() -> None:
    began = time.monotonic()
    print(machine())
    print(f"{load_average()} at the start (other processes compete for {os.cpu_count()} CPUs)")
    result: dict[str, float] = {}
    result.update(measure_throughput())
    result.update(restart_figures(measure_restarts()))
    print()
    print(f"{'target':<36}{'value':>10}   target")
    for name in TARGETS:
        if name not in result:
            continue
        value = result[name]
        shown = f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"
        print(f"{name:<36}{shown:>10}   {met(name, value)}")
    if PROBLEMS:
        print("\ncorrectness problems (the numbers above may not mean what they say):")
        for message in PROBLEMS:
            print(f"  PROBLEM {message}")
    else:
        print(
            "correctness checks (word counts in every throughput case; counts after every "
            "SIGKILL, exactly once): all passed"
        )
    print(f"total {time.monotonic() - began:.0f} s; {load_average()} at the end")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
