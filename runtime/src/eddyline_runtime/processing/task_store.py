"""A state store as a task's processors see it: record cache, then changelog, then store.

Writes from a processor go, in order, through

1. the record cache (KIP-63), when the thread has one: updates stay dirty in
   memory and reach the layers below once per key per flush;
2. the changelog layer: every write that reaches it is applied to the store's
   open transaction and remembered as a changelog record to send with the
   task's next commit (the last write of a key wins: the changelog topic is
   compacted, so the earlier ones would only be replayed to be overwritten);
3. the transactional store (KIP-892), committed after the log transaction
   holding those changelog records.

Reads see the processor's own writes at every layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.processing.record_cache import CachingKeyValueStore, ThreadCache
from eddyline_runtime.processing.topology import Change
from eddyline_runtime.state import KeyRange, KeyValue, ReadableKeyValueStore, StateStore

# Receives each update the cache flushes: the key and Change(new, old).
ChangeListener = Callable[[bytes, Change], None]


class ChangeloggingStore:
    """Applies writes to the store and keeps them as the changelog records of the next commit."""

    def __init__(self, store: StateStore, changelog: TopicPartition | None) -> None:
        self.name = store.name
        self.store = store
        self.changelog = changelog
        # key -> value (None: a delete), in first-write order since the last commit.
        self._pending: dict[bytes, bytes | None] = {}
        self.pending_bytes = 0

    def get(self, key: bytes) -> bytes | None:
        return self.store.get(key)

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        return self.store.scan(key_range)

    def put(self, key: bytes, value: bytes) -> None:
        self.store.put(key, value)
        if self.changelog is not None:
            self._pending[key] = value
            self.pending_bytes += len(key) + len(value)

    def delete(self, key: bytes) -> None:
        self.store.delete(key)
        if self.changelog is not None:
            self._pending[key] = None
            self.pending_bytes += len(key)

    def drain_changelog(self) -> list[tuple[bytes, bytes | None]]:
        """The changelog records of the writes since the last drain."""
        pending, self._pending = self._pending, {}
        self.pending_bytes = 0
        return list(pending.items())


class TaskStore(ReadableKeyValueStore):
    """The store object ``ProcessorContext.get_state_store`` returns inside the runtime."""

    def __init__(
        self,
        store: StateStore,
        *,
        changelog: TopicPartition | None,
        cache: ThreadCache | None,
        cache_name: str,
    ) -> None:
        self.name = store.name
        self.store = store
        self.logging = ChangeloggingStore(store, changelog)
        self._cached = (
            CachingKeyValueStore(self.logging, cache, cache_name=cache_name)
            if cache is not None and cache.max_bytes > 0
            else None
        )

    @property
    def cached(self) -> bool:
        return self._cached is not None

    def set_flush_listener(self, listener: ChangeListener) -> bool:
        """Forward updates as the cache flushes them; False when there is no cache.

        A DSL aggregation calls this once: with a cache it forwards on flush
        (three updates of a key before a commit forward once), without one it
        forwards each update itself.
        """
        if self._cached is None:
            return False
        self._cached.set_forward(listener)
        return True

    def get(self, key: bytes) -> bytes | None:
        if self._cached is not None:
            return self._cached.get(key)
        return self.store.get(key)

    def scan(self, key_range: KeyRange) -> Iterator[KeyValue]:
        if self._cached is not None:
            return self._cached.scan(key_range)
        return self.store.scan(key_range)

    def put(self, key: bytes, value: bytes) -> None:
        if type(key) is not bytes or type(value) is not bytes:
            raise TypeError(
                f'state store "{self.name}" takes bytes keys and values, got '
                f"{type(key).__name__} and {type(value).__name__}; serialize them first "
                "(eddyline_runtime.serde)"
            )
        if self._cached is not None:
            self._cached.put(key, value)
        else:
            self.logging.put(key, value)

    def delete(self, key: bytes) -> None:
        if self._cached is not None:
            self._cached.delete(key)
        else:
            self.logging.delete(key)

    def put_all(self, entries: list[tuple[bytes, bytes | None]]) -> None:
        for key, value in entries:
            if value is None:
                self.delete(key)
            else:
                self.put(key, value)

    def flush(self) -> None:
        """Push the cache's dirty entries down to the store and the changelog."""
        if self._cached is not None:
            self._cached.flush()
