"""Joins benchmark: a foreign-key join in eddyline beside Kafka Streams on the same broker.

Run it with ``make bench-joins`` (it compiles ``kstreams/FkJoin.java`` with ``javac`` against
the pinned ``kafka-streams`` jars of ``tools/kafka/pom.xml`` and passes the class directory as
``--classes``). It is a script, not a test: it measures and reports, and never fails on a
number; it does fail when an engine's output is wrong. It starts its own single KRaft broker
(``tests/support/kafka``), or uses ``EDDYLINE_TEST_KAFKA_BOOTSTRAP``.

**The program.** An orders table (key: order id, value ``CUSTOMER_ID|AMOUNT``) joined with a
customers table (key: customer id, value ``NAME|TIER``) by the customer id each order names:
Kafka's foreign-key join (KIP-213; subscriptions to the customers' partitions, responses back
to the orders'), every joined row ``ORDER|CUSTOMER`` to an output topic. Kafka Streams'
``FkJoin.java`` and eddyline's ``bench_joins_eddyline.py``. Both under ``exactly_once_v2``,
one stream thread, the same record cache (10 MiB), commit interval at the exactly-once default
(100 ms); both configurations are printed in the JSON.

**The input**, written before any engine starts: ``--customers`` customers, then ``--orders``
orders (each names a random customer), then every customer once more with a new name: each
rename travels back to every order that names it, so both sides of the join are exercised.
Written with Java's partitioner (murmur2), as a foreign-key join needs: with librdkafka's
default (CRC32) most subscriptions miss their customer (docs/benchmarks.md).
Each engine is a fresh process (fresh application id, state directory and output topic) on
the same input topics; the runs are interleaved, ``--runs`` (3) each, medians reported.

**Measured.** Timed from spawning the process (start-up included) until a ``read_committed``
consumer of the output topic holds the expected final table: every order with its customer's
latest value (a lost, duplicated-and-stale or wrong row never matches; the run fails after
``RUN_TIMEOUT_S``). Joined records per second are the orders (the final table's rows) over
that time; CPU seconds per joined record are the process's (every thread) over the same.
``*_first_row_s`` is when the first joined row was seen: start-up (Kafka Streams creates its
internal topics and rebalances first) is most of a small run. Both engines' final tables are
compared with each other as well (``results_equal``).

The last line printed is one JSON object for tools; ``load_average`` holds the 1-, 5- and
15-minute load averages at the start and the end: the figures mean something only on a quiet
machine (1-minute load below 1 at both).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient

from tests.bench.bench_kafka import (
    CACHE_MAX_BYTES,
    DEFAULT_PARTITIONS,
    ROOT,
    cpu_seconds,
    create_topics,
    stop,
    while_running,
)
from tests.support.kafka.broker import KafkaCluster, environment_bootstrap, kafka_libs

TIERS: Final = ("bronze", "silver", "gold")


# -- input and output ---------------------------------------------------------------------


class Input:
    """The generated tables: each written in full, then the customers renamed once."""

    def __init__(self, orders: int, customers: int, seed: int = 33) -> None:
        rng = random.Random(seed)
        self.customers = {f"c{i:07d}": f"name{i}|{TIERS[i % len(TIERS)]}" for i in range(customers)}
        self.orders = {
            f"o{i:08d}": f"c{rng.randrange(customers):07d}|{rng.randrange(1, 100_000) / 100}"
            for i in range(orders)
        }
        self.renamed = {key: f"renamed-{value}" for key, value in self.customers.items()}

    def expected(self) -> dict[str, str]:
        """The joined table at the end: each order with its customer's latest value."""
        return {
            key: f"{order}|{self.renamed[order[: order.index('|')]]}"
            for key, order in self.orders.items()
        }


def produce(bootstrap: str, topic: str, rows: dict[str, str]) -> None:
    # Java's partitioner (murmur2 of the key), not librdkafka's default (CRC32): the foreign-key
    # join sends each subscription to the customers' partition murmur2 names, so a customer
    # written anywhere else is never found there (with CRC32 a quarter of the orders joined).
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "partitioner": "murmur2_random",
        }
    )
    for key, value in rows.items():
        while True:
            try:
                producer.produce(topic, value.encode(), key.encode())
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError(f"could not write {len(rows)} records to {topic} within 60 s")


