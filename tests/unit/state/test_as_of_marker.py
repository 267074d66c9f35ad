"""A store closed cleanly keeps how current it was for its next open (state/as_of_marker.py);
one killed mid-run, changed since, or with a torn file reopens not knowing: never a time
too new. The store runs in a worker process, so "killed" is a real SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from eddyline_runtime.state import RocksDBStore
from eddyline_runtime.state.as_of_marker import AS_OF_FILE_NAME, take_as_of, write_as_of
from tests.unit.state.store_worker import CHANGELOG, Zygote

# A worker that answers nothing for this long is stuck, not slow.
WORKER_TIMEOUT_SECONDS = 30
T1, T2 = 1_795_000_000_000, 1_795_000_009_000


class Worker:
    """One process owning the store in ``directory``, driven over a pipe."""

    def __init__(self, directory: Path) -> None:
        self.pid, self.connection = Zygote.shared().start_worker(str(directory), 10_000)
        self.opened_at_offset = self._receive()

    def call(self, command: str, *args: Any) -> Any:
        self.connection.send((command, args))
        return self._receive()

    def _receive(self) -> Any:
        if not self.connection.poll(WORKER_TIMEOUT_SECONDS):
            raise AssertionError(f"store worker silent for {WORKER_TIMEOUT_SECONDS} s")
        return self.connection.recv()

    def kill(self) -> None:
        """SIGKILL, and wait until the process (and its store lock) is gone."""
        os.kill(self.pid, signal.SIGKILL)
        _drain(self.connection)
        deadline = time.monotonic() + WORKER_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.001)
        raise AssertionError(f"store worker {self.pid} did not exit")

    def close(self) -> None:
        self.call("close")
        self.connection.close()


def _drain(connection: Connection) -> None:
    with contextlib.suppress(EOFError, ConnectionResetError, OSError):
        while connection.poll(WORKER_TIMEOUT_SECONDS):
            connection.recv()
    connection.close()


def test_a_clean_close_keeps_the_time_and_a_kill_leaves_none(tmp_path: Path) -> None:
    first = Worker(tmp_path)
    first.call("put", b"k", b"v1")
    first.call("commit", 4)
    first.call("note_as_of", T1)
    first.close()
    assert (tmp_path / AS_OF_FILE_NAME).exists()
    # Reopened: as current as at the close; the file is read once and gone.
    second = Worker(tmp_path)
    assert second.opened_at_offset == 4
    assert second.call("recorded_as_of") == T1
    assert not (tmp_path / AS_OF_FILE_NAME).exists()
    # A run that commits more and is killed, with a newer time noted but never closed:
    # the next open knows nothing (the earlier file was taken by the open before).
    second.call("put", b"k", b"v2")
    second.call("commit", 9)
    second.call("note_as_of", T2)
    second.kill()
    third = Worker(tmp_path)
    assert third.opened_at_offset == 9
    assert third.call("recorded_as_of") is None
    third.close()
    assert not (tmp_path / AS_OF_FILE_NAME).exists()  # nothing noted: nothing kept


def test_a_killed_run_after_a_clean_open_does_not_revive_the_older_time(
    tmp_path: Path,
) -> None:
    first = Worker(tmp_path)
    first.call("commit", 4)
    first.call("note_as_of", T1)
    first.close()
    # Opened (taking the file) and killed before any commit: the data is still at 4, but
    # the file is gone, so the next open cannot tell (conservative, never wrong).
    second = Worker(tmp_path)
    assert second.call("recorded_as_of") == T1
    second.kill()
    third = Worker(tmp_path)
    assert third.call("recorded_as_of") is None
    third.close()


def test_a_file_whose_offsets_are_not_the_store_s_or_that_is_torn_is_ignored(
    tmp_path: Path,
) -> None:
    store = RocksDBStore("model", tmp_path)
    store.commit({CHANGELOG: 7})
    store.close()
    # Offsets other than the committed ones (the store changed after the file was
    # written): not trusted.
    write_as_of(tmp_path, {CHANGELOG: 6}, T1)
    reopened = RocksDBStore("model", tmp_path)
    assert reopened.recorded_as_of_ms is None
    reopened.close()
    for torn in ('{"as_of_ms": 17950', "", "not json", '{"as_of_ms": 1}'):
        (tmp_path / AS_OF_FILE_NAME).write_text(torn, encoding="utf-8")
        assert take_as_of(tmp_path, {CHANGELOG: 7}) is None
        assert not (tmp_path / AS_OF_FILE_NAME).exists()
    write_as_of(tmp_path, {CHANGELOG: 7}, T1)
    assert take_as_of(tmp_path, {CHANGELOG: 7}) == T1
