"""Kafka benchmark: eddyline beside Kafka Streams, the same word count on the same broker.

Run it with ``make bench-kafka`` (it compiles ``kstreams/WordCount.java`` with ``javac``
against the pinned ``kafka-streams`` jars of ``tools/kafka/pom.xml`` and passes the class
directory as ``--classes``). It is a script, not a test: it measures and reports, and never
fails on a number. It starts its own single KRaft broker (``tests/support/kafka``), or uses
``EDDYLINE_TEST_KAFKA_BOOTSTRAP``.

**The program.** Lines split into lower-case words, ``groupBy`` word through a repartition
topic, ``count`` into a RocksDB store, every new count to an output topic: Kafka Streams'
``WordCount.java`` and eddyline's ``bench_kafka_eddyline.py`` (``examples/wordcount``'s
topology). Both under ``exactly_once_v2``, one stream thread, the same record cache
(``statestore.cache.max.bytes`` 10 MiB, eddyline's default and Kafka Streams'), commit
interval left at the exactly-once default (100 ms). Kafka Streams runs as a user tuned for
fast restarts would: static membership (``group.instance.id``), so a restarted instance takes
its tasks back without a rebalance. Both configurations are printed in the JSON.

**Throughput.** ``--words`` words (default 1,000,000, the issue's size) in lines of
``WORDS_PER_LINE``, over ``--partitions`` input partitions (4), Zipf-like over ``VOCABULARY``
words, each engine with ``--threads`` stream threads (1): ``--partitions 8 --threads 2`` shows
where tasks outnumber threads. Each engine is a fresh process (fresh application id, state
directory and output topic) on the same input topic; the runs are interleaved, ``--runs`` (3)
each, medians reported. Timed from spawning the process (start-up included) until a
``read_committed`` consumer of the output topic has seen every word's final count; CPU seconds
are the process's (every thread: ``/proc/<pid>/stat``) at that moment. The final counts are
checked against the generated text: a lost or duplicated word would never match (the run
fails).

**Restart after SIGKILL.** A store of ``--keys`` (1,000,000) keys: each engine first counts
an input of that many distinct words (its own topic), then a feeder keeps writing lines of
``HOT_KEYS`` words. At a random instant 0.5-1 s later the process is SIGKILLed, the feeder
stops, a probe line with a new word is written and the process is started again on the same
state directory. Timed: from the kill to the probe word's count seen by a ``read_committed``
consumer (process start, rejoining, any restore and the first commit included). ``--restarts``
(3) kills each, median reported, for eddyline, Kafka Streams and Kafka Streams with
``enable.transactional.statestores`` (KIP-892; null when the pinned release's
``StreamsConfig`` lacks it). Under exactly-once, Kafka Streams without transactional stores
wipes a store after an unclean shutdown and restores its whole changelog; eddyline's stores
are transactional under exactly-once and restore the changelog's tail after their last commit.

**Commit modes.** ``--commit-mode`` (default ``concurrent,pipelined``; ``serial`` too)
lists eddyline's ``commit.mode`` values to measure, each in its own interleaved throughput
runs: the first is ``eddyline`` (its keys are the issue's, and the restarts use it), each
other one ``eddyline_<mode>``. Each eddyline run also reports its commits (``COMMITS`` at a
clean close): ``commit_p50_ms`` and ``commit_p99_ms`` over every commit of the run, and
``transactions_per_s_per_thread``, each thread's task transactions over the span from its
first commit to its last, averaged over the threads.

**Start modes.** ``--start-mode`` (default ``concurrent``) lists how eddyline's restarts start
a thread's tasks' transactional producers: ``concurrent`` (``KafkaLog.transactional_producers``,
every ``init_transactions`` in flight together) or ``serial`` (one after another, as before
issue 32). Each mode has its own store and kills; the first is ``eddyline_restart_s``, the
other ``eddyline_serial_starts_restart_s`` (or ``eddyline_concurrent_starts_restart_s``).

The last line printed is one JSON object for tools; the targets are printed for information.
``load_average`` holds the 1-, 5- and 15-minute load averages at the start and the end: the
figures mean something only on a quiet machine (1-minute load below 1 at both).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pstats
import random
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.bench.bench_kafka_eddyline import PROFILE_CLOCK_ENV, PROFILE_CLOCKS, SERIAL_STARTS_ENV
from tests.support.kafka.broker import KafkaCluster, environment_bootstrap, kafka_libs
from tests.support.waiting import wait_for

ROOT: Final = Path(__file__).resolve().parents[2]
DEFAULT_PARTITIONS: Final = 4
WORDS_PER_LINE: Final = 8
VOCABULARY: Final = 10_000
HOT_KEYS: Final = 64
CACHE_MAX_BYTES: Final = 10 * 1024 * 1024
RUN_TIMEOUT_S: Final = 900.0
TICKS: Final = os.sysconf("SC_CLK_TCK")


# -- input and output ---------------------------------------------------------------------


def text(words: int, seed: int = 21) -> list[str]:
    """``words`` words in lines of ``WORDS_PER_LINE``, Zipf-like over ``VOCABULARY``."""
    rng = random.Random(seed)
    ranks = [int(VOCABULARY ** rng.random()) for _ in range(words)]
    return [
        " ".join(f"w{rank}" for rank in ranks[start : start + WORDS_PER_LINE])
        for start in range(0, words, WORDS_PER_LINE)
    ]


def create_topics(admin: AdminClient, partitions: int, *names: str) -> None:
    futures = admin.create_topics([NewTopic(name, partitions, 1) for name in names])
    for future in futures.values():
        future.result()


def produce(
    bootstrap: str, topic: str, lines: list[str], partitions: int, partition: int | None = None
) -> None:
    """``lines`` round-robin over ``partitions``, or all to ``partition``."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    for index, line in enumerate(lines):
        target = index % partitions if partition is None else partition
        while True:
            try:
                producer.produce(topic, line.encode(), partition=target)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError(f"could not write {len(lines)} lines to {topic} within 60 s")


