"""An in-memory key-value store with the StateStore interface.

Like Kafka Streams' ``InMemoryKeyValueStore`` it is not transactional: writes
apply at once, so readers of either isolation level see them, the store itself
buffers nothing (``approximate_num_uncommitted_bytes()`` is 0), offsets are not
managed, and closing drops the data (restoration rebuilds it from the
changelog). It suits small state and tests.

In the runtime, a logged in-memory store's writes still become changelog
records that wait in memory for the task's next commit; those count against
``statestore.uncommitted.max.bytes`` like any store's, so a thread writing
mostly to in-memory stores is still made to commit before it outgrows its
share (that memory is as real as a transaction buffer's).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.key_ranges import KeyRange
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.state.errors import StoreClosedError
from eddyline_runtime.state.store import KeyValue, StateStore, StoreReader, check_key


class InMemoryStore(StateStore):
    """A dict plus a lazily sorted key list, guarded by one lock for reader threads."""

    def __init__(
        self, name: str, *, default_isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED
    ) -> None:
        self.name = name
        self.default_isolation = default_isolation
        self._data: dict[bytes, bytes] = {}
        self._sorted_keys: list[bytes] | None = []
        self._position: dict[TopicPartition, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def persistent(self) -> bool:
        return False

    @property
    def manages_offsets(self) -> bool:
        return False

    @property
    def is_open(self) -> bool:
        return not self._closed

    def put(self, key: bytes, value: bytes) -> None:
        self._check_open("put")
        if type(key) is not bytes or type(value) is not bytes:
            raise TypeError(
                f'state store "{self.name}": put takes bytes keys and values, got '
                f"{type(key).__name__} and {type(value).__name__}; serialize them first"
            )
        with self._lock:
            if key not in self._data:
                self._sorted_keys = None
            self._data[key] = value

    def delete(self, key: bytes) -> bytes | None:
        self._check_open("delete")
        check_key(self.name, "delete", key)
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._sorted_keys = None
        return old

    def get(self, key: bytes) -> bytes | None:
        self._check_open("get")
        check_key(self.name, "get", key)
        return self._data.get(key)

    def commit(self, changelog_offsets: Mapping[TopicPartition, int]) -> None:
        """Nothing to make visible: writes already are. Offsets are not managed here."""
        self._check_open("commit")

    def committed_offset(self, partition: TopicPartition) -> int | None:
        return None

    def approximate_num_uncommitted_bytes(self) -> int:
        return 0

    def update_position(self, partition: TopicPartition, offset: int) -> None:
        self._check_open("update its position")
        self._position[partition] = offset

    def position(
        self, isolation: IsolationLevel | str = IsolationLevel.READ_UNCOMMITTED
    ) -> Mapping[TopicPartition, int]:
        IsolationLevel.parse(isolation, key="isolation")
        return dict(self._position)

    def reader(self, isolation: IsolationLevel | str | None = None) -> StoreReader:
        level = (
            self.default_isolation
            if isolation is None
            else IsolationLevel.parse(isolation, key="isolation")
        )
        return _InMemoryReader(self, level)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._data = {}
            self._sorted_keys = []
        self.close_iterators()

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise StoreClosedError(self.name, operation)

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        """A snapshot of the range, taken under the lock: safe for any thread."""
        self._check_open("iterate")
        if key_range.empty:
            return iter(())
        with self._lock:
            if self._sorted_keys is None:
                self._sorted_keys = sorted(self._data)
            keys = key_range.slice_of(self._sorted_keys)
            data = self._data
            entries = [(key, data[key]) for key in keys]
        return self.own_iterator(iter(entries))


class _InMemoryReader(StoreReader):
    def __init__(self, store: InMemoryStore, isolation: IsolationLevel) -> None:
        self._store = store
        self.name = store.name
        self.isolation = isolation

    def get(self, key: bytes) -> bytes | None:
        return self._store.get(key)

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        return self._store.scan(key_range)

    def position(self) -> Mapping[TopicPartition, int]:
        return self._store.position(self.isolation)
