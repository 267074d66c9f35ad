"""The interactive-query HTTP server every instance runs (KIP-535).

Built on aiohttp: a mature, actively maintained asyncio server and client in
one package, needing no separate ASGI server, and small enough to run on a
background thread beside the stream threads. Handlers only read stores
through :class:`~eddyline_runtime.state.StoreReader` snapshots, which are
safe while the owner thread writes and commits.

Endpoints (JSON unless noted)::

    GET /v1/stores                              the stores and their serdes (a versioned
                                                store's history retention too)
    GET /v1/stores/{store}/keys/{key}           one key (a versioned store's: ``as_of=<ms>``
                                                for its value at a time, KIP-960; the answer
                                                has the version's timestamp and valid_to)
    GET /v1/stores/{store}/versions/{key}?from=&to=&ascending=
                                                a versioned store's versions of the key valid
                                                at some time in from..to (ms, inclusive; either
                                                may be omitted), newest first (KIP-968)
    GET /v1/stores/{store}/range?from=&to=      keys from..to (inclusive; either may be omitted)
    GET /v1/stores/{store}/all                  every key this instance holds
                                                (both paginated: ``limit`` and ``cursor``)
    GET /v1/stores/{store}/metadata/{key}       KeyQueryMetadata: active, standby hosts, partition,
                                                and every member's host (member_hosts)
    GET /v1/stores/{store}/windows?key=&from=&to=   (or /windows/{key}?from=&to=)
                                                a window store: the key's windows starting
                                                from..to (ms, inclusive; either may be omitted),
                                                routed as /keys is
    GET /v1/stores/{store}/windows?key_from=&key_to=&from=&to=
                                                the windows of keys key_from..key_to (inclusive;
                                                either may be omitted: every key's), from every
                                                local copy as /range reads
    GET /v1/stores/{store}/sessions?key=&earliest_end=&latest_start=   (or /sessions/{key})
                                                a session store: the key's sessions ending at or
                                                after earliest_end and starting at or before
                                                latest_start (either may be omitted)
    GET /v1/stores/{store}/sessions?key_from=&key_to=&earliest_end=&latest_start=
                                                the sessions of a key range so bounded
                                                (windows and sessions: ordered by key, then
                                                window start or session end, start;
                                                ``backward=true`` exactly reversed; paginated
                                                as /range is)
    GET /v1/lags                                all_local_store_partition_lags()
    GET /v1/layout                              task layout and store roles (query/layout.py),
                                                and this instance's query address
    GET /healthz   /readyz   /metrics (Prometheus text)
    GET /readyz/serving                         the query side's readiness: 200 while this
                                                instance answers queries from some copy it
                                                holds, processing or not (docs/queries.md)

Store reads take ``isolation=READ_COMMITTED|READ_UNCOMMITTED`` (default:
``default.state.isolation.level``; a response's ``isolation`` is the level its
readers read at) and ``allow_stale=true|false`` (KIP-535's
``includeStaleStores``, default false). A key query may also take
``position_bound=TOPIC:PARTITION:OFFSET[,...]`` (KIP-796's ``PositionBound``;
see query/position.py): then any copy that reached it answers, standby or
not, and one that has not answers 409. Any store read may take
``max_staleness_ms=<ms>`` (query/staleness.py): then any copy whose committed
data is at most that stale answers, standby or restoring, and one that is
staler, or does not know its staleness yet, answers 409 (a range, all, window
or session query over every key skips it instead, as ``skipped_partitions``).

Every answer says what it reflects: ``member``, ``host`` and ``revision`` (the
hash of the topology's description this member runs) name who answered; a
one-key answer, and each entry of an every-key answer's ``copies``, names the
copy (``partition``, ``task``, ``role``, ``stale``, ``lag``) and what it read:
``position`` (KIP-796, taken before the data is read, so the data is at least
that new; a standby's is only what its store last committed as an active copy,
a lower bound), ``changelog_offset`` (the last changelog record the copy's
data includes: exact for a key's value read committed, which reads the two
together; elsewhere taken before the data is read, a lower bound),
``committed_at_ms`` (the copy's last commit as its task's active copy; null for
a standby or restoring copy),
``as_of_ms`` (the copy includes every write its task committed by then; null:
unknown) and ``staleness_ms`` (the answer's time minus ``as_of_ms``; 0 for the
fresh active copy). docs/queries.md states the invariant for users.
Errors a client can act on:

* 404: no such store (the body lists the stores);
* 421: this instance does not hold the key's partition (the body names the
  hosts that do);
* 503 with ``Retry-After``: the local copy is a standby, still restoring, or
  a copy a new assignment moved to another member that this instance has not
  closed yet, and ``allow_stale`` is false (the body names the active host);
* 503 with ``Retry-After`` for every store read once the instance is closing
  (its final commits, then its stores close; the query server stops only after
  them, so ``/v1/layout`` keeps saying which tasks are not closed yet); the
  router then asks the other members' copies;
* 409 with ``Retry-After``: the copy has not reached the query's position
  bound yet (the body holds the position it reached), or is staler than its
  ``max_staleness_ms`` (the body holds its ``staleness_ms``, null when unknown);
* 410: a later page's cursor names a partition this instance no longer serves
  for the query (its task moved away, or its copy fell beyond
  ``max_staleness_ms``): the body names ``cursor_partitions`` and
  ``moved_partitions``; start the query again without a cursor
  (query/cursor.py);
* 400: a bad parameter (the body names the accepted values), or a serde that
  does not fit the stored bytes.

``/range``, ``/all`` and the window and session queries answer at most ``limit`` entries (default
:data:`DEFAULT_PAGE_ENTRIES`, at most :data:`MAX_PAGE_ENTRIES`) in key order;
when more remain, ``next_cursor`` is set and passing it back as ``cursor``
returns the entries after the last one served. It is null on the last page:
an answer is never cut short silently. A cursor is a key position, so any copy
continues it; over every key it also names the partitions its pages read, and
a later page reads exactly those (query/cursor.py). A query over every key may
name ``exclude_partitions=P1,P2``: partitions a router read elsewhere, left out.
Pages are read at different instants (each one committed state, or the owner's
open transaction under READ_UNCOMMITTED), as Kafka Streams' range queries are
per call.

Serdes a request may name (``key_serde``, ``value_serde``) are the built-in
ones and the store's own, never ``module:attribute``: a request must not
choose code to import and run.

A global store (``global_table``) is held whole by every member: any member
answers any key of it, with ``"global": true`` and ``partition`` -1 (none of a
task's), once its bootstrap is over (503 with ``Retry-After`` before that);
``/metadata`` names this member as the host, ``/v1/layout`` lists it under
``global_stores`` and ``/v1/lags`` gives its lag per topic partition.

A copy is fresh (answers without ``allow_stale``) only while it is the
running active copy of a task the assignment this instance knows gives it.
After a new assignment moves the task away, the copy still answers stale
queries, with its lag, until the stream thread closes it: routers fall back
on it while the new owner opens its own (query/client.py).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import logging
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from aiohttp import web

from eddyline_runtime.config import IsolationLevel
from eddyline_runtime.engine.global_thread import GlobalStoreError
from eddyline_runtime.engine.instance import InstanceNotStartedError, StreamsInstance
from eddyline_runtime.engine.queryable import (
    HostInfo,
    KeyQueryMetadata,
    LocalStorePartition,
    WindowedStoreShape,
    versioned_reader,
    windowed_store_shape,
)
from eddyline_runtime.errors import EddylineError
from eddyline_runtime.partitions import TopicPartition
from eddyline_runtime.query.cursor import (
    EXCLUDE_PARTITIONS_PARAMETER,
    CursorMovedError,
    PageCursor,
    continued,
    parse_cursor,
)
from eddyline_runtime.query.layout import member_report, topology_hash
from eddyline_runtime.query.limits import ConnectionGuard, ConnectionLimits, install_log_limits
from eddyline_runtime.query.position import (
    POSITION_BOUND_PARAMETER,
    format_position_bound,
    parse_position_bound,
    position_to_json,
    unreached,
)
from eddyline_runtime.query.prometheus import render_prometheus
from eddyline_runtime.query.staleness import (
    MAX_STALENESS_PARAMETER,
    CopyFreshness,
    copy_freshness,
    is_fresh,
    parse_max_staleness,
)
from eddyline_runtime.restore.replay.lag import wall_clock_ms
from eddyline_runtime.serde import SerdeError, serde_for_request
from eddyline_runtime.state import (
    DetachedSessionReader,
    DetachedWindowReader,
    KeyRange,
    StateStoreError,
    StoreReader,
)
from eddyline_runtime.value_and_timestamp import split_timestamped

logger = logging.getLogger(__name__)

# What a client should wait before retrying a standby or restoring store.
RETRY_AFTER_SECONDS = 1
# A page of /range or /all: small enough to answer in milliseconds and keep the
# event loop (and /healthz on it) responsive, large enough for few round trips.
# The query side's readiness: a query Service or router probes it, never a rollout or a
# PodDisruptionBudget, which keep to /readyz (processing).
SERVING_READINESS_PATH: Final = "/readyz/serving"
DEFAULT_PAGE_ENTRIES = 1_000
MAX_PAGE_ENTRIES = 10_000


class QueryServer:
    """Serves one instance's stores over HTTP on a background thread."""

    def __init__(
        self,
        instance: StreamsInstance,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.instance = instance
        self._host, self._port = host, port
        self.limits = limits or ConnectionLimits()
        self.guard = ConnectionGuard(self.limits, probes=partial(probe_answer, instance))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._watch: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.address: HostInfo | None = None

    def start(self) -> HostInfo:
        """Bind and serve; returns the bound address (port 0 picks a free one)."""
        self._thread = threading.Thread(target=self._serve, name="eddyline-query", daemon=True)
        self._thread.start()
        self._started.wait(10)
        if self._error is not None:
            raise EddylineError(
                f"the query server cannot listen on {self._host}:{self._port}: {self._error}; "
                "pick a free port (application.server)"
            ) from self._error
        assert self.address is not None
        return self.address

    def stop(self) -> None:
        loop, runner = self._loop, self._runner
        if loop is None or runner is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(runner), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    async def _shutdown(self, runner: web.AppRunner) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._listener is not None:
            self._listener.close()
        await runner.cleanup()

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        install_log_limits(loop)
        try:
            app = _application(self.instance)
            app.middlewares.append(self.guard.middleware)
            runner = web.AppRunner(
                app, access_log=None, keepalive_timeout=self.limits.idle_timeout_seconds
            )
            loop.run_until_complete(runner.setup())
            assert runner.server is not None
            self.guard.server = runner.server
            # Our own listener instead of a TCPSite: the guard sits in front of
            # aiohttp's protocol factory to cap connections (see limits.py).
            self._listener = loop.run_until_complete(
                loop.create_server(self.guard.factory, self._host, self._port)
            )
            self._runner = runner
            self._watch = loop.create_task(self.guard.watch())
            bound = self._listener.sockets[0].getsockname()
            self.address = HostInfo(self._host, int(bound[1]))
        except BaseException as exc:
            self._error = exc
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.close()


def _application(instance: StreamsInstance) -> web.Application:
    handlers = _Handlers(instance)
    app = web.Application()
    app.router.add_get("/v1/stores", handlers.stores)
    app.router.add_get("/v1/stores/{store}/keys/{key}", handlers.get_key)
    app.router.add_get("/v1/stores/{store}/versions/{key}", handlers.get_versions)
    app.router.add_get("/v1/stores/{store}/range", handlers.get_range)
    app.router.add_get("/v1/stores/{store}/all", handlers.get_all)
    app.router.add_get("/v1/stores/{store}/metadata/{key}", handlers.metadata)
    app.router.add_get("/v1/stores/{store}/windows/{key}", handlers.get_key_windows)
    app.router.add_get("/v1/stores/{store}/windows", handlers.get_all_windows)
    app.router.add_get("/v1/stores/{store}/sessions/{key}", handlers.get_key_sessions)
    app.router.add_get("/v1/stores/{store}/sessions", handlers.get_all_sessions)
    app.router.add_get("/v1/lags", handlers.lags)
    app.router.add_get("/v1/layout", handlers.layout)
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/readyz", handlers.readyz)
    app.router.add_get(SERVING_READINESS_PATH, handlers.serving)
    app.router.add_get("/metrics", handlers.metrics)
    return app


class _QueryError(Exception):
    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None):
        super().__init__(body.get("error", ""))
        self.status, self.body, self.headers = status, body, headers or {}

    def response(self) -> web.Response:
        return web.json_response(self.body, status=self.status, headers=self.headers)