class OutputWatcher:
    """A ``read_committed`` consumer of an output topic, keeping each word's latest count."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.latest: dict[str, int] = {}
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-watch-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self._consumer.assign([KafkaPartition(topic, p, 0) for p in range(partitions)])

    def poll(self, seconds: float = 0.05) -> list[str]:
        """Reads what is there; returns the words whose count changed."""
        changed = []
        for message in self._consumer.consume(100_000, seconds):
            if message.error() is not None:
                continue
            word = message.key().decode()
            self.latest[word] = struct.unpack(">q", message.value())[0]
            changed.append(word)
        return changed

    def close(self) -> None:
        self._consumer.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process, all its threads (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


# -- the engines ------------------------------------------------------------------------


class Engine:
    """How to start one engine's word count on the broker."""

    def __init__(
        self,
        name: str,
        bootstrap: str,
        workdir: Path,
        classes: Path | None,
        commit_mode: str | None = None,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        threads: int = 1,
        serial_starts: bool = False,
    ) -> None:
        self.name = name
        self.partitions = partitions  # of every topic a run creates
        self.threads = threads  # num.stream.threads
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.classes = classes
        self.commit_mode = commit_mode  # eddyline's commit.mode; None for Kafka Streams
        # eddyline only: tasks' producers started one after another (--start-mode serial).
        self.serial_starts = serial_starts

    @property
    def is_eddyline(self) -> bool:
        return self.commit_mode is not None

    def config(self, application_id: str, state_dir: Path, tx_stores: bool) -> dict[str, Any]:
        if self.is_eddyline:
            return {
                "application.id": application_id,
                "state.dir": str(state_dir),
                "processing.guarantee": "exactly_once_v2",
                "num.stream.threads": self.threads,
                "statestore.cache.max.bytes": CACHE_MAX_BYTES,
                "commit.mode": self.commit_mode,
            }
        config: dict[str, Any] = {
            "application.id": application_id,
            "bootstrap.servers": self.bootstrap,
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            "num.stream.threads": self.threads,
            "statestore.cache.max.bytes": CACHE_MAX_BYTES,
            # Static membership: a restarted instance takes its tasks back at once.
            "group.instance.id": f"{application_id}-instance-0",
        }
        if tx_stores:
            config["enable.transactional.statestores"] = "true"
        return config

    def spawn(
        self,
        config: dict[str, Any],
        input_topic: str,
        output_topic: str,
        tag: str,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        conf = self.workdir / f"{tag}.conf"
        out = (self.workdir / f"{tag}.log").open("ab")
        if self.is_eddyline:
            conf.write_text(json.dumps({"bootstrap": self.bootstrap, "config": config}))
            command = [sys.executable, "-m", "tests.bench.bench_kafka_eddyline"]
        else:
            assert self.classes is not None
            conf.write_text("".join(f"{key}={value}\n" for key, value in config.items()))
            libs = kafka_libs()
            command = [
                "java",
                "-Xmx1g",
                f"-Dlog4j2.configurationFile={self._log4j()}",
                "-cp",
                f"{libs}/*:{self.classes}",
                "WordCount",
            ]
        with out:
            return subprocess.Popen(
                [*command, str(conf), input_topic, output_topic],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self._env(), **(env or {})},
            )

    def _env(self) -> dict[str, str]:
        return {SERIAL_STARTS_ENV: "1"} if self.serial_starts else {}

    def _log4j(self) -> Path:
        path = self.workdir / "log4j2.properties"
        if not path.exists():
            path.write_text(
                "status = warn\nappender.console.type = Console\nappender.console.name = out\n"
                "appender.console.layout.type = PatternLayout\n"
                "appender.console.layout.pattern = [%d] %p %m (%c)%n\n"
                "rootLogger.level = WARN\nrootLogger.appenderRef.out.ref = out\n"
            )
        return path


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def while_running(
    condition: Callable[[], bool], what: str, process: subprocess.Popen[bytes], log: Path
) -> None:
    """``wait_for(condition)``, failing at once with the log's tail if the process exits."""

    def done() -> bool:
        if condition():
            return True
        if process.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            raise RuntimeError(f"{what}: the process exited with {process.returncode}:\n{tail}")
        return False

    # The conditions block in their consumer's poll; no sleep between them.
    wait_for(done, f"{what} (see {log})", RUN_TIMEOUT_S, interval=0)


