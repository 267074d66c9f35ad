"""A test driver for topologies: Kafka Streams' ``TopologyTestDriver``, in Python.

A topology's tests should not need a log, threads or a commit interval to see
what it does. :class:`TopologyTestDriver` runs a topology in-process and
synchronously: pipe a record with an explicit timestamp into a named input
(:meth:`TestInputTopic.pipe_input`), and by the time the call returns it has
gone through every sub-topology it reaches; read what the sinks wrote
(:meth:`TestOutputTopic.read_key_values_to_list`, ``read_records_to_list``...)
and what the stores hold (:meth:`TopologyTestDriver.get_key_value_store`,
``get_window_store``, ``get_session_store``); move the wall clock
(:meth:`TopologyTestDriver.advance_wall_clock_time`) to fire wall-clock
punctuations::

    with TopologyTestDriver(builder.build(), {"application.id": "wordcount"}) as driver:
        lines = driver.create_input_topic("text-lines")
        counts = driver.create_output_topic("word-counts")
        lines.pipe_input(None, "the quick brown fox", timestamp=0)
        assert counts.read_key_values_to_list() == [("the", 1), ("quick", 1), ...]
        assert driver.get_key_value_store("counts").get("the") == 1

What runs is the engine's own task code, not a re-implementation: each
sub-topology is a :class:`~eddyline_runtime.engine.task.StreamTask` (partition
0) with its :class:`~eddyline_runtime.engine.partition_group.PartitionGroup`
(KIP-695 timestamp order and ``max.task.idle.ms``, on the driver's clock), its
:class:`~eddyline_runtime.engine.task_topology.TaskTopology` (the processors,
record contexts, stream time, punctuations) and its stores as processors see
them in a pod: :class:`~eddyline_runtime.engine.task_store.TaskStore` with the
record cache (KIP-63) and changelog in front of a transactional RocksDB store
(in a temporary directory, removed at :meth:`TopologyTestDriver.close`) or an
in-memory one. Only the log and the stream thread stand aside: the topics are
lists in memory, and the driver does what a thread does, in Kafka's driver's
order:

* after each record, the task commits as a stream thread commits (the record
  cache flushed, outputs and changelog records written, the stores committed
  with their changelog offsets), so what a record causes is visible at once;
  a record written to a topic the topology reads (a repartition topic) is
  processed next, before the call returns;
* stream-time punctuations fire as records advance stream time; wall-clock
  ones only when :meth:`~TopologyTestDriver.advance_wall_clock_time` moves the
  driver's clock past them (punctuations and ``max.task.idle.ms`` never read
  the system clock: the driver's starts at ``initial_wall_clock_time_ms``);
* every topic has one partition, named as in a run (repartition topics
  ``<application.id>-<name>``, changelogs ``<application.id>-<store>-changelog``,
  both readable as output topics).

A ``StreamsInstance`` on the embedded log gives the same outputs and store
contents for the same inputs (``tests/integration/test_testing_scenarios.py`` holds
both to it), except where it commits less often: its record cache then
holds back (deduplicates) updates the driver's commit after every record
forwards.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, cast

from eddyline_runtime.config import IsolationLevel, StreamsConfig
from eddyline_runtime.engine.global_thread import GlobalStoreView
from eddyline_runtime.engine.partition_group import PartitionGroup
from eddyline_runtime.engine.record_cache import ThreadCache
from eddyline_runtime.engine.record_failures import RecordFailures
from eddyline_runtime.engine.task import StreamTask
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_topology import TaskTopology
from eddyline_runtime.engine.thread_metrics import ThreadMetrics
from eddyline_runtime.engine.topics import TopicLayout, single_partition_layout
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.log import FetchedColumns, LagTracker
from eddyline_runtime.log.port import RecordColumns
from eddyline_runtime.metrics import MetricName, MetricsRegistry
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing import StreamsBuilder
from eddyline_runtime.processing.operators.stores import (
    KeyValueStore,
    SessionStore,
    WindowStore,
)
from eddyline_runtime.processing.topology import Headers, StoreSpec, Topology
from eddyline_runtime.processing.windows import SessionWindow, TimeWindow, Windowed
from eddyline_runtime.serde import serde_for
from eddyline_runtime.state import (
    InMemoryStore,
    RocksDBStore,
    RocksDBStoreOptions,
    StateStore,
    VersionedKeyValueStore,
    global_store_directory,
    store_directory,
)
from eddyline_runtime.value_and_timestamp import split_timestamped

__all__ = [
    "EmptyTopicError",
    "ReadOnlyKeyValueStore",
    "ReadOnlySessionStore",
    "ReadOnlyWindowStore",
    "TestDriverError",
    "TestInputTopic",
    "TestOutputTopic",
    "TestRecord",
    "TopologyTestDriver",
    "read_store",
]

K = TypeVar("K")
V = TypeVar("V")

# Kafka's TopologyTestDriver runs without an application.id too, under this one.
DEFAULT_APPLICATION_ID = "topology-test-driver"
# The largest timestamp a window or session read may name (Kafka's Long.MAX_VALUE).
_MAX_TIME = 2**63 - 1


class TestDriverError(EddylineError):
    """The driver was asked for a topic or store the topology does not have, or after close."""

    __test__ = False  # not a pytest test class, whatever imports it


class EmptyTopicError(TestDriverError, LookupError):
    """A read from an output topic with no unread record (Kafka's NoSuchElementException)."""


@dataclass(frozen=True, slots=True)
class TestRecord(Generic[K, V]):
    """A record piped in or read out: key and value deserialized, with its timestamp and
    headers (Kafka's ``TestRecord``)."""

    __test__ = False

    key: K | None
    value: V | None
    timestamp: int
    headers: Headers = ()


# -- serdes ---------------------------------------------------------------------------------


def _serde(given: Any, default: str | None) -> Any:
    """A serde given by name or as an object; None: the topology's own (``default``)."""
    if given is None:
        return serde_for(default)
    if isinstance(given, str):
        return serde_for(given)
    return given


# -- the log's stand-in -----------------------------------------------------------------------


@dataclass(slots=True)
class _Topic:
    """One topic's only partition: every record written, and the ones not read yet."""

    records: list[tuple[bytes | None, bytes | None, int, Headers]] = field(default_factory=list)
    unread: deque[tuple[bytes | None, bytes | None, int, Headers]] = field(default_factory=deque)


# -- the driver -------------------------------------------------------------------------------


class TopologyTestDriver:
    """Runs a topology in-process and synchronously; see the module docstring."""

    __test__ = False

    def __init__(
        self,
        topology: Topology | StreamsBuilder,
        config: StreamsConfig | Mapping[str, Any] | None = None,
        *,
        initial_wall_clock_time_ms: int | None = None,
    ) -> None:
        """``config``: settings with Kafka Streams' names (``application.id`` defaults to
        ``topology-test-driver``; ``state.dir`` is always a temporary directory of the
        driver's own); the environment's ``EDDYLINE_*`` variables are not read.
        ``initial_wall_clock_time_ms``: where the driver's clock starts (default: now)."""
        self.topology = topology.build() if isinstance(topology, StreamsBuilder) else topology
        if not isinstance(config, StreamsConfig):
            properties = {"application.id": DEFAULT_APPLICATION_ID, **(config or {})}
            config = StreamsConfig.from_properties(properties, environ={})
        if config.ensure_explicit_internal_resource_naming:  # before any directory exists
            self.topology.ensure_explicit_naming()
        self._state_dir = Path(tempfile.mkdtemp(prefix="eddyline-test-driver-"))
        self.config = config.model_copy(update={"state_dir": self._state_dir})
        self._now_ms = (
            time.time_ns() // 1_000_000
            if initial_wall_clock_time_ms is None
            else initial_wall_clock_time_ms
        )
        self.layout: TopicLayout = single_partition_layout(
            self.topology, config.application_id, config.errors_dead_letter_queue_topic_name
        )
        self._topics: dict[str, _Topic] = {}
        # Physical topic -> the task that reads it (one partition: one task per sub-topology).
        self._readers: dict[str, StreamTask] = {}
        self._cache = ThreadCache(self.config.cache_bytes_per_thread)
        self._metrics = MetricsRegistry()
        # The thread and task metrics a stream thread keeps, for metrics().
        self._thread_metrics = ThreadMetrics(
            self._metrics, f"{config.application_id}-test-driver", self._cache, LagTracker()
        )
        self._tasks: list[StreamTask] = []
        self._closed = False
        # Global stores (GlobalKTable), by their topic: a record piped to a global topic
        # updates its store at once, as Kafka's driver's global state update task does.
        self._global_stores: dict[str, RocksDBStore] = {}
        self._global_views: dict[str, GlobalStoreView] = {}
        try:
            for spec in self.topology.global_stores.values():
                store = RocksDBStore(
                    spec.name,
                    global_store_directory(self._state_dir, spec.name),
                    RocksDBStoreOptions.from_config(self.config),
                )
                self._global_stores[spec.topic] = store
                self._global_views[spec.name] = GlobalStoreView(
                    spec.name, store.reader(IsolationLevel.READ_COMMITTED)
                )
            for sub in self.layout.subtopologies:
                task = self._create_task(TaskId(sub.id, 0))
                self._tasks.append(task)
                self._thread_metrics.task_created(task)
        except BaseException:
            self.close()
            raise
        for task in self._tasks:
            for tp in task.inputs:
                self._readers[tp.topic] = task

    def _clock(self) -> int:
        return self._now_ms

    def _open_store(self, name: str, task_id: TaskId) -> StateStore:
        """As a pod opens it (``StoreOpener.open``), without Spark builds: RocksDB under
        the driver's state directory, or in memory."""
        if not self.topology.stores[name].persistent:
            return InMemoryStore(name)
        return RocksDBStore(
            name,
            store_directory(self._state_dir, task_id, name),
            RocksDBStoreOptions.from_config(self.config),
        )

    def _create_task(self, task_id: TaskId) -> StreamTask:
        """The task as ``TaskManager.create_active`` assembles it, on the driver's clock,
        with nothing to restore and no producer (the driver writes what it commits)."""
        layout = self.layout
        subtopology = layout.subtopology(task_id)
        stores: dict[str, TaskStore] = {}
        try:
            for name in subtopology.stores:
                stores[name] = TaskStore(
                    self._open_store(name, task_id),
                    changelog=layout.changelog_partition(name, task_id),
                    # As TaskManager: no cache for a store with caching disabled.
                    cache=self._cache if self.topology.stores[name].cached else None,
                    cache_name=f"{task_id}/{name}",
                )
            topology = TaskTopology(
                self.topology,
                subtopology,
                task_id.partition,
                stores,
                global_stores=self._global_views,
                wall_clock_ms=self._clock,
                failures=RecordFailures.from_config(self.config),
                physical_topics=layout.physical,
            )
        except BaseException:
            for store in stores.values():
                store.close()
            raise
        inputs = layout.input_partitions(task_id)
        partitions = PartitionGroup(
            inputs,
            max_task_idle_ms=self.config.max_task_idle_ms,
            # Everything piped is buffered at once: an empty input has nothing unfetched.
            current_lag=lambda _tp: 0,
            clock_ms=self._clock,
        )
        task = StreamTask(
            task_id,
            topology=topology,
            stores=stores,
            partitions=partitions,
            logical_topics={physical: logical for logical, physical in layout.physical.items()},
        )
        task.start(dict.fromkeys(inputs, 0))
        return task

    # -- topics -----------------------------------------------------------------------

    def create_input_topic(
        self,
        topic: str,
        key_serde: Any = None,
        value_serde: Any = None,
        *,
        start_timestamp: int = 0,
        auto_advance_ms: int = 0,
    ) -> TestInputTopic[Any, Any]:
        """An input the topology reads; serdes by name (``"string"``) or as objects, by
        default the source's. Records piped without a timestamp get ``start_timestamp``,
        and each one moves it on by ``auto_advance_ms`` (Kafka's ``createInputTopic``)."""
        source = self._source_of(topic)
        return TestInputTopic(
            self,
            topic,
            _serde(key_serde, source.key_serde),
            _serde(value_serde, source.value_serde),
            start_timestamp=start_timestamp,
            auto_advance_ms=auto_advance_ms,
        )

    def create_output_topic(
        self, topic: str, key_serde: Any = None, value_serde: Any = None
    ) -> TestOutputTopic[Any, Any]:
        """A topic to read what was written to it: a sink's topic (serdes by default the
        sink's), a repartition topic or a changelog (raw bytes by default). Any name is
        accepted, as by Kafka's driver: a topic nothing writes stays empty."""
        physical = self.layout.physical.get(topic, topic)
        sinks = [
            node
            for node in self.topology.nodes.values()
            if node.kind == "sink" and self.layout.physical.get(node.topics[0]) == physical
        ]
        key_default = sinks[0].key_serde if sinks else None
        value_default = sinks[0].value_serde if sinks else None
        return TestOutputTopic(
            self, physical, _serde(key_serde, key_default), _serde(value_serde, value_default)
        )

    def produced_topic_names(self) -> set[str]:
        """Every topic a record was written to: sinks', repartition topics, changelogs."""
        return {name for name, topic in self._topics.items() if topic.records}

    def _source_of(self, topic: str) -> Any:
        for spec in self.topology.global_stores.values():
            if spec.topic == topic:
                return spec.store  # its serdes are the topic's
        for node in self.topology.nodes.values():
            if node.kind == "source" and topic in node.topics:
                if topic in self.topology.internal_topics:
                    break
                return node
        inputs = sorted(
            t
            for node in self.topology.nodes.values()
            if node.kind == "source"
            for t in node.topics
            if t not in self.topology.internal_topics
        )
        raise TestDriverError(
            f'the topology reads no topic "{topic}" (its inputs: {", ".join(inputs) or "none"}); '
            "pipe records into one of those"
        )

    def _topic(self, physical: str) -> _Topic:
        found = self._topics.get(physical)
        if found is None:
            found = self._topics[physical] = _Topic()
        return found

    # -- processing ---------------------------------------------------------------------

    def _pipe(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers,
    ) -> None:
        self._check_open()
        store = self._global_stores.get(topic)
        if store is not None:
            self._update_global(store, topic, key, value, timestamp, headers)
            return
        physical = self.layout.physical[topic]
        columns = RecordColumns()
        columns.append(key, value, timestamp, headers)
        self._write({TopicPartition(physical, 0): columns})
        self._process_all()

    def _update_global(  # noqa: PLR0917 - _pipe's record, passed on
        self,
        store: RocksDBStore,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers,
    ) -> None:
        """A record on a global topic, applied as the global thread applies it: key and
        value bytes as they are, a tombstone deletes, committed with its offset."""
        records = self._topic(topic).records
        records.append((key, value, timestamp, headers))
        if key is None:
            return  # a keyless record cannot be looked up: the global thread skips it too
        if value is None:
            store.delete(key)
        else:
            store.put(key, value)
        store.commit({TopicPartition(topic, 0): len(records) - 1})

    def _write(self, records: Mapping[TopicPartition, RecordColumns]) -> dict[TopicPartition, int]:
        """Append to the in-memory topics, and hand each record to the task reading its topic
        (what a fetch would); returns the offset of the last record per partition."""
        last: dict[TopicPartition, int] = {}
        for tp, columns in records.items():
            topic = self._topic(tp.topic)
            first = len(topic.records)
            headers = columns.headers or [()] * len(columns.keys)
            rows = list(zip(columns.keys, columns.values, columns.timestamps, headers, strict=True))
            topic.records.extend(rows)
            topic.unread.extend(rows)
            last[tp] = len(topic.records) - 1
            reader = self._readers.get(tp.topic)
            if reader is not None and rows:
                reader.add_input(
                    tp,
                    FetchedColumns(
                        list(range(first, first + len(rows))),
                        list(columns.keys),
                        list(columns.values),
                        list(columns.timestamps),
                        len(topic.records),
                        None if columns.headers is None else list(columns.headers),
                    ),
                )
        return last

    def _process_all(self) -> None:
        """Process every record timestamp order releases, one at a time and upstream
        sub-topologies first, committing after each (Kafka's ``completeAllProcessableWork``)."""
        while True:
            for task in self._tasks:
                if task.partitions.ready_to_process() and task.process(1):
                    self._thread_metrics.processed(1)
                    self._commit()
                    break
            else:
                return

    def _commit(self) -> None:
        """A stream thread's commit (``StreamThread.commit``), with the driver as the log:
        flush the record cache, write outputs and changelog records, commit the stores."""
        self._cache.flush()
        physical = self.layout.physical
        for task in self._tasks:
            outputs = {
                TopicPartition(physical[topic], 0): columns
                for topic, columns in task.drain_output_columns().items()
            }
            prepared = task.prepare_commit(outputs)
            if prepared is not None:
                task.complete_commit(self._write(prepared.records))
                self._thread_metrics.task_committed(task.id)
            task.grant_commit_request()

    def advance_wall_clock_time(self, advance_ms: int) -> None:
        """Move the driver's clock on by ``advance_ms``: the wall-clock punctuations due by
        then fire, and records held back by ``max.task.idle.ms`` may be processed."""
        self._check_open()
        if isinstance(advance_ms, bool) or not isinstance(advance_ms, int) or advance_ms < 0:
            raise TestDriverError(
                f"the wall clock moves forward by a whole number of ms >= 0, not {advance_ms!r}"
            )
        self._now_ms += advance_ms
        for task in self._tasks:
            task.punctuate_wall_clock(self._now_ms)
        self._commit()
        self._process_all()

    @property
    def wall_clock_time_ms(self) -> int:
        """The driver's clock: where it started plus every advance."""
        return self._now_ms

    # -- stores ---------------------------------------------------------------------------

    def _task_topology_of(self, name: str) -> TaskTopology:
        self._check_open()
        for task in self._tasks:
            if name in task.stores:
                return task.topology
        raise TestDriverError(
            f'the topology has no store "{name}" (its stores: '
            f"{', '.join(sorted(self.topology.stores)) or 'none'})"
        )

    def get_state_store(
        self, name: str
    ) -> KeyValueStore | WindowStore | SessionStore | VersionedKeyValueStore:
        """Store ``name`` as its processors see it: bytes in and out, reads seeing every
        write (Kafka's ``getStateStore``). Writes go through its record cache and
        changelog like a processor's, and commit with the next record."""
        topology = self._task_topology_of(name)
        if name in topology.window_stores:
            return topology.window_stores[name]
        if name in topology.session_stores:
            return topology.session_stores[name]
        if name in topology.versioned_stores:
            return topology.versioned_stores[name]
        return topology.stores[name]

    def _spec(self, name: str, kind: str) -> StoreSpec:
        self._task_topology_of(name)  # refuses a name the topology has no store by
        spec = self.topology.stores[name]
        found = (
            "window"
            if spec.window_retention_ms is not None
            else "session"
            if spec.session_retention_ms is not None
            else "versioned"
            if spec.versioned_history_ms is not None
            else "key-value"
        )
        if found != kind:
            raise TestDriverError(
                f'store "{name}" is a {found} store, not a {kind} store: read it with '
                f"get_{found.replace('-', '_')}_store"
            )
        return spec

    def get_key_value_store(self, name: str) -> ReadOnlyKeyValueStore[Any, Any]:
        """Key-value store ``name``, its keys and values read with the store's serdes (a
        global store's too)."""
        glob = self.topology.global_stores.get(name)
        if glob is not None:
            self._check_open()
            return ReadOnlyKeyValueStore(self._global_views[name], glob.store)
        spec = self._spec(name, "key-value")
        return ReadOnlyKeyValueStore(self._task_topology_of(name).stores[name], spec)

    def get_window_store(self, name: str) -> ReadOnlyWindowStore[Any, Any]:
        """Window store ``name``, its keys and values read with the store's serdes."""
        spec = self._spec(name, "window")
        return ReadOnlyWindowStore(self._task_topology_of(name).window_stores[name], spec)

    def get_session_store(self, name: str) -> ReadOnlySessionStore[Any, Any]:
        """Session store ``name``, its keys and values read with the store's serdes."""
        spec = self._spec(name, "session")
        return ReadOnlySessionStore(self._task_topology_of(name).session_stores[name], spec)

    def get_versioned_store(self, name: str) -> ReadOnlyVersionedStore[Any, Any]:
        """Versioned store ``name`` (KIP-889), its keys and values read with its serdes."""
        spec = self._spec(name, "versioned")
        return ReadOnlyVersionedStore(self._task_topology_of(name).versioned_stores[name], spec)

    # -- metrics --------------------------------------------------------------------------

    def metrics(self) -> dict[MetricName, float]:
        """Every metric's current value, as a stream thread running these tasks keeps them
        (Kafka's ``metrics()``): ``stream-task-metrics`` per task (``dropped-records-total``,
        ``record-lateness-avg``/``-max``, ...) and the thread's, tagged ``thread-id``
        ``<application.id>-test-driver``."""
        return self._metrics.snapshot()

    def metric(self, group: str, name: str, tags: Mapping[str, str] | None = None) -> float:
        """One metric's value; a KeyError names the metrics there are."""
        return self._metrics.value(group, name, tags)

    @property
    def dropped_records(self) -> int:
        """Records the processors dropped, every task's (the tasks' ``dropped-records-total``)."""
        return sum(task.topology.dropped_records for task in self._tasks)

    # -- lifecycle ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TestDriverError("the test driver is closed; create a new one")

    def close(self) -> None:
        """Close the processors and stores, and remove the driver's state directory.
        Nothing is committed first: every record was committed as it was processed."""
        if self._closed:
            return
        self._closed = True
        try:
            for task in self._tasks:
                task.close()
            for store in self._global_stores.values():
                store.close()
        finally:
            shutil.rmtree(self._state_dir, ignore_errors=True)

    def __enter__(self) -> TopologyTestDriver:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class TestInputTopic(Generic[K, V]):
    """Pipes records into one input of a :class:`TopologyTestDriver` (Kafka's
    ``TestInputTopic``); each call returns once the topology processed the records."""

    __test__ = False

    def __init__(
        self,
        driver: TopologyTestDriver,
        topic: str,
        key_serde: Any,
        value_serde: Any,
        *,
        start_timestamp: int = 0,
        auto_advance_ms: int = 0,
    ) -> None:
        self.driver = driver
        self.topic = topic
        self._key_serde = key_serde
        self._value_serde = value_serde
        self._current_time = start_timestamp
        self._advance = auto_advance_ms

    def advance_time(self, advance_ms: int) -> None:
        """Move the timestamp of the next record piped without one."""
        if advance_ms < 0:
            raise TestDriverError(f"time moves forward: advance_time({advance_ms}) is negative")
        self._current_time += advance_ms

    def _timestamp(self, timestamp: int | None) -> int:
        if timestamp is not None:
            return timestamp
        current = self._current_time
        self._current_time += self._advance
        return current

    def pipe_input(
        self, key: K | None, value: V | None, timestamp: int | None = None, headers: Headers = ()
    ) -> None:
        """One record; without ``timestamp``, the topic's current time (then auto-advanced)."""
        self.driver._pipe(
            self.topic,
            self._key_serde.serialize(key),
            self._value_serde.serialize(value),
            self._timestamp(timestamp),
            tuple(headers),
        )

    def pipe_record(self, record: TestRecord[K, V]) -> None:
        self.pipe_input(record.key, record.value, record.timestamp, record.headers)

    def pipe_value_list(self, values: Iterable[V | None]) -> None:
        """Keyless records, one per value, at the topic's current time."""
        for value in values:
            self.pipe_input(None, value)

    def pipe_key_value_list(self, pairs: Iterable[tuple[K | None, V | None]]) -> None:
        for key, value in pairs:
            self.pipe_input(key, value)

    def pipe_record_list(self, records: Iterable[TestRecord[K, V]]) -> None:
        for record in records:
            self.pipe_record(record)


class TestOutputTopic(Generic[K, V]):
    """Reads what was written to one topic (Kafka's ``TestOutputTopic``): each read
    consumes the oldest unread record; every reader of a topic shares its unread ones."""

    __test__ = False

    def __init__(
        self, driver: TopologyTestDriver, topic: str, key_serde: Any, value_serde: Any
    ) -> None:
        self.driver = driver
        self.topic = topic
        self._key_serde = key_serde
        self._value_serde = value_serde

    def _unread(self) -> deque[tuple[bytes | None, bytes | None, int, Headers]]:
        self.driver._check_open()
        return self.driver._topic(self.topic).unread

    def read_record(self) -> TestRecord[K, V]:
        unread = self._unread()
        if not unread:
            raise EmptyTopicError(f'topic "{self.topic}" has no unread record')
        key, value, timestamp, headers = unread.popleft()
        return TestRecord(
            self._key_serde.deserialize(key),
            self._value_serde.deserialize(value),
            timestamp,
            headers,
        )

    def read_value(self) -> V | None:
        return self.read_record().value

    def read_key_value(self) -> tuple[K | None, V | None]:
        record = self.read_record()
        return record.key, record.value

    def read_records_to_list(self) -> list[TestRecord[K, V]]:
        records = []
        while not self.is_empty():
            records.append(self.read_record())
        return records

    def read_values_to_list(self) -> list[V | None]:
        return [record.value for record in self.read_records_to_list()]

    def read_key_values_to_list(self) -> list[tuple[K | None, V | None]]:
        return [(record.key, record.value) for record in self.read_records_to_list()]

    def read_key_values_to_map(self) -> dict[K, V | None]:
        """Each key's last value (None for a tombstone, as Kafka's keeps it)."""
        latest: dict[K, V | None] = {}
        for record in self.read_records_to_list():
            if record.key is None:
                raise TestDriverError(
                    f'topic "{self.topic}" holds a record without a key: read it with '
                    "read_key_values_to_list"
                )
            latest[record.key] = record.value
        return latest

    def is_empty(self) -> bool:
        return not self._unread()

    @property
    def queue_size(self) -> int:
        """How many records are unread."""
        return len(self._unread())


# -- stores, read with their serdes ------------------------------------------------------


class KeyValueReads(Protocol):
    """What :class:`ReadOnlyKeyValueStore` reads: the operators' key-value store, or a
    store's reader (``state.StoreReader``)."""

    name: str

    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, key_range: KeyRange) -> Iterator[tuple[bytes, bytes]]: ...


