"""Limits that keep the query server answering when clients misbehave.

Without them, 1,109 idle sockets exhausted the process's file descriptors:
every ``/healthz`` probe failed for 30 s (a kubelet would have restarted the
pod) and asyncio logged 427,639 tracebacks. So:

* **a connection cap** (:attr:`ConnectionLimits.max_connections`): a new
  connection beyond it evicts the connection idle the longest (an idle
  keep-alive connection costs its client one reconnect; a refused probe
  costs a pod), and is refused with 503 only when every connection is in the
  middle of a request. The server never holds more sockets than the cap,
  so probes keep being accepted and answered. A connection whose request
  has arrived but is not handled yet is not idle: a burst accepted right
  after a probe would otherwise evict the probe, request and all;
* **an idle timeout**: a connection that has not sent a complete request
  within ``idle_timeout_seconds`` of opening or of its last answer is closed.
  That covers idle keep-alive connections and clients that trickle their
  headers (slowloris) alike;
* **a request timeout**: a request whose handling takes longer than
  ``request_timeout_seconds`` is aborted;
* **rate-limited log lines**: the same error is logged once, then at most
  once per :data:`LOG_REPEAT_SECONDS` with the number of repeats, never with
  a traceback flood.

Closing uses ``abort()``: ``close()`` waits to flush what a client that stops
reading never takes.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import select
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)

# The same log line at most once per this many seconds (with a count of repeats).
LOG_REPEAT_SECONDS = 10.0
# Answer to a connection refused because every slot is busy with a request.
_BUSY_BODY = b"too many connections, retry soon\n"
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: text/plain\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections the query server keeps, and for how long."""

    # Well above what probes, routers and dashboards need at once, and far
    # below the usual 1,024 file descriptors a process gets.
    max_connections: int = 256
    # Time to send a complete request after connecting or after the last answer.
    idle_timeout_seconds: float = 10.0
    # Longest a request may take, its answer's sending included.
    request_timeout_seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")

    def connection_cap(self) -> int:
        """``max_connections``, lowered to fit the process's file-descriptor limit.

        A third of the descriptors at most: the rest stay for the stores'
        files, the log, and the burst of sockets the event loop accepts in one
        go before the cap is enforced.
        """
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft // 3))


@dataclass
class _Connection:
    handler: Any  # aiohttp's RequestHandler
    since: float  # when it connected, or when its last request ended
    busy_since: float | None = None
    # A complete request head arrived and its handler has not run yet: not idle.
    request_arrived: bool = False


# What a probe path answers: (HTTP status, JSON body), or None for any other path.
ProbeAnswer = Callable[[str], "tuple[int, bytes] | None"]


