"""Reading changelogs into Spark: a pluggable source, and one built on the log port.

A restore build needs, per store partition, every keyed changelog record of
a fixed offset range as rows ``(partition, offset, key, value)``. Where they
come from is a :class:`ChangelogSource`:

* :class:`LogPortSource` reads through eddyline's log port (the embedded
  SQLite log today) with a PySpark Python ``DataSource``. Each Spark task
  opens the log **read-only** (it never takes the live log's write lock) and
  reads its offset range with ``fetch_changes_between``, as Arrow batches.
* With Kafka on a cluster, Spark's own Kafka source
  (``spark.read.format("kafka")`` with ``startingOffsets``/``endingOffsets``
  per partition) reads faster; a source for it implements the same protocol.

PySpark facts this module is shaped by (``docs/restore.md``):
the reader is pickled for the executors *before* ``partitions()`` runs, so
everything ``read()`` needs travels in the :class:`ChangelogRange` itself;
connections are opened inside ``read()`` (they do not pickle); ``partitions()``
must return a list; Arrow types must match the schema exactly (``int`` is
int32, ``binary`` is ``binary``, not ``large_binary``); and the driver fixes
every range's end before the job starts, so the manifest names exactly what
was read even while the changelog grows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log import Log, open_log
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.restore.spark.offset_ranges import OffsetRange

CHANGELOG_FORMAT: Final = "eddyline_changelog"
CHANGELOG_SCHEMA: Final = "partition int, offset long, key binary, value binary"
_ARROW_SCHEMA: Final = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)
# Records per fetch, and so per Arrow batch handed to the JVM: large enough that
# per-batch costs vanish, small enough to stay a few MiB.
_FETCH_RECORDS: Final = 50_000
# A session setting that marks this source as registered (again would log a warning).
_REGISTERED_CONF: Final = "spark.eddyline.changelogSourceRegistered"


@dataclass(frozen=True, slots=True)
class ChangelogBounds:
    """A changelog partition's offsets as the build saw them (``[start, end)``), and its
    epoch (``Log.partition_epoch``; None when the log cannot tell)."""

    start: int
    end: int
    epoch: str | None = None  # the epoch that wrote offset ``end - 1`` (see read_bounds)


class ChangelogShrankError(EddylineError):
    """The changelog lost records while a build fixed its bounds: its end is not its end."""


def read_bounds(log: Log, tp: TopicPartition, end: int | None = None) -> ChangelogBounds:
    """``tp``'s bounds for a build that reads up to ``end`` (default: the end now), and
    the epoch that wrote the last offset it reads (``Log.epoch_at``).

    Not the epoch now: the task writing the changelog begins a new epoch at its end
    (docs/state.md, "Epochs"), and the records a build read stay trusted across that
    as a store's do only when the build names the epoch that wrote them, which is how
    :func:`~eddyline_runtime.restore.ingest.sst_restore.check_manifest` judges it.
    """
    start = log.beginning_offset(tp)
    if end is None:
        end = log.end_offset(tp)
    if end <= start:
        return ChangelogBounds(start, end, log.partition_epoch(tp))
    epoch = log.epoch_at(tp, end - 1)
    if epoch is None:
        raise ChangelogShrankError(
            f"changelog {tp} ended at offset {end} and then lost records while the restore "
            "build read its bounds (it was truncated or put back from a backup): the build "
            "stops rather than name records it cannot read; run it again"
        )
    return ChangelogBounds(start, end, epoch)


class ChangelogSource(Protocol):
    """Where a restore build reads changelogs from."""

    def bounds(self, topic: str, partitions: Sequence[int]) -> Mapping[int, ChangelogBounds]:
        """Each partition's start and end now; the build reads exactly up to these ends."""
        ...

    def load(self, spark: SparkSession, topic: str, ranges: Sequence[OffsetRange]) -> DataFrame:
        """Rows ``(partition int, offset long, key binary, value binary)`` of every keyed
        record in ``ranges`` (a null value is a tombstone); one Spark partition per range."""
        ...


class LogPortSource:
    """Changelogs read through the log port (``open_log(url, read_only=True)``)."""

    def __init__(self, log_url: str) -> None:
        self.log_url = log_url

    def bounds(self, topic: str, partitions: Sequence[int]) -> Mapping[int, ChangelogBounds]:
        log = open_log(self.log_url, read_only=True)
        try:
            return {
                partition: read_bounds(log, TopicPartition(topic, partition))
                for partition in partitions
            }
        finally:
            log.close()

    def load(self, spark: SparkSession, topic: str, ranges: Sequence[OffsetRange]) -> DataFrame:
        if spark.conf.get(_REGISTERED_CONF, "false") != "true":
            spark.dataSource.register(ChangelogDataSource)
            spark.conf.set(_REGISTERED_CONF, "true")
        encoded = json.dumps([[r.partition, r.start, r.end] for r in ranges])
        return (
            spark.read.format(CHANGELOG_FORMAT)
            .option("logurl", self.log_url)
            .option("topic", topic)
            .option("ranges", encoded)
            .load()
        )


@dataclass(frozen=True)
class ChangelogRange(InputPartition):
    """One task's share: everything its ``read()`` needs, since it runs elsewhere."""

    log_url: str
    topic: str
    partition: int
    start: int
    end: int


class ChangelogDataSource(DataSource):
    """``spark.read.format("eddyline_changelog")``; options ``logurl``, ``topic``, ``ranges``
    (JSON ``[[partition, start, end], ...]``, fixed by the driver)."""

    @classmethod
    def name(cls) -> str:
        return CHANGELOG_FORMAT

    def schema(self) -> str:
        return CHANGELOG_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _ChangelogReader(self.options)


class _ChangelogReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        # Option keys are case-insensitive in Spark; ``dict(options)`` would lowercase them,
        # so every key used here is lowercase already.
        self.log_url = options["logurl"]
        self.topic = options["topic"]
        self.ranges = [tuple(r) for r in json.loads(options["ranges"])]

    def partitions(self) -> list[ChangelogRange]:
        return [
            ChangelogRange(self.log_url, self.topic, partition, start, end)
            for partition, start, end in self.ranges
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ChangelogRange):
            raise TypeError(f"expected a ChangelogRange, got {type(partition).__name__}")
        return read_range(partition)


def read_range(share: ChangelogRange) -> Iterator[pa.RecordBatch]:
    """The keyed records of one range as Arrow batches, read-only, in offset order."""
    log = open_log(share.log_url, read_only=True)
    tp = TopicPartition(share.topic, share.partition)
    position = share.start
    try:
        while position < share.end:
            changes = log.fetch_changes_between(tp, position, share.end, _FETCH_RECORDS)
            if changes.last_offset < 0:
                break
            if changes.keys:
                count = len(changes.keys)
                columns: list[Any] = [
                    pa.repeat(pa.scalar(share.partition, pa.int32()), count),
                    pa.array(changes.offsets, pa.int64()),
                    pa.array(changes.keys, pa.binary()),
                    pa.array(changes.values, pa.binary()),
                ]
                yield pa.RecordBatch.from_arrays(columns, schema=_ARROW_SCHEMA)
            position = changes.last_offset + 1
    finally:
        log.close()