class WindowReads(Protocol):
    """What :class:`ReadOnlyWindowStore` reads: the operators' window store, or a detached
    reader of one (``state.DetachedWindowReader``)."""

    name: str

    def fetch(self, key: bytes, window_start: int) -> bytes | None: ...

    def fetch_range(
        self, key: bytes, time_from: int, time_to: int
    ) -> Iterator[tuple[int, bytes]]: ...

    def fetch_all(self, time_from: int, time_to: int) -> Iterator[tuple[bytes, int, bytes]]: ...


class SessionReads(Protocol):
    """What :class:`ReadOnlySessionStore` reads: the operators' session store, or a
    detached reader of one (``state.DetachedSessionReader``)."""

    name: str

    def find_sessions(
        self, key: bytes, earliest_session_end: int, latest_session_start: int
    ) -> Iterator[tuple[bytes, int, int, bytes]]: ...

    def find_all_sessions(
        self, earliest_session_end: int, latest_session_start: int
    ) -> Iterator[tuple[bytes, int, int, bytes]]: ...


class ReadOnlyVersionedStore(Generic[K, V]):
    """A versioned store read with its serdes: ``get(key)`` is the latest value,
    ``get(key, as_of)`` the value valid at ``as_of`` (Kafka's ``VersionedKeyValueStore``
    reads, values only; ``versions`` gives (value, valid from, valid to) newest first)."""

    def __init__(self, store: VersionedKeyValueStore, spec: StoreSpec) -> None:
        self.name = spec.name
        self._store = store
        self._keys = serde_for(spec.key_serde)
        self._values = serde_for(spec.value_serde)

    def get(self, key: K, as_of: int | None = None) -> V | None:
        found = self._store.get(self._keys.serialize(key), as_of)
        return None if found is None else self._values.deserialize(found.value)

    def versions(self, key: K) -> list[tuple[V, int, int | None]]:
        return [
            (self._values.deserialize(r.value), r.timestamp, r.valid_to)
            for r in self._store.versions(self._keys.serialize(key))
        ]


