"""One running instance of a stream application (Kafka Streams' ``KafkaStreams`` object).

An instance resolves its topology against the log (topics, task counts),
spreads its tasks over ``num.stream.threads`` stream threads, and runs them
until it is closed. ``close()`` asks every thread to commit what it processed
and close its stores; a crash instead leaves the last commit, which the next
start resumes from (see :mod:`eddyline_runtime.processing.stream_thread`).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Collection, Sequence

from eddyline_runtime.config import StreamsConfig
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log import Log
from eddyline_runtime.metrics import MetricName, MetricsRegistry
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.stream_thread import (
    CommitListener,
    RestoreListener,
    StreamThread,
    ThreadSetup,
    ThreadState,
)
from eddyline_runtime.processing.topics import TopicLayout, resolve_topics
from eddyline_runtime.processing.topology import Topology


class InstanceState(enum.StrEnum):
    CREATED = "CREATED"
    REBALANCING = "REBALANCING"  # Kafka's name for "tasks are being created and restored"
    RUNNING = "RUNNING"
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    ERROR = "ERROR"


class StreamsFailedError(EddylineError):
    """A stream thread stopped on an error; the instance stopped with it."""


class StreamsInstance:
    def __init__(
        self,
        topology: Topology,
        config: StreamsConfig,
        log: Log,
        *,
        instance_id: str = "0",
        tasks: Collection[TaskId] | None = None,
        on_commit: Sequence[CommitListener] = (),
        on_restore: Sequence[RestoreListener] = (),
    ) -> None:
        """``tasks``: the active tasks this instance runs (None: all of them)."""
        self.topology = topology
        self.config = config
        self.log = log
        self.instance_id = instance_id
        self.metrics = MetricsRegistry()
        # Every metric's value as the threads closed (stores drop theirs on close).
        self.final_metrics: dict[MetricName, float] = {}
        self.state = InstanceState.CREATED
        self.layout: TopicLayout | None = None
        self.threads: list[StreamThread] = []
        self._wanted_tasks = None if tasks is None else set(tasks)
        self._on_commit = tuple(on_commit)
        self._on_restore = tuple(on_restore)
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self.state is not InstanceState.CREATED:
                raise EddylineError(f"an instance starts once; this one is {self.state}")
            self.state = InstanceState.REBALANCING
            layout = resolve_topics(self.topology, self.config.application_id, self.log)
            self.layout = layout
            wanted = self._wanted_tasks
            tasks = [t for t in layout.tasks() if wanted is None or t in wanted]
            setup = ThreadSetup(
                topology=self.topology,
                layout=layout,
                config=self.config,
                log=self.log,
                metrics=self.metrics,
                instance_id=self.instance_id,
                on_commit=self._on_commit,
                on_restore=self._on_restore,
            )
            count = self.config.num_stream_threads
            self.threads = [
                StreamThread(index, tasks[index::count], setup) for index in range(count)
            ]
            for thread in self.threads:
                thread.start()

    def close(self, timeout: float | None = None) -> None:
        """Commit, close every store and stop; raises what made a thread fail, if any."""
        with self._lock:
            if self.state in (InstanceState.CREATED, InstanceState.NOT_RUNNING):
                self.state = InstanceState.NOT_RUNNING
                return
            self.state = InstanceState.PENDING_SHUTDOWN
        for thread in self.threads:
            thread.request_stop()
        for thread in self.threads:
            thread.join(timeout)
        for thread in self.threads:
            self.final_metrics.update(thread.final_metrics)
        failed = self._failure()
        self.state = InstanceState.ERROR if failed else InstanceState.NOT_RUNNING
        if failed is not None:
            raise failed

    def check(self) -> InstanceState:
        """Update and return the state; raises StreamsFailedError once a thread failed."""
        failed = self._failure()
        if failed is not None:
            for thread in self.threads:
                thread.request_stop()
            for thread in self.threads:
                thread.join()
            self.state = InstanceState.ERROR
            raise failed
        if self.state is InstanceState.REBALANCING and all(
            thread.state is ThreadState.RUNNING for thread in self.threads
        ):
            self.state = InstanceState.RUNNING
        return self.state

    def _failure(self) -> StreamsFailedError | None:
        for thread in self.threads:
            if thread.error is not None:
                error = StreamsFailedError(f"{thread.name} failed: {thread.error}")
                error.__cause__ = thread.error
                return error
        return None

    # -- progress ---------------------------------------------------------------------

    @property
    def processed(self) -> int:
        return sum(task.processed for thread in self.threads for task in thread.tasks)

    def input_lags(self) -> dict[TopicPartition, int | None]:
        lags: dict[TopicPartition, int | None] = {}
        for thread in self.threads:
            lags.update(thread.input_lags())
        return lags

    def caught_up(self) -> bool:
        """Running, every input fetched to its end, nothing buffered, everything committed."""
        if self.check() is not InstanceState.RUNNING:
            return False
        return all(thread.idle and thread.buffered() == 0 for thread in self.threads) and all(
            lag == 0 for lag in self.input_lags().values()
        )

    def wait_until_caught_up(self, timeout: float, *, poll_seconds: float = 0.05) -> None:
        """Block until :meth:`caught_up` (inputs that keep growing never catch up)."""
        deadline = time.monotonic() + timeout
        while not self.caught_up():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"not caught up after {timeout} s: lags {self.input_lags()}, state {self.state}"
                )
            time.sleep(poll_seconds)
