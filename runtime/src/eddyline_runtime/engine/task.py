"""An active task: one sub-topology on one partition, with its stores and input buffers.

The task processes buffered input in timestamp order (its
:class:`PartitionGroup`, KIP-695), runs records through its
:class:`TaskTopology`, and keeps what its next commit needs: the outputs its
sinks produced, the changelog records of its store writes, and the next input
offset per partition. It does no I/O with the log itself; its stream thread
fetches for it (:meth:`StreamTask.add_input`) and commits for it: the thread
decides when and in which order (see :mod:`~eddyline_runtime.engine.stream_thread`),
the task says what (:meth:`StreamTask.prepare_commit`) and applies the outcome
(:meth:`StreamTask.complete_commit`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter

from eddyline_runtime.engine.partition_group import Chunk, PartitionGroup
from eddyline_runtime.engine.record_failures import TaskProcessingError
from eddyline_runtime.engine.task_store import TaskStore
from eddyline_runtime.engine.task_topology import Output, TaskTopology
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.log import FetchedColumns, TransactionalProducer
from eddyline_runtime.log.port import CommittedTransaction, RecordColumns
from eddyline_runtime.partitions import TaskId, TopicPartition
from eddyline_runtime.processing.topology import RecordFailedError
from eddyline_runtime.restore.replay.lag import LagInfo, wall_clock_ms
from eddyline_runtime.state import StoreCorruptedError

__all__ = ["PreparedCommit", "StreamTask", "TaskProcessingError", "next_process_batch"]


# Records a task processes before the thread looks at fetching, committing,
# replaying standbys and shutting down: sized to take about PROCESS_SECONDS
# (see next_process_batch). Each batch has a fixed cost: up to 5,000 instead
# of a fixed 1,000 took 7-10% off the CPU per word of the word count; a slow
# topology (1 ms per record) gets small batches, and a turn stays short so a
# thread's standbys (replayed after all its tasks' turns) stay fresh.
_PROCESS_BATCH_FIRST = 1_000
PROCESS_BATCH_LIMITS = (10, 5_000)
PROCESS_SECONDS = 0.01


@dataclass(frozen=True, slots=True)
class PreparedCommit:
    """What one task writes to the log in a commit (step 2 of the commit protocol)."""

    records: dict[TopicPartition, RecordColumns]  # outputs and changelog records
    changelog_records: dict[TopicPartition, int]  # how many of them per changelog
    input_offsets: dict[TopicPartition, int]  # next offset to read, where it moved


class StreamTask:
    def __init__(
        self,
        task_id: TaskId,
        *,
        topology: TaskTopology,
        stores: Mapping[str, TaskStore],
        partitions: PartitionGroup,
        logical_topics: Mapping[str, str],
        producer: TransactionalProducer | None = None,
    ) -> None:
        """``producer``: the task's own transactional producer under exactly-once."""
        self.id = task_id
        self.topology = topology
        self.stores = dict(stores)
        self.partitions = partitions
        self.producer = producer
        # Log topic -> the name the topology uses for it (internal topics differ).
        self._logical_topics = dict(logical_topics)
        # Next input offset to read per partition: what a commit stores.
        self.consumed: dict[TopicPartition, int] = {}
        self._committed_inputs: dict[TopicPartition, int] = {}
        # Next offset to fetch per input partition (the buffer runs ahead of ``consumed``).
        self._fetch_positions: dict[TopicPartition, int] = {}
        # Stores still replaying their changelog, with how far they have to go.
        self._restoring: dict[str, LagInfo] = {}
        self.running = False
        # Wall-clock ms of the last commit of this task's stores (from its start, whose
        # restored state is the task's committed state): what queries of its copies
        # report as ``committed_at_ms``. None until it starts.
        self.committed_at_ms: int | None = None
        self.processed = 0
        self._turn_records = _PROCESS_BATCH_FIRST  # records per turn, see take_turn
        self._transaction_open = False
        # Key and value bytes of the outputs send_outputs put in the open transaction:
        # uncommitted still, so they count against the budget until the commit.
        self._sent_output_bytes = 0

    def start(self, start_offsets: Mapping[TopicPartition, int]) -> None:
        """Restored: process from these input offsets (the committed ones)."""
        self.consumed = dict(start_offsets)
        self._committed_inputs = dict(start_offsets)
        self._fetch_positions = dict(start_offsets)
        self.committed_at_ms = wall_clock_ms()
        self.running = True

    # -- restoration, as queries see it --------------------------------------------

    def restoring(self, store: str, lag: LagInfo) -> None:
        """``store`` replays its changelog from now on; ``lag`` says how far it has to go."""
        self._restoring[store] = lag

    def restored(self, store: str) -> None:
        self._restoring.pop(store, None)

    def restore_lag(self, store: str) -> LagInfo | None:
        """How far ``store`` has still to replay; None once it is restored."""
        return self._restoring.get(store)

    # -- input ---------------------------------------------------------------------

    @property
    def inputs(self) -> list[TopicPartition]:
        return list(self._fetch_positions)

    def fetch_position(self, tp: TopicPartition) -> int:
        """The next offset of ``tp`` to fetch for this task."""
        return self._fetch_positions[tp]

    def add_input(self, tp: TopicPartition, fetched: FetchedColumns) -> int:
        """Buffer what a fetch returned; returns the records added."""
        if not fetched.offsets:
            return 0
        self.partitions.add_chunk(
            tp,
            Chunk(
                fetched.offsets, fetched.keys, fetched.values, fetched.timestamps, fetched.headers
            ),
        )
        self._fetch_positions[tp] = fetched.offsets[-1] + 1
        return len(fetched.offsets)

    def _store_corruption(self, error: Exception) -> StoreCorruptedError | None:
        """RocksDB's "Corruption: ..." from a store read is the store's fault, not the record's:
        report it with the operator action, naming the store whose files it names."""
        message = str(error)
        if not message.startswith("Corruption"):
            return None
        for name, task_store in self.stores.items():
            directory = getattr(task_store.store, "directory", None)
            if directory is not None and str(directory) in message:
                return StoreCorruptedError(name, directory, message)
        return None

    def process(self, max_records: int, max_uncommitted_bytes: int | None = None) -> int:
        """Process up to ``max_records`` buffered records, while timestamp order allows,
        and only until :meth:`uncommitted_bytes` reaches ``max_uncommitted_bytes``: the
        thread's budget then overshoots by at most one record's writes (KIP-892).

        Records go through the topology in batches: each the longest run of one
        partition's records that timestamp order releases in a row. Record by
        record instead while the topology cannot batch (a Processor API processor,
        which may ask for a commit after any record, or a stream-time punctuation,
        due after any record). Under a budget, the first record goes alone, and
        each later batch is sized from the bytes left and the bytes per record
        seen so far, halved for margin: near the limit that is one record at a
        time, so the check after each batch holds the limit within one record's
        size (while a record cache holds every write back, nothing grows and
        batches keep their full size).
        """
        group, topology, consumed = self.partitions, self.topology, self.consumed
        logical = self._logical_topics
        done = 0
        budgeted = max_uncommitted_bytes is not None
        start_bytes = self.uncommitted_bytes() if budgeted else 0
        while done < max_records and group.ready_to_process():
            limit = max_records - done if topology.batching else 1
            if max_uncommitted_bytes is not None and limit > 1:
                if done == 0:
                    limit = 1  # no size per record known yet: learn it from one
                else:
                    used = self.uncommitted_bytes()
                    if used > start_bytes:  # else a record cache holds every write back
                        per_record = (used - start_bytes) / done
                        room = max_uncommitted_bytes - used
                        limit = max(1, min(limit, int(room / (2 * per_record))))
            batch = group.next_batch(limit)
            if batch is None:
                break
            tp = batch.tp
            try:
                topology.process_batch(
                    logical[tp.topic],
                    batch.keys,
                    batch.values,
                    batch.timestamps,
                    batch.headers,
                    partition=tp.partition,
                    offsets=batch.offsets,
                )
            except RecordFailedError as failure:
                if isinstance(failure.cause, EddylineError):
                    raise failure.cause from None
                cause, offset = failure.cause, batch.offsets[failure.index]
                if isinstance(cause, Exception) and (corrupted := self._store_corruption(cause)):
                    raise corrupted from cause
                raise TaskProcessingError(
                    str(self.id), tp.topic, tp.partition, offset, cause
                ) from cause
            except EddylineError:
                raise
            except Exception as exc:
                raise self._store_corruption(exc) or TaskProcessingError(
                    str(self.id), tp.topic, tp.partition, batch.offsets[0], exc
                ) from exc
            consumed[tp] = batch.offsets[-1] + 1
            done += len(batch)
            if topology.commit_requested or (
                max_uncommitted_bytes is not None
                and self.uncommitted_bytes() >= max_uncommitted_bytes
            ):
                break
        self.processed += done
        group.flush_lateness()
        return done

    def take_turn(self, max_uncommitted_bytes: int | None) -> int:
        """One turn of the thread's loop: :meth:`process` as many records as the last
        turns' speed says fit in PROCESS_SECONDS."""
        limit = self._turn_records
        started = time.perf_counter()
        done = self.process(limit, max_uncommitted_bytes)
        self._turn_records = next_process_batch(limit, time.perf_counter() - started)
        return done

    def punctuate_wall_clock(self, now_ms: int) -> bool:
        """Run the wall-clock punctuations due by ``now_ms``; True if any ran."""
        if not self.running or now_ms < self.topology.next_wall_clock_punctuation:
            return False
        return self.topology.maybe_punctuate_wall_clock(now_ms)

    def drain_outputs(self) -> list[Output]:
        return self.topology.drain_outputs()

    def drain_output_columns(self) -> dict[str, RecordColumns]:
        return self.topology.drain_output_columns()

    def drain_changelogs(self) -> dict[TopicPartition, list[tuple[bytes, bytes | None]]]:
        drained: dict[TopicPartition, list[tuple[bytes, bytes | None]]] = {}
        for store in self.stores.values():
            changelog = store.logging.changelog
            if changelog is not None:
                entries = store.logging.drain_changelog()
                if entries:
                    drained[changelog] = entries
        return drained

    def uncommitted_bytes(self) -> int:
        """Store buffers plus the changelog and output records held for the next commit."""
        return (
            self.topology.output_bytes
            + self._sent_output_bytes
            + sum(
                store.store.approximate_num_uncommitted_bytes() + store.logging.pending_bytes
                for store in self.stores.values()
            )
        )

    def offsets_to_commit(self) -> dict[TopicPartition, int]:
        """Input offsets that moved since the last commit."""
        return {
            tp: offset
            for tp, offset in self.consumed.items()
            if self._committed_inputs.get(tp) != offset
        }

    # -- the commit (the thread runs the steps; see engine.stream_thread) ----------

    @property
    def commit_requested(self) -> bool:
        """A processor asked for a commit (``context.commit()``) since the last one."""
        return self.topology.commit_requested

    def grant_commit_request(self) -> None:
        """The thread committed (or there was nothing to commit): the request is answered."""
        self.topology.grant_commit_request()

    @property
    def transactional(self) -> bool:
        """Whether the task writes through its own transactional producer (exactly-once)."""
        return self.producer is not None

    def prepare_commit(self, outputs: dict[TopicPartition, RecordColumns]) -> PreparedCommit | None:
        """What this commit writes: ``outputs`` (the task's outputs, already split into
        partitions), the changelog records of its store writes, and the input offsets that
        moved. None when there is nothing to write."""
        timestamp = self.topology.timestamp
        changelogs = self.drain_changelogs()
        for tp, entries in changelogs.items():
            changes = outputs[tp] = RecordColumns()
            changes.extend(
                list(map(itemgetter(0), entries)),
                list(map(itemgetter(1), entries)),
                [timestamp] * len(entries),
            )
        offsets = self.offsets_to_commit()
        if not outputs and not offsets and not self._transaction_open:
            return None
        return PreparedCommit(
            outputs, {tp: len(entries) for tp, entries in changelogs.items()}, offsets
        )

    def complete_commit(self, changelog_last_offsets: Mapping[TopicPartition, int]) -> None:
        """Step 3, after the log committed what :meth:`prepare_commit` gave: commit each
        store with the offset of its changelog's last record."""
        self.commit_stores(changelog_last_offsets)

    def commit_stores(self, changelog_last_offsets: Mapping[TopicPartition, int]) -> None:
        """After the log committed: commit each store with its changelog's last offset."""
        moved = self.offsets_to_commit()
        for store in self.stores.values():
            for tp, offset in moved.items():
                store.store.update_position(tp, offset - 1)  # KIP-796: last offset reflected
            changelog = store.logging.changelog
            offsets = (
                {changelog: changelog_last_offsets[changelog]}
                if changelog is not None and changelog in changelog_last_offsets
                else {}
            )
            store.store.commit(offsets)
        self._committed_inputs = dict(self.consumed)
        self.committed_at_ms = wall_clock_ms()

    def commit_transaction(
        self,
        batches: Mapping[TopicPartition, RecordColumns],
        group: str,
        input_offsets: Mapping[TopicPartition, int],
    ) -> dict[TopicPartition, int]:
        """Write records and input offsets in one transaction of this task's producer, and
        commit it (``commit.mode=serial``)."""
        producer = self.open_transaction(batches, group, input_offsets)
        try:
            outcome: CommittedTransaction | Exception = producer.commit()
        except Exception as exc:
            outcome = exc
        return self.transaction_committed(outcome)

    def open_transaction(
        self,
        batches: Mapping[TopicPartition, RecordColumns],
        group: str,
        input_offsets: Mapping[TopicPartition, int],
    ) -> TransactionalProducer:
        """Hand the records and input offsets to this task's transaction (begun here unless
        :meth:`send_outputs` began it); its commit is the caller's
        (``Log.commit_transactions`` commits several tasks' at once), whose outcome goes
        to :meth:`transaction_committed`."""
        producer = self.send_outputs(batches)
        try:
            if input_offsets:
                producer.send_offsets(group, input_offsets)
        except BaseException:  # failed and dropped by the producer (fenced), or the thread's end
            self._transaction_open = False
            raise
        return producer

    def send_outputs(
        self, batches: Mapping[TopicPartition, RecordColumns], held_bytes: int = 0
    ) -> TransactionalProducer:
        """Send records into this task's open transaction, beginning one if none is open.
        Nothing is visible before the commit (read_committed); a crash or a fence aborts
        them with the transaction. ``held_bytes``: their size, counted as uncommitted
        until the transaction ends."""
        producer = self.producer
        assert producer is not None, "exactly-once tasks have a producer"
        if not self._transaction_open:
            producer.begin()
            self._transaction_open = True
        try:
            for tp, columns in batches.items():
                producer.send_columns(
                    tp, columns.keys, columns.values, columns.timestamps, columns.headers
                )
        except BaseException:  # failed and dropped by the producer (fenced), or the thread's end
            self._transaction_open = False
            raise
        self._sent_output_bytes += held_bytes
        return producer

    def transaction_committed(
        self, outcome: CommittedTransaction | Exception
    ) -> dict[TopicPartition, int]:
        """The open transaction's outcome: the last offset the log gave each partition, or
        the error its commit raised (the producer dropped the transaction either way)."""
        self._transaction_open = False
        self._sent_output_bytes = 0
        if isinstance(outcome, Exception):
            raise outcome
        return dict(outcome.last_offsets)

    def abort_transaction(self) -> None:
        if self.producer is not None and self._transaction_open:
            self.producer.abort()
            self._transaction_open = False
            self._sent_output_bytes = 0

    def close(self) -> None:
        """Close processors, stores and producer; uncommitted store writes are discarded."""
        self.running = False
        try:
            self.topology.close()
        finally:
            for name, store in self.stores.items():
                # Its committed data includes every write committed by its last commit
                # (or, closed mid-restore, by what was known when it began: its restore's
                # caught-up time): kept for the next open, so the copy reports its
                # staleness before it catches up again.
                as_of = self.committed_at_ms
                if as_of is None:
                    restoring = self._restoring.get(name)
                    as_of = None if restoring is None else restoring.caught_up_at_ms
                store.store.note_as_of(store.store.recorded_as_of_ms if as_of is None else as_of)
                store.close()
            if self.producer is not None:
                self.producer.close()


def next_process_batch(current: int, seconds: float) -> int:
    """A task's next record limit: doubled while a task's turn takes under half of
    PROCESS_SECONDS (a task short of input is not a slow one), halved when one
    takes over twice as long."""
    low, high = PROCESS_BATCH_LIMITS
    if seconds < PROCESS_SECONDS / 2:
        return min(current * 2, high)
    if seconds > PROCESS_SECONDS * 2:
        return max(current // 2, low)
    return current
