"""A stream thread's metrics, with Kafka Streams' groups and names.

Thread level (``stream-thread-metrics``: process and commit rates, totals and
latencies, and ``process-ratio``, the share of wall-clock time the thread
spent processing records, KIP-444's busy-time measure that an autoscaler
reads; ``stream-record-cache-metrics``), task level (``stream-task-metrics``,
with ``record-lateness-avg``/``-max``, each record's lateness behind the stream
time as its task's inputs release it; ``last-commit-timestamp``, the wall-clock
time in ms of the task's last commit, from which a scaling step's longest pause
between two commits of a task is read across members; and the consumer's
``records-lag`` per input partition), store level (``stream-state-metrics``:
restoration, what a Spark build gave, a standby's lag). Every metric carries the
thread's ``thread-id`` tag, and a task's also its ``task-id``: closing a task
drops its metrics, closing the thread drops them all and keeps their last values.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Final

from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.record_failures import DROP_REASONS
from eddyline_runtime.engine.task import StreamTask
from eddyline_runtime.log import LagTracker
from eddyline_runtime.metrics import MetricName, MetricsRegistry, Sensor
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.restore.ingest.sst_restore import IngestResult
from eddyline_runtime.restore.replay import RestoreResult, StandbyTask

# Every metric this module registers, by (group, name), with its description (the HELP
# text /metrics exports): Kafka Streams' wording where Kafka has the metric.
DESCRIPTIONS: Final[Mapping[tuple[str, str], str]] = {
    ("stream-task-metrics", "enforced-processing-total"): (
        "The total number of records processed while the task's other inputs had no buffered data "
        "(KIP-695 enforced processing)"
    ),
    ("stream-task-metrics", "enforced-processing-rate"): (
        "The average number of enforced-processing records per second"
    ),
    ("stream-task-metrics", "record-lateness-avg"): (
        "The average observed lateness of records, in ms behind the task's stream time"
    ),
    ("stream-task-metrics", "record-lateness-max"): (
        "The max observed lateness of records, in ms behind the task's stream time"
    ),
    ("stream-task-metrics", "process-total"): "The total number of records processed by the task",
    ("stream-task-metrics", "last-commit-timestamp"): (
        "The wall-clock time, in ms since the epoch, of the task's last commit on this member (NaN"
        " before its first)"
    ),
    ("stream-task-metrics", "dropped-records-total"): (
        "The total number of records dropped by the task"
    ),
    ("stream-task-metrics", "dropped-records-rate"): (
        "The average number of records dropped per second"
    ),
    ("stream-task-metrics", "dropped-records-by-reason-total"): (
        "The total number of records dropped by the task, by reason"
    ),
    ("stream-task-metrics", "dead-letter-queue-records-total"): (
        "The total number of records the error handlers wrote to the dead-letter queue (KIP-1034)"
    ),
    ("stream-task-metrics", "dead-letter-queue-records-rate"): (
        "The average number of records written to the dead-letter queue per second"
    ),
    ("stream-processor-node-metrics", "window-aggregate-final-emit-total"): (
        "The total number of final results a windowed aggregation emitted (emit on window close)"
    ),
    ("stream-processor-node-metrics", "window-aggregate-final-emit-rate"): (
        "The average number of final window results emitted per second"
    ),
    ("stream-processor-node-metrics", "window-aggregate-final-emit-latency-avg"): (
        "The average delay, in ms, between a window's close and the emit of its final result"
    ),
    ("stream-processor-node-metrics", "window-aggregate-final-emit-latency-max"): (
        "The max delay, in ms, between a window's close and the emit of its final result"
    ),
    ("stream-processor-node-metrics", "suppression-emit-total"): (
        "The total number of records emitted by the suppression buffer"
    ),
    ("stream-processor-node-metrics", "suppression-emit-rate"): (
        "The average number of records emitted by the suppression buffer per second"
    ),
    ("stream-processor-node-metrics", "suppression-buffer-size-avg"): (
        "The average size, in bytes, of the records a bounded or time-limited suppression buffered"
    ),
    ("stream-processor-node-metrics", "suppression-buffer-size-max"): (
        "The max size, in bytes, of the records a bounded or time-limited suppression buffered"
    ),
    ("stream-processor-node-metrics", "suppression-buffer-count-avg"): (
        "The average number of records a bounded or time-limited suppression buffered"
    ),
    ("stream-processor-node-metrics", "suppression-buffer-count-max"): (
        "The max number of records a bounded or time-limited suppression buffered"
    ),
    ("consumer-fetch-manager-metrics", "records-lag"): (
        "The latest lag of the input partition, in records (-1 before the first fetch)"
    ),
    ("stream-state-metrics", "standby-offset-lag"): (
        "How far the standby's store is behind the end of its changelog, in records"
    ),
    ("stream-state-metrics", "restore-ingested-keys"): (
        "Keys ingested from a Spark restore build's SST files (0: none, the changelog was replayed)"
    ),
    ("stream-state-metrics", "restore-ingested-offset"): (
        "The changelog offset a Spark restore build's SST files cover (-1: no build)"
    ),
    ("stream-state-metrics", "restore-build-wait-seconds"): (
        "Seconds the task waited for a Spark restore build before opening the store"
    ),
    ("stream-state-metrics", "restore-total"): (
        "The total number of changelog records restored into the store"
    ),
    ("stream-state-metrics", "restore-rate"): (
        "The average number of changelog records restored per second"
    ),
    ("stream-thread-metrics", "process-rate"): "The average number of records processed per second",
    ("stream-thread-metrics", "process-total"): (
        "The total number of records processed by the thread"
    ),
    ("stream-thread-metrics", "process-ratio"): (
        "The fraction of time the thread spent processing records (KIP-444)"
    ),
    ("stream-thread-metrics", "commit-rate"): "The average number of commits per second",
    ("stream-thread-metrics", "commit-total"): "The total number of commits",
    ("stream-thread-metrics", "commit-latency-avg"): "The average commit latency, in ms",
    ("stream-thread-metrics", "commit-latency-max"): "The max commit latency, in ms",
    ("stream-thread-metrics", "commit-fenced-total"): (
        "The total number of task commits dropped because another member fenced the task (it moved"
        " away)"
    ),
    ("stream-state-updater-metrics", "active-restoring-tasks"): (
        "The number of active tasks restoring their stores from changelogs now (KIP-869)"
    ),
    ("stream-record-cache-metrics", "hits-total"): "The total number of record cache hits",
    ("stream-record-cache-metrics", "misses-total"): "The total number of record cache misses",
    ("stream-record-cache-metrics", "forwards-saved-total"): (
        "The total number of downstream forwards the record cache saved by deduplicating updates "
        "(KIP-63)"
    ),
    ("stream-record-cache-metrics", "hit-ratio"): (
        "The record cache's hit ratio since the thread started"
    ),
    ("stream-record-cache-metrics", "size-bytes"): "The record cache's current size, in bytes",
    ("stream-record-cache-metrics", "overwrites-total"): (
        "The total number of record cache entries overwritten before they were flushed"
    ),
    ("stream-record-cache-metrics", "evictions-total"): (
        "The total number of record cache entries evicted"
    ),
}


class ThreadMetrics:
    """Registers one thread's metrics and records what the thread counts itself."""

    def __init__(
        self,
        metrics: MetricsRegistry,
        thread_name: str,
        cache: ThreadCache,
        lag: LagTracker,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self._tags = {"thread-id": thread_name}
        self._lag = lag
        self.processed_total = 0  # by every task this thread ran, closed ones included
        # Task commits dropped because another member fenced the task: it moved away
        # under this member (a rebalance, or a member that lost its membership).
        self.fenced_total = 0
        # Active tasks replaying their stores' changelogs now (restores run on the thread,
        # one task at a time; /metrics is served by another thread meanwhile).
        self._restoring_tasks = 0
        self._process_sensor = Sensor()
        self._commit_sensor = Sensor()
        # Per active task, the wall-clock time (ms since the epoch) of its last commit.
        self._last_commit_ms: dict[TaskId, float] = {}
        # Seconds spent processing, recorded once per loop iteration (zero when idle), so
        # their sum per second of the window is the busy share.
        self._busy_sensor = Sensor(clock=clock)
        self._register_thread(cache)

    def processed(self, records: int) -> None:
        self.processed_total += records
        self._process_sensor.record(records)

    def iterated(self, processing_seconds: float) -> None:
        """One turn of the loop spent ``processing_seconds`` in the tasks' processing."""
        self._busy_sensor.record(processing_seconds)

    def process_ratio(self) -> float:
        """The share of the last window's wall-clock time spent processing, 0 to 1."""
        return min(1.0, self._busy_sensor.total_rate())

    def committed(self, seconds: float) -> None:
        self._commit_sensor.record(seconds * 1000)

    def restore_started(self) -> None:
        """An active task began restoring its stores."""
        self._restoring_tasks += 1

    def restore_ended(self) -> None:
        """That task's stores are restored (or the restore failed)."""
        self._restoring_tasks -= 1

    def commit_fenced(self) -> None:
        """A task's commit was refused: another member fenced it (it was dropped uncommitted)."""
        self.fenced_total += 1

    def task_committed(self, task_id: TaskId) -> None:
        """``task_id``'s transaction (or its at-least-once commit) completed just now."""
        self._last_commit_ms[task_id] = time.time() * 1000

    def _task_tags(self, task_id: TaskId) -> dict[str, str]:
        return {**self._tags, "task-id": str(task_id)}

    def task_created(self, task: StreamTask) -> None:
        tags = self._task_tags(task.id)
        partitions = task.partitions
        register = partial(_register, self._metrics)
        register(
            MetricName.of("stream-task-metrics", "enforced-processing-total", tags),
            lambda: float(partitions.enforced_processing),
        )
        register(
            MetricName.of("stream-task-metrics", "enforced-processing-rate", tags),
            partitions.enforced_processing_sensor.total_rate,  # records/s: one value per batch
        )
        register(
            MetricName.of("stream-task-metrics", "record-lateness-avg", tags),
            partitions.record_lateness_sensor.avg,
        )
        register(
            MetricName.of("stream-task-metrics", "record-lateness-max", tags),
            partitions.record_lateness_sensor.max,
        )
        register(
            MetricName.of("stream-task-metrics", "process-total", tags),
            lambda: float(task.processed),
        )
        task_id = task.id
        register(
            MetricName.of("stream-task-metrics", "last-commit-timestamp", tags),
            # NaN until the task's first commit on this member.
            lambda: self._last_commit_ms.get(task_id, math.nan),
        )
        topology = task.topology
        register(
            MetricName.of("stream-task-metrics", "dropped-records-total", tags),
            lambda: float(topology.dropped_records),
        )
        register(
            MetricName.of("stream-task-metrics", "dropped-records-rate", tags),
            topology.dropped_records_sensor.rate,
        )
        # Beside Kafka's untagged dropped-records (the dashboard sums those): why each was
        # dropped, and what the handlers wrote to the dead-letter topic (KIP-1034).
        failures = topology.failures
        for reason in DROP_REASONS:
            register(
                MetricName.of(
                    "stream-task-metrics",
                    "dropped-records-by-reason-total",
                    {**tags, "reason": reason},
                ),
                partial(failures.dropped_by_reason.__getitem__, reason),
            )
        register(
            MetricName.of("stream-task-metrics", "dead-letter-queue-records-total", tags),
            lambda: float(failures.dead_letter_records),
        )
        register(
            MetricName.of("stream-task-metrics", "dead-letter-queue-records-rate", tags),
            failures.dead_letter_sensor.total_rate,  # records/s: one value per failure
        )
        for (node, sensor_name), sensor in topology.node_sensors.items():
            node_tags = {**tags, "processor-node-id": node}
            # Every node metric by its full name, so the dashboard and alerts can be checked
            # against what is registered (tests/unit/operator/test_chart_dashboard.py).
            for metric, source, read in (
                ("window-aggregate-final-emit-total", "window-aggregate-final-emit", "total"),
                ("window-aggregate-final-emit-rate", "window-aggregate-final-emit", "rate"),
                (
                    "window-aggregate-final-emit-latency-avg",
                    "window-aggregate-final-emit-latency",
                    "avg",
                ),
                (
                    "window-aggregate-final-emit-latency-max",
                    "window-aggregate-final-emit-latency",
                    "max",
                ),
                ("suppression-emit-total", "suppression-emit", "total"),
                ("suppression-emit-rate", "suppression-emit", "rate"),
                ("suppression-buffer-size-avg", "suppression-buffer-size", "avg"),
                ("suppression-buffer-size-max", "suppression-buffer-size", "max"),
                ("suppression-buffer-count-avg", "suppression-buffer-count", "avg"),
                ("suppression-buffer-count-max", "suppression-buffer-count", "max"),
            ):
                if source == sensor_name:
                    register(
                        MetricName.of("stream-processor-node-metrics", metric, node_tags),
                        _sensor_reading(sensor, read),
                    )
        for tp in task.inputs:
            # Kafka's consumer records-lag: the locally known lag (-1: not fetched yet).
            register(
                MetricName.of(
                    "consumer-fetch-manager-metrics",
                    "records-lag",
                    {**tags, "topic": tp.topic, "partition": str(tp.partition)},
                ),
                partial(self._records_lag, tp),
            )

    def _records_lag(self, tp: TopicPartition) -> float:
        lag = self._lag.current_lag(tp)
        return -1.0 if lag is None else float(lag)

    def standby_created(self, standby: StandbyTask) -> None:
        for name in standby.changelogs:
            _register(
                self._metrics,
                MetricName.of(
                    "stream-state-metrics",
                    "standby-offset-lag",
                    {**self._task_tags(standby.id), "store": name},
                ),
                partial(_standby_lag, standby, name),
            )

    def restored(
        self,
        task_id: TaskId,
        result: RestoreResult,
        ingested: IngestResult | None,
        build_wait_seconds: float,
    ) -> None:
        """A store finished restoring; ``ingested``: what a Spark build gave it."""
        tags = {**self._task_tags(task_id), "store": result.store}
        register = partial(_register, self._metrics)
        # What came from a Spark build: keys ingested and the offset they cover (-1: none,
        # the whole changelog was replayed), and how long the task waited for the build.
        register(
            MetricName.of("stream-state-metrics", "restore-ingested-keys", tags),
            lambda: float(ingested.keys if ingested is not None else 0),
        )
        register(
            MetricName.of("stream-state-metrics", "restore-ingested-offset", tags),
            lambda: float(ingested.offset if ingested is not None else -1),
        )
        register(
            MetricName.of("stream-state-metrics", "restore-build-wait-seconds", tags),
            lambda: build_wait_seconds,
        )
        register(
            MetricName.of("stream-state-metrics", "restore-total", tags),
            lambda: float(result.records),
        )
        register(
            MetricName.of("stream-state-metrics", "restore-rate", tags),
            lambda: result.records_per_second if result.records else 0.0,
        )

    def standby_seeded(
        self,
        task_id: TaskId,
        store: str,
        ingested: IngestResult | None,
        build_wait_seconds: float,
    ) -> None:
        """A standby's (or warm-up's) store opened after a Spark build: what it gave (the
        same names as an active store's restore; the replay itself is standby-offset-lag)."""
        tags = {**self._task_tags(task_id), "store": store}
        register = partial(_register, self._metrics)
        register(
            MetricName.of("stream-state-metrics", "restore-ingested-keys", tags),
            lambda: float(ingested.keys if ingested is not None else 0),
        )
        register(
            MetricName.of("stream-state-metrics", "restore-ingested-offset", tags),
            lambda: float(ingested.offset if ingested is not None else -1),
        )
        register(
            MetricName.of("stream-state-metrics", "restore-build-wait-seconds", tags),
            lambda: build_wait_seconds,
        )

    def task_closed(self, task_id: TaskId) -> None:
        """Drop the metrics of a task (active or standby) and of its stores."""
        self._last_commit_ms.pop(task_id, None)
        self._metrics.unregister_tagged(self._task_tags(task_id))

    def last_values(self) -> dict[MetricName, float]:
        """The thread's metrics now: closed stores drop theirs, reports keep these."""
        mine = ("thread-id", self._tags["thread-id"])
        return {
            name: value for name, value in self._metrics.snapshot().items() if mine in name.tags
        }

    def close(self) -> None:
        """Drop every metric of the thread."""
        self._metrics.unregister_tagged(self._tags)

    def _register_thread(self, cache: ThreadCache) -> None:
        metrics, tags = self._metrics, self._tags

        def register(group: str, name: str, read: Callable[[], float]) -> None:
            _register(metrics, MetricName.of(group, name, tags), read)

        process, commit = self._process_sensor, self._commit_sensor
        register("stream-thread-metrics", "process-rate", process.total_rate)
        register("stream-thread-metrics", "process-total", lambda: float(self.processed_total))
        register("stream-thread-metrics", "process-ratio", self.process_ratio)
        register("stream-thread-metrics", "commit-rate", commit.rate)
        register("stream-thread-metrics", "commit-total", lambda: commit.total_count)
        register("stream-thread-metrics", "commit-latency-avg", commit.avg)
        register("stream-thread-metrics", "commit-latency-max", commit.max)
        register("stream-thread-metrics", "commit-fenced-total", lambda: float(self.fenced_total))
        register(
            "stream-state-updater-metrics",
            "active-restoring-tasks",
            lambda: float(self._restoring_tasks),
        )
        register("stream-record-cache-metrics", "hits-total", lambda: float(cache.hits))
        register("stream-record-cache-metrics", "misses-total", lambda: float(cache.misses))
        register(
            "stream-record-cache-metrics", "forwards-saved-total", lambda: cache.forwards_saved
        )
        register(
            "stream-record-cache-metrics",
            "hit-ratio",
            lambda: cache.hits / (cache.hits + cache.misses) if cache.hits + cache.misses else 0.0,
        )
        register("stream-record-cache-metrics", "size-bytes", lambda: float(cache.num_bytes))
        register("stream-record-cache-metrics", "overwrites-total", lambda: float(cache.overwrites))
        register("stream-record-cache-metrics", "evictions-total", lambda: float(cache.evictions))


def _standby_lag(standby: StandbyTask, store: str) -> float:
    return float(standby.lag(store).offset_lag)


def _sensor_reading(sensor: Sensor, read: str) -> Callable[[], float]:
    """The reading of ``sensor`` a node metric publishes: its total, rate, mean or maximum."""
    readings: dict[str, Callable[[], float]] = {
        "total": partial(getattr, sensor, "total_sum"),
        "rate": sensor.total_rate,
        "avg": sensor.avg,
        "max": sensor.max,
    }
    return readings[read]


def _register(metrics: MetricsRegistry, name: MetricName, read: Callable[[], float]) -> None:
    """Register one of this module's metrics with its description from :data:`DESCRIPTIONS`."""
    metrics.register(name, read, description=DESCRIPTIONS[name.group, name.name])