class TableWatcher:
    """A ``read_committed`` consumer of an output topic, keeping each key's latest value."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.latest: dict[str, str] = {}
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-watch-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self._consumer.assign([KafkaPartition(topic, p, 0) for p in range(DEFAULT_PARTITIONS)])

    def poll(self, seconds: float = 0.05) -> None:
        for message in self._consumer.consume(100_000, seconds):
            key, value = message.key(), message.value()
            if message.error() is not None or key is None:
                continue  # both engines write every joined row keyed by its order
            if value is None:
                self.latest.pop(key.decode(), None)
            else:
                self.latest[key.decode()] = value.decode()

    def close(self) -> None:
        self._consumer.close()


# -- the engines ------------------------------------------------------------------------


class Engine:
    """How to start one engine's foreign-key join on the broker."""

    def __init__(self, name: str, bootstrap: str, workdir: Path, classes: Path) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.classes = classes

    @property
    def is_eddyline(self) -> bool:
        return self.name == "eddyline"

    def config(self, application_id: str, state_dir: Path) -> dict[str, Any]:
        config: dict[str, Any] = {
            "application.id": application_id,
            "state.dir": str(state_dir),
            "processing.guarantee": "exactly_once_v2",
            "num.stream.threads": 1,
            "statestore.cache.max.bytes": CACHE_MAX_BYTES,
        }
        if not self.is_eddyline:
            config["bootstrap.servers"] = self.bootstrap
        return config

    def spawn(self, config: dict[str, Any], topics: list[str], tag: str) -> subprocess.Popen[bytes]:
        conf = self.workdir / f"{tag}.conf"
        out = (self.workdir / f"{tag}.log").open("ab")
        if self.is_eddyline:
            conf.write_text(json.dumps({"bootstrap": self.bootstrap, "config": config}))
            command = [sys.executable, "-m", "tests.bench.bench_joins_eddyline"]
        else:
            conf.write_text("".join(f"{key}={value}\n" for key, value in config.items()))
            log4j = self.workdir / "log4j2.properties"
            log4j.write_text(
                "status = warn\nappender.console.type = Console\nappender.console.name = out\n"
                "appender.console.layout.type = PatternLayout\n"
                "appender.console.layout.pattern = [%d] %p %m (%c)%n\n"
                "rootLogger.level = WARN\nrootLogger.appenderRef.out.ref = out\n"
            )
            command = [
                "java",
                "-Xmx1g",
                f"-Dlog4j2.configurationFile={log4j}",
                "-cp",
                f"{kafka_libs()}/*:{self.classes}",
                "FkJoin",
            ]
        with out:
            return subprocess.Popen(
                [*command, str(conf), *topics],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )


def run_once(
    engine: Engine,
    admin: AdminClient,
    inputs: tuple[str, str],
    expected: dict[str, str],
    run: int,
) -> tuple[dict[str, float], dict[str, str]]:
    """One timed run: its figures and the output table it produced."""
    tag = f"{engine.name}-fk-{run}"
    app = f"{tag}-{uuid.uuid4().hex[:6]}"
    output = f"{app}-out"
    create_topics(admin, DEFAULT_PARTITIONS, output)
    watcher = TableWatcher(engine.bootstrap, output)
    log = engine.workdir / f"{tag}.log"
    started = time.monotonic()
    process = engine.spawn(
        engine.config(app, engine.workdir / "state" / app), [*inputs, output], tag
    )
    try:
        first_row: list[float] = []

        def done() -> bool:
            watcher.poll()
            if watcher.latest and not first_row:
                first_row.append(time.monotonic() - started)
            return watcher.latest == expected

        while_running(done, f"{engine.name} foreign-key join run {run}", process, log)
        elapsed = time.monotonic() - started
        cpu = cpu_seconds(process.pid)
    finally:
        stop(process)
        watcher.close()
    rows = len(expected)
    figures = {
        "records_per_s": rows / elapsed,
        "cpu_s_per_record": cpu / rows,
        "seconds": elapsed,
        # Start-up and the first joins: Kafka Streams creates its internal topics and rebalances
        # before it processes a record, so this part is a large share of a small run.
        "first_row_s": first_row[0],
        "cpu_s": cpu,
    }
    print(
        f"{engine.name} run {run}: {rows:,} joined rows in {elapsed:.2f} s "
        f"(first after {first_row[0]:.2f} s; {figures['records_per_s']:,.0f} records/s, "
        f"{cpu:.1f} CPU s, "
        f"{figures['cpu_s_per_record'] * 1e6:.0f} CPU µs per record)",
        flush=True,
    )
    return figures, dict(watcher.latest)


