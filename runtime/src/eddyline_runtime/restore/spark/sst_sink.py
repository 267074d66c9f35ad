"""Writing SST files from Spark tasks, and the manifests from the driver once all succeeded.

``df.write.format("eddyline_sst")`` takes rows ``(partition, key, value,
versions)`` laid out by (store partition, key): range-partitioned and sorted
within each Spark partition, one row per key (``value`` null when the key's
latest version is a tombstone; ``versions`` the records it collapsed). Each
task writes one SST file per store partition it meets, through
:class:`~eddyline_runtime.state.sst_files.SortedFileWriter` (``state/`` owns
rocksdict), and reports the files in its commit message.

Atomicity, end to end:

* file names carry the store partition, the Spark partition and the task
  attempt id, so a retried or speculative attempt never overwrites another's
  file; a file appears under its name only once finished and synced;
* a task that fails deletes the files it wrote; a killed one may leave some
  behind, but no commit message names them;
* :meth:`_SstWriter.commit` runs on the driver after **every** task
  succeeded: it writes one manifest per store partition listing exactly the
  files the commit messages name, then deletes any file no manifest names.
  A build that fails calls :meth:`_SstWriter.abort` and writes no manifest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from eddyline_runtime import __version__
from eddyline_runtime.restore.manifest import (
    MANIFEST_FORMAT_VERSION,
    MANIFEST_SUFFIX,
    ChangelogRef,
    ManifestFile,
    RestoreManifest,
    sst_name,
    write_manifest,
)
from eddyline_runtime.state.sst_files import SortedFileWriter, SstFile

SST_FORMAT: Final = "eddyline_sst"


@dataclass(frozen=True, slots=True)
class BuildPlan:
    """What the driver fixed before the job: passed to every task and to commit()."""

    application: str
    store: str
    topic: str
    build_id: str
    build_dir: str
    created_at: str
    # store partition -> (log start, log end) as read; the build covers [start, end).
    bounds: Mapping[int, tuple[int, int]]
    # store partition -> the changelog's epoch when its end was fixed (None: unknown).
    epochs: Mapping[int, str | None]

    def encode(self) -> str:
        return json.dumps(
            {
                "application": self.application,
                "store": self.store,
                "topic": self.topic,
                "build_id": self.build_id,
                "build_dir": self.build_dir,
                "created_at": self.created_at,
                "bounds": {str(p): list(b) for p, b in self.bounds.items()},
                "epochs": {str(p): e for p, e in self.epochs.items()},
            }
        )

    @classmethod
    def decode(cls, text: str) -> BuildPlan:
        raw = json.loads(text)
        bounds = {int(p): (int(b[0]), int(b[1])) for p, b in raw.pop("bounds").items()}
        epochs = {int(p): e for p, e in raw.pop("epochs").items()}
        return cls(bounds=bounds, epochs=epochs, **raw)


@dataclass(frozen=True)
class SstCommitMessage(WriterCommitMessage):
    """What one successful task wrote: (store partition, file name, sha256, bytes, keys)
    per file in key order, and (store partition, records, tombstones) it collapsed."""

    spark_partition: int
    files: tuple[tuple[int, str, str, int, int], ...]
    counts: tuple[tuple[int, int, int], ...]


class SstDataSource(DataSource):
    """``df.write.format("eddyline_sst").option("plan", BuildPlan.encode()).mode("append")``."""

    @classmethod
    def name(cls) -> str:
        return SST_FORMAT

    def schema(self) -> str:
        return "partition int, key binary, value binary, versions long"

    def writer(self, schema: StructType, overwrite: bool) -> _SstWriter:
        return _SstWriter(BuildPlan.decode(self.options["plan"]))


class _SstWriter(DataSourceArrowWriter):
    def __init__(self, plan: BuildPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SstCommitMessage:
        context = TaskContext.get()
        spark_partition = context.partitionId() if context is not None else 0
        attempt = context.taskAttemptId() if context is not None else 0
        task = _TaskFiles(self.plan, spark_partition, attempt)
        try:
            for batch in iterator:
                task.add(batch)
            return task.finish()
        except BaseException:
            task.abort()
            raise

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        write_manifests(self.plan, [m for m in messages if isinstance(m, SstCommitMessage)])

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        build_dir = Path(self.plan.build_dir)
        for message in messages:
            if not isinstance(message, SstCommitMessage):
                continue
            for _, name, _, _, _ in message.files:
                (build_dir / name).unlink(missing_ok=True)
        _remove_unlisted_files(build_dir, set())


class _TaskFiles:
    """One task's files: a new one each time the store partition changes."""

    def __init__(self, plan: BuildPlan, spark_partition: int, attempt: int) -> None:
        self.plan = plan
        self.spark_partition = spark_partition
        self.attempt = attempt
        self.build_dir = Path(plan.build_dir)
        self.finished: list[tuple[int, SstFile]] = []
        self.counts: dict[int, list[int]] = {}  # store partition -> [records, tombstones]
        self._writer: SortedFileWriter | None = None
        self._partition = -1
        self._sequence = 0

    def add(self, batch: pa.RecordBatch) -> None:
        partitions = batch.column(0)
        # Rows arrive sorted by (partition, key), so each partition is one slice.
        for partition in pc.unique(partitions).to_pylist():
            first = pc.index(partitions, partition).as_py()
            rows = batch.slice(first, _run_length(partitions, first, partition))
            self._add_rows(partition, rows)

    def _add_rows(self, partition: int, rows: pa.RecordBatch) -> None:
        counts = self.counts.setdefault(partition, [0, 0])
        counts[0] += pc.sum(rows.column(3)).as_py() or 0
        values = rows.column(2)
        live = pc.is_valid(values)
        counts[1] += len(rows) - (pc.sum(live).as_py() or 0)
        rows = rows.filter(live)
        if len(rows) == 0:
            return
        if partition != self._partition:
            self._finish_file()
            self._partition = partition
        if self._writer is None:
            name = sst_name(partition, self.spark_partition, self.attempt, self._sequence)
            self._sequence += 1
            self._writer = SortedFileWriter(self.build_dir / name, store=self.plan.store)
        self._writer.add(rows.column(1).to_pylist(), rows.column(2).to_pylist())

    def _finish_file(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            finished = writer.finish()
            if finished is not None:
                self.finished.append((self._partition, finished))

    def finish(self) -> SstCommitMessage:
        self._finish_file()
        return SstCommitMessage(
            self.spark_partition,
            tuple(
                (partition, f.path.name, f.sha256, f.size, f.entries)
                for partition, f in self.finished
            ),
            tuple((p, c[0], c[1]) for p, c in sorted(self.counts.items())),
        )

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()
        for _, finished in self.finished:
            finished.path.unlink(missing_ok=True)


def _run_length(column: pa.Array, first: int, value: int) -> int:
    """Rows equal to ``value`` from ``first`` on (the column is sorted)."""
    rest = column.slice(first)
    differs = pc.not_equal(rest, value)
    position = pc.index(differs, True).as_py()
    return len(rest) if position < 0 else int(position)


def write_manifests(plan: BuildPlan, messages: Sequence[SstCommitMessage]) -> list[Path]:
    """One manifest per planned store partition, from the successful tasks' messages."""
    build_dir = Path(plan.build_dir)
    files: dict[int, list[tuple[int, str, str, int, int]]] = {p: [] for p in plan.bounds}
    records = dict.fromkeys(plan.bounds, 0)
    # Spark partitions hold ascending key ranges, and a task's files ascend: this is key order.
    for message in sorted(messages, key=lambda m: m.spark_partition):
        for partition, name, sha256, size, keys in message.files:
            files[partition].append((message.spark_partition, name, sha256, size, keys))
        for partition, count, _ in message.counts:
            records[partition] += count
    written = []
    listed: set[str] = set()
    for partition, (log_start, log_end) in sorted(plan.bounds.items()):
        entries = tuple(
            ManifestFile(name=name, sha256=sha256, bytes=size, keys=keys)
            for _, name, sha256, size, keys in files[partition]
        )
        listed.update(entry.name for entry in entries)
        manifest = RestoreManifest(
            format_version=MANIFEST_FORMAT_VERSION,
            eddyline_version=__version__,
            build_id=plan.build_id,
            created_at=plan.created_at,
            application=plan.application,
            store=plan.store,
            changelog=ChangelogRef(topic=plan.topic, partition=partition),
            # The last offset read, keyless records included, as replay commits it.
            offset=log_end - 1 if log_end > log_start else -1,
            log_start=log_start,
            log_end=log_end,
            changelog_epoch=plan.epochs.get(partition),
            records_read=records[partition],
            keys=sum(entry.keys for entry in entries),
            files=entries,
        )
        written.append(write_manifest(build_dir, manifest))
    _remove_unlisted_files(build_dir, listed)
    return written


def _remove_unlisted_files(build_dir: Path, listed: set[str]) -> None:
    """Files of failed or killed attempts: no manifest names them, so they can only mislead."""
    if not build_dir.is_dir():
        return
    for entry in build_dir.iterdir():
        if entry.name.endswith(MANIFEST_SUFFIX) or entry.name in listed:
            continue
        if entry.name.endswith((".sst", ".sst.tmp")):
            entry.unlink(missing_ok=True)
