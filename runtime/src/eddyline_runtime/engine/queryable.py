"""What an instance tells interactive queries (KIP-535): where keys live, how stale copies are.

Kafka Streams' names: :class:`HostInfo` is a member's query address,
:class:`KeyQueryMetadata` says which host holds a key's active copy and which
hold standbys, :class:`~eddyline_runtime.restore.replay.lag.LagInfo` how far a
local store trails its changelog.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.errors import InvalidArgumentError

# One StoreRole for the instance's view and the member reports.
from eddyline_runtime.membership import StoreRole
from eddyline_runtime.partitions import TaskId
from eddyline_runtime.processing.topology import Topology
from eddyline_runtime.restore.replay.lag import LagInfo
from eddyline_runtime.state import (
    DetachedSessionReader,
    DetachedWindowReader,
    Retention,
    StoreReader,
    VersionedStoreReader,
)


@dataclass(frozen=True, order=True)
class HostInfo:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, address: str) -> HostInfo:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgumentError(
                f'"{address}" is not a host:port address (e.g. localhost:7070)'
            )
        return cls(host, int(port))


@dataclass(frozen=True)
class KeyQueryMetadata:
    """Where a key's store partition lives: the active copy's host, the standbys' hosts.

    While no assignment covers the key: no host, but the key's partition (a router finds
    the copies members hold, as through a topology upgrade's pause). :attr:`NOT_AVAILABLE`
    (no host, partition -1) is Kafka's value for a key with no partition known.
    """

    active_host: HostInfo | None
    standby_hosts: tuple[HostInfo, ...]
    partition: int

    NOT_AVAILABLE: ClassVar[KeyQueryMetadata]

    @property
    def partition_known(self) -> bool:
        """The key's partition is known (it may have no host yet): not NOT_AVAILABLE."""
        return self.partition >= 0


KeyQueryMetadata.NOT_AVAILABLE = KeyQueryMetadata(None, (), -1)


@dataclass(frozen=True)
class LocalStorePartition:
    """One store partition this instance holds, and how it may be read."""

    store: str
    partition: int
    task: TaskId
    role: StoreRole  # ACTIVE or STANDBY; ``running`` tells a restoring active copy
    running: bool  # an active task that finished restoring; standbys never are
    lag: LagInfo
    open_reader: Callable[[IsolationLevel | None], StoreReader] = field(compare=False)
    # The copy's bytes on disk (StateStore.disk_bytes: None for an in-memory store); a
    # callable, as the walk is wanted only by /v1/layout, not by every query that routes.
    disk_bytes: Callable[[], int | None] = field(compare=False, default=lambda: None)
    # Wall-clock ms of the last commit this copy made as its task's active copy (the commit
    # that made its position durable); None for a copy that replays a changelog (a standby,
    # a restoring copy): the active's commit times are not in the changelog.
    committed_at_ms: int | None = field(compare=False, default=None)

    @property
    def current(self) -> bool:
        """Up to date: queries may read it without allowing stale results."""
        return self.role is StoreRole.ACTIVE and self.running


@dataclass(frozen=True)
class WindowedStoreShape:
    """What a query needs to read a window or session store (see :func:`windowed_store_shape`).

    ``size_ms``: a window's size (its end is start + size), None when the store
    is no windowed aggregation's (a Processor API window store: windows are
    named by their start only). ``timestamped``: values carry the newest record
    timestamp before the aggregate (Kafka's ``ValueAndTimestamp``), as the
    windowed aggregations write them; queries answer the aggregate.
    """

    store: str
    kind: str  # "window" or "session"
    retention: Retention
    size_ms: int | None
    timestamped: bool

    def open_reader(
        self, local: LocalStorePartition, isolation: IsolationLevel | None
    ) -> DetachedWindowReader | DetachedSessionReader:
        inner = local.open_reader(isolation)
        if self.kind == "session":
            return DetachedSessionReader(inner, self.retention)
        return DetachedWindowReader(inner, self.retention)


def windowed_store_shape(topology: Topology, store: str) -> WindowedStoreShape | None:
    """The shape of ``store`` when it is a window or session store; None otherwise."""
    spec = topology.stores.get(store)
    if spec is None or spec.retention_ms is None:
        return None
    retention = Retention.of(spec.retention_ms)
    if spec.session_retention_ms is not None:
        return WindowedStoreShape(store, "session", retention, None, False)
    return WindowedStoreShape(store, "window", retention, spec.window_size_ms, spec.timestamped)


def versioned_reader(
    topology: Topology, local: LocalStorePartition, isolation: IsolationLevel | None
) -> VersionedStoreReader | None:
    """An in-process reader of a versioned store's local copy (KIP-960/968 queries:
    ``get(key, as_of)``, ``versions(key, from, to)``); None when the store is not versioned."""
    spec = topology.stores.get(local.store)
    if spec is None or spec.versioned_history_ms is None:
        return None
    return VersionedStoreReader(local.open_reader(isolation), spec.versioned_history_ms)