# -- throughput -------------------------------------------------------------------------


def throughput_run(
    engine: Engine,
    admin: AdminClient,
    input_topic: str,
    expected: Counter[str],
    run: int,
    *,
    env: dict[str, str] | None = None,
) -> dict[str, float]:
    tag = f"{engine.name}-tp-{run}"
    app = f"{tag}-{uuid.uuid4().hex[:6]}"
    output = f"{app}-out"
    create_topics(admin, engine.partitions, output)
    watcher = OutputWatcher(engine.bootstrap, output, engine.partitions)
    want = dict(expected)
    words = sum(expected.values())
    config = engine.config(app, engine.workdir / "state" / app, tx_stores=False)
    started = time.monotonic()
    process = engine.spawn(config, input_topic, output, tag, env)
    log = engine.workdir / f"{tag}.log"
    cpu = 0.0
    running: list[tuple[float, float]] = []  # (instant, CPU s) when it printed RUNNING
    try:

        def done() -> bool:
            watcher.poll()
            if not running and "RUNNING" in log.read_text(errors="replace"):
                running.append((time.monotonic(), cpu_seconds(process.pid)))
            return watcher.latest == want

        while_running(
            done, f"{engine.name} throughput run {run}", process, engine.workdir / f"{tag}.log"
        )
        elapsed = time.monotonic() - started
        cpu = cpu_seconds(process.pid)
    finally:
        stop(process)
        watcher.close()
    # RUNNING is seen within a poll (50 ms) of being printed; a run that ends first has no
    # "after start" figures beyond the whole run's.
    running_at, running_cpu = running[0] if running else (started, 0.0)
    result = {
        "words_per_s": words / elapsed,
        "cpu_s_per_m_words": cpu / (words / 1e6),
        "seconds": elapsed,
        "start_s": running_at - started,
        "running_words_per_s": words / (started + elapsed - running_at),
        "running_cpu_s_per_m_words": (cpu - running_cpu) / (words / 1e6),
    }
    if engine.is_eddyline:
        result.update(commit_figures(log))
    print(
        f"{engine.name} run {run}: {words:,} words in {elapsed:.2f} s "
        f"({result['words_per_s']:,.0f} words/s, {cpu:.1f} CPU s; RUNNING after "
        f"{result['start_s']:.2f} s, {cpu - running_cpu:.1f} CPU s after it)"
        + (
            f"; commits p50 {result['commit_p50_ms']:.1f} ms, p99 {result['commit_p99_ms']:.1f} "
            f"ms, {result['transactions_per_s_per_thread']:.1f} transactions/s per thread"
            if "commit_p50_ms" in result
            else ""
        ),
        flush=True,
    )
    return result


