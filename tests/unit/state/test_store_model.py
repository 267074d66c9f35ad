"""Model-based tests: random put/delete/commit/close/reopen/crash against a dict model.

The store runs in a worker process so that "crash" can be a real SIGKILL:
RocksDB's memtables die with the process, exactly as in production. Each
commit's changelog offset advances by the number of writes it holds, as a
changelog would. The properties:

* the owner always sees its own writes (gets and every ordered scan);
* READ_COMMITTED readers never see uncommitted data; READ_UNCOMMITTED ones do;
* after close + reopen, the store is exactly the last commit;
* after a crash (SIGKILL of the owner), the store is exactly its last commit,
  and its committed offset names that commit; uncommitted writes never
  reappear. The durability bound (drawn per example) only changes when the
  log is synced, which must not change any of this.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
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

from tests.unit.state.store_worker import Zygote

# A worker that answers nothing for this long is stuck, not slow.
WORKER_TIMEOUT_SECONDS = 30
keys = st.binary(max_size=2)  # small: overwrites, empty keys and 0xff bytes are common
values = st.binary(max_size=6)


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="eddyline-model-")
        self.committed: dict[bytes, bytes] = {}
        self.pending: dict[bytes, bytes | None] = {}
        self.last_offset: int | None = None
        self.worker_pid: int | None = None
        self.connection: Connection | None = None

    @initialize(max_records=st.sampled_from([0, 3, 10, 10_000]))
    def start(self, max_records: int) -> None:
        self.max_records = max_records
        assert self._start_worker() is None

    def _start_worker(self) -> int | None:
        self.worker_pid, self.connection = Zygote.shared().start_worker(
            self.directory, self.max_records
        )
        offset: int | None = self._receive()
        return offset

    def _kill_worker(self) -> None:
        """SIGKILL the worker and wait until it is gone (its store lock with it)."""
        assert self.connection is not None and self.worker_pid is not None
        os.kill(self.worker_pid, signal.SIGKILL)
        with contextlib.suppress(EOFError, ConnectionResetError):
            while self.connection.poll(WORKER_TIMEOUT_SECONDS):
                self.connection.recv()
        self._forget_worker()

    def _forget_worker(self) -> None:
        """Close our end and wait until the worker process no longer exists."""
        assert self.connection is not None and self.worker_pid is not None
        self.connection.close()
        deadline = time.monotonic() + WORKER_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            try:
                os.kill(self.worker_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.001)
        else:
            raise AssertionError(f"store worker {self.worker_pid} did not exit")
        self.connection = None
        self.worker_pid = None

    def call(self, command: str, *args: Any) -> Any:
        assert self.connection is not None
        self.connection.send((command, args))
        return self._receive()

    def _receive(self) -> Any:
        assert self.connection is not None
        if not self.connection.poll(WORKER_TIMEOUT_SECONDS):
            raise AssertionError(f"store worker silent for {WORKER_TIMEOUT_SECONDS} s")
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

    @rule()
    def close_and_reopen(self) -> None:
        self.call("close")
        self._forget_worker()
        assert self._start_worker() == self.last_offset
        self.pending = {}

    @rule()
    def crash_and_reopen(self) -> None:
        self._kill_worker()
        recovered = self._start_worker()
        # A process crash loses no acknowledged commit (the log is written,
        # unsynced, before commit returns) and keeps nothing uncommitted.
        assert recovered == self.last_offset
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
        if self.connection is not None:
            self._kill_worker()
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
