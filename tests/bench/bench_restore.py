"""Restore benchmark: batched serial replay vs Spark build + SST ingest, side by side.

A changelog of 2M records over 200k keys in 4 partitions (16-byte keys whose
first byte spreads over 0x00-0xff, 100-byte values, 5% deletes) in the
embedded log. Measured, in one run:

* serial replay: the runtime's ``restore()`` (fetch 10k, one WriteBatch each)
  into 4 fresh stores, one after another: wall and CPU seconds;
* Spark: JVM start-up (``local[N]`` session) on its own; a cold build (the
  first job pays codegen and JIT) and a warm one in the same session; CPU of
  the whole process tree (driver, JVM, Python workers) from /proc;
* ingest of each build's SST files into 4 fresh stores (keys/s end to end:
  checksums, copies, a new database, the ingest, offsets, flushes, the rename;
  and for RocksDB's ingest call alone), and a check that they equal the
  replayed stores key for key, with the same offsets.

From the per-record CPU costs and the fixed cost, it computes the number of
executor cores at which the Spark path overtakes serial replay of **one**
store partition of 100M and 1B records (serial replay is one core per store
partition; restores of different partitions already run in parallel), with
perfect scaling assumed: ``fixed + N * spark_cpu / cores + ingest < N * serial_cpu``.

Then, unless ``--no-k8s``, the same changelog size on the real nodes
(``bench_restore_k8s.py``, needs root): restore Jobs with 1 and 2 executor pods
(``k8s_1_executor_records_per_s``, ``k8s_2_executors_records_per_s``, their fixed
and per-record costs, CPU s per million records) beside ``local_records_per_s``
(the local build, JVM start included, as a Job's wall time includes it) and
``serial_records_per_s``, and ``crossover_records``.

The last line is JSON. Timings are noisy on a shared machine: the load
average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

from eddyline_runtime.log import Record, SqliteLog
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.ingest.sst_restore import ingest_manifest
from eddyline_runtime.restore.replay import restore
from eddyline_runtime.restore.spark.spark_build import build, spark_session
from eddyline_runtime.state import KeyRange, RocksDBStore

TOPIC = "bench-counts-changelog"
PARTITIONS = 4
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant, with their reaped children."""
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry)] = fields
        parents[int(entry)] = int(fields[1])
    total = 0.0
    for pid, fields in stats.items():
        ancestor = pid
        while ancestor not in (0, 1, root) and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor == root:
            # utime, stime, cutime, cstime: fields 14-17 of stat (11-14 after the name).
            total += sum(int(value) for value in fields[11:15]) / _CLOCK_TICKS
    return total


def produce(log: SqliteLog, records: int, keys: int) -> None:
    log.create_topic(TOPIC, PARTITIONS, compacted=True)
    per_partition = records // PARTITIONS
    keys_per_partition = keys // PARTITIONS
    value = b"v" * 100
    chunk = 50_000
    for partition in range(PARTITIONS):
        tp = TopicPartition(TOPIC, partition)
        for first in range(0, per_partition, chunk):
            batch = []
            for i in range(first, min(first + chunk, per_partition)):
                n = (i * 7919) % keys_per_partition  # every key, in scattered order
                key = bytes([(n * 131) % 256]) + struct.pack(">I", partition) + n.to_bytes(11)
                deleted = i % 20 == 19  # 5% deletes
                batch.append(Record(key, None if deleted else value, i))
            log.produce(tp, batch)


def serial_replay(log: SqliteLog, root: Path) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    records = 0
    for partition in range(PARTITIONS):
        with RocksDBStore("counts", root / f"0_{partition}" / "counts") as store:
            records += restore(store, log, TopicPartition(TOPIC, partition)).records
    return time.perf_counter() - wall, time.process_time() - cpu, records


def store_contents(directory: Path, partition: int) -> tuple[list[tuple[bytes, bytes]], int | None]:
    with RocksDBStore("counts", directory) as store:
        contents = list(store.scan(KeyRange.closed(None, None)))
        return contents, store.committed_offset(TopicPartition(TOPIC, partition))


def crossover_cores(
    records: float, serial_us: float, spark_us: float, fixed_s: float, ingest_s_per_record: float
) -> float | None:
    """Cores at which the Spark path beats serial replay of one partition of ``records``."""
    serial_s = records * serial_us / 1e6
    room = serial_s - fixed_s - records * ingest_s_per_record
    if room <= 0:
        return None
    return records * spark_us / 1e6 / room