class _Handlers:
    def __init__(self, instance: StreamsInstance) -> None:
        self.instance = instance
        self._revision: str | None = None

    def _answerer(self) -> dict[str, Any]:
        """Who answers: this member, its query address, and the topology revision it runs
        (the hash of the topology's description, as /v1/layout and the operator name it)."""
        if self._revision is None:
            # An instance runs one topology for its life: described once, not per query.
            self._revision = topology_hash(self.instance.topology.describe())
        return {
            "member": self.instance.member.id,
            "host": self.instance.member.address,
            "revision": self._revision,
        }

    # -- stores -------------------------------------------------------------------

    async def stores(self, request: web.Request) -> web.Response:
        topology = self.instance.topology
        return web.json_response(
            {
                "stores": [
                    {
                        "name": s.name,
                        "key_serde": s.key_serde,
                        "value_serde": s.value_serde,
                        # A versioned store says so: its keys take as_of (KIP-960).
                        **(
                            {}
                            if s.versioned_history_ms is None
                            else {"versioned_history_ms": s.versioned_history_ms}
                        ),
                    }
                    for s in topology.stores.values()
                ]
                + [
                    {
                        "name": g.name,
                        "key_serde": g.store.key_serde,
                        "value_serde": g.store.value_serde,
                        "global": True,
                        "topic": g.topic,
                    }
                    for g in topology.global_stores.values()
                ]
            }
        )

    async def get_key(self, request: web.Request) -> web.Response:
        if request.match_info["store"] in self.instance.topology.global_stores:
            return self._global_get(request)
        try:
            store = self._readable_store(request)
            isolation, allow_stale = _read_options(request)
            bound = _position_bound(request)
            max_staleness = _max_staleness(request)
            keys, values = _serdes(self.instance, store, request)
            key = keys.serialize_text(request.match_info["key"])
            metadata = _available(self.instance, _metadata(self.instance, store, key), store)
            local = self._hosted(store, metadata)
            bounded = bound is not None
            freshness = _checked(
                self.instance, local, metadata, allow_stale, max_staleness, bounded=bounded
            )
            reader = local.open_reader(isolation)
            # Before the data: what the answer reads is at least this new.
            position = reader.position()
            if bound is not None:
                # A bound says what is fresh enough: any copy that reached it will do.
                _check_reached(store, position, bound, metadata)
            versioned = versioned_reader(self.instance.topology, local, isolation)
            version: dict[str, Any] = {}
            read_with: int | None = None  # the changelog offset the value was read with
            if versioned is None:
                if "as_of" in request.query:
                    raise _QueryError(
                        400,
                        {
                            "error": f'store "{store}" is not a versioned store: as_of '
                            "applies to a table materialized with Materialized.as_versioned"
                        },
                    )
                value, offsets = reader.get_with_changelog_offsets(key)
                if offsets is not None and len(offsets) == 1:
                    # The store's one changelog, read with the data: exact.
                    [read_with] = offsets.values()
            else:
                # KIP-960's VersionedKeyQuery: the latest version, or the one valid at as_of.
                as_of = _time_option(request, "as_of")
                record = versioned.get(key, as_of)
                value = None if record is None else record.value
                if record is not None:
                    version = {"timestamp": record.timestamp, "valid_to": record.valid_to}
            rendered = None if value is None else _render(values, value, store, "value_serde")
        except _QueryError as error:
            return error.response()
        except StateStoreError as error:
            return _moving(error).response()
        return web.json_response(
            {
                "store": store,
                "key": request.match_info["key"],
                "found": value is not None,
                "value": rendered,
                **version,
                **_served_by(local, reader.isolation, self.instance),
                **_reflects(local, position, freshness, changelog_offset=read_with),
                **self._answerer(),
            }
        )

    async def get_versions(self, request: web.Request) -> web.Response:
        """KIP-968's ``MultiVersionedKeyQuery``: a key's versions valid at some time in
        [from, to], newest first (``ascending=true``: oldest first)."""
        try:
            store = self._readable_store(request)
            isolation, allow_stale = _read_options(request)
            max_staleness = _max_staleness(request)
            keys, values = _serdes(self.instance, store, request)
            key = keys.serialize_text(request.match_info["key"])
            metadata = _available(self.instance, _metadata(self.instance, store, key), store)
            local = self._hosted(store, metadata)
            freshness = _checked(self.instance, local, metadata, allow_stale, max_staleness)
            position = local.open_reader(isolation).position()
            versioned = versioned_reader(self.instance.topology, local, isolation)
            if versioned is None:
                raise _QueryError(
                    400,
                    {
                        "error": f'store "{store}" is not a versioned store: /versions applies '
                        "to a table materialized with Materialized.as_versioned"
                    },
                )
            frm = _time_option(request, "from")
            to = _time_option(request, "to")
            if frm is not None and to is not None and frm > to:
                raise _QueryError(400, {"error": f"from={frm} is after to={to}; pass from <= to"})
            found = versioned.versions(
                key,
                0 if frm is None else frm,
                _MAX_TIME if to is None else to,
                ascending=_flag(request, "ascending"),
            )
            versions = [
                {
                    "value": _render(values, record.value, store, "value_serde"),
                    "timestamp": record.timestamp,
                    "valid_to": record.valid_to,
                }
                for record in found
            ]
        except _QueryError as error:
            return error.response()
        except StateStoreError as error:
            return _moving(error).response()
        return web.json_response(
            {
                "store": store,
                "key": request.match_info["key"],
                "versions": versions,
                **_served_by(local, versioned.isolation, self.instance),
                **_reflects(local, position, freshness),
                **self._answerer(),
            }
        )

    async def get_range(self, request: web.Request) -> web.Response:
        frm, to = request.query.get("from"), request.query.get("to")
        return self._scan(request, frm, to)

    async def get_all(self, request: web.Request) -> web.Response:
        return self._scan(request, None, None)

    def _global_get(self, request: web.Request) -> web.Response:
        """A key of a global store: this member's whole copy answers it."""
        try:
            store = self._readable_store(request)
            isolation, _ = _read_options(request)
            if _max_staleness(request) is not None:
                raise _unmeasured_global(store)
            keys, values = _serdes(self.instance, store, request)
            key = keys.serialize_text(request.match_info["key"])
            reader = _global_reader(self.instance, store, isolation)
            position = reader.position()
            value = reader.get(key)
            rendered = None if value is None else _render(values, value, store, "value_serde")
        except _QueryError as error:
            return error.response()
        except StateStoreError as error:
            return _moving(error).response()
        lags = self.instance.global_stores.lags(store)
        return web.json_response(
            {
                "store": store,
                "key": request.match_info["key"],
                "found": value is not None,
                "value": rendered,
                "global": True,
                "partition": -1,
                "role": "global",
                "stale": False,
                "lag": sum(lag.offset_lag for lag in lags.values()),
                "isolation": reader.isolation.value,
                "position": position_to_json(position),
                "changelog_offset": None,
                "committed_at_ms": None,
                "as_of_ms": None,
                "staleness_ms": None,
                **self._answerer(),
            }
        )

    def _scan(self, request: web.Request, frm: str | None, to: str | None) -> web.Response:
        try:
            store = self._readable_store(request)
            spec = self.instance.topology.stores.get(store)
            if spec is not None and spec.versioned_history_ms is not None:
                raise _QueryError(
                    400,
                    {
                        "error": f'store "{store}" is a versioned store: range and all '
                        "queries of it are not served yet; query one key with "
                        "/keys/{key} (as_of=<ms> for its value at a time)"
                    },
                )
            isolation, allow_stale = _read_options(request)
            max_staleness = _max_staleness(request)
            keys, values = _serdes(self.instance, store, request)
            every_key = store not in self.instance.topology.global_stores
            limit, cursor = _page_options(request, every_key=every_key)
            after = None if cursor is None else cursor.after
            excluded = _excluded_partitions(request)
            key_range = KeyRange.closed(
                None if frm is None else keys.serialize_text(frm),
                None if to is None else keys.serialize_text(to),
            )
            if after is not None:
                # The smallest key after the cursor is the cursor followed by a zero byte.
                resume = after + b"\x00"
                lower = resume if key_range.lower is None else max(key_range.lower, resume)
                key_range = KeyRange(lower, key_range.upper)
        except _QueryError as error:
            return error.response()
        served: list[int] = []
        skipped: list[int] = []
        scans: list[Iterator[tuple[bytes, bytes]]] = []
        levels: list[IsolationLevel] = []
        copies: list[dict[str, Any]] = []
        if store in self.instance.topology.global_stores:
            if max_staleness is not None:
                return _unmeasured_global(store).response()
            try:
                reader = _global_reader(self.instance, store, isolation)
            except _QueryError as error:
                return error.response()
            except StateStoreError as error:
                return _moving(error).response()
            levels.append(reader.isolation)
            scans.append(reader.scan(key_range))
        try:
            selected = _every_key_copies(
                self.instance,
                store,
                allow_stale,
                max_staleness,
                skipped,
                cursor=cursor,
                excluded=excluded,
            )
        except _QueryError as error:
            return error.response()
        for local, freshness in selected:
            served.append(local.partition)
            try:
                reader = local.open_reader(isolation)
                copies.append(_copy_answer(local, reader, freshness, self.instance))
                levels.append(reader.isolation)
                scans.append(reader.scan(key_range))
            except StateStoreError as error:
                return _moving(error).response()
        # One entry past the page says whether another page follows.
        page = list(itertools.islice(heapq.merge(*scans), limit + 1))
        more = len(page) > limit
        page = page[:limit]
        try:
            entries = [
                [
                    _render(keys.serde, stored_key, store, "key_serde"),
                    _render(values, value, store, "value_serde"),
                ]
                for stored_key, value in page
            ]
        except _QueryError as error:
            return error.response()
        return web.json_response(
            {
                "store": store,
                "isolation": _read_at(levels, isolation),
                "entries": entries,
                "next_cursor": _next_cursor(page[-1][0], served, every_key) if more else None,
                "partitions": served,
                "skipped_partitions": skipped,
                "copies": copies,
                **self._answerer(),
            }
        )

    async def metadata(self, request: web.Request) -> web.Response:
        try:
            store = self._store(request)
            keys, _ = _serdes(self.instance, store, request)
            key = keys.serialize_text(request.match_info["key"])
            if store in self.instance.topology.global_stores:
                # Every member holds all of it: this one answers (Kafka names the local host).
                return web.json_response(
                    {
                        "active_host": self.instance.member.address,
                        "standby_hosts": [],
                        "partition": -1,
                        "global": True,
                        "member_hosts": _member_hosts(self.instance),
                    }
                )
            metadata = _metadata(self.instance, store, key)
        except _QueryError as error:
            return error.response()
        return web.json_response(
            {**_metadata_body(metadata), "member_hosts": _member_hosts(self.instance)}
        )

    async def lags(self, request: web.Request) -> web.Response:
        lags = self.instance.all_local_store_partition_lags()
        body: dict[str, dict[str, dict[str, Any]]] = {
            store: {
                str(partition): {
                    "current_offset_position": lag.current_offset_position,
                    "end_offset_position": lag.end_offset_position,
                    "offset_lag": lag.offset_lag,
                }
                for partition, lag in sorted(partitions.items())
            }
            for store, partitions in sorted(lags.items())
        }
        for pending in self.instance.restore_pending():
            # A missing store waiting for a Spark build: a replay would start at the
            # changelog's start.
            body.setdefault(pending.store, {})[str(pending.changelog.partition)] = {
                "current_offset_position": pending.log_start,
                "end_offset_position": pending.log_end,
                "offset_lag": pending.records,
                "restorePending": True,
                "restoreDeadline": round(pending.deadline, 3),
            }
        return web.json_response(body)

    async def layout(self, request: web.Request) -> web.Response:
        try:
            report = member_report(self.instance)
        except InstanceNotStartedError as error:
            return web.json_response(
                {"error": str(error)},
                status=503,
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        # The address lets a router that reached this member through a Service (or any
        # alias) query it directly.
        return web.json_response({**report.to_json(), "address": self.instance.member.address})

    # -- window and session stores ----------------------------------------------------

    async def get_key_windows(self, request: web.Request) -> web.Response:
        return self._windowed(request, "window", request.match_info["key"])

    async def get_all_windows(self, request: web.Request) -> web.Response:
        return self._windowed(request, "window", None)

    async def get_key_sessions(self, request: web.Request) -> web.Response:
        return self._windowed(request, "session", request.match_info["key"])

    async def get_all_sessions(self, request: web.Request) -> web.Response:
        return self._windowed(request, "session", None)

    def _windowed(self, request: web.Request, kind: str, path_key: str | None) -> web.Response:
        """A window or session query: one key's (routed like /keys) or a key range's, every
        key's by default (read from every local copy, like /range), ordered by key then time
        (backward: exactly reversed), paginated by the last entry served."""
        served_by: dict[str, Any] = {}
        try:
            store = self._readable_store(request)
            shape = windowed_store_shape(self.instance.topology, store)
            if shape is None or shape.kind != kind:
                what = "a key-value" if shape is None else f"a {shape.kind}"
                raise _QueryError(
                    400,
                    {
                        "error": f'store "{store}" is {what} store, not a {kind} store; query '
                        f"it with {_QUERY_OF[shape.kind if shape else 'key-value']}"
                    },
                )
            isolation, allow_stale = _read_options(request)
            max_staleness = _max_staleness(request)
            keys, values = _serdes(self.instance, store, request)
            lower, upper = _time_bounds(request, kind)
            backward = _flag(request, "backward")
            key_text, from_text, to_text = _key_options(request, kind, path_key)
            every_key = key_text is None
            limit, cursor = _page_options(request, every_key=every_key)
            after_order = None if cursor is None else _order_of_cursor(cursor.after, kind)
            skipped: list[int] = []
            if key_text is not None:
                key = keys.serialize_text(key_text)
                key_from: bytes | None = key
                key_to: bytes | None = key
                metadata = _available(self.instance, _metadata(self.instance, store, key), store)
                local = self._hosted(store, metadata)
                freshness = _checked(self.instance, local, metadata, allow_stale, max_staleness)
                selected = [(local, freshness)]
            else:
                key_from = None if from_text is None else keys.serialize_text(from_text)
                key_to = None if to_text is None else keys.serialize_text(to_text)
                selected = _every_key_copies(
                    self.instance,
                    store,
                    allow_stale,
                    max_staleness,
                    skipped,
                    cursor=cursor,
                    excluded=_excluded_partitions(request),
                )
            copies = [local for local, _ in selected]
            # Each copy's position before its data is read: the answer is at least this new.
            answers = [
                _copy_answer(local, local.open_reader(isolation), freshness, self.instance)
                for local, freshness in selected
            ]
            readers = [shape.open_reader(local, isolation) for local in copies]
            if key_text is not None:
                served_by = answers[0]
            bounds = _WindowedBounds(key_from, key_to, lower, upper, backward)
            scans = [_windowed_entries(shape, reader, bounds) for reader in readers]
            merged: Iterator[_Found] = heapq.merge(*scans, key=_found_order, reverse=backward)
            page, more = _page_after(merged, after_order, backward, limit)
            entries = [
                {
                    "key": _render(keys.serde, entry_key, store, "key_serde"),
                    "start": start,
                    "end": end,
                    "value": _render(values, value, store, "value_serde"),
                }
                for _, entry_key, start, end, value in page
            ]
        except _QueryError as error:
            return error.response()
        except StateStoreError as error:
            return _moving(error).response()
        body: dict[str, Any] = {
            "store": store,
            "isolation": _read_at([reader.isolation for reader in readers], isolation),
            "backward": backward,
            "entries": entries,
            "next_cursor": (
                _order_cursor(page[-1][0], [c.partition for c in copies], every_key)
                if more
                else None
            ),
        }
        if key_text is not None:
            body.update(key=key_text, **served_by)
        else:
            body.update(
                key_from=from_text,
                key_to=to_text,
                partitions=[c.partition for c in copies],
                skipped_partitions=skipped,
                copies=answers,
            )
        body.update(self._answerer())
        return web.json_response(body)

    # -- health and metrics ---------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return _probe_response(self.instance, "/healthz")

    async def readyz(self, request: web.Request) -> web.Response:
        return _probe_response(self.instance, "/readyz")

    async def serving(self, request: web.Request) -> web.Response:
        return _probe_response(self.instance, SERVING_READINESS_PATH)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=render_prometheus(
                self.instance.metrics.snapshot(), self.instance.metrics.descriptions()
            ),
            content_type="text/plain",
            charset="utf-8",
        )

    # -- helpers --------------------------------------------------------------------

    def _readable_store(self, request: web.Request) -> str:
        """:meth:`_store`, for a read of its data: refused while the instance closes."""
        store = self._store(request)
        if self.instance.closing:
            raise _QueryError(
                503,
                {
                    "error": f'instance "{self.instance.member.id}" is shutting down: its copies '
                    f'of store "{store}" are being committed and closed; query another '
                    "member, or retry once the membership moved them"
                },
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        return store

    def _store(self, request: web.Request) -> str:
        store = request.match_info["store"]
        topology = self.instance.topology
        if store not in topology.stores and store not in topology.global_stores:
            known = sorted([*topology.stores, *topology.global_stores])
            raise _QueryError(
                404,
                {"error": f'no store named "{store}"; stores: {", ".join(known)}', "stores": known},
            )
        return store

    def _hosted(self, store: str, metadata: KeyQueryMetadata) -> LocalStorePartition:
        """This instance's copy of the key's partition; 421 (Misdirected) naming the hosts
        when it has none."""
        for local in self.instance.local_store_partitions(store):
            if local.partition == metadata.partition:
                return local
        raise _QueryError(
            421,
            {
                "error": f"this instance does not host partition {metadata.partition} of "
                f'store "{store}"; query one of the hosts that do',
                **_metadata_body(metadata),
            },
        )


def probe_answer(instance: StreamsInstance, path: str) -> tuple[int, bytes] | None:
    """The answer to a liveness (``/healthz``), processing readiness (``/readyz``) or
    serving readiness (``/readyz/serving``) probe.

    (status, JSON body), or None for any other path. The connection guard
    answers probes with it too when every connection slot is busy.
    """
    state = instance.state.value
    if path == "/healthz":
        healthy = instance.healthy()
        body: dict[str, Any] = {"status": "ok" if healthy else "failed", "state": state}
        return (200 if healthy else 503), json.dumps(body).encode()
    if path == "/readyz":
        ready = instance.ready()
        return (200 if ready else 503), json.dumps({"ready": ready, "state": state}).encode()
    if path == SERVING_READINESS_PATH:
        # Both signals in one answer: a caller sees a pod that serves but does not process.
        serving, processing = instance.serving(), instance.ready()
        body = {"serving": serving, "processing": processing, "state": state}
        return (200 if serving else 503), json.dumps(body).encode()
    return None


def _probe_response(instance: StreamsInstance, path: str) -> web.Response:
    answer = probe_answer(instance, path)
    assert answer is not None, path
    status, body = answer
    return web.Response(body=body, status=status, content_type="application/json")


def _position_bound(request: web.Request) -> dict[TopicPartition, int] | None:
    raw = request.query.get(POSITION_BOUND_PARAMETER)
    if raw is None:
        return None
    try:
        return parse_position_bound(raw)
    except EddylineError as error:
        raise _QueryError(400, {"error": str(error)}) from None


def _check_reached(
    store: str,
    position: Mapping[TopicPartition, int],
    bound: Mapping[TopicPartition, int],
    metadata: KeyQueryMetadata,
) -> None:
    """409 when this copy has not reached the query's position bound (KIP-796)."""
    missing = unreached(position, bound)
    if missing:
        raise _QueryError(
            409,
            {
                "error": f'this copy of store "{store}" has not reached the position bound yet '
                f"({format_position_bound(missing)}); retry, or ask another copy",
                "position": position_to_json(position),
                "position_bound": position_to_json(bound),
                **_metadata_body(metadata),
            },
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )


def _read_options(request: web.Request) -> tuple[IsolationLevel | None, bool]:
    raw_isolation = request.query.get("isolation")
    try:
        isolation = (
            None if raw_isolation is None else IsolationLevel.parse(raw_isolation, key="isolation")
        )
    except EddylineError as error:
        raise _QueryError(400, {"error": str(error)}) from None
    raw_stale = request.query.get("allow_stale", "false").lower()
    if raw_stale not in ("true", "false", "1", "0"):
        raise _QueryError(400, {"error": f'allow_stale must be true or false, got "{raw_stale}"'})
    return isolation, raw_stale in ("true", "1")


class _KeyCodec:
    """A store's key serde, and how a key written in a URL becomes its input."""

    def __init__(self, name: str, serde: Any) -> None:
        self.name = name
        self.serde = serde

    def serialize_text(self, text: str) -> bytes:
        try:
            parsed: Any = text
            if self.name in ("long", "int"):
                parsed = int(text)
            elif self.name == "json":
                parsed = json.loads(text)
            elif self.name == "bytes":
                parsed = text.encode()
            serialized: bytes = self.serde.serialize(parsed)
        except (ValueError, TypeError) as error:
            raise _QueryError(
                400, {"error": f'cannot read key "{text}" as {self.name}: {error}'}
            ) from None
        return serialized

    def deserialize(self, data: bytes) -> Any:
        return self.serde.deserialize(data)


def _global_reader(
    instance: StreamsInstance, store: str, isolation: IsolationLevel | None
) -> StoreReader:
    """The global store's reader once its bootstrap is over; 503 before."""
    if not instance.global_stores.bootstrapped.is_set():
        raise _QueryError(
            503,
            {
                "error": f'global store "{store}" is still loading its topic on this member '
                "(bootstrap before processing starts); retry shortly",
                "global": True,
            },
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    try:
        return instance.global_stores.reader(store, isolation)
    except GlobalStoreError as error:
        raise _QueryError(
            503, {"error": str(error)}, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        ) from None


def _serdes(instance: StreamsInstance, store: str, request: web.Request) -> tuple[_KeyCodec, Any]:
    topology = instance.topology
    glob = topology.global_stores.get(store)
    spec = topology.stores[store] if glob is None else glob.store
    own = (spec.key_serde, spec.value_serde)
    key_name = request.query.get("key_serde", spec.key_serde or "string")
    value_name = request.query.get("value_serde", spec.value_serde or "bytes")
    try:
        keys = _KeyCodec(key_name, serde_for_request(key_name, own=own, key="key_serde"))
        values = serde_for_request(value_name, own=own, key="value_serde")
    except EddylineError as error:
        raise _QueryError(400, {"error": str(error)}) from None
    return keys, values


def _render(serde: Any, data: bytes, store: str, option: str) -> Any:
    """Stored bytes as JSON; bytes a requested serde cannot read are the request's fault."""
    try:
        value = serde.deserialize(data)
    except (SerdeError, ValueError, TypeError) as error:
        raise _QueryError(
            400,
            {
                "error": f'store "{store}" holds data that {option} cannot read ({error}); '
                f"query with the store's own {option} (GET /v1/stores lists them)"
            },
        ) from None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


def _page_options(request: web.Request, *, every_key: bool) -> tuple[int, PageCursor | None]:
    """``limit`` (1..MAX_PAGE_ENTRIES) and the ``cursor`` a page resumes after
    (query/cursor.py; ``every_key``: a query over every key, whose cursor names its
    partitions)."""
    raw_limit = request.query.get("limit")
    limit = DEFAULT_PAGE_ENTRIES
    if raw_limit is not None:
        try:
            limit = int(raw_limit)
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_PAGE_ENTRIES:
            raise _QueryError(
                400,
                {
                    "error": f'limit must be a whole number from 1 to {MAX_PAGE_ENTRIES}, got "'
                    f'{raw_limit}"; follow next_cursor for more entries'
                },
            )
    raw_cursor = request.query.get("cursor")
    if raw_cursor is None:
        return limit, None
    try:
        return limit, parse_cursor(raw_cursor, every_key=every_key)
    except EddylineError as error:
        raise _QueryError(400, {"error": str(error)}) from None


def _next_cursor(last: bytes, partitions: Sequence[int], every_key: bool) -> str:
    """The cursor after the last entry served: its key position and, for a query over
    every key, the partitions the pages read (query/cursor.py)."""
    return PageCursor(last, tuple(sorted(partitions)) if every_key else None).text()


def _excluded_partitions(request: web.Request) -> set[int]:
    """``exclude_partitions=P1,P2``: partitions a router has read elsewhere already."""
    raw = request.query.get(EXCLUDE_PARTITIONS_PARAMETER, "")
    items = [item.strip() for item in raw.split(",") if item.strip()]
    if not all(item.isdigit() for item in items):
        raise _QueryError(
            400,
            {
                "error": f"{EXCLUDE_PARTITIONS_PARAMETER}={raw!r}: give partition numbers "
                f"separated by commas (e.g. {EXCLUDE_PARTITIONS_PARAMETER}=0,2)"
            },
        )
    return {int(item) for item in items}


def _every_key_copies(
    instance: StreamsInstance,
    store: str,
    allow_stale: bool,
    max_staleness: int | None,
    skipped: list[int],
    *,
    cursor: PageCursor | None,
    excluded: set[int],
) -> list[tuple[LocalStorePartition, CopyFreshness]]:
    """The copies a page over every key reads: :func:`_servable`'s, less the partitions
    the request excludes, and on a later page exactly the cursor's (410 when one is no
    longer served here: the query must start again)."""
    servable = [
        (local, freshness)
        for local, freshness in _servable(instance, store, allow_stale, max_staleness, skipped)
        if local.partition not in excluded
    ]
    try:
        read, left = continued(cursor, (local.partition for local, _ in servable), store)
    except CursorMovedError as error:
        raise _QueryError(
            410,
            {
                "error": str(error),
                "cursor_partitions": error.partitions,
                "moved_partitions": error.gone,
            },
        ) from None
    skipped.extend(left)
    skipped.sort()
    return [(local, freshness) for local, freshness in servable if local.partition in read]


def _time_option(request: web.Request, name: str) -> int | None:
    """A versioned query's time option (``as_of``, ``from``, ``to``: ms >= 0); None if
    omitted (the latest version; unbounded)."""
    text = request.query.get(name)
    if text is None:
        return None
    if not text.isdigit():
        raise _QueryError(
            400, {"error": f"{name}={text!r} is not a timestamp in milliseconds >= 0"}
        )
    return int(text)


_QUERY_OF = {
    "key-value": "/keys, /range or /all",
    "window": "/windows",
    "session": "/sessions",
}
_MAX_TIME = (1 << 63) - 1


def _time_bounds(request: web.Request, kind: str) -> tuple[int, int]:
    """A window query's ``from``/``to`` (window starts), a session query's
    ``earliest_end``/``latest_start``: milliseconds >= 0; omitted means unbounded."""
    names = ("from", "to") if kind == "window" else ("earliest_end", "latest_start")
    bounds = []
    for name, default in zip(names, (0, _MAX_TIME), strict=True):
        raw = request.query.get(name)
        if raw is None:
            bounds.append(default)
            continue
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if not 0 <= value <= _MAX_TIME:
            raise _QueryError(
                400,
                {"error": f'{name} must be a time in milliseconds >= 0, got "{raw}"'},
            )
        bounds.append(value)
    return bounds[0], bounds[1]


# (order, key, start, end, value): the order is (key, window start, sequence number)
# for windows and (key, session end, session start) for sessions.
_Found = tuple[tuple[bytes, int, int], bytes, int, int | None, bytes]


def _found_order(entry: _Found) -> tuple[bytes, int, int]:
    return entry[0]


@dataclass(frozen=True)
class _WindowedBounds:
    """A window or session query's keys (inclusive, None: open), times and direction."""

    key_from: bytes | None
    key_to: bytes | None
    lower: int
    upper: int
    backward: bool


def _windowed_entries(
    shape: WindowedStoreShape,
    reader: DetachedWindowReader | DetachedSessionReader,
    bounds: _WindowedBounds,
) -> Iterator[_Found]:
    """(order, key, start, end, value) in the store's key-range order (backward: exactly
    reversed); the order merges partitions and makes the page cursor. Window ends are
    start + size (None when the size is unknown); the values of windowed aggregations
    lose their timestamp (the aggregate is the answer)."""
    key_from, key_to, lower, upper = bounds.key_from, bounds.key_to, bounds.lower, bounds.upper
    if isinstance(reader, DetachedSessionReader):
        find = (
            reader.backward_find_key_range_sessions
            if bounds.backward
            else reader.find_key_range_sessions
        )
        for entry_key, start, end, value in find(key_from, key_to, lower, upper):
            yield (entry_key, end, start), entry_key, start, end, value
        return
    fetch = reader.backward_fetch_key_range if bounds.backward else reader.fetch_key_range
    size = shape.size_ms
    for entry_key, start, value in fetch(key_from, key_to, lower, upper):
        data = split_timestamped(value)[1] if shape.timestamped else value
        # Windowed aggregations keep no duplicates: the sequence number is always 0.
        yield (entry_key, start, 0), entry_key, start, None if size is None else start + size, data


_ORDER_TIMES: Final = struct.Struct(">QQ")


def _page_after(
    merged: Iterator[_Found], after: tuple[bytes, int, int] | None, backward: bool, limit: int
) -> tuple[list[_Found], bool]:
    """The ``limit`` entries after the cursor's, and whether more follow."""
    if after is not None:
        # Partitions hold disjoint keys, so (key, time, tiebreak) names one entry.
        if backward:
            merged = itertools.dropwhile(lambda entry: entry[0] >= after, merged)
        else:
            merged = itertools.dropwhile(lambda entry: entry[0] <= after, merged)
    # One entry past the page says whether another page follows.
    page = list(itertools.islice(merged, limit + 1))
    return page[:limit], len(page) > limit


def _order_cursor(order: tuple[bytes, int, int], partitions: Sequence[int], every_key: bool) -> str:
    """The cursor after a window or session entry: its key and two times."""
    key, first, second = order
    return _next_cursor(key + _ORDER_TIMES.pack(first, second), partitions, every_key)


def _order_of_cursor(after: bytes, kind: str) -> tuple[bytes, int, int]:
    if len(after) < _ORDER_TIMES.size:
        raise _QueryError(
            400,
            {
                "error": f"cursor is not one this server returned for a {kind} query; pass "
                "the next_cursor of the previous page unchanged"
            },
        )
    cut = len(after) - _ORDER_TIMES.size
    first, second = _ORDER_TIMES.unpack_from(after, cut)
    return after[:cut], first, second


def _flag(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false")
    if raw.lower() not in ("true", "false", "1", "0"):
        raise _QueryError(400, {"error": f'{name} must be true or false, got "{raw}"'})
    return raw.lower() in ("true", "1")


def _key_options(
    request: web.Request, kind: str, path_key: str | None
) -> tuple[str | None, str | None, str | None]:
    """(key, key_from, key_to) of a window or session query: one key (in the path or
    ``key=``) or a key range (``key_from``/``key_to``, inclusive, either omitted: open)."""
    key = request.query.get("key")
    key_from, key_to = request.query.get("key_from"), request.query.get("key_to")
    path = "windows" if kind == "window" else "sessions"
    if path_key is not None and key is not None:
        raise _QueryError(
            400,
            {
                "error": f"key is given twice (in the path and as key=); use "
                f"/{path}/{{key}} or /{path}?key=..., not both"
            },
        )
    key = path_key if key is None else key
    if key is not None and (key_from is not None or key_to is not None):
        raise _QueryError(
            400,
            {
                "error": "key and key_from/key_to cannot be combined: give key=... for one "
                "key, or key_from=...&key_to=... (inclusive, either may be omitted) for a range"
            },
        )
    return key, key_from, key_to


def _check_fresh(
    instance: StreamsInstance,
    local: LocalStorePartition,
    allow_stale: bool,
    metadata: KeyQueryMetadata,
) -> None:
    if allow_stale or is_fresh(instance, local):
        return
    if local.role.value == "standby":
        why = "a standby copy"
    elif local.current:
        why = "a copy moving to another member (not closed yet)"
    else:
        why = "still restoring"
    raise _QueryError(
        503,
        {
            "error": f'partition {local.partition} of store "{local.store}" is {why} here '
            f"(lag {local.lag.offset_lag}); query the active host, or pass allow_stale=true "
            f"(or {MAX_STALENESS_PARAMETER}=<ms> for an answer at most that stale)",
            "lag": local.lag.offset_lag,
            **_metadata_body(metadata),
        },
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


def _checked(
    instance: StreamsInstance,
    local: LocalStorePartition,
    metadata: KeyQueryMetadata,
    allow_stale: bool,
    max_staleness: int | None,
    *,
    bounded: bool = False,
) -> CopyFreshness:
    """The copy's freshness, once it may answer.

    With ``max_staleness_ms`` the bound alone judges, as a position bound does: any copy
    within it answers, standby or restoring, and one beyond it (or not knowing its
    staleness) is refused with 409. Without one, the copy must be fresh or the query
    allow stale answers, unless a position bound (``bounded``) judges instead.
    """
    freshness = copy_freshness(local, fresh=is_fresh(instance, local), now_ms=wall_clock_ms())
    if max_staleness is not None:
        _check_staleness(local, freshness, max_staleness, metadata)
    elif not bounded:
        _check_fresh(instance, local, allow_stale, metadata)
    return freshness


def _check_staleness(
    local: LocalStorePartition,
    freshness: CopyFreshness,
    max_staleness: int,
    metadata: KeyQueryMetadata,
) -> None:
    """409 with ``Retry-After`` when the copy is staler than the bound, or cannot tell."""
    if freshness.within(max_staleness):
        return
    staleness = freshness.staleness_ms
    copy = f'partition {local.partition} of store "{local.store}" ({_copy_kind(local)})'
    if staleness is None:
        why = (
            f"does not know its staleness: it has not caught up with its changelog since it "
            f"opened (lag {local.lag.offset_lag})"
        )
    else:
        why = f"is {staleness} ms stale"
    raise _QueryError(
        409,
        {
            "error": f"this copy of {copy} {why}, beyond {MAX_STALENESS_PARAMETER}="
            f"{max_staleness}; retry later, raise {MAX_STALENESS_PARAMETER}, ask another copy, "
            f"or query without {MAX_STALENESS_PARAMETER} and with allow_stale=true",
            MAX_STALENESS_PARAMETER: max_staleness,
            "staleness_ms": staleness,
            "as_of_ms": freshness.as_of_ms,
            "role": local.role.value,
            "lag": local.lag.offset_lag,
            **_metadata_body(metadata),
        },
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


def _unmeasured_global(store: str) -> _QueryError:
    """409 for a staleness bound on a global store: no copy of it measures its staleness.
    No ``Retry-After``: retrying cannot help."""
    return _QueryError(
        409,
        {
            "error": f'global store "{store}" does not measure its staleness: no copy of it '
            f"can show it is within {MAX_STALENESS_PARAMETER}; query it without "
            f"{MAX_STALENESS_PARAMETER} (GET /v1/lags gives its lag in records)",
            MAX_STALENESS_PARAMETER: None,
            "staleness_ms": None,
            "global": True,
        },
    )


def _copy_kind(local: LocalStorePartition) -> str:
    if local.role.value == "standby":
        return "a standby copy"
    return "the active copy" if local.running else "a restoring copy"


def _reflects(
    local: LocalStorePartition,
    position: Mapping[TopicPartition, int],
    freshness: CopyFreshness,
    *,
    changelog_offset: int | None = None,
) -> dict[str, Any]:
    """What an answer reflects: the copy's position when the read began, the last
    changelog record its data includes (``changelog_offset`` when read with the data,
    else the copy's as the request began), when that copy last committed (its active's
    commits only), and its freshness (staleness.py)."""
    return {
        "position": position_to_json(position),
        # Any copy's, so two copies of a partition compare by it (a replaying copy's
        # input position is only what its store last committed as an active copy: the
        # changelog does not carry positions). Read with the data (a key's committed
        # value) it is exact; otherwise taken as the request began, before the data was
        # read, a commit in between can make the data newer: a lower bound.
        "changelog_offset": (
            local.lag.current_offset_position - 1 if changelog_offset is None else changelog_offset
        ),
        "committed_at_ms": local.committed_at_ms,
        "as_of_ms": freshness.as_of_ms,
        "staleness_ms": freshness.staleness_ms,
    }


def _max_staleness(request: web.Request) -> int | None:
    raw = request.query.get(MAX_STALENESS_PARAMETER)
    if raw is None:
        return None
    try:
        return parse_max_staleness(raw)
    except EddylineError as error:
        raise _QueryError(400, {"error": str(error)}) from None


def _metadata(instance: StreamsInstance, store: str, key: bytes) -> KeyQueryMetadata:
    try:
        metadata = instance.key_query_metadata(store, key)
    except InstanceNotStartedError as error:
        raise _QueryError(
            503, {"error": str(error)}, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        ) from None
    if metadata is None:  # the handlers check the store first; a topology never loses one
        raise _QueryError(404, {"error": f'no store named "{store}"'})
    return metadata


def _available(
    instance: StreamsInstance, metadata: KeyQueryMetadata, store: str
) -> KeyQueryMetadata:
    """A key's metadata for serving it: 503 while no assignment covers it yet, unless this
    instance holds a copy of its partition anyway (one given nothing keeps its copies on
    disk open as standbys: an upgrade's reset membership), which answers by the usual rules."""
    unassigned = metadata.active_host is None and not metadata.standby_hosts
    held = any(
        local.partition == metadata.partition for local in instance.local_store_partitions(store)
    )
    if not metadata.partition_known or (unassigned and not held):
        raise _QueryError(
            503,
            {"error": f'no assignment covers this key of store "{store}" yet; retry shortly'},
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    return metadata


def _moving(error: StateStoreError) -> _QueryError:
    """The store closed under the query: its task is moving (a rebalance); retry shortly."""
    return _QueryError(
        503,
        {"error": f"the store is being closed or moved ({error}); retry"},
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


def _metadata_body(metadata: KeyQueryMetadata) -> dict[str, Any]:
    return {
        "active_host": None if metadata.active_host is None else str(metadata.active_host),
        "standby_hosts": [str(host) for host in metadata.standby_hosts],
        "partition": metadata.partition,
    }


def _member_hosts(instance: StreamsInstance) -> list[str]:
    """Every member's query address in the assignment this instance knows, and this
    instance's own: the hosts a router asks for copies (warm-ups, restoring ones, and those
    a member holds while no assignment names it) the key's metadata does not name."""
    assignment = instance.assignment
    members = [] if assignment is None else [m.address for m in assignment.members]
    return sorted({a for a in [*members, instance.member.address] if a})


def _read_at(levels: Sequence[IsolationLevel], asked: IsolationLevel | None) -> str | None:
    """The level the readers opened read at (one store's copies share it; a request without
    one gets the store's default); with no copy read, the level asked for, else None."""
    if levels:
        return levels[0].value
    return None if asked is None else asked.value


def _servable(
    instance: StreamsInstance,
    store: str,
    allow_stale: bool,
    max_staleness: int | None,
    skipped: list[int],
) -> list[tuple[LocalStorePartition, CopyFreshness]]:
    """The local copies a range, all, window or session query over every key reads, in
    partition order, with their freshness; the others' partitions go to ``skipped`` (a
    router finds them on another member). With ``max_staleness_ms``, the copies within
    it, whatever their role; else the fresh ones, or all of them when stale is allowed."""
    now = wall_clock_ms()
    servable = []
    for local in sorted(instance.local_store_partitions(store), key=lambda p: p.partition):
        fresh = is_fresh(instance, local)
        freshness = copy_freshness(local, fresh=fresh, now_ms=now)
        if freshness.within(max_staleness) if max_staleness is not None else fresh or allow_stale:
            servable.append((local, freshness))
        else:
            skipped.append(local.partition)
    return servable


def _copy_answer(
    local: LocalStorePartition,
    reader: StoreReader,
    freshness: CopyFreshness,
    instance: StreamsInstance,
) -> dict[str, Any]:
    """One copy's part of an answer over many partitions: who it is and what it reflects."""
    return {
        **_served_by(local, reader.isolation, instance),
        **_reflects(local, reader.position(), freshness),
    }


def _served_by(
    local: LocalStorePartition, isolation: IsolationLevel, instance: StreamsInstance
) -> dict[str, Any]:
    return {
        "partition": local.partition,
        "task": str(local.task),
        "role": local.role.value,
        "stale": not is_fresh(instance, local),
        "lag": local.lag.offset_lag,
        "isolation": isolation.value,
    }