class ReadOnlyKeyValueStore(Generic[K, V]):
    """A key-value store read with its serdes (Kafka's ``ReadOnlyKeyValueStore``)."""

    def __init__(self, store: KeyValueReads, spec: StoreSpec) -> None:
        self.name = spec.name
        self._store = store
        self._keys = serde_for(spec.key_serde)
        self._values = serde_for(spec.value_serde)

    def get(self, key: K) -> V | None:
        found = self._store.get(self._keys.serialize(key))
        return None if found is None else self._values.deserialize(found)

    def all(self) -> list[tuple[K, V]]:
        """Every entry, in byte order of the serialized keys."""
        return [
            (self._keys.deserialize(key), self._values.deserialize(value))
            for key, value in self._store.scan(KeyRange(None, None))
        ]

    def range(self, from_key: K | None, to_key: K | None) -> list[tuple[K, V]]:
        """The entries from ``from_key`` to ``to_key``, both inclusive (None: unbounded)."""
        key_range = KeyRange.closed(
            None if from_key is None else self._keys.serialize(from_key),
            None if to_key is None else self._keys.serialize(to_key),
        )
        return [
            (self._keys.deserialize(key), self._values.deserialize(value))
            for key, value in self._store.scan(key_range)
        ]

    def approximate_num_entries(self) -> int:
        return sum(1 for _ in self._store.scan(KeyRange(None, None)))


