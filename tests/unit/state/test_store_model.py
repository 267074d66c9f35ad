"""Model-based tests: random put/delete/commit/close/reopen/crash against a dict model.

The store runs in a worker process so that "crash" can be a real SIGKILL:
RocksDB's memtables die with the process, exactly as in production. Each
commit's changelog offset advances by the number of writes it holds, as a
changelog would. The properties:

* the owner always sees its own writes (gets and every ordered scan);
* READ_COMMITTED readers never see uncommitted data; READ_UNCOMMITTED ones do;
* after close + reopen, the store is exactly the last commit;
* after a crash, the store is exactly the state of *some* commit, its
  committed offset names that commit, and it is no further behind the last
  acknowledged commit than the durability bound allows; uncommitted writes
  never reappear.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.state import (
    DurabilityBound,
    RocksDBStore,
    RocksDBStoreOptions,
    TopicPartition,
)

CHANGELOG = TopicPartition("model-changelog", 0)
keys = st.binary(max_size=2)  # small: overwrites, empty keys and 0xff bytes are common
values = st.binary(max_size=6)


def _serve(connection: Connection, directory: str, max_records: int) -> None:
    """Worker process: own one store, execute commands sent over the pipe."""
    store = RocksDBStore(
        "model",
        directory,
        RocksDBStoreOptions(durability=DurabilityBound(max_records=max_records, max_seconds=3600)),
    )
    connection.send(store.committed_offset(CHANGELOG))
    committed = store.reader(IsolationLevel.READ_COMMITTED)
    uncommitted = store.reader(IsolationLevel.READ_UNCOMMITTED)
    handlers: dict[str, Callable[..., Any]] = {
        "put": store.put,
        "delete": store.delete,
        "commit": lambda offset: store.commit({CHANGELOG: offset}),
        "get": store.get,
        "all": lambda: list(store.all()),
        "prefix": lambda prefix: list(store.prefix_scan(prefix)),
        "range": lambda low, high: list(store.range(low, high)),
        "committed_all": lambda: list(committed.all()),
        "committed_get": committed.get,
        "uncommitted_all": lambda: list(uncommitted.all()),
        "uncommitted_bytes": store.approximate_num_uncommitted_bytes,
    }
    while True:
        command, args = connection.recv()
        if command == "close":
            store.close()
            connection.send(None)
            return
        connection.send(handlers[command](*args))


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="eddyline-model-")
        self.committed: dict[bytes, bytes] = {}
        self.pending: dict[bytes, bytes | None] = {}
        # offset -> the data as of that commit; None is "before any commit".
        self.history: dict[int | None, dict[bytes, bytes]] = {None: {}}
        self.last_offset: int | None = None
        self.worker: multiprocessing.process.BaseProcess | None = None
        self.connection: Connection | None = None

    @initialize(max_records=st.sampled_from([0, 3, 10, 10_000]))
    def start(self, max_records: int) -> None:
        self.max_records = max_records
        assert self._start_worker() is None

    def _start_worker(self) -> int | None:
        context = multiprocessing.get_context("fork")
        parent, child = context.Pipe()
        self.worker = context.Process(
            target=_serve, args=(child, self.directory, self.max_records), daemon=True
        )
        self.worker.start()
        child.close()
        self.connection = parent
        offset: int | None = parent.recv()
        return offset

    def call(self, command: str, *args: Any) -> Any:
        assert self.connection is not None
        self.connection.send((command, args))
        return self.connection.recv()

    def view(self) -> dict[bytes, bytes]:
        merged = dict(self.committed)
        for key, value in self.pending.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return merged

    @rule(key=keys, value=values)
    def put(self, key: bytes, value: bytes) -> None:
        self.call("put", key, value)
        self.pending[key] = value

    @rule(key=keys)
    def delete(self, key: bytes) -> None:
        self.call("delete", key)
        self.pending[key] = None

    @rule()
    def commit(self) -> None:
        offset = (self.last_offset if self.last_offset is not None else -1) + max(
            len(self.pending), 1
        )
        self.call("commit", offset)
        self.committed = self.view()
        self.pending = {}
        self.last_offset = offset
        self.history[offset] = dict(self.committed)

    @rule()
    def close_and_reopen(self) -> None:
        self.call("close")
        assert self.worker is not None
        self.worker.join()
        assert self._start_worker() == self.last_offset
        self.pending = {}

    @rule()
    def crash_and_reopen(self) -> None:
        assert self.worker is not None and self.worker.pid is not None
        os.kill(self.worker.pid, signal.SIGKILL)
        self.worker.join()
        recovered = self._start_worker()
        assert recovered in self.history, f"offset {recovered} was never committed"
        if self.last_offset is not None:
            floor = self.last_offset - self.max_records
            assert (recovered if recovered is not None else -1) >= floor, (
                f"reopened at {recovered}, more than {self.max_records} records behind "
                f"{self.last_offset}"
            )
        # Commits after the recovered one are gone from the store (the changelog
        # would replay them); the model continues from what the store holds.
        self.committed = dict(self.history[recovered])
        self.history = {
            k: v
            for k, v in self.history.items()
            if k is None or (recovered is not None and k <= recovered)
        }
        self.last_offset = recovered
        self.pending = {}
        assert self.call("all") == sorted(self.committed.items())

    @rule(key=keys)
    def owner_get(self, key: bytes) -> None:
        assert self.call("get", key) == self.view().get(key)

    @rule(key=keys)
    def committed_reader_get(self, key: bytes) -> None:
        assert self.call("committed_get", key) == self.committed.get(key)

    @rule(prefix=st.binary(max_size=1))
    def owner_prefix_scan(self, prefix: bytes) -> None:
        expected = sorted((k, v) for k, v in self.view().items() if k.startswith(prefix))
        assert self.call("prefix", prefix) == expected

    @rule(low=st.none() | keys, high=st.none() | keys)
    def owner_range(self, low: bytes | None, high: bytes | None) -> None:
        expected = sorted(
            (k, v)
            for k, v in self.view().items()
            if (low is None or k >= low) and (high is None or k <= high)
        )
        assert self.call("range", low, high) == expected

    @precondition(lambda self: self.connection is not None)
    @invariant()
    def scans_match_the_model(self) -> None:
        assert self.call("all") == sorted(self.view().items())
        assert self.call("committed_all") == sorted(self.committed.items())
        assert self.call("uncommitted_all") == sorted(self.view().items())
        buffered = sum(len(k) + len(v or b"") for k, v in self.pending.items())
        assert self.call("uncommitted_bytes") == buffered

    def teardown(self) -> None:
        if self.worker is not None and self.worker.pid is not None and self.worker.is_alive():
            os.kill(self.worker.pid, signal.SIGKILL)
            self.worker.join()
        shutil.rmtree(Path(self.directory), ignore_errors=True)


TestStoreModel = StoreModel.TestCase
TestStoreModel.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # Every replay starts worker processes; the explain phase would replay
    # hundreds of times after a failure, and the shrunk example says enough.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
