"""Global stores and the global thread (Kafka Streams' ``GlobalStreamThread``).

A global store (``StreamsBuilder.global_table``) is held whole by every instance:
each reads every partition of the store's topic itself, whatever tasks it runs.
The topic is the store's changelog (Kafka's source-topic changelog): records go
into the store as they are (key and value bytes; a tombstone deletes), each
fetched batch in one ``restore_batch``, so the store commits its data with the
offset of the last record it includes, one offset per topic partition. That is
its checkpoint: a restart resumes after it, not from the topic's start.

Where reading resumes, and whether the copy on disk can be trusted at all, is
the one replay rule of :mod:`eddyline_runtime.restore.replay.changelog_replay`,
judged per topic partition. A copy that does not fit its topic (the topic was
truncated past it, recreated, or its retention deleted records it never read)
is set aside into the quarantine, like a task store's, and rebuilt from the
topic's start: the topic is the only truth a global store has.

Order at start (Kafka's): the global thread *bootstraps* every global store up to
the topic's end offsets it saw on starting, and only then do the stream threads
start, so no record is processed against a global table that is still loading.
After that the thread keeps reading what the topics gain, as long as the
instance runs. The instance is not ready (``/readyz``) before the bootstrap ends.

What a global store has not, and why: no task, so no standby (every instance holds
it already), no Spark restore build (a build is per task changelog partition),
no KIP-816 relocation (its directory, ``state.dir/global/<store>``, is named by
the store, not by a sub-topology ordinal), no changelog topic of its own.
Processors read it, never write it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eddyline_runtime.config import IsolationLevel, StreamsConfig
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.log import Log
from eddyline_runtime.metrics import MetricName, MetricsRegistry
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing.topology import Change, GlobalStoreSpec, Topology
from eddyline_runtime.restore.replay import (
    LagInfo,
    ReplayStart,
    mismatch_error,
    replay_batch,
    replay_start,
)
from eddyline_runtime.restore.replay.changelog_replay import quarantine_note
from eddyline_runtime.state import (
    RocksDBStore,
    RocksDBStoreOptions,
    StoreReader,
    global_store_directory,
)
from eddyline_runtime.state.state_directory import write_quarantine_note

logger = logging.getLogger(__name__)

# Records per fetch and per WriteBatch while keeping a global store current.
_BATCH_RECORDS = 10_000
# How long the global thread sleeps when no topic gained anything: a new record reaches
# the global store this much later at worst (Kafka's global consumer polls the same way).
_IDLE_POLL_SECONDS = 0.05


class GlobalStoreError(EddylineError):
    """A global store cannot be kept: its topic is missing, or it was asked to do what a
    global store does not (be written by a processor)."""


class GlobalStoreView:
    """A global store as processors see it: read-only, at READ_COMMITTED.

    Kafka Streams gives processors a read-only view too: the store is written
    only from its topic, by the global thread, and every task of every instance
    reads the same data.
    """

    def __init__(self, name: str, reader: StoreReader) -> None:
        self.name = name
        self._reader = reader

    def get(self, key: bytes) -> bytes | None:
        return self._reader.get(key)

    def scan(self, key_range: KeyRange) -> Iterator[tuple[bytes, bytes]]:
        return iter(self._reader.scan(key_range))

    def put(self, key: bytes, value: bytes) -> None:
        raise self._read_only("put")

    def delete(self, key: bytes) -> bytes | None:
        raise self._read_only("delete")

    def set_flush_listener(self, listener: Callable[[bytes, Change], None]) -> bool:
        return False  # no record cache: nothing to flush

    def _read_only(self, operation: str) -> GlobalStoreError:
        return GlobalStoreError(
            f'global store "{self.name}" is read-only to processors ({operation} refused): '
            "it is written only from its topic, by the global thread; produce to the topic "
            "to change it"
        )


@dataclass
class _Held:
    """One global store on this instance and how far it read each topic partition."""

    spec: GlobalStoreSpec
    store: RocksDBStore
    partitions: tuple[TopicPartition, ...]
    # Next topic offset to apply per partition (the store committed the one before it).
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    # The topic's end offsets as last asked (a lag's upper bound).
    ends: dict[TopicPartition, int] = field(default_factory=dict)
    # The topic partitions' incarnations the copy reads (None: the log cannot tell).
    epochs: dict[TopicPartition, str | None] = field(default_factory=dict)


class GlobalStores:
    """Every global store of a topology on one instance: opened, bootstrapped, kept current.

    Written only by the global thread; read by stream threads and queries through
    thread-safe READ_COMMITTED readers.
    """

    def __init__(
        self,
        topology: Topology,
        config: StreamsConfig,
        log: Log,
        *,
        metrics: MetricsRegistry | None = None,
        on_set_aside: Callable[[Path], None] | None = None,
    ) -> None:
        self._topology = topology
        self._config = config
        self._log = log
        self._metrics = metrics
        self._on_set_aside = on_set_aside
        self._options = RocksDBStoreOptions.from_config(config)
        self._held: dict[str, _Held] = {}
        # Records applied since this instance started. Counted before a batch's position
        # moves, so whoever sees a store caught up (behind() false) sees its count too.
        self.records_applied = 0
        self.bootstrapped = threading.Event()
        if not topology.global_stores:
            self.bootstrapped.set()  # nothing to load: processing may start at once

    @property
    def names(self) -> list[str]:
        return sorted(self._topology.global_stores)

    def open(self) -> None:
        """Open every global store and judge its copy against its topic (rebuilding a copy
        that does not fit it); nothing is read yet."""
        for name, spec in self._topology.global_stores.items():
            partitions = self._partitions(spec)
            store = self._open_store(name)
            try:
                store = self._trusted(store, spec, partitions)
            except BaseException:
                store.close()
                raise
            held = _Held(spec, store, partitions)
            for tp in partitions:
                committed = store.committed_offset(tp)
                held.positions[tp] = (
                    self._log.beginning_offset(tp) if committed is None else committed + 1
                )
                held.ends[tp] = self._log.end_offset(tp)
                held.epochs[tp] = self._log.partition_epoch(tp)
            self._held[name] = held
            self._register_metrics(held)

    def bootstrap(self, stopped: threading.Event) -> int:
        """Read every global topic up to the end offsets it has now; returns records applied.

        Records produced meanwhile are read after (by :meth:`poll`): a topic that never
        stops growing must not keep the stream threads from ever starting.
        """
        applied = 0
        started = time.perf_counter()
        targets = {
            name: {tp: self._log.end_offset(tp) for tp in held.partitions}
            for name, held in self._held.items()
        }
        for name, held in self._held.items():
            for tp, target in targets[name].items():
                while held.positions[tp] < target and not stopped.is_set():
                    records, position = replay_batch(
                        held.store, self._log, tp, held.positions[tp], max_records=_BATCH_RECORDS
                    )
                    if position == held.positions[tp]:
                        break  # nothing at or after it any more (the end moved back)
                    self.records_applied += records  # before the position: see __init__
                    held.positions[tp] = position
                    held.ends[tp] = max(held.ends[tp], target)
                    applied += records
        if not stopped.is_set():
            self.bootstrapped.set()
            if self._held:
                logger.info(
                    "global stores %s bootstrapped: %d records in %.3f s",
                    ", ".join(self._held),
                    applied,
                    time.perf_counter() - started,
                )
        return applied

    def poll(self) -> int:
        """Apply what each global topic gained since the last call; returns records applied.

        Raises :class:`~eddyline_runtime.restore.replay.ChangelogMismatchError` when a
        topic no longer holds what the store read (truncated or recreated under it).
        """
        applied = 0
        for name, held in self._held.items():
            for tp in held.partitions:
                position = held.positions[tp]
                end = self._log.end_offset(tp)
                held.ends[tp] = end
                if position == end:
                    continue  # nothing new (the epoch is only asked when there is)
                # The copy applied everything before ``position``: the one replay rule
                # judges that, with the incarnation it reads (a topic recreated or
                # truncated under it, or retention past what it has not read, fails here;
                # the next start sets the copy aside and rebuilds it from the topic).
                log = self._log
                start = replay_start(
                    position - 1,
                    log.beginning_offset(tp),
                    end,
                    store_epoch=held.epochs[tp],
                    log_epoch=log.partition_epoch(tp) if position < end else held.epochs[tp],
                )
                if not start.trusted:
                    raise mismatch_error(name, tp, start, copy="global store")
                records, next_position = replay_batch(
                    held.store, self._log, tp, position, max_records=_BATCH_RECORDS
                )
                self.records_applied += records  # before the position: see __init__
                held.positions[tp] = next_position
                applied += records
        return applied

    def behind(self, name: str) -> bool:
        """Whether the store's topic holds records this copy has not applied (the log asked
        now, not the ends last fetched); True while the store is not open."""
        held = self._held.get(name)
        if held is None:
            return True
        positions = dict(held.positions)  # written by the global thread: read once
        return any(positions[tp] < self._log.end_offset(tp) for tp in held.partitions)

    def view(self, name: str) -> GlobalStoreView:
        """What a processor reads (``context.get_state_store``)."""
        return GlobalStoreView(name, self.reader(name, IsolationLevel.READ_COMMITTED))

    def reader(self, name: str, isolation: IsolationLevel | None = None) -> StoreReader:
        """A thread-safe read view (queries); the store keeps nothing uncommitted, so both
        isolation levels read the same data."""
        held = self._held.get(name)
        if held is None:
            raise GlobalStoreError(
                f'global store "{name}" is not open on this instance yet (it opens when the '
                "instance starts); retry shortly"
            )
        return held.store.reader(isolation)

    def lags(self, name: str) -> dict[int, LagInfo]:
        """Partition of the store's topic -> how far this copy trails it."""
        held = self._held.get(name)
        if held is None:
            return {}
        return {
            tp.partition: LagInfo(held.positions[tp], held.ends.get(tp, held.positions[tp]))
            for tp in held.partitions
        }

    def close(self) -> None:
        for name, held in list(self._held.items()):
            held.store.close()
            if self._metrics is not None:
                self._metrics.unregister_tagged({"store": name})
        self._held.clear()

    # -- helpers ----------------------------------------------------------------------

    def _partitions(self, spec: GlobalStoreSpec) -> tuple[TopicPartition, ...]:
        topic = self._log.topics().get(spec.topic)
        if topic is None:
            raise GlobalStoreError(
                f'global store "{spec.name}" reads topic "{spec.topic}", which does not '
                "exist: create it (an application creates only its internal topics) or "
                "fix the topic name given to global_table"
            )
        return tuple(TopicPartition(spec.topic, p) for p in range(topic.partitions))

    def _open_store(self, name: str) -> RocksDBStore:
        return RocksDBStore(
            name,
            global_store_directory(self._config.state_dir, name),
            self._options,
            metrics=self._metrics,
            metric_tags={"thread-id": "GlobalStreamThread", "task-id": "global"},
        )

    def _judge(
        self,
        store: RocksDBStore,
        partitions: tuple[TopicPartition, ...],
        tp: TopicPartition,
        committed: int | None,
    ) -> ReplayStart:
        """The one replay rule for one topic partition of a global store."""
        log = self._log
        return replay_start(
            committed,
            log.beginning_offset(tp),
            log.end_offset(tp),
            store_epoch=store.changelog_epoch(tp),
            log_epoch=log.partition_epoch(tp),
            # Offsets of the topic's other partitions are this store's own, not a sign of
            # a copy from elsewhere (a task store has one changelog partition; this, many).
            other_changelogs=[t for t in store.committed_changelogs() if t not in partitions],
        )

    def _trusted(
        self, store: RocksDBStore, spec: GlobalStoreSpec, partitions: tuple[TopicPartition, ...]
    ) -> RocksDBStore:
        """The store, or a new empty one when any partition's verdict distrusts the copy."""
        log = self._log
        for tp in partitions:
            start = self._judge(store, partitions, tp, store.committed_offset(tp))
            if start.trusted:
                continue
            reason = mismatch_error(spec.name, tp, start, copy="global")
            kept = store.set_aside(start.verdict.value)
            if kept is not None:
                note = quarantine_note(spec.name, tp, start, "global")
                # Not a changelog of its own: `eddyline state republish` refuses it, saying why.
                note["global_topic"] = spec.topic
                write_quarantine_note(kept, note)
                if self._on_set_aside is not None:
                    self._on_set_aside(kept)
            logger.error(
                "%s. Rebuilding global store %s from its topic's start%s",
                reason.problem,
                spec.name,
                "" if kept is None else f"; the copy it held is kept at {kept}",
            )
            store = self._open_store(spec.name)
            break
        for tp in partitions:
            epoch = log.partition_epoch(tp)
            if epoch is not None:
                store.record_changelog_epoch(tp, epoch)
        return store

    def _register_metrics(self, held: _Held) -> None:
        if self._metrics is None:
            return
        tags = {"store": held.spec.name}

        def lag() -> float:
            return float(sum(held.ends[tp] - held.positions[tp] for tp in held.partitions))

        self._metrics.register(
            MetricName.of("global-store-metrics", "records-lag", tags),
            lag,
            description="How far the global store is behind the end of its topic, in records",
        )


