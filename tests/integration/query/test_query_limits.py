"""The query server under misbehaving clients: real sockets, a real server, real limits.

Idle sockets beyond the connection cap are closed (the idlest first), idle
and header-trickling clients are dropped after the idle timeout, and
``/healthz`` keeps answering throughout, also in an ``eddyline run`` process
whose file descriptors would otherwise run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from eddyline_runtime.engine.instance import StreamsInstance
from eddyline_runtime.log import SqliteLog
from eddyline_runtime.query.limits import ConnectionGuard, ConnectionLimits, _Connection
from eddyline_runtime.query.server import QueryServer
from tests.support.example_run import eddyline_run, example_manifest
from tests.support.http_client import http_get
from tests.support.waiting import wait_for
from tests.support.word_count import streams_config, word_count

StreamPair = tuple[asyncio.StreamReader, asyncio.StreamWriter]
LIMITS = ConnectionLimits(max_connections=20, idle_timeout_seconds=0.5)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[QueryServer]:
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("lines", 1)
    instance = StreamsInstance(word_count(), streams_config(tmp_path / "state"), log)
    served = QueryServer(instance, "127.0.0.1", 0, limits=LIMITS)
    served.start()
    try:
        yield served
    finally:
        served.stop()
        instance.close(30)
        log.close()


def address_of(server: QueryServer) -> tuple[str, int]:
    assert server.address is not None
    return server.address.host, server.address.port


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server closed this socket (a read returns end of file or a reset)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def seconds_until_closed(sock: socket.socket, limit: float) -> float:
    started = time.monotonic()
    sock.settimeout(limit)
    try:
        data = sock.recv(1024)
    except TimeoutError:
        return float("inf")
    except ConnectionResetError:
        data = b""
    assert data == b"", data
    return time.monotonic() - started


def test_idle_connections_beyond_the_cap_are_closed_and_healthz_still_answers(
    server: QueryServer,
) -> None:
    sockets = [socket.create_connection(address_of(server)) for _ in range(100)]
    try:
        wait_for(
            lambda: sum(closed_by_server(s) for s in sockets) >= 100 - LIMITS.max_connections,
            "the server closes the connections over its cap",
            timeout=5,
        )
        assert server.guard.open_connections <= LIMITS.max_connections
        # The oldest idle ones went first: the newest are still open.
        assert not any(closed_by_server(s) for s in sockets[-5:])
        for _ in range(5):
            assert http_get(str(server.address), "/healthz").status == 200
            # Not started: not ready, and it says so promptly.
            assert http_get(str(server.address), "/readyz").json()["ready"] is False
    finally:
        for sock in sockets:
            sock.close()


def test_a_probe_followed_by_a_burst_of_connections_is_answered_not_evicted(
    server: QueryServer,
) -> None:
    # The probe's request is sent before the burst, but the server accepts
    # the burst (more connections than its cap) before it reads the probe's
    # socket: the probe is the oldest connection then, yet it is not idle.
    failures = []
    for attempt in range(10):
        with socket.create_connection(address_of(server)) as probe:
            probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            burst = [
                socket.create_connection(address_of(server))
                for _ in range(3 * LIMITS.max_connections)
            ]
            probe.settimeout(5)
            try:
                answer = probe.recv(64)
            except OSError as error:
                answer = repr(error).encode()
            for sock in burst:
                sock.close()
        if not answer.startswith(b"HTTP/1.1 200"):
            failures.append(f"probe {attempt}: {answer!r}")
    assert failures == []
    assert server.guard.evicted > 0  # the burst did go over the cap
    # Accepted in order: once a last probe is answered, every burst socket was
    # accepted; once none is counted, each was closed, and stopping the server
    # leaves no transport of the burst half made.
    assert http_get(str(server.address), "/healthz").status == 200
    wait_for(lambda: server.guard.open_connections == 0, "the burst's connections close")


def test_a_connection_that_sends_nothing_is_closed_after_the_idle_timeout(
    server: QueryServer,
) -> None:
    with socket.create_connection(address_of(server)) as sock:
        waited = seconds_until_closed(sock, limit=5)
    assert LIMITS.idle_timeout_seconds * 0.8 <= waited < LIMITS.idle_timeout_seconds + 1.5


def test_a_client_that_trickles_its_headers_is_closed_after_the_idle_timeout(
    server: QueryServer,
) -> None:
    with socket.create_connection(address_of(server)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        closed_after = float("inf")
        while time.monotonic() - started < 5:
            try:
                sock.sendall(b"X-Slow: 1\r\n")  # never the blank line that ends the headers
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            if closed_by_server(sock):
                closed_after = time.monotonic() - started
                break
            sock.setblocking(True)
            time.sleep(0.1)
    assert closed_after < LIMITS.idle_timeout_seconds + 1.5


def test_a_keep_alive_connection_is_closed_once_idle_after_its_answer(
    server: QueryServer,
) -> None:
    with socket.create_connection(address_of(server)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        waited = seconds_until_closed(sock, limit=5)
    assert waited < LIMITS.idle_timeout_seconds + 1.5


# -- a real `eddyline run` process with few file descriptors -----------------------------

# Fewer descriptors than the sockets the test opens, more than the default cap needs.
SERVER_DESCRIPTORS = 400
IDLE_SOCKETS = 600


def limit_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SERVER_DESCRIPTORS, SERVER_DESCRIPTORS))


@pytest.mark.slow
def test_an_eddyline_run_keeps_answering_probes_when_idle_sockets_outnumber_its_descriptors(
    tmp_path: Path,
) -> None:
    manifest, address = example_manifest(tmp_path, "custom_processor", "custom_processor")
    port = int(address.rpartition(":")[2])
    log = SqliteLog(tmp_path / "log.db")
    log.create_topic("events", 1)
    log.close()
    sockets: list[socket.socket] = []
    with eddyline_run(manifest, address, preexec_fn=limit_descriptors) as run:
        try:
            wait_for(
                lambda: http_get(address, "/healthz").status == 200, "the instance serves /healthz"
            )
            for _ in range(IDLE_SOCKETS):
                sock = socket.socket()
                sock.setblocking(False)
                sock.connect_ex(("127.0.0.1", port))
                sockets.append(sock)
            failures = []
            for attempt in range(10):
                started = time.monotonic()
                response = http_get(address, "/healthz")
                if response.status != 200:
                    failures.append(
                        f"probe {attempt}: {response.status} {response.text!r} after "
                        f"{time.monotonic() - started:.1f} s"
                    )
                time.sleep(0.2)
            assert failures == [], f"{failures}\n{run.output()[-3000:]}"
        finally:
            for sock in sockets:
                sock.close()
    assert len(run.output().splitlines()) < 50, run.output()[-3000:]


# -- every slot busy, and a request that runs too long -----------------------------------


@contextlib.asynccontextmanager
async def guarded_server(
    guard: ConnectionGuard, slow_seconds: float
) -> AsyncIterator[tuple[int, asyncio.AbstractEventLoop]]:
    """A real aiohttp app behind ``guard`` whose one route, /slow, takes ``slow_seconds``."""

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(slow_seconds)
        return web.Response(text="done")

    app = web.Application(middlewares=[guard.middleware])
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    assert runner.server is not None
    guard.server = runner.server
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(guard.factory, "127.0.0.1", 0)
    watch = loop.create_task(guard.watch())
    try:
        yield listener.sockets[0].getsockname()[1], loop
    finally:
        watch.cancel()
        listener.close()
        await runner.cleanup()


async def busy_with_slow_requests(port: int, count: int) -> list[StreamPair]:
    """``count`` connections each in the middle of a /slow request."""
    busy = [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)]
    for _, writer in busy:
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
    await asyncio.sleep(0.3)  # the requests are being handled
    return busy


async def answer_to(port: int, path: bytes) -> bytes:
    """What a new connection asking for ``path`` is answered before the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


