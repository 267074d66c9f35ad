"""Start a worker script many times without paying its imports each time.

A crash test starts its worker, SIGKILLs it and starts it again, tens of times;
each start of ``python worker.py`` spent ~0.3 s importing the runtime (a quarter
of the worker's CPU in ``test_exactly_once_crash.py``). A :class:`ForkServer`
imports the script once (as a module, so its ``main()`` does not run), waits, and
forks a child per start: each child is a real process of its own (its own pid,
SIGKILLed at whatever instant the test picks, its files and RocksDB handles
opened by itself after the fork) that runs the script's ``main()`` with the
arguments given, its stderr appended to a file, and exits as the script would.

The server never reaps a child until the test asks (``poll``/``wait``), so a
dead child's pid stays a zombie, never reused, until the test has seen its exit:
a SIGKILL aimed at it can never hit another process.

What differs from a fresh interpreter: the children share the server's hash
seed (``PYTHONHASHSEED``) and the modules' import-time state; ``random`` is
reseeded in each child by Python itself.

Protocol (one JSON object a line; requests on the server's stdin, answers on
its stdout): ``{"start": [args], "stderr": path}`` → ``{"pid": n}``;
``{"poll": pid}`` and ``{"wait": pid}`` → ``{"returncode": n or null}``
(``wait`` blocks until the child exits). End of input ends the server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any


class ForkServerError(RuntimeError):
    """The fork server died or answered something it should not have."""


class ForkServer:
    """A process that imported ``script`` (and ``preload``) and forks a child per start."""

    def __init__(
        self,
        script: Path,
        *,
        preload: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        stderr: Path,
    ) -> None:
        with stderr.open("ab") as errors:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.forkserver", str(script), *preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                env=dict(env) if env is not None else None,
                cwd=Path(__file__).resolve().parents[2],  # `tests.support` imports from here
            )
        self._lock = threading.Lock()
        self.stderr = stderr

    def start(self, args: Sequence[str], *, stderr: Path) -> ForkedProcess:
        """Fork a child that runs the script's ``main()`` with ``args`` as ``sys.argv[1:]``."""
        answer = self._ask({"start": list(args), "stderr": str(stderr)})
        return ForkedProcess(self, int(answer["pid"]))

    def close(self) -> None:
        """End the server (its children are the caller's to have ended first)."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        with self._lock:
            try:
                stdin.write(json.dumps(request).encode() + b"\n")
                stdin.flush()
                line = stdout.readline()
            except (BrokenPipeError, ValueError) as error:
                raise ForkServerError(self._died()) from error
        if not line:
            raise ForkServerError(self._died())
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise ForkServerError(f"the fork server refused {request}: {answer['error']}")
        return answer

    def _died(self) -> str:
        tail = self.stderr.read_text(errors="replace")[-3_000:] if self.stderr.exists() else ""
        return f"the fork server ended (returncode {self._process.poll()}); its stderr:\n{tail}"


class ForkedProcess:
    """A child of a :class:`ForkServer`, with the part of ``subprocess.Popen``'s
    interface crash tests use; ``returncode`` is ``-signal`` after a signal, as there."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server._ask({"poll": self.pid})["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001  # a killed child is seen at once; a long run costs few polls
        while (returncode := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout or 0.0)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        return returncode

    def send_signal(self, sig: int) -> None:
        # Safe while returncode is None: the server reaps only when asked, so the
        # pid is this child's (running or a zombie) until poll() has seen it exit.
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# -- the server ------------------------------------------------------------------------


def _load(script: Path) -> ModuleType:
    """Import ``script`` as a module named after its file (its ``main()`` not run)."""
    spec = importlib.util.spec_from_file_location(script.stem, script)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {script}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[script.stem] = module
    spec.loader.exec_module(module)
    return module


def _run_child(
    module: ModuleType, script: Path, args: list[str], stderr: str, server_fds: Sequence[int]
) -> None:
    """In the forked child: become ``python script args...`` and never return."""
    code = 1
    try:
        for fd in server_fds:  # the protocol's pipes are the server's, not the child's
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDWR)
        errors = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(errors, 2)
        os.close(devnull)
        os.close(errors)
        sys.stdout = sys.__stdout__
        sys.argv = [str(script), *args]
        try:
            module.main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if not isinstance(exit_.code, int | None):
                print(exit_.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        # What the interpreter does at exit: wait for non-daemon threads, run atexit.
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _returncode(pid: int, *, block: bool) -> int | None:
    done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    return os.waitstatus_to_exitcode(status) if done else None


def serve(script: Path, preload: Sequence[str], requests: IO[bytes], answers: IO[bytes]) -> None:
    module = _load(script)
    for name in preload:
        importlib.import_module(name)
    children: set[int] = set()

    def answer(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message).encode() + b"\n")
        answers.flush()

    while line := requests.readline():
        request = json.loads(line)
        try:
            if "start" in request:
                if threading.active_count() > 1:  # a fork copies no thread but this one
                    raise ValueError(f"the server runs threads: {threading.enumerate()}")
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    fds = (requests.fileno(), answers.fileno())
                    _run_child(module, script, request["start"], request["stderr"], fds)
                children.add(pid)
                answer({"pid": pid})
            elif "poll" in request or "wait" in request:
                pid = request.get("poll", request.get("wait"))
                if pid not in children:
                    raise ValueError(f"pid {pid} is not a child of this server, or was reaped")
                returncode = _returncode(pid, block="wait" in request)
                if returncode is not None:
                    children.discard(pid)
                answer({"returncode": returncode})
            else:
                raise ValueError(f"unknown request {request}")
        except (OSError, ValueError) as error:
            answer({"error": str(error)})
    for pid in children:  # the caller left some running: end them with the server
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def main() -> None:
    script, preload = Path(sys.argv[1]), sys.argv[2:]
    # The protocol owns fds 0 and 1; anything the script prints goes to stderr.
    requests, answers = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(script, preload, requests, answers)


if __name__ == "__main__":
    main()
