"""The state store contract of KIP-892, in Python.

A :class:`StateStore` has one owner: the stream thread of the task it belongs
to (the single-writer principle). The owner writes (``put``, ``delete``,
``put_all``), reads its own writes, and calls :meth:`StateStore.commit` after
the changelog transaction holding those writes has committed. Other threads
(interactive queries, metrics) never touch the store directly; they ask for a
:class:`StoreReader` with an isolation level:

* ``READ_COMMITTED`` sees only what the last ``commit`` made durable-to-be;
* ``READ_UNCOMMITTED`` also sees the owner's open transaction.

Offsets follow Kafka Streams: the changelog offset a store commits is the
offset of the *last changelog record its data includes*; restoration resumes
at that offset + 1.

Keys and values are ``bytes``; iteration is in unsigned byte order of keys.
A key that is not ``bytes`` (None included) raises ``TypeError`` naming the
store, in every operation. Iterators belong to their store: ``close()``
invalidates every iterator still open on it (the next step raises
:class:`~eddyline_runtime.state.errors.StoreClosedError`) and releases what
they held at once, without waiting for garbage collection.
"""

from __future__ import annotations

import abc
import logging
import threading
import weakref
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, Self

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state.errors import StoreClosedError

KeyValue = tuple[bytes, bytes]

logger = logging.getLogger(__name__)

# Guards every store's iterator registry: readers on other threads register
# iterators while the owner may be closing the store.
_ITERATORS_LOCK = threading.Lock()


def check_key(store: str, operation: str, key: object) -> None:
    """Raise the TypeError every store operation gives for a key that is not bytes."""
    if type(key) is not bytes:
        raise TypeError(
            f'state store "{store}": {operation} takes a bytes key, got '
            f"{type(key).__name__}; serialize it first (the topology's serdes do this)"
        )


class ReadableBytes(Protocol):
    """Point reads and ordered scans: a backing store, or another thread's reader of one
    (what the window, session and versioned stores read through)."""

    name: str

    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]: ...


class KeyValueBytesStore(ReadableBytes, Protocol):
    """What a window, session or versioned store needs from the store under it: a
    :class:`StateStore`, or the engine's task store (record cache and changelog over a
    StateStore)."""

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> bytes | None: ...

    def reader(self, isolation: IsolationLevel | str | None = None) -> StoreReader: ...