def test_with_every_slot_busy_a_new_connection_gets_503_and_long_requests_are_aborted() -> None:
    """The guard in front of a real aiohttp app whose one route takes 3 s."""
    limits = ConnectionLimits(max_connections=2, request_timeout_seconds=1.0)

    async def scenario() -> tuple[list[bytes], bytes, float]:
        async with guarded_server(ConnectionGuard(limits), 3) as (port, loop):
            busy = await busy_with_slow_requests(port, 2)
            refused = await answer_to(port, b"/slow")
            started = loop.time()
            answers = [await asyncio.wait_for(r.read(), 5) for r, _ in busy]
            aborted_after = loop.time() - started + 0.3
            for _, busy_writer in busy:
                busy_writer.close()
            return answers, refused, aborted_after

    answers, refused, aborted_after = asyncio.run(scenario())
    assert refused.startswith(b"HTTP/1.1 503"), refused
    assert b"too many connections" in refused
    assert answers == [b"", b""]  # cut off without an answer, not served after 3 s
    assert aborted_after < 2.5


def test_with_every_slot_busy_health_probes_are_still_answered() -> None:
    """Probes stay outside the cap: a kubelet must not kill a pod whose slots are all busy."""
    limits = ConnectionLimits(max_connections=1, request_timeout_seconds=5.0)

    def probes(path: str) -> tuple[int, bytes] | None:
        return (200, b'{"status": "ok"}') if path == "/healthz" else None

    async def scenario() -> tuple[bytes, bytes]:
        async with guarded_server(ConnectionGuard(limits, probes=probes), 2) as (port, _):
            busy = await busy_with_slow_requests(port, 1)
            probe, other = await answer_to(port, b"/healthz"), await answer_to(port, b"/slow")
            for _, busy_writer in busy:
                busy_writer.close()
            return probe, other

    probe, other = asyncio.run(scenario())
    assert probe.startswith(b"HTTP/1.1 200"), probe
    assert probe.endswith(b'{"status": "ok"}'), probe
    assert other.startswith(b"HTTP/1.1 503"), other


class _UnreadHandler:
    """What the guard needs of aiohttp's RequestHandler, for a connection whose handler the
    loop has not run yet; records whether the guard closed it."""

    transport = None

    def __init__(self) -> None:
        self.closed = False

    def force_close(self) -> None:
        self.closed = True


def test_a_request_the_loop_has_not_handled_yet_is_not_timed_out_as_idle() -> None:
    # Under load the loop may take longer than the idle timeout between reading a request
    # and running its handler: that connection is not idle (the full suite at load 20 had
    # a probe closed with its request unanswered). One that sent nothing is.
    guard = ConnectionGuard(LIMITS)
    waiting, silent = _UnreadHandler(), _UnreadHandler()
    long_ago = time.monotonic() - 10 * LIMITS.idle_timeout_seconds
    guard._connections[waiting] = _Connection(waiting, long_ago, request_arrived=True)
    guard._connections[silent] = _Connection(silent, long_ago)
    guard.sweep()
    assert (waiting.closed, silent.closed) == (False, True)
    assert guard.open_connections == 1
