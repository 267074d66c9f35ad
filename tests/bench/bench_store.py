"""Store benchmark: eddyline's RocksDB store against raw rocksdict and Quix Streams.

Run it with ``make bench-store`` (it needs ``.venv-bench``, which also holds
``quixstreams``). It is a script, not a test: it measures and reports, and never
fails on a number.

What is compared, in one process and on one workload (300,000 records of
100-byte values over 50,000 distinct keys in a fixed shuffled order, committed
every 10,000 records; each case in a fresh temporary directory; the median of
three runs):

* ``eddyline_put_commit``: :class:`RocksDBStore` ``put`` per record and
  ``commit({changelog partition: offset of the last record})`` every 10,000.
  Timed: the puts and the commits, including the log syncs the durability
  bound makes a commit run. Not timed: open and close.
* ``raw_put``: rocksdict ``Rdict.put`` per record, write-ahead log off (the
  non-transactional path KIP-892 must not be slower than; the store itself keeps
  its log on). No transactions at all: the floor a store doing per-record
  writes would sit on, and what a transactional buffer must not fall below.
* ``batch_ceiling``: a plain ``dict`` written as one ``WriteBatch`` (WAL off)
  per 10,000 records. This is the store's design with nothing else (no offsets,
  no checks, no log, RocksDB's default 64 MiB memtable): the ceiling for the
  design. The store passes it because it runs an 8 MiB memtable: RocksDB's
  inserts slow down as the memtable grows.
* ``quix_put_commit``: Quix Streams' ``RocksDBStorePartition``, one partition
  transaction per 10,000 records (``set_bytes``, ``prepare``,
  ``flush(changelog_offset)``), without a changelog producer. Like ours, Quix
  keeps its write-ahead log on; each store runs as shipped.
* ``eddyline_get`` / ``quix_get``: 300,000 point reads through an open
  transaction (read-your-writes) on a store holding all 300,000 records
  committed, with 10,000 more buffered (half overwrites, half new keys); the
  reads hit the buffer (~19%) and the database (~81%).
* ``peak_rss``: in a fresh subprocess (``--rss-probe``), how much the process
  grows while the store holds 64 MiB of uncommitted key + value bytes, each
  value its own ``bytes`` object as a real application's serialized values
  are. The ratio to 64 MiB is the price of buffering in Python objects.

The last line printed is one JSON object for tools; the targets are printed
for information only.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from eddyline_runtime.state import (
    DurabilityBound,
    RocksDBStore,
    RocksDBStoreOptions,
    TopicPartition,
)

if TYPE_CHECKING:
    from quixstreams.state.rocksdb import RocksDBStorePartition

NUM_RECORDS: Final = 300_000
NUM_KEYS: Final = 50_000
RECORDS_PER_COMMIT: Final = 10_000
NUM_GETS: Final = NUM_RECORDS  # the get cases read the record key sequence, remixed
VALUE_SIZE: Final = 100
RUNS: Final = 3
SEED: Final = 42
# The open transaction of the get cases: this many overwrites and as many new keys.
TX_OVERWRITES: Final = RECORDS_PER_COMMIT // 2
TX_NEW_KEYS: Final = RECORDS_PER_COMMIT // 2
# Every GET_NEW_KEY_EVERY-th read asks for a key only the open transaction has.
GET_NEW_KEY_EVERY: Final = 10
RSS_PROBE_BYTES: Final = 64 * 1024 * 1024
CHANGELOG: Final = TopicPartition("bench-store-changelog", 0)
STORE_OPTIONS: Final = RocksDBStoreOptions(durability=DurabilityBound())

# name -> (minimum or maximum, threshold); information only, never enforced.
TARGETS: Final[dict[str, tuple[str, float]]] = {
    "put_vs_quix": (">=", 2.5),
    "put_vs_raw": (">=", 1.0),
    "get_vs_quix": (">=", 2.0),
    "peak_rss_growth_ratio": ("<=", 2.0),
}

Chunk = tuple[list[tuple[bytes, bytes]], int]


@dataclass(frozen=True, slots=True)
class Workload:
    """Everything the cases write and read, generated once and outside every timer."""

    keys: list[bytes]  # one per record, in record order
    values: list[bytes]  # one per record, all distinct objects
    chunks: list[Chunk]  # (records, changelog offset of the last one) per commit
    final: dict[bytes, bytes]  # what the store holds once every record is committed
    tx_writes: list[tuple[bytes, bytes]]  # the open transaction of the get cases
    get_keys: list[bytes]  # the keys the get cases read, in order
    expected_gets: dict[bytes, bytes]  # final + tx_writes

    @classmethod
    def generate(cls) -> Workload:
        rng = random.Random(SEED)
        distinct = [b"key-%08d" % i for i in range(NUM_KEYS)]
        keys = distinct * (NUM_RECORDS // NUM_KEYS)
        rng.shuffle(keys)
        values = [rng.randbytes(VALUE_SIZE) for _ in range(NUM_RECORDS)]
        records = list(zip(keys, values, strict=True))
        chunks = [
            (records[start : start + RECORDS_PER_COMMIT], start + RECORDS_PER_COMMIT - 1)
            for start in range(0, NUM_RECORDS, RECORDS_PER_COMMIT)
        ]
        final = dict(records)

        step = NUM_KEYS // TX_OVERWRITES
        overwritten = distinct[::step][:TX_OVERWRITES]
        new_keys = [b"new-%08d" % i for i in range(TX_NEW_KEYS)]
        tx_writes = [(key, rng.randbytes(VALUE_SIZE)) for key in overwritten + new_keys]
        get_keys = [  # the record key sequence, every 10th read swapped for a new key
            new_keys[(i // GET_NEW_KEY_EVERY) % TX_NEW_KEYS] if i % GET_NEW_KEY_EVERY == 0 else key
            for i, key in enumerate(keys)
        ]
        return cls(keys, values, chunks, final, tx_writes, get_keys, {**final, **dict(tx_writes)})

    def buffered_get_fraction(self) -> float:
        buffered = {key for key, _ in self.tx_writes}
        return sum(key in buffered for key in self.get_keys) / len(self.get_keys)

    def sample(self) -> list[tuple[bytes, bytes]]:
        """Some committed entries to check a case really wrote what it was timed on."""
        return list(self.final.items())[::997]


# -- helpers ------------------------------------------------------------------------


@contextmanager
def fresh_directory(case: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"eddyline-bench-{case}-") as directory:
        yield Path(directory)


def timed(body: Callable[[], None]) -> float:
    """Seconds ``body`` takes, after collecting garbage the previous case left behind."""
    gc.collect()
    started = time.perf_counter()
    body()
    return time.perf_counter() - started


# What the correctness checks found; printed before the results, never fatal.
PROBLEMS: list[str] = []


def problem(message: str) -> None:
    if message not in PROBLEMS:
        PROBLEMS.append(message)


def check(
    case: str, read: Callable[[bytes], bytes | None], expected: list[tuple[bytes, bytes]]
) -> None:
    """Flag a case that did not store what it was timed on (a sanity check, not on time)."""
    for key, value in expected:
        found = read(key)
        if found != value:
            problem(f"{case}: {key!r} reads {found!r:.40}, expected {value!r:.40}")
            return


def check_offset(case: str, found: int | None) -> None:
    if found != NUM_RECORDS - 1:
        problem(f"{case}: committed changelog offset reads {found}, expected {NUM_RECORDS - 1}")


def wal_off() -> WriteOptions:
    options = WriteOptions()
    # A property at run time; rocksdict's stub wrongly declares a method.
    options.disable_wal = True  # type: ignore[method-assign,assignment]
    return options


def open_rdict(directory: Path) -> Rdict:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return Rdict(str(directory), options)


def quix_partition_class() -> type[RocksDBStorePartition]:
    # quixstreams' import chain warns about its own dependencies (authlib, which
    # forces its warnings to "always"); recording them is what keeps them quiet.
    with warnings.catch_warnings(record=True):
        from quixstreams.state.rocksdb import RocksDBStorePartition
    return RocksDBStorePartition


def eddyline_load(store: RocksDBStore, chunks: list[Chunk]) -> None:
    put, commit = store.put, store.commit
    for records, offset in chunks:
        for key, value in records:
            put(key, value)
        commit({CHANGELOG: offset})


def quix_load(partition: RocksDBStorePartition, chunks: list[Chunk]) -> None:
    for records, offset in chunks:
        tx = partition.begin()
        set_bytes = tx.set_bytes
        for key, value in records:
            set_bytes(key, value, prefix=b"")
        tx.prepare()
        tx.flush(changelog_offset=offset)


# -- the cases: each returns the seconds of one run ------------------------------------


def eddyline_put_commit(work: Workload) -> float:
    with fresh_directory("eddyline-put") as directory:
        store = RocksDBStore("bench", directory, STORE_OPTIONS)
        try:
            seconds = timed(lambda: eddyline_load(store, work.chunks))
            check("eddyline_put_commit", store.get, work.sample())
            check_offset("eddyline_put_commit", store.committed_offset(CHANGELOG))
        finally:
            store.close()
        # What a restart finds on disk must agree with what the store said in memory.
        with RocksDBStore("bench", directory, STORE_OPTIONS) as reopened:
            check_offset("eddyline_put_commit (reopened)", reopened.committed_offset(CHANGELOG))
            check("eddyline_put_commit (reopened)", reopened.get, work.sample())
    return seconds


def raw_put(work: Workload) -> float:
    with fresh_directory("raw-put") as directory:
        db = open_rdict(directory)
        write_options = wal_off()

        def body() -> None:
            put = db.put
            for records, _ in work.chunks:
                for key, value in records:
                    put(key, value, write_options)

        try:
            seconds = timed(body)
            check("raw_put", db.get, work.sample())
        finally:
            db.close()
    return seconds


def batch_ceiling(work: Workload) -> float:
    with fresh_directory("batch-ceiling") as directory:
        db = open_rdict(directory)
        write_options = wal_off()

        def body() -> None:
            write = db.write
            for records, _ in work.chunks:
                buffer: dict[bytes, bytes] = {}
                for key, value in records:
                    buffer[key] = value
                batch = WriteBatch(raw_mode=True)
                put = batch.put
                for key, value in buffer.items():
                    put(key, value)
                write(batch, write_options)

        try:
            seconds = timed(body)
            check("batch_ceiling", db.get, work.sample())
        finally:
            db.close()
    return seconds


def quix_put_commit(work: Workload) -> float:
    partition_class = quix_partition_class()
    with fresh_directory("quix-put") as directory:
        partition = partition_class(str(directory))
        try:
            seconds = timed(lambda: quix_load(partition, work.chunks))
            check("quix_put_commit", partition.get, work.sample())
            check_offset("quix_put_commit", partition.get_changelog_offset())
        finally:
            partition.close()
    return seconds


def eddyline_get(work: Workload) -> float:
    with fresh_directory("eddyline-get") as directory:
        store = RocksDBStore("bench", directory, STORE_OPTIONS)
        try:
            eddyline_load(store, work.chunks)
            for key, value in work.tx_writes:
                store.put(key, value)

            def body() -> None:
                get = store.get
                for key in work.get_keys:
                    get(key)

            seconds = timed(body)
            check("eddyline_get", store.get, list(work.expected_gets.items())[::97])
        finally:
            store.close()
    return seconds


def quix_get(work: Workload) -> float:
    partition_class = quix_partition_class()
    with fresh_directory("quix-get") as directory:
        partition = partition_class(str(directory))
        try:
            quix_load(partition, work.chunks)
            tx = partition.begin()
            for key, value in work.tx_writes:
                tx.set_bytes(key, value, prefix=b"")

            def body() -> None:
                get_bytes = tx.get_bytes
                for key in work.get_keys:
                    get_bytes(key, prefix=b"")

            seconds = timed(body)
            expected = list(work.expected_gets.items())[::97]
            check("quix_get", lambda key: tx.get_bytes(key, prefix=b""), expected)
        finally:
            partition.close()
    return seconds


# -- peak RSS, in a subprocess -----------------------------------------------------------


def proc_status_bytes() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes."""
    found: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(rest.split()[0]) * 1024  # reported in kB
    return found