class ReadableKeyValueStore(abc.ABC):
    """Point and ordered reads; shared by stores (owner view) and readers.

    Implementations provide :meth:`get` and :meth:`scan`; Kafka's range
    methods are expressed through ``scan``.
    """

    @abc.abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``, or None when absent or deleted."""

    @abc.abstractmethod
    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        """Entries with keys in ``key_range``, in key order."""

    name: str

    def range(self, from_key: bytes | None, to_key: bytes | None) -> Iterator[KeyValue]:
        """Entries with ``from_key <= key <= to_key`` in key order; None ends are unbounded.

        ``from_key > to_key`` is empty, with a warning (as in Kafka Streams): it is
        usually arguments in the wrong order, or a serde whose bytes do not sort
        like its values.
        """
        for end in (from_key, to_key):
            if end is not None:
                check_key(self.name, "range", end)
        if from_key is not None and to_key is not None and from_key > to_key:
            logger.warning(
                'state store "%s": range(from=%r, to=%r) is empty because from > to. The '
                "arguments may be in the wrong order, or the key serde may not preserve "
                "ordering when its bytes are compared (the built-in numeric serdes do not "
                "for negative numbers)",
                self.name,
                from_key,
                to_key,
            )
            return iter(())
        return self.scan(KeyRange.closed(from_key, to_key))

    def prefix_scan(self, prefix: bytes) -> Iterator[KeyValue]:
        """Entries whose key starts with ``prefix``, in key order."""
        check_key(self.name, "prefix_scan", prefix)
        return self.scan(KeyRange.prefix(prefix))

    def all(self) -> Iterator[KeyValue]:
        """Every entry, in key order."""
        return self.scan(KeyRange())


class StoreReader(ReadableKeyValueStore):
    """A read view of a store for threads other than its owner.

    Safe to use while the owner writes and commits. Each call sees one
    consistent snapshot at the reader's :attr:`isolation`; an iterator keeps
    the snapshot it started with until it is exhausted or dropped.
    """

    isolation: IsolationLevel

    @abc.abstractmethod
    def position(self) -> Mapping[TopicPartition, int]:
        """KIP-796 input position the data visible to this reader reflects."""

    def get_with_changelog_offsets(
        self, key: bytes
    ) -> tuple[bytes | None, Mapping[TopicPartition, int] | None]:
        """:meth:`get`, and the committed changelog offsets of the very data it read (the
        last record of each changelog it includes), so an answer can say exactly what it
        reflects; None when this reader cannot tell them together (uncommitted writes are
        visible, or the store keeps no offsets): the caller falls back to a lower bound."""
        return self.get(key), None


class StateStore(ReadableKeyValueStore):
    """A named, transactional key-value store owned by one stream thread."""

    name: str

    @property
    @abc.abstractmethod
    def persistent(self) -> bool:
        """Whether committed data survives close and reopen."""

    @property
    @abc.abstractmethod
    def manages_offsets(self) -> bool:
        """Whether :meth:`commit` persists changelog offsets atomically with the data."""

    @property
    @abc.abstractmethod
    def is_open(self) -> bool: ...

    @abc.abstractmethod
    def put(self, key: bytes, value: bytes) -> None:
        """Write ``key`` in the open transaction; visible to the owner at once."""

    @abc.abstractmethod
    def delete(self, key: bytes) -> bytes | None:
        """Delete ``key`` in the open transaction (a tombstone until commit); returns the
        value it had, None if none."""

    def put_if_absent(self, key: bytes, value: bytes) -> bytes | None:
        """Write ``key`` only if it has no value; returns the value it had (None: written)."""
        current = self.get(key)
        if current is None:
            self.put(key, value)
        return current

    def put_all(self, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Write many entries; a None value deletes, as in Kafka's ``putAll``."""
        for key, value in entries:
            if value is None:
                self.delete(key)
            else:
                self.put(key, value)

    @abc.abstractmethod
    def commit(self, changelog_offsets: Mapping[TopicPartition, int]) -> None:
        """Make every write since the last commit visible to READ_COMMITTED readers.

        ``changelog_offsets`` maps each changelog partition to the offset of the
        last record the committed data includes. A store that manages offsets
        persists them atomically with the data: after a crash either both are
        there or neither is.
        """

    def restore_batch(
        self,
        entries: Sequence[tuple[bytes, bytes | None]],
        changelog_offsets: Mapping[TopicPartition, int],
    ) -> None:
        """Apply a batch of changelog records (None deletes) and commit their offsets.

        Restoration calls this once per fetched batch, never once per record;
        stores may write the batch directly rather than through their buffer.
        """
        self.put_all(entries)
        self.commit(changelog_offsets)

    @abc.abstractmethod
    def committed_offset(self, partition: TopicPartition) -> int | None:
        """The changelog offset last committed for ``partition``; None if none or not managed."""

    def committed_changelogs(self) -> Collection[TopicPartition]:
        """Every changelog partition the store holds a committed offset for."""
        return ()

    def changelog_epoch(self, partition: TopicPartition) -> str | None:
        """The changelog's incarnation the committed offset of ``partition`` belongs to.

        See :meth:`eddyline_runtime.log.Log.partition_epoch`; None when the
        store does not manage offsets or none was recorded.
        """
        return None

    def record_changelog_epoch(self, partition: TopicPartition, epoch: str) -> None:
        """Keep ``epoch`` beside ``partition``'s offset, written with the next commit."""

    def wipe(self) -> None:
        """Close the store and delete everything it holds, committed state included."""
        self.close()

    def set_aside(self, reason: str, note: Mapping[str, Any] | None = None) -> Path | None:
        """Close the store and move what it holds out of its place; returns where it went.

        ``note`` (what :func:`~eddyline_runtime.state.state_directory.write_quarantine_note`
        writes) goes with the copy, never after it.

        For a store that cannot be trusted (its offsets do not fit its
        changelog) but may be the best copy of its state left: restoration
        rebuilds the store from the changelog, and the copy set aside can be
        written back into it (``eddyline state republish``). A store with
        nothing on disk has nothing to keep: it is wiped (None).
        """
        self.wipe()
        return None

    @abc.abstractmethod
    def approximate_num_uncommitted_bytes(self) -> int:
        """About how many key + value bytes the next commit would free."""

    def disk_bytes(self) -> int | None:
        """Bytes the store takes on disk (what its volume must hold), at most a few seconds
        old; safe to ask from any thread. None: the store keeps nothing on disk."""
        return None

    @abc.abstractmethod
    def update_position(self, partition: TopicPartition, offset: int) -> None:
        """Record that the open transaction reflects input ``partition`` up to ``offset``."""

    @abc.abstractmethod
    def position(
        self, isolation: IsolationLevel | str = IsolationLevel.READ_UNCOMMITTED
    ) -> Mapping[TopicPartition, int]:
        """KIP-796 position: committed only, or including the open transaction."""

    @abc.abstractmethod
    def reader(self, isolation: IsolationLevel | str | None = None) -> StoreReader:
        """A thread-safe read view; ``None`` uses the store's default isolation level."""

    @abc.abstractmethod
    def close(self) -> None:
        """Discard uncommitted writes and release the store. Idempotent."""

    def note_as_of(self, as_of_ms: int | None) -> None:
        """Its owner's word, before :meth:`close`: the committed data includes every write
        its task committed by ``as_of_ms`` (None: it cannot tell). A store that persists
        keeps it for its next open (state/as_of_marker.py); others forget it."""
        del as_of_ms

    @property
    def recorded_as_of_ms(self) -> int | None:
        """What :meth:`note_as_of` said before this store was last closed cleanly, if its
        data is still what it was then; None otherwise (and for stores that keep none)."""
        return None

    # -- iterators die with their store ------------------------------------------------

    def own_iterator(self, items: Iterator[KeyValue]) -> Iterator[KeyValue]:
        """Wrap ``items`` so that :meth:`close_iterators` can end it."""
        iterator = StoreIterator(self.name, items)
        with _ITERATORS_LOCK:
            registry: weakref.WeakSet[StoreIterator] | None = self.__dict__.get("_open_iterators")
            if registry is None:
                registry = self.__dict__["_open_iterators"] = weakref.WeakSet()
            registry.add(iterator)
        if not self.is_open:
            # close() ran while this iterator was being made: it may have missed it.
            iterator.invalidate()
            raise StoreClosedError(self.name, "iterate")
        return iterator

    def close_iterators(self) -> None:
        """Invalidate every iterator still open on this store (its next step raises
        StoreClosedError) and drop what it holds now, not when it is collected."""
        with _ITERATORS_LOCK:
            registry: weakref.WeakSet[StoreIterator] | None = self.__dict__.get("_open_iterators")
            iterators = list(registry) if registry else []
            if registry:
                registry.clear()
        for iterator in iterators:
            iterator.invalidate()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class StoreIterator(Iterator[KeyValue]):
    """An iterator over a store's entries that its store can end.

    ``invalidate`` waits for a step in progress on another thread, then drops
    the underlying iterator: for RocksDB that releases the database, which
    stays open (and locked) while any iterator on it lives.
    """

    __slots__ = ("__weakref__", "_items", "_lock", "_store")

    def __init__(self, store: str, items: Iterator[KeyValue]) -> None:
        self._store = store
        self._items: Iterator[KeyValue] | None = items
        self._lock = threading.Lock()

    def __iter__(self) -> StoreIterator:
        return self

    def __next__(self) -> KeyValue:
        with self._lock:
            items = self._items
            if items is None:
                raise StoreClosedError(self._store, "iterate: the store closed under this iterator")
            try:
                return next(items)
            except StopIteration:
                # Exhausted: let go of the underlying iterator now.
                self._items = iter(())
                raise

    def invalidate(self) -> None:
        with self._lock:
            self._items = None
