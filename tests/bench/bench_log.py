"""Log benchmark: produce and fetch rates and transaction commit latency, per adapter.

Run it with ``make bench-log`` (or ``.venv/bin/python tests/bench/bench_log.py``).
It is a script, not a test: it measures and reports, and never fails on a number.

Side by side, in one run, through the :class:`~eddyline_runtime.log.Log` port:

* ``sqlite_*``: the embedded log in a temporary directory.
* ``kafka_*``: always. The project's own broker (one KRaft node of the pinned
  release, started here from ``.cache/kafka`` as the tests start it, and stopped
  at the end), or the cluster ``EDDYLINE_TEST_KAFKA_BOOTSTRAP`` names instead
  (``host:port,...``; client settings from the file ``EDDYLINE_LOG_SETTINGS``
  names); fresh topics under a prefix of this run.
* ``kafka_mock_*``: librdkafka's mock cluster in this process, produce and
  fetch only. It shows the client's own cost (no network, no disk); its
  transactions are not Kafka's, so none are timed.

Measured: ``produce_records_per_s`` (``--records`` records of ``--value-bytes``
through ``Log.produce`` in batches of ``--batch``), ``fetch_records_per_s``
(reading them all back with ``Log.fetch``), ``txn_commit_ms_p50``/``p99`` (the
commit of ``--transactions`` transactions, each ``--batch`` records on one
partition plus one input offset: begin and sends are not timed). The last
line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from eddyline_runtime.log import Log, Record, open_log
from eddyline_runtime.partitions import TopicPartition

KAFKA_BOOTSTRAP_ENV = "EDDYLINE_TEST_KAFKA_BOOTSTRAP"
TOPIC = "bench-records"
INPUT = "bench-input"


def measure(
    name: str, log: Log, args: argparse.Namespace, *, transactions: bool, create: bool = True
) -> dict[str, float]:
    if create:
        log.create_topic(TOPIC, 1)
        log.create_topic(INPUT, 1)
    tp, input_tp = TopicPartition(TOPIC, 0), TopicPartition(INPUT, 0)
    value = b"v" * args.value_bytes
    batch = [Record(b"key-%d" % i, value, 1_700_000_000_000 + i) for i in range(args.batch)]
    started = time.perf_counter()
    produced = 0
    while produced < args.records:
        log.produce(tp, batch)
        produced += len(batch)
    produce_s = time.perf_counter() - started

    # From the log start to the end: the mock cluster keeps only the latest records.
    end = log.end_offset(tp)
    started = time.perf_counter()
    position, fetched = log.beginning_offset(tp), 0
    while position < end:
        records = log.fetch(tp, position, 10_000).records
        if not records:
            break
        fetched += len(records)
        position = records[-1].offset + 1
    fetch_s = time.perf_counter() - started
    results = {
        f"{name}_produce_records_per_s": round(produced / produce_s),
        f"{name}_fetch_records_per_s": round(fetched / fetch_s),
    }
    if transactions:
        producer = log.transactional_producer(f"bench-{uuid.uuid4().hex[:8]}-0_0")
        latencies = []
        for n in range(args.transactions):
            producer.begin()
            producer.send_batch(tp, batch)
            producer.send_offsets("bench", {input_tp: n + 1})
            started = time.perf_counter()
            producer.commit()
            latencies.append((time.perf_counter() - started) * 1000)
        producer.close()
        latencies.sort()
        results[f"{name}_txn_commit_ms_p50"] = round(statistics.median(latencies), 3)
        results[f"{name}_txn_commit_ms_p99"] = round(
            latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3
        )
    print(name, results, flush=True)
    return results


def run(opener: Callable[[], Log], *args: object, **kwargs: object) -> dict[str, float]:
    log = opener()
    try:
        return measure(*args, log=log, **kwargs)  # type: ignore[misc,arg-type]
    finally:
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--transactions", type=int, default=200)
    parser.add_argument("--no-mock", action="store_true", help="skip librdkafka's mock cluster")
    args = parser.parse_args()

    results: dict[str, object] = {
        "records": args.records,
        "batch": args.batch,
        "value_bytes": args.value_bytes,
        "transactions": args.transactions,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    with tempfile.TemporaryDirectory(prefix="bench-log-") as directory:
        url = f"sqlite:///{Path(directory) / 'log.db'}"
        results.update(run(lambda: open_log(url), "sqlite", args=args, transactions=True))

    if not args.no_mock:
        from eddyline_runtime.log.kafka import KafkaLog
        from tests.support.kafka.mock_cluster import MockCluster

        cluster = MockCluster()
        try:
            cluster.create_topic(TOPIC)
            cluster.create_topic(INPUT)
            results.update(
                run(
                    lambda: KafkaLog.open(cluster.url, {}),
                    "kafka_mock",
                    args=args,
                    transactions=False,
                    create=False,
                )
            )
        finally:
            cluster.close()

    from eddyline_runtime.log.kafka import KafkaLog
    from eddyline_runtime.log.kafka_settings import settings_from_environment
    from tests.support.kafka.broker import KafkaCluster

    prefix = f"eddyline-bench-{uuid.uuid4().hex[:8]}."
    bootstrap = os.environ.get(KAFKA_BOOTSTRAP_ENV)
    if bootstrap:
        settings = settings_from_environment()
        results["kafka_broker"] = f"{KAFKA_BOOTSTRAP_ENV}={bootstrap}"
        results.update(
            run(
                lambda: KafkaLog.open(f"kafka://{bootstrap}", settings, topic_prefix=prefix),
                "kafka",
                args=args,
                transactions=True,
            )
        )
    else:
        # The project's own broker (one KRaft node, as the tests start it), so the
        # kafka_* figures are always there; tests/support/kafka/ fetches the jars.
        with (
            tempfile.TemporaryDirectory(prefix="bench-log-kafka-") as directory,
            KafkaCluster(Path(directory)) as broker,
        ):
            results["kafka_broker"] = f"project broker, Apache Kafka {broker.version}"
            results["kafka_version"] = broker.version
            results.update(
                run(
                    lambda: KafkaLog.open(f"kafka://{broker.bootstrap}", {}, topic_prefix=prefix),
                    "kafka",
                    args=args,
                    transactions=True,
                )
            )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