@dataclass
class ConnectionGuard:
    """Wraps aiohttp's protocol factory: counts, evicts and times out connections.

    Connections are counted from the transport's own events: one is added when
    its transport connects it and removed when the transport reports it lost,
    whatever happened in between. (Counting by polling each handler's
    transport missed connections that opened and closed between two polls: a
    client making one connection per request, as ``urllib`` does, filled the
    cap with ghosts and had half its requests refused.)
    """

    limits: ConnectionLimits
    server: web.Server | None = None  # set once the app runner is set up
    # Answers liveness and readiness probes even when every slot is busy, so a
    # flood of slow requests never gets a healthy pod killed by its kubelet.
    probes: ProbeAnswer | None = None
    refused: int = 0
    evicted: int = 0
    timed_out: int = 0
    # Keyed by aiohttp's RequestHandler (hashable by identity, as aiohttp keys it too).
    _connections: dict[Any, _Connection] = field(default_factory=dict)
    _cap: int = field(init=False, default=0)  # max_connections within the fd limit

    def __post_init__(self) -> None:
        self._cap = self.limits.connection_cap()

    def factory(self) -> asyncio.Protocol:
        """What ``loop.create_server`` calls for each accepted socket."""
        busy = sum(c.busy_since is not None for c in self._connections.values())
        if busy >= self._cap:
            self.refused += 1
            _log_limited(
                logging.WARNING,
                "query server: all %d connections are busy with requests; refusing new ones "
                "with 503 (health probes are still answered)",
                self._cap,
            )
            return _OverCap(self.probes, self.limits.idle_timeout_seconds)
        assert self.server is not None, "set the guard's server before serving"
        return _Counted(self, self.server())

    def _opened(self, handler: Any) -> None:
        self._connections[handler] = _Connection(handler, time.monotonic())
        if len(self._connections) > self._cap:
            self._enforce_cap()

    def _request_arrived(self, handler: Any) -> None:
        connection = self._connections.get(handler)
        if connection is not None:
            connection.request_arrived = True

    def _closed(self, handler: Any) -> None:
        self._connections.pop(handler, None)

    def _enforce_cap(self) -> None:
        idle = sorted(
            (c for c in self._connections.values() if c.busy_since is None),
            key=lambda connection: connection.since,
        )
        for connection in idle:
            key = connection.handler
            if len(self._connections) <= self._cap:
                return
            # A request that arrived but is not read yet is not idle: a flood of
            # connections accepted after a probe (in the same batch or the next,
            # before the loop reads the probe's socket) would otherwise evict the
            # probe with its request in flight, and the kubelet sees a reset.
            if _request_waiting(connection):
                continue
            self.evicted += 1
            _log_limited(
                logging.INFO,
                "query server: %d connections open, closing the ones idle the longest",
                self._cap,
            )
            self._abort(key)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Marks a connection busy while a request is handled."""
        connection = self._connections.get(request.protocol)
        if connection is not None:
            connection.busy_since = time.monotonic()
        try:
            return await handler(request)
        finally:
            if connection is not None:
                connection.busy_since = None
                connection.request_arrived = False
                connection.since = time.monotonic()

    async def watch(self) -> None:
        """Close connections idle or busy for too long; runs until cancelled."""
        period = min(self.limits.idle_timeout_seconds, self.limits.request_timeout_seconds) / 4
        while True:
            await asyncio.sleep(max(period, 0.05))
            self.sweep()

    def sweep(self) -> None:
        now = time.monotonic()
        for key, connection in list(self._connections.items()):
            if connection.busy_since is not None:
                overdue = now - connection.busy_since > self.limits.request_timeout_seconds
            elif _request_waiting(connection):
                # Not idle either: its request is in, the loop has not run its handler
                # yet (a loaded machine, a burst accepted first). Closing it here reset
                # a kubelet's probe after the idle timeout under load.
                overdue = False
            else:
                overdue = now - connection.since > self.limits.idle_timeout_seconds
            if overdue:
                self.timed_out += 1
                self._abort(key)

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def _abort(self, key: Any) -> None:
        connection = self._connections.pop(key)
        transport = connection.handler.transport
        connection.handler.force_close()
        if transport is not None:
            transport.abort()


def _request_waiting(connection: _Connection) -> bool:
    """Whether a request (or any bytes) of this connection waits for the loop to handle it:
    such a connection is not idle, for the cap's evictions and the idle timeout alike."""
    return connection.request_arrived or _has_input(connection.handler.transport)