class ReadOnlyWindowStore(Generic[K, V]):
    """A window store read with its serdes (Kafka's ``ReadOnlyWindowStore``). The values
    of a windowed aggregation's store carry their timestamp; these reads drop it, as
    Kafka's driver does for a timestamped window store."""

    def __init__(self, store: WindowReads, spec: StoreSpec) -> None:
        self.name = spec.name
        self._store = store
        self._keys = serde_for(spec.key_serde)
        self._values = serde_for(spec.value_serde)
        self._timestamped = spec.timestamped
        self._size = spec.window_size_ms

    def _value(self, stored: bytes) -> V:
        data = split_timestamped(stored)[1] if self._timestamped else stored
        return self._values.deserialize(data)  # type: ignore[no-any-return]

    def _windowed(self, key: bytes, start: int) -> Windowed[K]:
        end = start if self._size is None else start + self._size
        return Windowed(self._keys.deserialize(key), TimeWindow(start, end))

    def fetch(self, key: K, window_start: int) -> V | None:
        found = self._store.fetch(self._keys.serialize(key), window_start)
        return None if found is None else self._value(found)

    def fetch_range(self, key: K, time_from: int, time_to: int) -> list[tuple[int, V]]:
        """``key``'s windows starting from ``time_from`` to ``time_to`` (inclusive), as
        (start, value), oldest first."""
        return [
            (start, self._value(value))
            for start, value in self._store.fetch_range(
                self._keys.serialize(key), time_from, time_to
            )
        ]

    def fetch_all(self, time_from: int, time_to: int) -> list[tuple[Windowed[K], V]]:
        return [
            (self._windowed(key, start), self._value(value))
            for key, start, value in self._store.fetch_all(time_from, time_to)
        ]

    def all(self) -> list[tuple[Windowed[K], V]]:
        """Every live window of every key."""
        return self.fetch_all(0, _MAX_TIME)