def rss_probe() -> None:
    """Grow an uncommitted transaction to 64 MiB and print the process growth as JSON."""
    gc.collect()
    try:
        # Reset the high-water mark to the current RSS, so the import peak cannot count.
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass
    before = proc_status_bytes()
    with fresh_directory("rss-probe") as directory:
        store = RocksDBStore("rss-probe", directory, STORE_OPTIONS)
        put, uncommitted = store.put, store.approximate_num_uncommitted_bytes
        urandom = os.urandom
        entries = 0
        while uncommitted() < RSS_PROBE_BYTES:
            # A distinct value object per entry, created here: the store holds real
            # per-entry memory, as it would for an application's serialized values.
            put(b"rss-%010d" % entries, urandom(VALUE_SIZE))
            entries += 1
        uncommitted_bytes = uncommitted()
        after = proc_status_bytes()
        store.close()
    if PROBLEMS:
        print("\ncorrectness problems (the numbers above may not mean what they say):")
        for message in PROBLEMS:
            print(f"  PROBLEM {message}")
    else:
        print("correctness checks (values read back, committed offsets, reopen): all passed")
    print(
        json.dumps(
            {
                "rss_before": before["VmRSS"],
                "hwm_after": after["VmHWM"],
                "entries": entries,
                "uncommitted_bytes": uncommitted_bytes,
            }
        )
    )