def commit_figures(log: Path) -> dict[str, float]:
    """Commit latency percentiles and task transactions per second per thread, from the
    ``COMMITS`` line eddyline printed at its clean close (none if it printed none)."""
    lines = [
        line for line in log.read_text(errors="replace").splitlines() if line.startswith("COMMITS ")
    ]
    if not lines:
        return {}
    threads: dict[str, list[list[float]]] = json.loads(lines[-1].removeprefix("COMMITS "))
    seconds = sorted(c[1] for commits in threads.values() for c in commits)
    if not seconds:
        return {}
    rates = [
        sum(c[2] for c in commits) / (commits[-1][0] - commits[0][0])
        for commits in threads.values()
        if len(commits) > 1 and commits[-1][0] > commits[0][0]
    ]
    return {
        "commit_p50_ms": percentile(seconds, 0.50) * 1000,
        "commit_p99_ms": percentile(seconds, 0.99) * 1000,
        "transactions_per_s_per_thread": statistics.fmean(rates) if rates else 0.0,
    }


def percentile(ordered: list[float], share: float) -> float:
    """The nearest-rank percentile of ascending values."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


# -- restart ----------------------------------------------------------------------------


class Feeder:
    """Writes lines of hot words into the input until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self._topic = topic
        self._partitions = partitions
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng = random.Random(7)
        index = 0
        while not self._stop.wait(0.005):
            line = " ".join(f"hot{rng.randrange(HOT_KEYS)}" for _ in range(WORDS_PER_LINE))
            self._producer.produce(self._topic, line.encode(), partition=index % self._partitions)
            self._producer.poll(0)
            index += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.flush(30)


def restart_runs(
    engine: Engine, admin: AdminClient, keys: int, restarts: int, tx_stores: bool
) -> list[float]:
    label = f"{engine.name}{'-tx' if tx_stores else ''}"
    app = f"{label}-rs-{uuid.uuid4().hex[:6]}"
    input_topic, output = f"{app}-in", f"{app}-out"
    create_topics(admin, engine.partitions, input_topic, output)
    keyset = [f"k{i:07d}" for i in range(keys)]
    produce(
        engine.bootstrap,
        input_topic,
        [" ".join(keyset[i : i + WORDS_PER_LINE]) for i in range(0, keys, WORDS_PER_LINE)],
        engine.partitions,
    )
    config = engine.config(app, engine.workdir / "state" / app, tx_stores=tx_stores)
    watcher = OutputWatcher(engine.bootstrap, output, engine.partitions)
    log = engine.workdir / f"{label}-rs.log"
    process = engine.spawn(config, input_topic, output, f"{label}-rs")
    started = time.monotonic()
    seconds: list[float] = []
    rng = random.Random(11)
    try:
        while_running(
            lambda: watcher.poll() is not None and len(watcher.latest) >= keys,
            f"{label}: filling the store with {keys:,} keys",
            process,
            log,
        )
        print(
            f"{label}: store of {keys:,} keys filled in {time.monotonic() - started:.1f} s",
            flush=True,
        )
        for restart in range(restarts):
            feeder = Feeder(engine.bootstrap, input_topic, engine.partitions)
            time.sleep(0.5 + rng.random() * 0.5)
            process.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            process.wait()
            feeder.stop()
            probe = f"probe{restart}{uuid.uuid4().hex[:6]}"
            produce(
                engine.bootstrap,
                input_topic,
                [probe],
                engine.partitions,
                partition=restart % engine.partitions,
            )
            process = engine.spawn(config, input_topic, output, f"{label}-rs")
            while_running(
                lambda probe=probe: probe in watcher.poll(0.01) or probe in watcher.latest,
                f"{label}: restart {restart}",
                process,
                log,
            )
            seconds.append(time.monotonic() - killed)
            print(f"{label}: SIGKILL -> probe counted {seconds[-1]:.2f} s", flush=True)
    finally:
        stop(process)
        watcher.close()
    return seconds


def has_transactional_stores(libs: Path) -> bool:
    """Whether the pinned ``StreamsConfig`` knows ``enable.transactional.statestores``."""
    jar = next(libs.glob("kafka-streams-[0-9]*.jar"))
    with zipfile.ZipFile(jar) as archive:
        return b"enable.transactional.statestores" in archive.read(
            "org/apache/kafka/streams/StreamsConfig.class"
        )


# -- main -------------------------------------------------------------------------------

COMMIT_MODES: Final = ("pipelined", "concurrent", "serial")
START_MODES: Final = ("concurrent", "serial")


