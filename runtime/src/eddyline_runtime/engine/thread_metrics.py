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
from collections.abc import Callable
from functools import partial

from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.record_failures import DROP_REASONS
from eddyline_runtime.engine.task import StreamTask
from eddyline_runtime.log import LagTracker
from eddyline_runtime.metrics import MetricName, MetricsRegistry, Sensor
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.restore.ingest.sst_restore import IngestResult
from eddyline_runtime.restore.replay import RestoreResult, StandbyTask


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

    def task_committed(self, task_id: TaskId) -> None:
        """``task_id``'s transaction (or its at-least-once commit) completed just now."""
        self._last_commit_ms[task_id] = time.time() * 1000

    def _task_tags(self, task_id: TaskId) -> dict[str, str]:
        return {**self._tags, "task-id": str(task_id)}

    def task_created(self, task: StreamTask) -> None:
        tags = self._task_tags(task.id)
        partitions = task.partitions
        register = self._metrics.register
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
            self._metrics.register(
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
        register = self._metrics.register
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
        register = self._metrics.register
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
            metrics.register(MetricName.of(group, name, tags), read)

        process, commit = self._process_sensor, self._commit_sensor
        register("stream-thread-metrics", "process-rate", process.total_rate)
        register("stream-thread-metrics", "process-total", lambda: float(self.processed_total))
        register("stream-thread-metrics", "process-ratio", self.process_ratio)
        register("stream-thread-metrics", "commit-rate", commit.rate)
        register("stream-thread-metrics", "commit-total", lambda: commit.total_count)
        register("stream-thread-metrics", "commit-latency-avg", commit.avg)
        register("stream-thread-metrics", "commit-latency-max", commit.max)
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