class GlobalStreamThread(threading.Thread):
    """Opens and bootstraps the global stores, calls ``on_bootstrapped`` (the instance
    starts its stream threads there), then keeps the stores current until stopped.

    A failure ends the thread with :attr:`error` set; the instance reports it as it
    reports a stream thread's (Kafka's global thread failure stops the instance).
    """

    def __init__(self, stores: GlobalStores, on_bootstrapped: Callable[[], None]) -> None:
        super().__init__(name="GlobalStreamThread", daemon=True)
        self.stores = stores
        self._on_bootstrapped = on_bootstrapped
        self._stopped = threading.Event()
        self.error: BaseException | None = None

    @property
    def records_applied(self) -> int:
        """Records the global stores applied since the instance started."""
        return self.stores.records_applied

    def request_stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        try:
            self.stores.open()
            self.stores.bootstrap(self._stopped)
            if self._stopped.is_set():
                return
            self._on_bootstrapped()
            while not self._stopped.is_set():
                if self.stores.poll() == 0:
                    self._stopped.wait(_IDLE_POLL_SECONDS)
        except BaseException as error:  # reported through the instance, as a stream thread's
            logger.exception("the global thread failed")
            self.error = error
        finally:
            # Stream threads stop before this one (the instance's close order), so no
            # processor reads a global store after it closed.
            self.stores.close()