def mode_list(option: str, accepted: tuple[str, ...]) -> Callable[[str], list[str]]:
    """``--commit-mode``, ``--start-mode``: modes, comma-separated, each once."""

    def parse(value: str) -> list[str]:
        modes = [mode.strip() for mode in value.split(",") if mode.strip()]
        unknown = [mode for mode in modes if mode not in accepted]
        if not modes or unknown or len(set(modes)) != len(modes):
            raise argparse.ArgumentTypeError(
                f"{option} {value!r}: give one or more of {', '.join(accepted)}, "
                "comma-separated, each once (the first is reported as 'eddyline')"
            )
        return modes

    return parse


def median(values: list[float], digits: int = 2) -> float | None:
    """None for no values (``--restarts 0`` skips the restarts)."""
    return round(statistics.median(values), digits) if values else None


def report(
    args: argparse.Namespace,
    libs: Path,
    runs: dict[str, list[dict[str, float]]],
    restart: dict[str, list[float]],
    configs: dict[str, dict[str, Any]],
    *,
    load: dict[str, list[float]],
) -> dict[str, Any]:
    """The JSON line's figures: medians of the runs and restarts."""
    result: dict[str, Any] = {
        "kafka_version": libs.parent.name,
        "words": args.words,
        "keys": args.keys,
        "partitions": args.partitions,
        "threads": args.threads,
    }
    for name, measured in runs.items():
        result[f"{name}_eos_words_per_s"] = round(
            statistics.median(r["words_per_s"] for r in measured)
        )
        result[f"{name}_cpu_s_per_m_words"] = median([r["cpu_s_per_m_words"] for r in measured])
        # The same from the RUNNING line on: without the JVM's or interpreter's start-up.
        result[f"{name}_start_s"] = median([r["start_s"] for r in measured])
        result[f"{name}_running_words_per_s"] = round(
            statistics.median(r["running_words_per_s"] for r in measured)
        )
        result[f"{name}_running_cpu_s_per_m_words"] = median(
            [r["running_cpu_s_per_m_words"] for r in measured]
        )
        for figure in ("commit_p50_ms", "commit_p99_ms", "transactions_per_s_per_thread"):
            values = [r[figure] for r in measured if figure in r]
            if values:
                result[f"{name}_{figure}"] = median(values, 1)
    result["kstreams_restart_s"] = median(restart["kstreams"])
    result["kstreams_tx_stores_restart_s"] = (
        median(restart["kstreams_tx"]) if "kstreams_tx" in restart else None
    )
    result["eddyline_restart_s"] = median(restart["eddyline"])
    for name, kills in restart.items():
        if name.endswith("_starts"):  # --start-mode's other mode
            result[f"{name}_restart_s"] = median(kills)
    result["eddyline_vs_kstreams_words_per_s"] = round(
        result["eddyline_eos_words_per_s"] / result["kstreams_eos_words_per_s"], 2
    )
    result["kstreams_config"] = configs["kstreams"]
    result["eddyline_config"] = configs["eddyline"]
    result["eddyline_commit_modes"] = args.commit_mode
    result["eddyline_start_modes"] = args.start_mode
    result["load_average"] = load
    return result


def check_targets(result: dict[str, Any]) -> dict[str, bool | None]:
    """The issue's targets, for information (None: not measured in this run)."""
    eddyline, plain, tx = (
        result["eddyline_restart_s"],
        result["kstreams_restart_s"],
        result["kstreams_tx_stores_restart_s"],
    )
    return {
        "eddyline restart < kstreams restart (no tx stores)": (
            None if eddyline is None or plain is None else eddyline < plain
        ),
        "eddyline restart <= kstreams restart with tx stores": (
            None if eddyline is None or tx is None else eddyline <= tx
        ),
        "eddyline EOS words/s >= 0.5x kstreams": result["eddyline_vs_kstreams_words_per_s"] >= 0.5,
    }


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--classes",
        type=Path,
        required=True,
        help="directory of the compiled WordCount.class (make bench-kafka)",
    )
    parser.add_argument("--words", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--partitions",
        type=int,
        default=DEFAULT_PARTITIONS,
        help="input (and output) partitions, so tasks per sub-topology",
    )
    parser.add_argument("--threads", type=int, default=1, help="num.stream.threads of both")
    parser.add_argument("--restarts", type=int, default=3, help="0: throughput only")
    parser.add_argument(
        "--commit-mode",
        type=mode_list("--commit-mode", COMMIT_MODES),
        default=["concurrent", "pipelined"],
        help="eddyline's commit.mode values to measure, comma-separated; the first is "
        "'eddyline' in the JSON (default: concurrent,pipelined; serial is measurable too)",
    )
    parser.add_argument(
        "--start-mode",
        type=mode_list("--start-mode", START_MODES),
        default=["concurrent"],
        help="how eddyline's restarts start the tasks' transactional producers, "
        "comma-separated: concurrent (KafkaLog.transactional_producers) or serial (one "
        "init_transactions after another, as before issue 32); the first is "
        "'eddyline_restart_s', another 'eddyline_serial_starts_restart_s' (default: concurrent)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="instead: one eddyline run with its stream thread under cProfile; print the top",
    )
    parser.add_argument(
        "--profile-clock",
        choices=PROFILE_CLOCKS,
        default="wall",
        help="--profile's timer: wall (waits count) or cpu (the stream thread's CPU time)",
    )
    return parser.parse_args()


