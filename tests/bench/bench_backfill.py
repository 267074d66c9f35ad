"""Backfill benchmark (a first slice): a windowed count's store built from history by
the PySpark backfill vs by replaying the history through a StreamsInstance.

A history of ``--records`` records (default 200,000) over ``--partitions`` partitions
(default 4) of the embedded log; the topology is a windowed count (1 s tumbling
windows, 500 ms grace, emit-final). Measured in one run:

* ``replay_s``: a StreamsInstance (at-least-once, defaults) from offset 0 to the end,
  until caught up and closed: the stores the app's pods would build by a reset;
* ``backfill_s``: ``eddyline backfill build``'s job end to end (plan, Spark session in
  ``local[N]``, every task partition, SSTs and manifests), and ``spark_start_s``, the
  session's start alone, within it;
* ``results_equal``: every task's backfilled SST, ingested as a pod ingests a restore
  build, equals the replayed store byte for byte.

Not measured yet (issue 35): Kafka with exactly_once_v2, 5M records over 8
partitions, a count behind a repartition (the backfill refuses repartitions so far),
time to the new revision processing live input, and the crossover size. The last
line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from eddyline_runtime.backfill import spark_job
from eddyline_runtime.log.sqlite_log import SqliteLog
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.processing.loader import load_topology
from eddyline_runtime.restore.spark.spark_build import spark_session
from tests.integration.backfill.test_task_history import ingested
from tests.support.backfill import reference_replay, store_contents, write_history
from tests.support.topologies.backfill_topologies import INPUT

REFERENCE = "tests.support.topologies.backfill_topologies:windowed_count"
STORE = "window-counts"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    root = str(Path(__file__).resolve().parents[2])
    # Spark's workers import the topology by reference, from this checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    application = "bench-backfill"
    with tempfile.TemporaryDirectory(prefix="bench-backfill-") as work:
        directory = Path(work)
        state_dir = directory / "replay-state"
        topology = load_topology(REFERENCE)
        log = SqliteLog(directory / "log.db")
        try:
            write_history(log, INPUT, args.partitions, args.records)
            started = time.monotonic()
            # As another application: the backfilled app's changelogs start empty, as a
            # new store's do (the backfill writes them); its positions are the replay's.
            config, _ = reference_replay(topology, application, log, state_dir)
            replay_s = time.monotonic() - started
            url = log.url
        finally:
            log.close()
        print(f"replay: {args.records:,} records in {replay_s:.1f} s", file=sys.stderr)
        started = time.monotonic()
        plan = spark_job.fix_plan(
            topology,
            application=application,
            reference=REFERENCE,
            stores=[STORE],
            log_url=url,
            output=directory / "builds",
            build_id="bench",
        )
        spark = spark_session(args.master, app_name=spark_job.APP_NAME)
        spark_start_s = time.monotonic() - started
        try:
            result = spark_job.run_backfill(spark, plan)
        finally:
            spark.stop()
        backfill_s = time.monotonic() - started
        print(f"backfill: {result.records:,} records in {backfill_s:.1f} s", file=sys.stderr)
        equal = result.records == args.records
        for task in result.tasks:
            partition = int(str(task["task"]).split("_")[1])
            manifests = task["manifests"]
            assert isinstance(manifests, dict)
            expected = store_contents(config, state_dir, TaskId(0, partition), STORE)
            got = ingested(manifests[STORE], config, directory / f"ingested-{partition}")
            equal = equal and got == expected
    print(
        json.dumps(
            {
                "history_records": args.records,
                "partitions": args.partitions,
                "log": "sqlite",
                "master": args.master,
                "replay_s": round(replay_s, 2),
                "backfill_s": round(backfill_s, 2),
                "spark_start_s": round(spark_start_s, 2),
                "backfill_speedup": round(replay_s / backfill_s, 3),
                "results_equal": equal,
                "crossover_records": None,
            }
        )
    )
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