def _has_input(transport: asyncio.BaseTransport | None) -> bool:
    """Whether bytes (or the client's end of file) wait on this socket, not yet read."""
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None or sock.fileno() < 0:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, reporting its opening and loss to the guard.

    Everything else is passed through unchanged: aiohttp's handler stays the
    protocol that requests, middlewares and the web server know.
    """

    def __init__(self, guard: ConnectionGuard, handler: Any) -> None:
        self._guard = guard
        self._handler = handler
        self._tail = b""  # the last bytes received, for a head end split across reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._handler.connection_made(transport)
        self._guard._opened(self._handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard._closed(self._handler)
        self._handler.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" in self._tail + data[:3] or b"\r\n\r\n" in data:
            self._guard._request_arrived(self._handler)
        self._tail = data[-3:]
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return bool(self._handler.eof_received())

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()


# A request head longer than this is not a probe.
_MAX_PROBE_HEAD = 8 * 1024


class _OverCap(asyncio.Protocol):
    """A connection over the cap while every slot is busy.

    A liveness or readiness probe still gets its answer (a kubelet that sees
    probes time out restarts a healthy pod); anything else gets 503. Either
    way the connection is closed after one answer, or after the idle timeout
    if no complete request head arrives.
    """

    def __init__(self, probes: ProbeAnswer | None, idle_timeout_seconds: float) -> None:
        self._probes = probes
        self._idle_timeout_seconds = idle_timeout_seconds
        self._head = b""
        self._transport: asyncio.WriteTransport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self._transport = transport
        if self._probes is None:
            self._answer(_BUSY_RESPONSE)
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._idle_timeout_seconds, transport.abort)

    def data_received(self, data: bytes) -> None:
        self._head += data
        if b"\r\n\r\n" not in self._head and len(self._head) < _MAX_PROBE_HEAD:
            return
        request_line = self._head.split(b"\r\n", 1)[0].split()
        answer = None
        if len(request_line) == 3 and request_line[0] == b"GET" and self._probes is not None:
            answer = self._probes(request_line[1].decode("latin-1"))
        if answer is None:
            self._answer(_BUSY_RESPONSE)
            return
        status, body = answer
        reason = b"OK" if status == 200 else b"Service Unavailable"
        self._answer(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (status, reason, len(body), body)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _answer(self, response: bytes) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(response)
            self._transport.close()


# -- rate-limited log lines ------------------------------------------------------------


@dataclass
class _Seen:
    last_logged: float
    repeats: int = 0


_seen: dict[tuple[str, str], _Seen] = {}


def _should_log(origin: str, message: str) -> tuple[bool, int]:
    """(log it now, how many identical lines were dropped since the last one)."""
    now = time.monotonic()
    seen = _seen.get((origin, message))
    if seen is None:
        if len(_seen) > 1_000:  # a flood of distinct messages: start over, stay bounded
            _seen.clear()
        _seen[(origin, message)] = _Seen(now)
        return True, 0
    if now - seen.last_logged >= LOG_REPEAT_SECONDS:
        repeats, seen.repeats, seen.last_logged = seen.repeats, 0, now
        return True, repeats
    seen.repeats += 1
    return False, 0


def _log_limited(level: int, message: str, *args: object) -> None:
    log, repeats = _should_log(__name__, message)
    if log:
        suffix = f" (and {repeats} more times in the last {LOG_REPEAT_SECONDS:.0f} s)"
        logger.log(level, message + (suffix if repeats else ""), *args)


class RepeatedLogFilter(logging.Filter):
    """Lets a logger's identical lines through once per LOG_REPEAT_SECONDS, counting repeats.

    A repeat that gets through keeps its message but not its traceback: the
    first occurrence printed it already.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        log, repeats = _should_log(record.name, str(record.msg))
        if log and repeats:
            record.msg = f"{record.msg} (and {repeats} more times in the last "
            record.msg += f"{LOG_REPEAT_SECONDS:.0f} s)"
            record.exc_info = None
            record.exc_text = None
        return log


def install_log_limits(loop: asyncio.AbstractEventLoop) -> None:
    """Rate-limit the loop's unhandled errors and aiohttp's per-request error lines."""

    def on_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        failure = context.get("exception")
        if isinstance(failure, OSError) and failure.errno in (errno.EMFILE, errno.ENFILE):
            # Expected while a flood of sockets is being cut down to the cap: one line.
            _log_limited(
                logging.WARNING,
                "query server: out of file descriptors accepting a connection (%s); idle "
                "connections are being closed",
                failure.strerror,
            )
            return
        log, repeats = _should_log("asyncio", str(context.get("message", "")))
        if not log:
            return
        if repeats:
            context = {key: value for key, value in context.items() if key not in ("exception",)}
            context["message"] = (
                f"{context.get('message', '')} (and {repeats} more times in the last "
                f"{LOG_REPEAT_SECONDS:.0f} s)"
            )
        loop.default_exception_handler(context)

    loop.set_exception_handler(on_error)
    server_logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, RepeatedLogFilter) for f in server_logger.filters):
        server_logger.addFilter(RepeatedLogFilter())