def main() -> None:
    args = arguments()
    load = {"start": [round(x, 2) for x in os.getloadavg()]}
    print(f"load average at the start: {load['start']}", flush=True)
    libs = kafka_libs()
    tx_supported = has_transactional_stores(libs)
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-kafka-")))
        bootstrap = environment_bootstrap()
        if bootstrap is None:
            cluster = stack.enter_context(KafkaCluster(workdir / "kafka", 1, libs))
            bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        shape = {"partitions": args.partitions, "threads": args.threads}
        engines = {"kstreams": Engine("kstreams", bootstrap, workdir, args.classes, **shape)}
        for i, mode in enumerate(args.commit_mode):
            name = "eddyline" if i == 0 else f"eddyline_{mode}"
            engines[name] = Engine(
                name, bootstrap, workdir, args.classes, commit_mode=mode, **shape
            )
        lines = text(args.words)
        expected = Counter(word for line in lines for word in line.split())
        input_topic = f"bench-lines-{uuid.uuid4().hex[:6]}"
        create_topics(admin, args.partitions, input_topic)
        produce(bootstrap, input_topic, lines, args.partitions)
        print(
            f"input: {args.words:,} words, {len(lines):,} lines, {len(expected):,} distinct, "
            f"{args.partitions} partitions, {args.threads} stream thread(s); "
            f"broker {bootstrap}, Kafka {libs.parent.name}",
            flush=True,
        )

        if args.profile is not None:
            env = {
                "EDDYLINE_BENCH_PROFILE": str(args.profile),
                PROFILE_CLOCK_ENV: args.profile_clock,
            }
            throughput_run(engines["eddyline"], admin, input_topic, expected, 0, env=env)
            stats = pstats.Stats(str(args.profile))
            stats.sort_stats("tottime").print_stats(30)
            stats.sort_stats("cumulative").print_stats(30)
            return

        runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
        for run in range(args.runs):
            for name, engine in engines.items():  # interleaved
                runs[name].append(throughput_run(engine, admin, input_topic, expected, run))

        restart: dict[str, list[float]] = {"kstreams": [], "eddyline": []}
        if args.restarts > 0:  # --restarts 0: throughput only
            restart["kstreams"] = restart_runs(
                engines["kstreams"], admin, args.keys, args.restarts, False
            )
            for i, mode in enumerate(args.start_mode):
                name = "eddyline" if i == 0 else f"eddyline_{mode}_starts"
                engine = Engine(
                    name,
                    bootstrap,
                    workdir,
                    args.classes,
                    commit_mode=args.commit_mode[0],
                    serial_starts=mode == "serial",
                    **shape,
                )
                restart[name] = restart_runs(engine, admin, args.keys, args.restarts, False)
        if tx_supported and args.restarts > 0:
            restart["kstreams_tx"] = restart_runs(
                engines["kstreams"], admin, args.keys, args.restarts, True
            )
        configs = {
            name: engine.config("<application.id>", Path("<state.dir>"), tx_stores=False)
            for name, engine in engines.items()
        }

    load["end"] = [round(x, 2) for x in os.getloadavg()]
    result = report(args, libs, runs, restart, configs, load=load)
    targets = check_targets(result)
    for target, met in targets.items():
        print(f"target: {target}: {'n/a' if met is None else 'met' if met else 'NOT met'}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