def main() -> None:  # noqa: PLR0915 - one run, read top to bottom
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--no-k8s",
        dest="k8s",
        action="store_false",
        help="skip the restore Jobs on the real nodes (they need root)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="eddyline-bench-restore-"))
    out: dict[str, object] = {"records": args.records, "partitions": PARTITIONS}
    out["load_avg_start"] = round(os.getloadavg()[0], 2)
    try:
        log = SqliteLog(work / "log.db")
        started = time.perf_counter()
        produce(log, args.records, args.keys)
        print(f"changelog: {args.records:,} records in {time.perf_counter() - started:.1f} s")

        serial_s, serial_cpu, keyed = serial_replay(log, work / "replay")
        out["serial_replay_s"] = round(serial_s, 2)
        out["serial_cpu_s"] = round(serial_cpu, 2)
        out["serial_records_per_s"] = round(keyed / serial_s)
        print(f"serial replay: {serial_s:.2f} s wall, {serial_cpu:.2f} CPU-s")

        me = os.getpid()
        cpu0, wall0 = tree_cpu_seconds(me), time.perf_counter()
        spark = spark_session(args.master)
        out["jvm_start_s"] = round(time.perf_counter() - wall0, 2)
        jvm_cpu = tree_cpu_seconds(me) - cpu0
        out["jvm_start_cpu_s"] = round(jvm_cpu, 2)
        print(f"JVM start: {out['jvm_start_s']} s wall, {jvm_cpu:.1f} CPU-s")

        builds = []
        for label in ("cold", "warm"):
            cpu0, wall0 = tree_cpu_seconds(me), time.perf_counter()
            result = build(
                spark,
                application="bench",
                store="counts",
                changelog_topic=TOPIC,
                partitions=list(range(PARTITIONS)),
                output=work / f"out-{label}",
                log_url=log.url,
            )
            wall = time.perf_counter() - wall0
            cpu = tree_cpu_seconds(me) - cpu0
            builds.append((wall, cpu, result))
            print(f"Spark build ({label}): {wall:.2f} s wall, {cpu:.1f} CPU-s")
        spark.stop()
        (cold_s, cold_cpu, _), (warm_s, warm_cpu, result) = builds
        manifests = result.read()
        out["spark_build_s"] = round(cold_s, 2)
        out["spark_build_warm_s"] = round(warm_s, 2)
        out["spark_cpu_us_per_record"] = round(cold_cpu / args.records * 1e6, 2)
        out["spark_warm_cpu_us_per_record"] = round(warm_cpu / args.records * 1e6, 2)
        out["serial_cpu_us_per_record"] = round(serial_cpu / args.records * 1e6, 2)
        out["keys_before_dedup"] = sum(m.records_read for m in manifests.values())
        out["keys_after_dedup"] = sum(m.keys for m in manifests.values())
        out["sst_files"] = sum(len(m.files) for m in manifests.values())
        out["sst_bytes"] = sum(f.bytes for m in manifests.values() for f in m.files)

        ingest_s, ingest_call_s, ingested_keys, equal = 0.0, 0.0, 0, True
        for partition, path in sorted(result.manifests.items()):
            target = work / "sst" / f"0_{partition}" / "counts"
            tp = TopicPartition(TOPIC, partition)
            ingested = ingest_manifest(
                path,
                application="bench",
                store="counts",
                changelog=tp,
                directory=target,
                log_start=log.beginning_offset(tp),
                log_end=log.end_offset(tp),
            )
            ingest_s += ingested.seconds
            ingest_call_s += ingested.ingest_seconds
            ingested_keys += ingested.keys
            replayed = work / "replay" / f"0_{partition}" / "counts"
            equal = equal and store_contents(target, partition) == store_contents(
                replayed, partition
            )
        log.close()
        out["ingest_s"] = round(ingest_s, 3)
        out["ingest_keys_per_s"] = round(ingested_keys / ingest_s)
        # RocksDB's ingest call alone, without the fixed cost of creating each store.
        out["ingest_call_keys_per_s"] = round(ingested_keys / ingest_call_s)
        out["stores_equal_to_replay"] = equal
        out["spark_to_queryable_s"] = round(out["jvm_start_s"] + cold_s + ingest_s, 2)  # type: ignore[operator]
        out["local_records_per_s"] = round(keyed / (float(out["jvm_start_s"]) + cold_s))  # type: ignore[arg-type]

        serial_us = serial_cpu / args.records * 1e6
        warm_us = warm_cpu / args.records * 1e6
        fixed_s = float(out["jvm_start_s"]) + max(cold_s - warm_s, 0.0)  # type: ignore[arg-type]
        ingest_per_record = ingest_s / args.records
        out["spark_over_serial_cpu_ratio"] = round(cold_cpu / serial_cpu, 2)
        out["spark_warm_over_serial_cpu_ratio"] = round(warm_cpu / serial_cpu, 2)
        out["fixed_cost_s"] = round(fixed_s, 2)
        for label, size in (("100m", 100e6), ("1b", 1e9)):
            cores = crossover_cores(size, serial_us, warm_us, fixed_s, ingest_per_record)
            out[f"crossover_cores_{label}"] = None if cores is None else round(cores, 1)
        out["one_to_two_core_scaling"] = (
            "not measurable here: 2 cores shared with other jobs (see load_avg)"
        )
        if args.k8s:
            sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
            from tests.bench.bench_restore_k8s import run as k8s_run

            out.update(
                k8s_run(
                    work, records=args.records, keys=args.keys, partitions=PARTITIONS,
                    serial_records_per_s=float(out["serial_records_per_s"]),  # type: ignore[arg-type]
                )
            )  # fmt: skip
        out["load_avg_end"] = round(os.getloadavg()[0], 2)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