# -- main -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--classes",
        type=Path,
        required=True,
        help="directory of the compiled FkJoin.class (make bench-joins)",
    )
    parser.add_argument("--orders", type=int, default=50_000)
    parser.add_argument("--customers", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.orders < 1 or args.customers < 1 or args.runs < 1:
        parser.error("--orders, --customers and --runs must each be at least 1")
    load = {"start": [round(x, 2) for x in os.getloadavg()]}
    print(f"load average at the start: {load['start']}", flush=True)
    libs = kafka_libs()
    data = Input(args.orders, args.customers)
    expected = data.expected()
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-joins-")))
        bootstrap = environment_bootstrap()
        if bootstrap is None:
            cluster = stack.enter_context(KafkaCluster(workdir / "kafka", 1, libs))
            bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        suffix = uuid.uuid4().hex[:6]
        inputs = (f"bench-orders-{suffix}", f"bench-customers-{suffix}")
        create_topics(admin, DEFAULT_PARTITIONS, *inputs)
        produce(bootstrap, inputs[1], data.customers)
        produce(bootstrap, inputs[0], data.orders)
        produce(bootstrap, inputs[1], data.renamed)
        print(
            f"input: {args.orders:,} orders, {args.customers:,} customers written twice, "
            f"{DEFAULT_PARTITIONS} partitions; broker {bootstrap}, Kafka {libs.parent.name}",
            flush=True,
        )
        engines = {
            name: Engine(name, bootstrap, workdir, args.classes)
            for name in ("kstreams", "eddyline")
        }
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
        tables: dict[str, dict[str, str]] = {}
        for run in range(args.runs):
            for name, engine in engines.items():  # interleaved
                figures, tables[name] = run_once(engine, admin, inputs, expected, run)
                runs[name].append(figures)
        configs = {
            name: engine.config("<application.id>", Path("<state.dir>"))
            for name, engine in engines.items()
        }
    load["end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at the end: {load['end']}", flush=True)
    result: dict[str, Any] = {
        "kafka_version": libs.parent.name,
        "orders": args.orders,
        "customers": args.customers,
        "runs": args.runs,
    }
    for name, measured in runs.items():
        result[f"{name}_fk_join_records_per_s"] = round(
            statistics.median(r["records_per_s"] for r in measured)
        )
        result[f"{name}_cpu_s_per_record"] = statistics.median(
            r["cpu_s_per_record"] for r in measured
        )
        result[f"{name}_first_row_s"] = round(
            statistics.median(r["first_row_s"] for r in measured), 2
        )
        result[f"{name}_seconds"] = [round(r["seconds"], 2) for r in measured]
    result["eddyline_vs_kstreams_records_per_s"] = round(
        result["eddyline_fk_join_records_per_s"] / result["kstreams_fk_join_records_per_s"], 2
    )
    # Each run already matched the expected table; this compares the engines directly.
    result["results_equal"] = tables["eddyline"] == tables["kstreams"]
    result["kstreams_config"] = configs["kstreams"]
    result["eddyline_config"] = configs["eddyline"]
    result["load_average"] = load
    met = result["eddyline_vs_kstreams_records_per_s"] >= 0.5
    verdict = "met" if met else "NOT met"
    print(f"target: eddyline foreign-key join records/s >= 0.5x kstreams: {verdict}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