class ReadOnlySessionStore(Generic[K, V]):
    """A session store read with its serdes (Kafka's ``ReadOnlySessionStore``)."""

    def __init__(self, store: SessionReads, spec: StoreSpec) -> None:
        self.name = spec.name
        self._store = store
        self._keys = serde_for(spec.key_serde)
        self._values = serde_for(spec.value_serde)

    def _entry(self, key: bytes, start: int, end: int, value: bytes) -> tuple[Windowed[K], V]:
        return (
            Windowed(self._keys.deserialize(key), SessionWindow(start, end)),
            self._values.deserialize(value),
        )

    def fetch(self, key: K) -> list[tuple[Windowed[K], V]]:
        """Every live session of ``key``."""
        return self.find_sessions(key, 0, _MAX_TIME)

    def find_sessions(
        self, key: K, earliest_session_end: int, latest_session_start: int
    ) -> list[tuple[Windowed[K], V]]:
        """``key``'s sessions ending at or after ``earliest_session_end`` and starting at or
        before ``latest_session_start``."""
        return [
            self._entry(*entry)
            for entry in self._store.find_sessions(
                self._keys.serialize(key), earliest_session_end, latest_session_start
            )
        ]

    def all(self) -> list[tuple[Windowed[K], V]]:
        """Every live session of every key."""
        return [self._entry(*entry) for entry in self._store.find_all_sessions(0, _MAX_TIME)]


def read_store(
    reads: KeyValueReads | WindowReads | SessionReads, spec: StoreSpec
) -> list[tuple[Any, Any]]:
    """Every entry of a store of any kind, read with its serdes: what a test compares
    between the driver and a run (``ReadOnly*Store.all()``)."""
    if spec.window_retention_ms is not None:
        return ReadOnlyWindowStore[Any, Any](cast(WindowReads, reads), spec).all()
    if spec.session_retention_ms is not None:
        return ReadOnlySessionStore[Any, Any](cast(SessionReads, reads), spec).all()
    return ReadOnlyKeyValueStore[Any, Any](cast(KeyValueReads, reads), spec).all()
