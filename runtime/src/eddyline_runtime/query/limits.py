"""Limits that keep the query server answering when clients misbehave.

Without them, 1,109 idle sockets exhausted the process's file descriptors:
every ``/healthz`` probe failed for 30 s (a kubelet would have restarted the
pod) and asyncio logged 427,639 tracebacks. So:

* **a connection cap** (:attr:`ConnectionLimits.max_connections`): a new
  connection beyond it evicts the connection idle the longest (an idle
  keep-alive connection costs its client one reconnect; a refused probe
  costs a pod), and is refused with 503 only when every connection is in the
  middle of a request. The server never holds more sockets than the cap,
  so probes keep being accepted and answered;
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
    # The loop connects a protocol a moment after the factory returns it.
    connected: bool = False


@dataclass
class ConnectionGuard:
    """Wraps aiohttp's protocol factory: counts, evicts and times out connections."""

    limits: ConnectionLimits
    server: web.Server | None = None  # set once the app runner is set up
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
        self._forget_closed()
        busy = sum(c.busy_since is not None for c in self._connections.values())
        if busy >= self._cap:
            self.refused += 1
            _log_limited(
                logging.WARNING,
                "query server: all %d connections are busy with requests; refusing new ones "
                "with 503",
                self._cap,
            )
            return _Refuse()
        assert self.server is not None, "set the guard's server before serving"
        handler = self.server()
        self._connections[handler] = _Connection(handler, time.monotonic())
        if len(self._connections) > self._cap:
            # The loop connects this protocol (and those accepted just before it)
            # right after: evict once they are connected, so an abort reaches them.
            asyncio.get_running_loop().call_soon(self._enforce_cap)
        return handler

    def _enforce_cap(self) -> None:
        self._forget_closed()
        while len(self._connections) > self._cap:
            idle = [
                (c.since, key)
                for key, c in self._connections.items()
                if c.busy_since is None and c.handler.transport is not None
            ]
            if not idle:
                return  # every one is busy: the request timeout will free slots
            _, key = min(idle)
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
                connection.since = time.monotonic()

    async def watch(self) -> None:
        """Close connections idle or busy for too long; runs until cancelled."""
        period = min(self.limits.idle_timeout_seconds, self.limits.request_timeout_seconds) / 4
        while True:
            await asyncio.sleep(max(period, 0.05))
            self.sweep()

    def sweep(self) -> None:
        now = time.monotonic()
        self._forget_closed()
        for key, connection in list(self._connections.items()):
            if connection.handler.transport is None:
                continue  # not connected yet
            if connection.busy_since is not None:
                overdue = now - connection.busy_since > self.limits.request_timeout_seconds
            else:
                overdue = now - connection.since > self.limits.idle_timeout_seconds
            if overdue:
                self.timed_out += 1
                self._abort(key)

    @property
    def open_connections(self) -> int:
        self._forget_closed()
        return len(self._connections)

    def _abort(self, key: Any) -> None:
        connection = self._connections.pop(key)
        transport = connection.handler.transport
        connection.handler.force_close()
        if transport is not None:
            transport.abort()

    def _forget_closed(self) -> None:
        for key, connection in list(self._connections.items()):
            transport = connection.handler.transport
            if transport is not None:
                connection.connected = True
            if (transport is None and connection.connected) or (
                transport is not None and transport.is_closing()
            ):
                del self._connections[key]


class _Refuse(asyncio.Protocol):
    """A connection over the cap while every slot is busy: 503, then close."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_BUSY_RESPONSE)
        transport.close()


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
