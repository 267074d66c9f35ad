"""A store owned by a worker process, driven over a pipe: lets tests SIGKILL the owner.

Workers are forked by a *zygote*: a clean interpreter that has imported
eddyline but never opened RocksDB. Forking the test process itself would copy
RocksDB's global background-thread pool without its threads (earlier tests
started them), and the child's first flush would wait forever; spawning a
fresh interpreter per worker costs ~0.2 s of imports each time.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.state import (
    DurabilityBound,
    RocksDBStore,
    RocksDBStoreOptions,
    TopicPartition,
)

CHANGELOG = TopicPartition("model-changelog", 0)


def serve_store(connection: Connection, directory: str, max_records: int) -> None:
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
        "note_as_of": store.note_as_of,
        "recorded_as_of": lambda: store.recorded_as_of_ms,
    }
    while True:
        command, args = connection.recv()
        if command == "close":
            store.close()
            connection.send(None)
            return
        connection.send(handlers[command](*args))


class Zygote:
    """Forks store workers on request; one per test session."""

    _instance: Zygote | None = None

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, __file__, "--zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._socket_dir = tempfile.mkdtemp(prefix="eddyline-zygote-")
        self._count = 0
        atexit.register(self._process.kill)

    @classmethod
    def shared(cls) -> Zygote:
        if cls._instance is None or cls._instance._process.poll() is not None:
            cls._instance = cls()
        return cls._instance

    def start_worker(self, directory: str, max_records: int) -> tuple[int, Connection]:
        """A new worker owning the store in ``directory``: its pid and a connection to it."""
        self._count += 1
        address = os.path.join(self._socket_dir, f"w{self._count}")
        with Listener(address, family="AF_UNIX") as listener:
            assert self._process.stdin is not None and self._process.stdout is not None
            self._process.stdin.write(f"{directory}\t{max_records}\t{address}\n")
            self._process.stdin.flush()
            pid = int(self._process.stdout.readline())
            connection = listener.accept()
        return pid, connection


def _zygote_main() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps killed workers
    for line in sys.stdin:
        directory, max_records, address = line.rstrip("\n").split("\t")
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                serve_store(Client(address, family="AF_UNIX"), directory, int(max_records))
            finally:
                os._exit(0)
        print(pid, flush=True)


if __name__ == "__main__":
    _zygote_main()