def measure_peak_rss() -> dict[str, int]:
    probe = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--rss-probe"],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, int] = json.loads(probe.stdout.strip().splitlines()[-1])
    return result


# -- reporting ---------------------------------------------------------------------------


def machine() -> str:
    cpus = len(os.sched_getaffinity(0))
    return (
        f"machine: nproc={cpus}, {platform.machine()}, Linux {platform.release()}; "
        f"python {platform.python_version()} ({platform.python_implementation()}); "
        f"rocksdict {importlib.metadata.version('rocksdict')}, "
        f"quixstreams {importlib.metadata.version('quixstreams')}, "
        f"eddyline {importlib.metadata.version('eddyline')}; "
        f"temp dir {tempfile.gettempdir()}"
    )


def met(name: str, value: float) -> str:
    comparison, threshold = TARGETS[name]
    ok = value >= threshold if comparison == ">=" else value <= threshold
    return f"{comparison} {threshold:<4}  {'met' if ok else 'NOT met'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rss-probe", action="store_true", help=argparse.SUPPRESS)
    if parser.parse_args().rss_probe:
        rss_probe()
        return

    print(machine())
    print(
        f"workload: {NUM_RECORDS:,} records of {VALUE_SIZE}-byte values over {NUM_KEYS:,} keys, "
        f"{RECORDS_PER_COMMIT:,} per commit; median of {RUNS} runs, each in a fresh directory; "
        f"eddyline {STORE_OPTIONS.durability}",
        flush=True,
    )
    work = Workload.generate()

    cases: dict[str, Callable[[Workload], float]] = {
        "eddyline_put_commit": eddyline_put_commit,
        "raw_put": raw_put,
        "batch_ceiling": batch_ceiling,
        "quix_put_commit": quix_put_commit,
        "eddyline_get": eddyline_get,
        "quix_get": quix_get,
    }
    # Interleave the runs so drift on the machine spreads over every case alike.
    runs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(RUNS):
        for name, case in cases.items():
            runs[name].append(case(work))
    operations = {name: NUM_GETS if name.endswith("_get") else NUM_RECORDS for name in cases}
    rates = {
        name: round(operations[name] / statistics.median(times)) for name, times in runs.items()
    }
    rss = measure_peak_rss()

    print()
    print(f"{'case':<22}{'ops/s':>12}   runs (s)")
    for name, times in runs.items():
        unit = "gets" if name.endswith("_get") else "records"
        spread = " / ".join(f"{t:.3f}" for t in times)
        print(f"{name:<22}{rates[name]:>12,}   {spread}   ({unit})")
    print(
        f"(gets: {work.buffered_get_fraction():.0%} of reads hit the open transaction's "
        f"{len(work.tx_writes):,} buffered writes, the rest the database)"
    )

    growth = rss["hwm_after"] - rss["rss_before"]
    ratios = {
        "put_vs_quix": round(rates["eddyline_put_commit"] / rates["quix_put_commit"], 2),
        "put_vs_raw": round(rates["eddyline_put_commit"] / rates["raw_put"], 2),
        "get_vs_quix": round(rates["eddyline_get"] / rates["quix_get"], 2),
        "peak_rss_growth_ratio": round(growth / RSS_PROBE_BYTES, 2),
    }
    put_vs_ceiling = rates["eddyline_put_commit"] / rates["batch_ceiling"]
    print()
    print(f"{'ratio':<46}{'value':>7}   target")
    rows = [
        ("put_vs_quix", "eddyline_put_commit / quix_put_commit"),
        ("put_vs_raw", "eddyline_put_commit / raw_put"),
        (None, "eddyline_put_commit / batch_ceiling"),
        ("get_vs_quix", "eddyline_get / quix_get"),
        ("peak_rss_growth_ratio", "peak RSS growth / 64 MiB uncommitted"),
    ]
    for key, label in rows:
        value = put_vs_ceiling if key is None else ratios[key]
        target = "(the ceiling; information)" if key is None else met(key, value)
        print(f"{label:<46}{value:>7.2f}   {target}")
    print(
        f"peak RSS: +{growth / 2**20:.1f} MiB while {rss['entries']:,} entries held "
        f"{rss['uncommitted_bytes'] / 2**20:.1f} MiB uncommitted "
        f"({growth / rss['entries']:.0f} bytes per {rss['uncommitted_bytes'] / rss['entries']:.0f}"
        "-byte entry)"
    )
    if PROBLEMS:
        print("\ncorrectness problems (the numbers above may not mean what they say):")
        for message in PROBLEMS:
            print(f"  PROBLEM {message}")
    else:
        print("correctness checks (values read back, committed offsets, reopen): all passed")
    print(
        json.dumps(
            {
                **{name: rates[name] for name in cases},
                "peak_rss_growth_bytes": growth,
                "peak_rss_growth_ratio": ratios["peak_rss_growth_ratio"],
                "put_vs_quix": ratios["put_vs_quix"],
                "put_vs_raw": ratios["put_vs_raw"],
                "get_vs_quix": ratios["get_vs_quix"],
            }
        )
    )


if __name__ == "__main__":
    main()
